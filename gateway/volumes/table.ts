/**
 * `gateway/volumes/` owns managed volumes at the gateway (E2B's `Volume`): the table of who owns
 * each volume and where it lives (`table.ts`), and the operator's move (`move.ts`). The E2B
 * routes over them are `faces/e2b/volumes.ts`.
 *
 * The volume table: one row per volume in the gateway's database, beside the node and key
 * tables: its id, its team and name (unique per team), the node that holds it, whether that
 * node keeps volumes on a shared root, and its state (`creating`, `ready`, `moving`,
 * `deleting`: only a `ready` volume may be mounted, moved or deleted). The files live on the
 * node; the table is what makes a name mean one volume fleet-wide. A volume's content token is
 * not stored: it is derived from the fleet token and the id, so every gateway on the same fleet
 * token, and every restart, agrees on it.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import { HttpError } from "../../shared/http_error.ts";

/** A volume's lifecycle at the gateway. */
export type VolumeState = "creating" | "ready" | "moving" | "deleting";

/** One row of the volume table. */
export interface VolumeRow {
  /** `vol-` and 20 lowercase hex digits. */
  id: string;
  /** The owning team. */
  team: string;
  /** Its name, unique within the team. */
  name: string;
  /** The node that holds it (on a shared root: the node that made it). */
  node: string;
  /** True when the node keeps volumes on a shared root (every node serves it). */
  shared: boolean;
  /** See {@linkcode VolumeState}. */
  state: VolumeState;
  /** The cap in bytes, as the node reported it. */
  sizeBytes: number;
  /** ISO 8601. */
  createdAt: string;
}

/**
 * A move's, delete's or stale-copy drop's hold on a volume, from {@linkcode VolumeStore.claim}:
 * the only way to write the row back or delete it while the step runs. Its token names this
 * claim and the row as it was read: a step that outlived its claim (its gateway's lease ended
 * mid-step and another gateway claimed the volume) is refused, never written over the other's.
 */
export interface VolumeClaim {
  /** The volume. */
  readonly id: string;
  /** `moving` or `deleting`. */
  readonly state: VolumeState;
  /** Opaque to callers: what the store compares at release. */
  readonly token: string;
}

/**
 * The 409 of a release or delete whose claim is no longer the one held: another gateway took
 * the volume over (or, on a shared table, this gateway's lease ended mid-step), so nothing was
 * written.
 */
export function claimTakenOver(id: string, what: string): HttpError {
  return new HttpError(
    409,
    `Another gateway took over volume '${id}' while this ${what} ran (this gateway's claim ` +
      "lapsed, e.g. its etcd lease ended mid-step): nothing was written; GET the volume to see " +
      "its state now, and retry once it is ready",
  );
}

/** The most volumes one team may have (every map has a bound). */
export const MAX_VOLUMES_PER_TEAM = 1000;

/**
 * Where the volume rows are kept: the gateway's database ({@linkcode VolumeTable}), or etcd in
 * shared mode (`etcd_table.ts`), so every gateway of a fleet knows every volume.
 */
export interface VolumeStore {
  /**
   * Inserts a `creating` row; a name the team already uses is a 409.
   *
   * @throws {HttpError} 409 naming the name, 429 past {@linkcode MAX_VOLUMES_PER_TEAM}.
   */
  reserve(row: { id: string; team: string; name: string; node: string }): Promise<void>;
  /** The row by id, limited to `team` when given (another team's is absent). */
  get(id: string, team?: string): Promise<VolumeRow | undefined>;
  /** The team's row by name. */
  byName(team: string, name: string): Promise<VolumeRow | undefined>;
  /** The team's rows (every team's when `team` is undefined), oldest first. */
  list(team?: string): Promise<VolumeRow[]>;
  /** Changes a row's state, node, shared flag or cap. */
  update(
    id: string,
    patch: { state?: VolumeState; node?: string; shared?: boolean; sizeBytes?: number },
  ): Promise<void>;
  /**
   * Moves a `ready` row to `state` at once; `undefined` when it was not `ready` (another delete
   * or move got there first).
   */
  claim(id: string, state: "moving" | "deleting"): Promise<VolumeClaim | undefined>;
  /**
   * Ends a claim: the row is `ready` again, on `patch.node` when given, only if the claim is
   * still the one held and the row unchanged since it was claimed.
   *
   * @throws {HttpError} 409 ({@linkcode claimTakenOver}) when it is not: nothing is written.
   */
  release(claim: VolumeClaim, patch?: { node?: string }): Promise<void>;
  /**
   * Removes a claimed row, on the same condition as {@linkcode VolumeStore.release}.
   *
   * @throws {HttpError} 409 ({@linkcode claimTakenOver}) when the claim is not held.
   */
  remove(claim: VolumeClaim): Promise<void>;
  /** Removes a row no step claims (a create's own, which nobody else can claim yet). */
  delete(id: string): Promise<void>;
  /**
   * Marks a create in flight that mounts the volume where every gateway sees it, unless the
   * volume is claimed by a move or delete (`undefined` then); answers the release. Absent on a
   * store only one gateway uses (the gateway's own count is enough there).
   */
  mountStart?(id: string): Promise<(() => Promise<void>) | undefined>;
  /** The creates in flight that mount the volume, through every gateway. */
  mountsInFlight?(id: string): Promise<number>;
}

/**
 * The volume table over the gateway's database.
 *
 * @example
 * ```ts ignore
 * const table = new VolumeTable(db);
 * table.reserve({ id, team: "acme", name: "data", node: "node-a" });
 * ```
 */
export class VolumeTable implements VolumeStore {
  #db: DatabaseSync;
  constructor(db: DatabaseSync) {
    this.#db = db;
    db.exec(`CREATE TABLE IF NOT EXISTS volumes (
      id TEXT PRIMARY KEY,
      team TEXT NOT NULL,
      name TEXT NOT NULL,
      node TEXT NOT NULL,
      shared INTEGER NOT NULL DEFAULT 0,
      state TEXT NOT NULL,
      size_bytes INTEGER NOT NULL DEFAULT 0,
      created_at TEXT NOT NULL,
      claim TEXT,
      UNIQUE (team, name)
    )`);
    const columns = db.prepare("PRAGMA table_info(volumes)").all() as { name: string }[];
    if (!columns.some((c) => c.name === "claim")) {
      db.exec("ALTER TABLE volumes ADD COLUMN claim TEXT");
    }
    // A gateway stopped in the middle of a create, move or delete left its row in that state,
    // which would refuse every mount for ever: no step of those is in flight after a start. A
    // move flips the node only once the copy is whole, so its volume is still on the old node;
    // a delete that did reach the node answers the next DELETE with "not here", which deletes
    // the row; a create's volume was never shown to anyone.
    db.exec("DELETE FROM volumes WHERE state = 'creating'");
    db.exec(
      "UPDATE volumes SET state = 'ready', claim = NULL WHERE state IN ('moving', 'deleting')",
    );
  }

  /**
   * Inserts a `creating` row; a name the team already uses is a 409.
   *
   * @throws {HttpError} 409 naming the name, 429 past {@linkcode MAX_VOLUMES_PER_TEAM}.
   */
  reserve(row: { id: string; team: string; name: string; node: string }): Promise<void> {
    return settle(() => {
      const count = this.#db.prepare("SELECT COUNT(*) AS n FROM volumes WHERE team = ?")
        .get(row.team) as { n: number };
      if (count.n >= MAX_VOLUMES_PER_TEAM) {
        throw new HttpError(
          429,
          `Team '${row.team}' has ${count.n} volumes, the most one team may have: destroy some`,
        );
      }
      try {
        this.#db.prepare(
          "INSERT INTO volumes (id, team, name, node, state, created_at) VALUES (?, ?, ?, ?, 'creating', ?)",
        ).run(row.id, row.team, row.name, row.node, new Date().toISOString());
      } catch (error) {
        if (/UNIQUE/.test((error as Error).message)) {
          throw new HttpError(
            409,
            `Your team already has a volume named '${row.name}': pick another name, or connect ` +
              "to that one (GET /volumes lists them)",
          );
        }
        throw error;
      }
    });
  }

  /** The row by id, limited to `team` when given (another team's is absent). */
  get(id: string, team?: string): Promise<VolumeRow | undefined> {
    return settle(() => {
      const r = this.#db.prepare("SELECT * FROM volumes WHERE id = ?").get(id) as
        | Record<string, unknown>
        | undefined;
      const row = r && rowOf(r);
      return row && (team === undefined || row.team === team) ? row : undefined;
    });
  }

  /** The team's row by name. */
  byName(team: string, name: string): Promise<VolumeRow | undefined> {
    return settle(() => {
      const r = this.#db.prepare("SELECT * FROM volumes WHERE team = ? AND name = ?")
        .get(team, name) as Record<string, unknown> | undefined;
      return r && rowOf(r);
    });
  }

  /** The team's rows (every team's when `team` is undefined), oldest first. */
  list(team?: string): Promise<VolumeRow[]> {
    return settle(() => {
      const rows = team === undefined
        ? this.#db.prepare("SELECT * FROM volumes ORDER BY created_at, id").all()
        : this.#db.prepare("SELECT * FROM volumes WHERE team = ? ORDER BY created_at, id").all(
          team,
        );
      return (rows as Record<string, unknown>[]).map(rowOf);
    });
  }

  /** Changes a row's state, node, shared flag or cap. */
  async update(
    id: string,
    patch: { state?: VolumeState; node?: string; shared?: boolean; sizeBytes?: number },
  ): Promise<void> {
    const row = await this.get(id);
    if (row === undefined) return;
    this.#db.prepare(
      "UPDATE volumes SET state = ?, node = ?, shared = ?, size_bytes = ?, " +
        "claim = CASE WHEN ? IN ('moving', 'deleting') THEN claim ELSE NULL END WHERE id = ?",
    )
      .run(
        patch.state ?? row.state,
        patch.node ?? row.node,
        (patch.shared ?? row.shared) ? 1 : 0,
        patch.sizeBytes ?? row.sizeBytes,
        patch.state ?? row.state,
        id,
      );
  }

  /**
   * Moves a `ready` row to `state` in one statement, with a fresh claim token; `undefined` when
   * it was not `ready` (another delete or move got there first).
   */
  claim(id: string, state: "moving" | "deleting"): Promise<VolumeClaim | undefined> {
    return settle(() => {
      const token = crypto.randomUUID();
      const r = this.#db.prepare(
        "UPDATE volumes SET state = ?, claim = ? WHERE id = ? AND state = 'ready'",
      ).run(state, token, id);
      return Number(r.changes) === 1 ? { id, state, token } : undefined;
    });
  }

  /**
   * Ends a claim (see {@linkcode VolumeStore.release}): the token guards against a step that
   * finishes after its claim was ended (by a restart, or an operator's release) and another
   * step claimed the volume.
   *
   * @throws {HttpError} 409 when the claim is not the one held.
   */
  release(claim: VolumeClaim, patch: { node?: string } = {}): Promise<void> {
    return settle(() => {
      const r = this.#db.prepare(
        "UPDATE volumes SET state = 'ready', claim = NULL, node = COALESCE(?, node) " +
          "WHERE id = ? AND claim = ?",
      ).run(patch.node ?? null, claim.id, claim.token);
      if (Number(r.changes) !== 1) throw claimTakenOver(claim.id, stepOf(claim));
    });
  }

  /**
   * Removes a claimed row.
   *
   * @throws {HttpError} 409 when the claim is not the one held.
   */
  remove(claim: VolumeClaim): Promise<void> {
    return settle(() => {
      const r = this.#db.prepare("DELETE FROM volumes WHERE id = ? AND claim = ?")
        .run(claim.id, claim.token);
      if (Number(r.changes) !== 1) throw claimTakenOver(claim.id, stepOf(claim));
    });
  }

  /** Removes the row. */
  delete(id: string): Promise<void> {
    return settle(() => {
      this.#db.prepare("DELETE FROM volumes WHERE id = ?").run(id);
    });
  }
}

/** The step a claim is for, as an error names it. */
export function stepOf(claim: VolumeClaim): string {
  return claim.state === "deleting" ? "delete" : "move";
}

/** A synchronous read or write of the database as the store's promise (a throw rejects it). */
function settle<T>(f: () => T): Promise<T> {
  try {
    return Promise.resolve(f());
  } catch (error) {
    return Promise.reject(error);
  }
}

function rowOf(r: Record<string, unknown>): VolumeRow {
  return {
    id: String(r.id),
    team: String(r.team),
    name: String(r.name),
    node: String(r.node),
    shared: Number(r.shared) === 1,
    state: String(r.state) as VolumeState,
    sizeBytes: Number(r.size_bytes),
    createdAt: String(r.created_at),
  };
}

/**
 * The content token of a volume: HMAC-SHA256 of its id under the fleet token, hex. The SDK sends
 * it as `Authorization: Bearer <token>` to the content API.
 *
 * @example
 * ```ts ignore
 * const token = await volumeToken("t".repeat(32), "vol-0123456789abcdef0123");
 * ```
 */
export async function volumeToken(fleetToken: string, id: string): Promise<string> {
  const key = await crypto.subtle.importKey(
    "raw",
    new TextEncoder().encode(fleetToken),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  const mac = await crypto.subtle.sign("HMAC", key, new TextEncoder().encode(`volume:${id}`));
  return "vt_" + [...new Uint8Array(mac)].map((b) => b.toString(16).padStart(2, "0")).join("");
}
