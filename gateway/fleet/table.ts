/**
 * The Fleet's SQLite table: which ids checked in, where, and when (never their readings, which
 * are kept in memory only). Kept apart from `fleet.ts` because persistence has its own rule: the
 * table only matters at the next start, so a write that fails (a full disk) is logged once and
 * never stops routing now.
 *
 * @module
 */
import { DatabaseSync, type StatementSync } from "node:sqlite";
import type { NodeRow } from "./node.ts";
import type { ChangeLog } from "../../shared/log.ts";

/** The longest a check-in waits to be written: they go to the table together, once a second. */
export const FLUSH_EVERY_MS = 1_000;

/** A check-in waiting to be written: the row as it will be. */
interface PendingRow {
  endpoint: string;
  intervalSeconds: number;
  build: string;
  /** Written only when the row is new. */
  firstSeen: number;
  lastCheckIn: number;
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
 * Check-ins are not written one by one: each waits in memory (the latest per node) and they are
 * written together, in one transaction, at the first check-in or `flushDue` once the oldest has
 * waited `FLUSH_EVERY_MS`, and at `close()`. A fleet of 10,000 nodes is 667 check-ins a second,
 * and one write each (a WAL commit and its sync) was the largest share of a check-in's cost. A
 * crash loses at most a second of check-ins; the table only serves the next start, where every
 * node is down until it checks in anyway, and a node whose first check-in was lost joins again.
 * A removal is written at once.
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
  readonly #upsert: StatementSync;
  readonly #remove: StatementSync;
  /** id → its check-in not written yet (one per node: the fleet bounds it). */
  readonly #pending = new Map<string, PendingRow>();
  /** When the oldest waiting check-in was recorded: none waits longer than `FLUSH_EVERY_MS`. */
  #oldestPending = 0;

  /** Opens (creating if needed) the table in `database`, or in a private in-memory one. */
  constructor(database: DatabaseSync | undefined, changes: ChangeLog) {
    this.#db = database ?? new DatabaseSync(":memory:");
    this.#ownsDb = database === undefined;
    this.#changes = changes;
    this.#db.exec(schema);
    this.#upsert = this.#db.prepare(
      `INSERT INTO gateway_nodes (id, endpoint, interval_seconds, build, first_seen, last_check_in)
       VALUES (?, ?, ?, ?, ?, ?)
       ON CONFLICT (id) DO UPDATE SET endpoint = excluded.endpoint,
         interval_seconds = excluded.interval_seconds, build = excluded.build,
         last_check_in = excluded.last_check_in`,
    );
    this.#remove = this.#db.prepare(`DELETE FROM gateway_nodes WHERE id = ?`);
  }

  /** Check-ins waiting to be written (diagnostics and tests). */
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
   * Records a node's first check-in at `at` (its first and last check-in both), written with
   * the next batch.
   *
   * @example
   * ```ts ignore
   * table.insert(node, now);
   * ```
   */
  insert(node: Pick<NodeRow, "id" | "endpoint" | "intervalSeconds" | "build">, at: number): void {
    this.#wait(node, at, at);
  }

  /**
   * Records a known node's check-in at `at`, written with the next batch.
   *
   * @example
   * ```ts ignore
   * table.update(node, now);
   * ```
   */
  update(node: Pick<NodeRow, "id" | "endpoint" | "intervalSeconds" | "build">, at: number): void {
    // A row not written yet keeps its first check-in; a known row's first_seen is never rewritten.
    this.#wait(node, this.#pending.get(node.id)?.firstSeen ?? at, at);
  }

  #wait(
    node: Pick<NodeRow, "id" | "endpoint" | "intervalSeconds" | "build">,
    firstSeen: number,
    at: number,
  ): void {
    if (this.#pending.size === 0) this.#oldestPending = at;
    this.#pending.set(node.id, {
      endpoint: node.endpoint,
      intervalSeconds: node.intervalSeconds,
      build: node.build,
      firstSeen,
      lastCheckIn: at,
    });
    this.flushDue(at);
  }

  /**
   * Writes the waiting check-ins when the oldest has waited `FLUSH_EVERY_MS` at `now` (the
   * Fleet's sweep calls it, so a quiet fleet's check-ins are written too).
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
   * Writes every waiting check-in now, in one transaction.
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
        for (const [id, r] of pending) {
          this.#upsert.run(id, r.endpoint, r.intervalSeconds, r.build, r.firstSeen, r.lastCheckIn);
        }
        if (own) this.#db.exec("COMMIT");
      } catch (error) {
        if (own && this.#db.isTransaction) this.#db.exec("ROLLBACK");
        throw error;
      }
    });
  }

  /**
   * Deletes a node's row, at once.
   *
   * @example
   * ```ts ignore
   * table.remove("node-c");
   * ```
   */
  remove(id: string): void {
    this.#pending.delete(id);
    this.#persist(() => this.#remove.run(id));
  }

  /**
   * Writes the waiting check-ins, then closes the database when the table opened it itself (the
   * in-memory default).
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
