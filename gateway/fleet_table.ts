/**
 * The Fleet's SQLite table: which ids checked in, where, and when (never their readings, which
 * are kept in memory only). Kept apart from `fleet.ts` because persistence has its own rule: the
 * table only matters at the next start, so a write that fails (a full disk) is logged once and
 * never stops routing now.
 *
 * @module
 */
import { DatabaseSync, type StatementSync } from "node:sqlite";
import type { NodeRow } from "./fleet_node.ts";
import type { ChangeLog } from "../shared/log.ts";

interface Row {
  id: string;
  endpoint: string;
  interval_seconds: number;
  build: string;
  first_seen: number;
  last_check_in: number;
}

const schema = `CREATE TABLE IF NOT EXISTS gateway_nodes (
  id TEXT PRIMARY KEY,
  endpoint TEXT NOT NULL,
  interval_seconds REAL NOT NULL,
  build TEXT NOT NULL,
  first_seen INTEGER NOT NULL,
  last_check_in INTEGER NOT NULL
)`;

/**
 * The node table over one database handle: created if absent, read once at start, then written
 * by check-ins and removals. A failed write is reported through `changes` (once, and cleared by
 * the next write that succeeds) instead of thrown.
 *
 * @example
 * ```ts ignore
 * const table = new NodeTable(undefined, new ChangeLog(log));
 * for (const row of table.load()) console.log(row.id);
 * table.close();
 * ```
 */
export class NodeTable {
  readonly #db: DatabaseSync;
  readonly #ownsDb: boolean;
  readonly #changes: ChangeLog;
  readonly #insert: StatementSync;
  readonly #update: StatementSync;
  readonly #remove: StatementSync;

  /** Opens (creating if needed) the table in `database`, or in a private in-memory one. */
  constructor(database: DatabaseSync | undefined, changes: ChangeLog) {
    this.#db = database ?? new DatabaseSync(":memory:");
    this.#ownsDb = database === undefined;
    this.#changes = changes;
    this.#db.exec(schema);
    this.#insert = this.#db.prepare(
      `INSERT INTO gateway_nodes (id, endpoint, interval_seconds, build, first_seen, last_check_in)
       VALUES (?, ?, ?, ?, ?, ?)`,
    );
    this.#update = this.#db.prepare(
      `UPDATE gateway_nodes SET endpoint = ?, interval_seconds = ?, build = ?, last_check_in = ?
       WHERE id = ?`,
    );
    this.#remove = this.#db.prepare(`DELETE FROM gateway_nodes WHERE id = ?`);
  }

  /**
   * Every row, by id.
   *
   * @example
   * ```ts ignore
   * const rows = table.load();
   * ```
   */
  load(): NodeRow[] {
    const rows = this.#db.prepare(`SELECT * FROM gateway_nodes ORDER BY id`).all() as unknown[];
    return rows.map((raw) => {
      const row = raw as Row;
      return {
        id: row.id,
        endpoint: row.endpoint,
        intervalSeconds: row.interval_seconds,
        build: row.build,
        firstSeen: row.first_seen,
        lastCheckIn: row.last_check_in,
      };
    });
  }

  /**
   * Writes a node's first check-in at `at` (its first and last check-in both).
   *
   * @example
   * ```ts ignore
   * table.insert(node, now);
   * ```
   */
  insert(node: Pick<NodeRow, "id" | "endpoint" | "intervalSeconds" | "build">, at: number): void {
    this.#persist(() =>
      this.#insert.run(node.id, node.endpoint, node.intervalSeconds, node.build, at, at)
    );
  }

  /**
   * Writes a known node's check-in at `at`.
   *
   * @example
   * ```ts ignore
   * table.update(node, now);
   * ```
   */
  update(node: Pick<NodeRow, "id" | "endpoint" | "intervalSeconds" | "build">, at: number): void {
    this.#persist(() =>
      this.#update.run(node.endpoint, node.intervalSeconds, node.build, at, node.id)
    );
  }

  /**
   * Deletes a node's row.
   *
   * @example
   * ```ts ignore
   * table.remove("node-c");
   * ```
   */
  remove(id: string): void {
    this.#persist(() => this.#remove.run(id));
  }

  /** Closes the database when the table opened it itself (the in-memory default). */
  close(): void {
    if (this.#ownsDb && this.#db.isOpen) this.#db.close();
  }

  #persist(write: () => unknown): void {
    // The table only matters at the next start; a full disk must not stop routing now.
    try {
      write();
      this.#changes.clear("persist");
    } catch (error) {
      this.#changes.report("persist", "failing", "error", "could not write the node table", {
        error: (error as Error).message,
      });
    }
  }
}
