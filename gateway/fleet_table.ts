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

/** How often, at most, the batched check-in times are written. */
export const FLUSH_EVERY_MS = 1_000;

function identity(endpoint: string, intervalSeconds: number, build: string): string {
  return `${endpoint}\n${intervalSeconds}\n${build}`;
}

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
 * A check-in that changes only the time is not written at once: times wait in memory and are
 * written together, in one transaction, at the first check-in or `flushDue` once the oldest has
 * waited `FLUSH_EVERY_MS`, and at `close()`. A settled fleet of 10,000
 * nodes is 667 check-ins a second, and one write each (a WAL commit and its sync) was the
 * largest share of a check-in's cost. What a crash loses is at most a second of check-in times:
 * the table only serves the next start, which reads a node as down until it checks in anyway.
 * A new node, a move, a new interval or build is written at once.
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
  readonly #touch: StatementSync;
  /** id → its endpoint, interval and build as last written, to tell a time-only check-in. */
  readonly #written = new Map<string, string>();
  /** id → a check-in time not written yet (at most one per node: the fleet bounds it). */
  readonly #pending = new Map<string, number>();
  /** When the oldest waiting time was recorded: none waits longer than `FLUSH_EVERY_MS`. */
  #oldestPending = 0;

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
    this.#touch = this.#db.prepare(`UPDATE gateway_nodes SET last_check_in = ? WHERE id = ?`);
  }

  /** Check-in times waiting to be written (diagnostics and tests). */
  get pending(): number {
    return this.#pending.size;
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
      this.#written.set(row.id, identity(row.endpoint, row.interval_seconds, row.build));
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
    this.#pending.delete(node.id);
    this.#written.set(node.id, identity(node.endpoint, node.intervalSeconds, node.build));
    this.#persist(() =>
      this.#insert.run(node.id, node.endpoint, node.intervalSeconds, node.build, at, at)
    );
  }

  /**
   * Records a known node's check-in at `at`: written at once when its endpoint, interval or
   * build changed, else batched with the other check-in times (see the class).
   *
   * @example
   * ```ts ignore
   * table.update(node, now);
   * ```
   */
  update(node: Pick<NodeRow, "id" | "endpoint" | "intervalSeconds" | "build">, at: number): void {
    const written = identity(node.endpoint, node.intervalSeconds, node.build);
    if (this.#written.get(node.id) === written) {
      if (this.#pending.size === 0) this.#oldestPending = at;
      this.#pending.set(node.id, at);
      this.flushDue(at);
      return;
    }
    this.#pending.delete(node.id);
    this.#written.set(node.id, written);
    this.#persist(() =>
      this.#update.run(node.endpoint, node.intervalSeconds, node.build, at, node.id)
    );
  }

  /**
   * Writes the waiting check-in times when the oldest has waited `FLUSH_EVERY_MS` at `now`
   * (the Fleet's sweep calls it, so a quiet fleet's times are written too).
   *
   * @example
   * ```ts ignore
   * table.flushDue(Date.now());
   * ```
   */
  flushDue(now: number): void {
    if (this.#pending.size === 0 || now - this.#oldestPending < FLUSH_EVERY_MS) return;
    this.flush();
  }

  /**
   * Writes every waiting check-in time now, in one transaction.
   *
   * @example
   * ```ts ignore
   * table.flush();
   * ```
   */
  flush(): void {
    if (this.#pending.size === 0 || !this.#db.isOpen) return;
    const pending = [...this.#pending];
    this.#pending.clear();
    this.#persist(() => {
      // Another owner of the handle may be inside its own transaction: join it then.
      const own = !this.#db.isTransaction;
      if (own) this.#db.exec("BEGIN");
      try {
        for (const [id, at] of pending) this.#touch.run(at, id);
        if (own) this.#db.exec("COMMIT");
      } catch (error) {
        if (own && this.#db.isTransaction) this.#db.exec("ROLLBACK");
        throw error;
      }
    });
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
    this.#pending.delete(id);
    this.#written.delete(id);
    this.#persist(() => this.#remove.run(id));
  }

  /**
   * Writes the waiting check-in times, then closes the database when the table opened it
   * itself (the in-memory default).
   */
  close(): void {
    this.flush();
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
