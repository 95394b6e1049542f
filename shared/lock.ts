/**
 * The single-writer lock: one process per SQLite file, for the life of the process.
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";

/**
 * Thrown when another process already holds the database file.
 *
 * @example
 * ```ts ignore
 * try { openExclusiveDatabase(path, "DORMICE_GATEWAY_DB"); }
 * catch (e) { if (e instanceof DatabaseLockedError) { console.error(e.message); Deno.exit(2); } }
 * ```
 */
export class DatabaseLockedError extends Error {
  /** The file that is held. */
  readonly path: string;
  /** Builds the error with a sentence naming the file and the variable to change. */
  constructor(path: string, variable: string) {
    super(
      `Cannot open ${path}: another process holds it (one process per database file). ` +
        `Stop the other process, or set ${variable} to a different path for this one`,
    );
    this.name = "DatabaseLockedError";
    this.path = path;
  }
}

/**
 * Opens a SQLite file and holds it exclusively for as long as the returned handle lives.
 *
 * Uses `PRAGMA locking_mode=EXCLUSIVE` and one write transaction: SQLite then keeps the file
 * lock until the connection closes, so a second process fails at its first write. Keep the
 * handle referenced: a collected handle releases the lock. Requires `--allow-read` and
 * `--allow-write` on the file.
 *
 * @throws {DatabaseLockedError} when another process holds the file.
 * @example
 * ```ts ignore
 * import { openExclusiveDatabase } from "@dormice/cluster/shared";
 * const db = openExclusiveDatabase("/var/lib/dormice/ledger.db", "DORMICE_DATA_DIR");
 * ```
 */
export function openExclusiveDatabase(path: string, variable: string): DatabaseSync {
  const db = new DatabaseSync(path, { timeout: 0 });
  try {
    db.exec("PRAGMA locking_mode=EXCLUSIVE");
    db.exec("PRAGMA journal_mode=WAL");
    db.exec("CREATE TABLE IF NOT EXISTS _dormice_lock (held_by INTEGER)");
    db.exec("BEGIN IMMEDIATE");
    db.prepare("DELETE FROM _dormice_lock").run();
    db.prepare("INSERT INTO _dormice_lock (held_by) VALUES (?)").run(Deno.pid);
    db.exec("COMMIT");
  } catch (error) {
    try {
      db.close();
    } catch { /* already unusable */ }
    if (/locked|busy/i.test(String((error as Error)?.message))) {
      throw new DatabaseLockedError(path, variable);
    }
    throw error;
  }
  return db;
}
