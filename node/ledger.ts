/**
 * The node's ledger: one SQLite row per sandbox, held by one daemon (the single-writer lock).
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { DatabaseSync as Database } from "node:sqlite";
import { join } from "node:path";
import { openExclusiveDatabase } from "../shared/lock.ts";
import type { SandboxSpec, SandboxState, StateCounts } from "../shared/schemas.ts";
import { sandboxStates } from "../shared/schemas.ts";
import { DEFAULT_TEAM } from "../shared/teams.ts";
import type { DeadlineAction, SandboxRecord } from "./service_contract.ts";

/** What the ledger needs to write a new row. */
export interface NewSandboxRow {
  /** The primary key, minted by {@linkcode newSandboxId}. */
  id: string;
  /** The sandbox name; unique within its team. */
  name: string;
  /** The team that owns it; {@linkcode DEFAULT_TEAM} when absent. */
  team?: string;
  /** The lifecycle state the row starts in (the service writes `active`). */
  state: SandboxState;
  /** The template the sandbox was built from. */
  template: string;
  /** The caller's key/value labels. */
  metadata: Record<string, string>;
  /** The resource limits the sandbox was built with. */
  spec: SandboxSpec;
  /** Default environment of every command in the sandbox. */
  env: Record<string, string>;
  /** Creation time, ms since the epoch; also the first `lastActiveAt`. */
  createdAt: number;
  /** E2B deadline, ms since the epoch; `null` for none. */
  deadlineAt: number | null;
  /** What the scanner does past the deadline; `null` when there is none. */
  deadlineAction: DeadlineAction | null;
}

/** The fields of a row that can change after it is written. */
export interface SandboxRowPatch {
  /** The new lifecycle state. */
  state?: SandboxState;
  /** The new metadata, replacing the old as a whole. */
  metadata?: Record<string, string>;
  /** Last use (the idle clock), ms since the epoch. */
  lastActiveAt?: number;
  /** New E2B deadline, ms since the epoch; `null` clears it. */
  deadlineAt?: number | null;
  /** New deadline action; `null` clears it. */
  deadlineAction?: DeadlineAction | null;
}

/** Options of {@linkcode Ledger}. */
export interface LedgerOptions {
  /** This node's id, stamped on every record handed out. */
  nodeId: string;
  /** This node's origin, stamped on every record handed out. */
  endpoint: string;
}

interface Row {
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
}

/**
 * The table's columns. A name is unique within its team, not across the ledger: team A's
 * `agent-1` and team B's `agent-1` are two sandboxes.
 */
const columns = `
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
  UNIQUE (team, name)`;

/**
 * Brings a ledger written before teams (no `team` column, names unique across the ledger) to
 * the current table: every old row joins the default team. SQLite cannot drop a column's UNIQUE
 * in place, so the table is rebuilt and copied in one transaction: a crash leaves either the old
 * table or the new one, never half of each.
 */
function migrateToTeams(db: DatabaseSync): void {
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

/**
 * Mints a sandbox id: `sbx_` and 20 random lowercase base32 characters (100 bits), URL-safe.
 *
 * @example
 * ```ts
 * import { newSandboxId } from "@dormice/cluster/node";
 * newSandboxId(); // "sbx_k3v9q0..."
 * ```
 */
export function newSandboxId(): string {
  const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
  const bytes = crypto.getRandomValues(new Uint8Array(20));
  let out = "sbx_";
  for (const b of bytes) out += alphabet[b & 31];
  return out;
}

/**
 * The sandbox ledger on `node:sqlite`. {@linkcode Ledger.open} holds the file exclusively for the
 * life of the object (a second daemon on the same data dir fails at boot); `close()` releases it.
 *
 * @example
 * ```ts
 * import { Ledger } from "@dormice/cluster/node";
 * const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
 * console.log(ledger.census().active); // 0
 * ledger.close();
 * ```
 */
export class Ledger {
  #db: DatabaseSync;
  #options: LedgerOptions;

  /** Wraps an open database (prefer {@linkcode Ledger.open} or {@linkcode Ledger.inMemory}). */
  constructor(db: DatabaseSync, options: LedgerOptions) {
    this.#db = db;
    this.#options = options;
    db.exec(`CREATE TABLE IF NOT EXISTS sandboxes (${columns})`);
    migrateToTeams(db);
    db.exec("CREATE INDEX IF NOT EXISTS sandboxes_deadline ON sandboxes (deadline_at)");
  }

  /**
   * Opens `<dataDir>/ledger.db`, holding it exclusively.
   *
   * Requires `--allow-read` and `--allow-write` on the data dir.
   *
   * @throws {import("../shared/lock.ts").DatabaseLockedError} when another process holds it.
   */
  static open(dataDir: string, options: LedgerOptions): Ledger {
    return new Ledger(
      openExclusiveDatabase(join(dataDir, "ledger.db"), "DORMICE_DATA_DIR"),
      options,
    );
  }

  /** A ledger in memory, for tests and embedding. */
  static inMemory(options: LedgerOptions): Ledger {
    return new Ledger(new Database(":memory:"), options);
  }

  /** Writes a new row; throws when the id or the name is taken. */
  insert(row: NewSandboxRow): SandboxRecord {
    this.#db.prepare(
      `INSERT INTO sandboxes (id, name, team, state, template, metadata, spec, env, created_at,
        last_active_at, deadline_at, deadline_action) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
    ).run(
      row.id,
      row.name,
      row.team ?? DEFAULT_TEAM,
      row.state,
      row.template,
      JSON.stringify(row.metadata),
      JSON.stringify(row.spec),
      JSON.stringify(row.env),
      row.createdAt,
      row.createdAt,
      row.deadlineAt,
      row.deadlineAction,
    );
    return this.byId(row.id)!;
  }

  /** The row with this id, or undefined. */
  byId(id: string): SandboxRecord | undefined {
    const row = this.#db.prepare("SELECT * FROM sandboxes WHERE id = ?").get(id);
    return row ? this.#record(row as unknown as Row) : undefined;
  }

  /** The row with this name in `team` (the default team when absent), or undefined. */
  byName(name: string, team: string = DEFAULT_TEAM): SandboxRecord | undefined {
    const row = this.#db.prepare("SELECT * FROM sandboxes WHERE team = ? AND name = ?")
      .get(team, name);
    return row ? this.#record(row as unknown as Row) : undefined;
  }

  /** Every row, oldest first. */
  all(): SandboxRecord[] {
    return this.#db.prepare("SELECT * FROM sandboxes ORDER BY created_at, name").all()
      .map((r) => this.#record(r as unknown as Row));
  }

  /** Rows whose deadline is at or before `now` (ms since the epoch). */
  pastDeadline(now: number): SandboxRecord[] {
    return this.#db.prepare(
      "SELECT * FROM sandboxes WHERE deadline_at IS NOT NULL AND deadline_at <= ? ORDER BY deadline_at",
    ).all(now).map((r) => this.#record(r as unknown as Row));
  }

  /** Changes a row; returns the new record, or undefined when there is no such row. */
  update(id: string, patch: SandboxRowPatch): SandboxRecord | undefined {
    const sets: string[] = [];
    const values: (string | number | null)[] = [];
    if (patch.state !== undefined) sets.push("state = ?"), values.push(patch.state);
    if (patch.metadata !== undefined) {
      sets.push("metadata = ?"), values.push(JSON.stringify(patch.metadata));
    }
    if (patch.lastActiveAt !== undefined) {
      sets.push("last_active_at = ?"), values.push(patch.lastActiveAt);
    }
    if (patch.deadlineAt !== undefined) sets.push("deadline_at = ?"), values.push(patch.deadlineAt);
    if (patch.deadlineAction !== undefined) {
      sets.push("deadline_action = ?"), values.push(patch.deadlineAction);
    }
    if (sets.length > 0) {
      this.#db.prepare(`UPDATE sandboxes SET ${sets.join(", ")} WHERE id = ?`).run(...values, id);
    }
    return this.byId(id);
  }

  /** Deletes a row; returns whether it existed. */
  delete(id: string): boolean {
    return Number(this.#db.prepare("DELETE FROM sandboxes WHERE id = ?").run(id).changes) > 0;
  }

  /** How many sandboxes are in each state. */
  census(): StateCounts {
    const counts = Object.fromEntries(sandboxStates.map((s) => [s, 0])) as StateCounts;
    const rows = this.#db.prepare("SELECT state, COUNT(*) AS n FROM sandboxes GROUP BY state")
      .all() as unknown as { state: SandboxState; n: number }[];
    for (const { state, n } of rows) if (state in counts) counts[state] = Number(n);
    return counts;
  }

  /**
   * Running sandboxes (active or restoring, E2B's `running`) per team, for the check-in: the
   * gateway holds each team to its `maxSandboxes` with these counts.
   */
  teamCounts(): Record<string, number> {
    const rows = this.#db.prepare(
      "SELECT team, COUNT(*) AS n FROM sandboxes WHERE state IN ('active', 'restoring') GROUP BY team",
    ).all() as unknown as { team: string; n: number }[];
    return Object.fromEntries(rows.map(({ team, n }) => [team, Number(n)]));
  }

  /** Closes the database, releasing the lock. Safe to call twice. */
  close(): void {
    if (this.#db.isOpen) this.#db.close();
  }

  #record(row: Row): SandboxRecord {
    return {
      id: row.id,
      name: row.name,
      team: row.team,
      state: row.state as SandboxState,
      nodeId: this.#options.nodeId,
      endpoint: this.#options.endpoint,
      template: row.template,
      metadata: JSON.parse(row.metadata),
      spec: JSON.parse(row.spec),
      createdAt: new Date(Number(row.created_at)).toISOString(),
      lastActiveAt: new Date(Number(row.last_active_at)).toISOString(),
      env: JSON.parse(row.env),
      deadlineAt: row.deadline_at === null ? null : Number(row.deadline_at),
      deadlineAction: row.deadline_action as DeadlineAction | null,
    };
  }
}
