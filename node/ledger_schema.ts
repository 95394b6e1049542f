/**
 * The ledger's table: its columns, the row SQLite returns, the migrations of ledgers written by
 * older versions, and the ledger's instance id.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { DEFAULT_TEAM } from "../shared/teams.ts";

/** A ledger row as SQLite returns it. */
export interface Row {
  id: string;
  name: string;
  team: string;
  state: string;
  template: string;
  metadata: string;
  spec: string;
  env: string;
  created_at: number;
  last_active_at: number;
  deadline_at: number | null;
  deadline_action: string | null;
  e2b: string | null;
}

/**
 * The table's columns. A name is unique within its team, not across the ledger: team A's
 * `agent-1` and team B's `agent-1` are two sandboxes.
 */
export const columns = `
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  team TEXT NOT NULL DEFAULT '${DEFAULT_TEAM}',
  state TEXT NOT NULL,
  template TEXT NOT NULL,
  metadata TEXT NOT NULL,
  spec TEXT NOT NULL,
  env TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  last_active_at INTEGER NOT NULL,
  deadline_at INTEGER,
  deadline_action TEXT,
  e2b TEXT NOT NULL DEFAULT '{}',
  UNIQUE (team, name)`;

/**
 * Brings a ledger written before teams (no `team` column, names unique across the ledger) to
 * the current table: every old row joins the default team. SQLite cannot drop a column's UNIQUE
 * in place, so the table is rebuilt and copied in one transaction: a crash leaves either the old
 * table or the new one, never half of each.
 */
export function migrateToTeams(db: DatabaseSync): void {
  const info = db.prepare("PRAGMA table_info(sandboxes)").all() as unknown as { name: string }[];
  if (info.some((c) => c.name === "team")) return;
  db.exec("BEGIN IMMEDIATE");
  try {
    db.exec(`CREATE TABLE sandboxes_teams (${columns})`);
    db.exec(`INSERT INTO sandboxes_teams (id, name, team, state, template, metadata, spec, env,
      created_at, last_active_at, deadline_at, deadline_action)
      SELECT id, name, '${DEFAULT_TEAM}', state, template, metadata, spec, env, created_at,
      last_active_at, deadline_at, deadline_action FROM sandboxes`);
    db.exec("DROP TABLE sandboxes");
    db.exec("ALTER TABLE sandboxes_teams RENAME TO sandboxes");
    db.exec("COMMIT");
  } catch (error) {
    db.exec("ROLLBACK");
    throw error;
  }
}

/** Adds the `e2b` column to a ledger written before it; its rows keep `{}` (no settings). */
export function migrateToE2bSettings(db: DatabaseSync): void {
  const info = db.prepare("PRAGMA table_info(sandboxes)").all() as unknown as { name: string }[];
  if (info.some((c) => c.name === "e2b")) return;
  db.exec("ALTER TABLE sandboxes ADD COLUMN e2b TEXT NOT NULL DEFAULT '{}'");
}

/**
 * The ledger's instance id from its `meta` table, minted (16 random hex digits) and written the
 * first time: a ledger made before the table gets one at its next open.
 */
export function readInstanceId(db: DatabaseSync): string {
  db.exec("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)");
  const read = () =>
    (db.prepare("SELECT value FROM meta WHERE key = 'instance_id'").get() as
      | { value: string }
      | undefined)?.value;
  const found = read();
  if (found !== undefined) return found;
  const minted = Array.from(
    crypto.getRandomValues(new Uint8Array(8)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
  db.prepare("INSERT OR IGNORE INTO meta (key, value) VALUES ('instance_id', ?)").run(minted);
  return read()!;
}
