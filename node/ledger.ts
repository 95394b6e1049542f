/**
 * The node's ledger: one SQLite row per sandbox, held by one daemon (the single-writer lock).
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { DatabaseSync as Database } from "node:sqlite";
import { join } from "node:path";
import { openExclusiveDatabase } from "../shared/lock.ts";
import { yieldToLoop } from "../shared/event_loop.ts";
import { type Log, silentLog } from "../shared/log.ts";
import type { PoolSpec } from "../shared/pools.ts";
import type { SandboxSpec, SandboxState, StateCounts } from "../shared/schemas.ts";
import { sandboxStates } from "../shared/schemas.ts";
import { DEFAULT_TEAM } from "../shared/teams.ts";
import { isDiskFull, LedgerFullError, LedgerReserve } from "./ledger_space.ts";
import type { DeadlineAction, E2bSettings, SandboxRecord } from "./service_contract.ts";
import {
  columns,
  migrateToE2bSettings,
  migrateToTeams,
  readInstanceId,
  type Row,
} from "./ledger_schema.ts";

export { newSandboxId } from "./sandbox_id.ts";

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
  /** The E2B create options the node keeps (lifecycle, network); `{}` when absent. */
  e2b?: E2bSettings;
}

/** A warm pool sandbox as the ledger records it: built and probed, owned by no one yet. */
export interface WarmRow {
  /** The id its container is labelled with; it keeps it when claimed. */
  id: string;
  /** The template it was built from. */
  template: string;
  /** Its size. */
  spec: PoolSpec;
  /** When it joined its pool, ms since the epoch. */
  createdAt: number;
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
  /** New E2B settings, replacing the old as a whole. */
  e2b?: E2bSettings;
  /** A new spec, replacing the old as a whole (new egress rules of a running sandbox). */
  spec?: SandboxSpec;
}

/** Rows read at once by {@linkcode Ledger.pages}: about 15 ms of the event loop. */
export const LEDGER_PAGE_ROWS = 500;

/** A write to the ledger, as {@linkcode Ledger.onChange} listeners see it. */
export interface LedgerChange {
  /** What the write did to the row. */
  kind: "insert" | "update" | "delete";
  /** The row's id. */
  id: string;
  /** True when the write set the row's deadline (an insert with one, an update of it). */
  deadline: boolean;
}

/** Options of {@linkcode Ledger}. */
export interface LedgerOptions {
  /** This node's id, stamped on every record handed out. */
  nodeId: string;
  /** This node's origin, stamped on every record handed out. */
  endpoint: string;
  /** The data dir, named in the 507 of a write refused for space; set by `open()`. */
  dataDir?: string;
  /** The reserve a destroy may spend on a full disk (see `ledger_space.ts`); set by `open()`. */
  reserve?: LedgerReserve;
  /** Where spending the reserve is logged; `silentLog` when absent. */
  log?: Log;
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
  #dataDir: string;
  #log: Log;
  /**
   * The idle clock of rows used since the last flush, by id: a read or a command must not need
   * a ledger write (it would fail on a full disk, and costs a write per call). An entry leaves
   * when it is flushed or its row is deleted, so there are never more entries than rows.
   */
  #touched = new Map<string, number>();
  #listeners = new Set<(change: LedgerChange) => void>();
  #changeSeq = 0;

  /**
   * This ledger's own id, minted at its first open and kept in it for ever: what the executor
   * labels its sandboxes with (`dormice.instance`), so two nodes that share a node id on one
   * engine (two copies of one fleet, a restored data dir) never take each other's containers for
   * their own. Unlike the node id it cannot be configured, so it cannot be shared by mistake.
   */
  readonly instanceId: string;

  /** Wraps an open database (prefer {@linkcode Ledger.open} or {@linkcode Ledger.inMemory}). */
  constructor(db: DatabaseSync, options: LedgerOptions) {
    this.#db = db;
    this.#options = options;
    this.#dataDir = options.dataDir ?? "(in memory)";
    this.#log = options.log ?? silentLog;
    db.exec(`CREATE TABLE IF NOT EXISTS sandboxes (${columns})`);
    migrateToTeams(db);
    migrateToE2bSettings(db);
    db.exec("CREATE INDEX IF NOT EXISTS sandboxes_deadline ON sandboxes (deadline_at)");
    // Listings read a page at a time in this order (Ledger.pages).
    db.exec("CREATE INDEX IF NOT EXISTS sandboxes_created ON sandboxes (created_at, name, id)");
    // Warm pool sandboxes have their own table: they belong to no team and have no name yet, so
    // the census, the team counts, listings and lookups never see them; the boot reconcile
    // does (their containers are this node's, not orphans).
    db.exec(`CREATE TABLE IF NOT EXISTS warm (
      id TEXT PRIMARY KEY, template TEXT NOT NULL, spec TEXT NOT NULL, created_at INTEGER NOT NULL)`);
    this.instanceId = readInstanceId(db);
  }

  /**
   * Opens `<dataDir>/ledger.db`, holding it exclusively, and writes its reserve beside it when
   * the disk has room (without room the ledger opens, and refuses new sandboxes until it has).
   *
   * Requires `--allow-read` and `--allow-write` on the data dir.
   *
   * @throws {import("../shared/lock.ts").DatabaseLockedError} when another process holds it.
   * @throws {Error} SQLite's "database or disk is full" when the disk has no room for the lock
   * (`isDiskFull()` tells it apart).
   */
  static open(dataDir: string, options: LedgerOptions): Ledger {
    const reserve = options.reserve ?? new LedgerReserve(dataDir);
    const ledger = new Ledger(
      openExclusiveDatabase(join(dataDir, "ledger.db"), "DORMICE_DATA_DIR"),
      { ...options, dataDir, reserve },
    );
    reserve.restore();
    return ledger;
  }

  /** A ledger in memory, for tests and embedding. */
  static inMemory(options: LedgerOptions): Ledger {
    return new Ledger(new Database(":memory:"), options);
  }

  /**
   * Writes a new row; throws when the id or the name is taken.
   *
   * @throws {LedgerFullError} when the disk has no room, or had none a moment ago (the reserve
   * is spent: the room a destroy gave back is kept for destroys).
   */
  insert(row: NewSandboxRow): SandboxRecord {
    const what = `sandbox '${row.name}'`;
    this.refuseNewWhileFull(what);
    this.#write(what, () => this.#insertRow(row));
    this.#emit({ kind: "insert", id: row.id, deadline: row.deadlineAt !== null });
    return this.byId(row.id)!;
  }

  #insertRow(row: NewSandboxRow): void {
    this.#db.prepare(
      `INSERT INTO sandboxes (id, name, team, state, template, metadata, spec, env, created_at,
        last_active_at, deadline_at, deadline_action, e2b)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
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
      JSON.stringify(row.e2b ?? {}),
    );
  }

  /**
   * Throws when a new row would be refused: the reserve is spent (the disk was full a moment
   * ago). A create asks first, so no sandbox is built only to be taken back.
   *
   * @throws {LedgerFullError} naming `what` (e.g. "sandbox 'a'").
   */
  refuseNewWhileFull(what: string): void {
    if (this.#options.reserve?.spent) throw new LedgerFullError(this.#dataDir, what);
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

  /** Every row, oldest first. Holds the event loop for all of them: prefer {@linkcode Ledger.pages}. */
  all(): SandboxRecord[] {
    return this.#db.prepare("SELECT * FROM sandboxes ORDER BY created_at, name, id").all()
      .map((r) => this.#record(r as unknown as Row));
  }

  /**
   * Up to `limit` rows after `after` (the last row of the previous page; from the oldest when
   * absent), in the order of {@linkcode Ledger.all}: a page is one indexed query.
   */
  page(after: SandboxRecord | undefined, limit: number): SandboxRecord[] {
    const rows = after === undefined
      ? this.#db.prepare("SELECT * FROM sandboxes ORDER BY created_at, name, id LIMIT ?")
        .all(limit)
      : this.#db.prepare(
        `SELECT * FROM sandboxes WHERE (created_at, name, id) > (?, ?, ?)
          ORDER BY created_at, name, id LIMIT ?`,
      ).all(Date.parse(after.createdAt), after.name, after.id, limit);
    return rows.map((r) => this.#record(r as unknown as Row));
  }

  /**
   * Every row, oldest first, a page of `pageSize` (default {@linkcode LEDGER_PAGE_ROWS}) at a
   * time with the event loop let run between pages: reading and decoding a row costs about
   * 30 µs (20,000 rows held the loop 600 ms, measured 2026-12-07). A row written meanwhile is
   * seen when it sorts after the page being read; one destroyed meanwhile may still be seen.
   */
  async *pages(
    pageSize: number = LEDGER_PAGE_ROWS,
    yieldNow: () => Promise<void> = yieldToLoop,
  ): AsyncGenerator<SandboxRecord[]> {
    let after: SandboxRecord | undefined;
    for (;;) {
      const page = this.page(after, pageSize);
      if (page.length > 0) yield page;
      if (page.length < pageSize) return;
      after = page[page.length - 1];
      await yieldNow();
    }
  }

  /** Every row's id, name, team and state: the narrow columns, no JSON decoded. */
  keys(): { id: string; name: string; team: string; state: SandboxState }[] {
    return this.#db.prepare("SELECT id, name, team, state FROM sandboxes").all() as unknown as {
      id: string;
      name: string;
      team: string;
      state: SandboxState;
    }[];
  }

  /** The earliest deadline of any row (ms since the epoch), or null when no row has one. */
  nextDeadline(): number | null {
    const row = this.#db.prepare(
      "SELECT MIN(deadline_at) AS at FROM sandboxes WHERE deadline_at IS NOT NULL",
    ).get() as { at: number | bigint | null } | undefined;
    return row?.at === null || row?.at === undefined ? null : Number(row.at);
  }

  /** Rows whose deadline is at or before `now` (ms since the epoch). */
  pastDeadline(now: number): SandboxRecord[] {
    return this.#db.prepare(
      "SELECT * FROM sandboxes WHERE deadline_at IS NOT NULL AND deadline_at <= ? ORDER BY deadline_at",
    ).all(now).map((r) => this.#record(r as unknown as Row));
  }

  /**
   * Changes a row; returns the new record, or undefined when there is no such row.
   *
   * @throws {LedgerFullError} when the disk has no room for the change.
   */
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
    if (patch.e2b !== undefined) sets.push("e2b = ?"), values.push(JSON.stringify(patch.e2b));
    if (patch.spec !== undefined) sets.push("spec = ?"), values.push(JSON.stringify(patch.spec));
    if (sets.length > 0) {
      const { changes } = this.#write(
        `a change of sandbox '${id}'`,
        () =>
          this.#db.prepare(`UPDATE sandboxes SET ${sets.join(", ")} WHERE id = ?`).run(
            ...values,
            id,
          ),
      );
      if (patch.lastActiveAt !== undefined) this.#touched.delete(id);
      if (Number(changes) > 0) {
        this.#emit({ kind: "update", id, deadline: patch.deadlineAt !== undefined });
      }
    }
    return this.byId(id);
  }

  /**
   * Deletes a row; returns whether it existed. On a full disk the reserve is given up once to
   * let it through: a destroy is what frees space.
   *
   * @throws {LedgerFullError} when the disk has no room even then.
   */
  delete(id: string): boolean {
    const what = `the removal of '${id}'`;
    const run = () => this.#db.prepare("DELETE FROM sandboxes WHERE id = ?").run(id).changes;
    let changes;
    try {
      changes = run();
    } catch (error) {
      if (!isDiskFull(error)) throw error;
      const reserve = this.#options.reserve;
      if (!reserve?.release()) {
        throw new LedgerFullError(this.#dataDir, what, { reserveSpent: reserve !== undefined });
      }
      this.#log("warn", "data disk full: the ledger gave up its reserve to record a destroy", {
        dataDir: this.#dataDir,
        reserve: reserve.path,
        fix: "free space on the data disk; new sandboxes are refused until the reserve is back",
      });
      try {
        changes = run();
      } catch (again) {
        if (!isDiskFull(again)) throw again;
        throw new LedgerFullError(this.#dataDir, what, { reserveSpent: true });
      }
    }
    this.#touched.delete(id);
    const gone = Number(changes) > 0;
    if (gone) this.#emit({ kind: "delete", id, deadline: false });
    return gone;
  }

  /**
   * Calls `listener` after every write, synchronously (the deadline timer re-arms there, so a
   * new deadline is seen before the verb that wrote it returns). A listener must be quick and
   * must not throw: its throw would fail the write's caller. Returns the unsubscribe function.
   */
  onChange(listener: (change: LedgerChange) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /**
   * Sets a row's idle clock in memory (records show it at once); {@linkcode Ledger.flushTouches}
   * writes it. An unknown id is dropped at the next flush.
   */
  touch(id: string, at: number): void {
    this.#touched.set(id, at);
  }

  /**
   * Writes every idle clock set since the last flush in one transaction; returns how many rows
   * it wrote. On failure nothing is lost: the clocks stay in memory for the next flush.
   *
   * @throws {LedgerFullError} when the disk has no room.
   */
  flushTouches(): number {
    if (this.#touched.size === 0) return 0;
    const pending = [...this.#touched];
    const statement = this.#db.prepare("UPDATE sandboxes SET last_active_at = ? WHERE id = ?");
    this.#write("the idle clock of its sandboxes", () => {
      this.#db.exec("BEGIN");
      try {
        for (const [id, at] of pending) statement.run(at, id);
        this.#db.exec("COMMIT");
      } catch (error) {
        if (this.#db.isTransaction) this.#db.exec("ROLLBACK");
        throw error;
      }
    });
    // Synchronous from the read to here: nothing touched a row in between.
    for (const [id] of pending) this.#touched.delete(id);
    return pending.length;
  }

  /** Idle clocks set in memory and not yet written. */
  get unflushedTouches(): number {
    return this.#touched.size;
  }

  /**
   * Writes the reserve again if a destroy spent it and the disk has room; returns whether the
   * ledger has its reserve (always true in memory).
   */
  restoreReserve(): boolean {
    return this.#options.reserve?.restore() ?? true;
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

  /**
   * Records a warm pool sandbox whose container is built and probed.
   *
   * @throws {LedgerFullError} when the disk has no room.
   */
  insertWarm(row: WarmRow): void {
    this.refuseNewWhileFull(`warm sandbox '${row.id}'`);
    this.#write(
      `warm sandbox '${row.id}'`,
      () =>
        this.#db.prepare("INSERT INTO warm (id, template, spec, created_at) VALUES (?, ?, ?, ?)")
          .run(row.id, row.template, JSON.stringify(row.spec), row.createdAt),
    );
  }

  /** Forgets a warm sandbox (its container removed); returns whether it was recorded. */
  deleteWarm(id: string): boolean {
    return Number(this.#db.prepare("DELETE FROM warm WHERE id = ?").run(id).changes) > 0;
  }

  /** Every warm sandbox recorded, oldest first. */
  warmRows(): WarmRow[] {
    return (this.#db.prepare("SELECT * FROM warm ORDER BY created_at, id").all() as unknown as {
      id: string;
      template: string;
      spec: string;
      created_at: number;
    }[]).map((r) => ({
      id: r.id,
      template: r.template,
      spec: JSON.parse(r.spec),
      createdAt: Number(r.created_at),
    }));
  }

  /**
   * Turns warm sandbox `row.id` into an owned sandbox row in one transaction: a crash leaves
   * either the warm row or the sandbox row, never both and never neither.
   *
   * @throws {LedgerFullError} when the disk has no room (the warm row is kept).
   * @throws {Error} SQLite's constraint error when the name is taken in the team.
   */
  claimWarm(row: NewSandboxRow): SandboxRecord {
    const what = `sandbox '${row.name}'`;
    this.refuseNewWhileFull(what);
    this.#write(what, () => {
      this.#db.exec("BEGIN IMMEDIATE");
      try {
        const gone = this.#db.prepare("DELETE FROM warm WHERE id = ?").run(row.id).changes;
        if (Number(gone) !== 1) throw new Error(`No warm sandbox '${row.id}' in the ledger`);
        this.#insertRow(row);
        this.#db.exec("COMMIT");
      } catch (error) {
        if (this.#db.isTransaction) this.#db.exec("ROLLBACK");
        throw error;
      }
    });
    this.#emit({ kind: "insert", id: row.id, deadline: row.deadlineAt !== null });
    return this.byId(row.id)!;
  }

  /** Closes the database, releasing the lock. Safe to call twice. */
  close(): void {
    if (this.#db.isOpen) this.#db.close();
  }

  /**
   * A number that grows with every change of the rows: the clock's microseconds or one more
   * than the last, whichever is larger, so it also keeps growing across a restart. A reading
   * that carries it and an answer that names it let the gateway tell whether the reading counts
   * that answer's change (`ledgerSeq` in a check-in, `x-dormice-ledger-seq` on an answer).
   */
  get changeSeq(): number {
    return this.#changeSeq;
  }

  #emit(change: LedgerChange): void {
    this.#changeSeq = Math.max(this.#changeSeq + 1, Date.now() * 1000);
    for (const listener of this.#listeners) listener(change);
  }

  /** Runs one write; a refusal for want of space becomes the 507 naming the data dir. */
  #write<T>(what: string, fn: () => T): T {
    try {
      return fn();
    } catch (error) {
      if (isDiskFull(error)) throw new LedgerFullError(this.#dataDir, what);
      throw error;
    }
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
      lastActiveAt: new Date(this.#touched.get(row.id) ?? Number(row.last_active_at))
        .toISOString(),
      env: JSON.parse(row.env),
      deadlineAt: row.deadline_at === null ? null : Number(row.deadline_at),
      deadlineAction: row.deadline_action as DeadlineAction | null,
      e2b: row.e2b ? JSON.parse(row.e2b) : {},
    };
  }
}
