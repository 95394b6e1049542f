/**
 * The volume table in etcd, for shared mode (`DORMICE_GATEWAY_ETCD`): every gateway of the fleet
 * reads and writes the same rows, so a volume created through one gateway is mounted, read and
 * deleted through any other, and a move started on one is seen as `moving` on all.
 *
 * Keys, under the fleet's prefix:
 *
 * | key | holds | lease |
 * |---|---|---|
 * | `volumes/rows/<id>` | the row (JSON) | the creating gateway's while `creating`; none once `ready` |
 * | `volumes/names/<team>/<name>` | the id: the name's uniqueness within the team | as the row |
 * | `volumes/busy/<id>` | `moving` or `deleting` | the gateway that claimed it |
 * | `volumes/mounting/<id>/<uuid>` | a create in flight that mounts it | the creating gateway's |
 *
 * The states in flight are tied to the lease of the gateway running the step: a gateway that
 * dies mid-create takes its half-made row with it, and one that dies mid-move or mid-delete
 * frees the volume (it is `ready` again once its lease ends) without another gateway having to
 * guess whether the step is still running. A claim's release, and the write-back or delete that
 * ends its step, is one transaction compared on that claim's busy key (its create revision) and
 * on the row as read at claim time: a step that outlived its lease never ends another gateway's
 * claim or writes a stale node back (a 409 says so). Each row is read with its busy key in one
 * transaction; a claim is one transaction compared on both and on there being no create in
 * flight that mounts the volume, and such a create's mark is put only while no claim exists:
 * a delete through one gateway and a create mounting the volume through another cannot both
 * go ahead.
 *
 * @module
 */
import { HttpError } from "../../shared/http_error.ts";
import type { EtcdClient, EtcdCompare, EtcdKv } from "../etcd/client.ts";
import { EtcdRequestError, EtcdUnavailableError } from "../etcd/client.ts";
import type { EtcdSession } from "../etcd/session.ts";
import { etcdRetryAfterSeconds } from "../etcd/answers.ts";
import {
  claimTakenOver,
  MAX_VOLUMES_PER_TEAM,
  stepOf,
  type VolumeClaim,
  type VolumeRow,
  type VolumeState,
  type VolumeStore,
} from "./table.ts";

/** Options of {@linkcode EtcdVolumeTable}. */
export interface EtcdVolumeTableOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The gateway's lease: its creates, moves and deletes in flight go with it. */
  session: EtcdSession;
  /** The fleet's key prefix, e.g. `/dormice/`. */
  prefix: string;
}

/**
 * The volume rows in etcd (see the module doc).
 *
 * @example
 * ```ts ignore
 * const table = new EtcdVolumeTable({ client, session, prefix: "/dormice/" });
 * await table.reserve({ id, team: "acme", name: "data", node: "node-a" });
 * ```
 */
export class EtcdVolumeTable implements VolumeStore {
  readonly #client: EtcdClient;
  readonly #session: EtcdSession;
  readonly #rows: string;
  readonly #names: string;
  readonly #busy: string;
  readonly #mounting: string;

  /** Builds the table; nothing is read or written until a method is called. */
  constructor(options: EtcdVolumeTableOptions) {
    this.#client = options.client;
    this.#session = options.session;
    this.#rows = `${options.prefix}volumes/rows/`;
    this.#names = `${options.prefix}volumes/names/`;
    this.#busy = `${options.prefix}volumes/busy/`;
    this.#mounting = `${options.prefix}volumes/mounting/`;
  }

  async reserve(row: { id: string; team: string; name: string; node: string }): Promise<void> {
    const count = (await this.list(row.team)).length;
    if (count >= MAX_VOLUMES_PER_TEAM) {
      throw new HttpError(
        429,
        `Team '${row.team}' has ${count} volumes, the most one team may have: destroy some`,
      );
    }
    const stored: VolumeRow = {
      ...row,
      shared: false,
      state: "creating",
      sizeBytes: 0,
      createdAt: new Date().toISOString(),
    };
    const nameKey = this.#nameKey(row.team, row.name);
    const written = await this.#withLease((lease) =>
      this.#client.txn([{ key: nameKey, target: "CREATE", result: "EQUAL", revision: "0" }], [
        { op: "put", key: this.#rows + row.id, value: JSON.stringify(stored), lease },
        { op: "put", key: nameKey, value: row.id, lease },
      ])
    );
    if (!written.succeeded) {
      throw new HttpError(
        409,
        `Your team already has a volume named '${row.name}': pick another name, or connect ` +
          "to that one (GET /volumes lists them)",
      );
    }
  }

  async get(id: string, team?: string): Promise<VolumeRow | undefined> {
    const r = await this.#ask(() =>
      this.#client.txn([], [
        { op: "range", key: this.#rows + id },
        { op: "range", key: this.#busy + id },
      ])
    );
    const row = rowOf(r.ranges[0][0], r.ranges[1][0]);
    return row && (team === undefined || row.team === team) ? row : undefined;
  }

  async byName(team: string, name: string): Promise<VolumeRow | undefined> {
    const kv = await this.#ask(() => this.#client.get(this.#nameKey(team, name)));
    if (kv === null) return undefined;
    const row = await this.get(kv.value, team);
    return row?.name === name ? row : undefined;
  }

  async list(team?: string): Promise<VolumeRow[]> {
    const r = await this.#ask(() =>
      this.#client.txn([], [
        { op: "range", key: this.#rows, prefix: true },
        { op: "range", key: this.#busy, prefix: true },
      ])
    );
    const busy = new Map(r.ranges[1].map((kv) => [kv.key.slice(this.#busy.length), kv]));
    const rows = r.ranges[0]
      .map((kv) => rowOf(kv, busy.get(kv.key.slice(this.#rows.length))))
      .filter((row): row is VolumeRow => row !== undefined)
      .filter((row) => team === undefined || row.team === team);
    return rows.sort((a, b) =>
      a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : a.id < b.id ? -1 : 1
    );
  }

  /**
   * Changes a row (a create's, or a test's): compared on the row and its claim as read, so a
   * write from a stale read is refused rather than put over a newer one.
   *
   * @throws {HttpError} 409 when the row is gone (its creating gateway's lease ended) or changed
   *   meanwhile.
   */
  async update(
    id: string,
    patch: { state?: VolumeState; node?: string; shared?: boolean; sizeBytes?: number },
  ): Promise<void> {
    const r = await this.#read(id);
    const row = rowOf(r.row, r.busy);
    if (r.row === undefined || row === undefined) throw gone(id);
    const state = patch.state ?? row.state;
    const next: VolumeRow = {
      ...row,
      node: patch.node ?? row.node,
      shared: patch.shared ?? row.shared,
      sizeBytes: patch.sizeBytes ?? row.sizeBytes,
      state: state === "creating" ? "creating" : "ready",
    };
    const nameKey = this.#nameKey(row.team, row.name);
    const rowRevision = r.row.modRevision;
    const busyRevision = r.busy?.createRevision ?? "0";
    const written = await this.#withLease((lease) => {
      // A ready row outlives its gateway; a creating one, a move's or a delete's claim do not.
      const rowLease = next.state === "creating" ? lease : undefined;
      return this.#client.txn([
        { key: this.#rows + id, target: "MOD", result: "EQUAL", revision: rowRevision },
        { key: this.#busy + id, target: "CREATE", result: "EQUAL", revision: busyRevision },
      ], [
        { op: "put", key: this.#rows + id, value: JSON.stringify(next), lease: rowLease },
        { op: "put", key: nameKey, value: id, lease: rowLease },
        state === "moving" || state === "deleting"
          ? { op: "put", key: this.#busy + id, value: state, lease }
          : { op: "delete", key: this.#busy + id },
      ]);
    });
    if (!written.succeeded) throw gone(id);
  }

  /**
   * Claims a `ready` row: its busy key is created under this gateway's lease, compared on the
   * row as read. The claim's token is the busy key's create revision (unique to this claim: a
   * claim made after this one lapsed creates the key anew, at a later revision) and the row's
   * mod revision.
   */
  async claim(id: string, state: "moving" | "deleting"): Promise<VolumeClaim | undefined> {
    const r = await this.#read(id);
    const kv = r.row;
    const row = rowOf(kv, r.busy);
    if (kv === undefined || row === undefined || row.state !== "ready") return undefined;
    const written = await this.#withLease((lease) =>
      this.#client.txn([
        { key: this.#rows + id, target: "MOD", result: "EQUAL", revision: kv.modRevision },
        { key: this.#busy + id, target: "CREATE", result: "EQUAL", revision: "0" },
        // No create in flight mounts it (an empty range holds; any key has a revision).
        {
          key: `${this.#mounting}${id}/`,
          prefix: true,
          target: "CREATE",
          result: "EQUAL",
          revision: "0",
        },
      ], [{ op: "put", key: this.#busy + id, value: state, lease }])
    );
    if (!written.succeeded) return undefined;
    return { id, state, token: `${written.revision}/${kv.modRevision}` };
  }

  /**
   * Ends a claim in one transaction compared on the claim (its busy key's create revision) and
   * on the row's mod revision read at claim time.
   *
   * @throws {HttpError} 409 when another gateway took the volume over: nothing is written.
   */
  async release(claim: VolumeClaim, patch: { node?: string } = {}): Promise<void> {
    const { busyRevision, rowRevision } = tokenOf(claim);
    const kv = (await this.#read(claim.id)).row;
    const row = rowOf(kv, undefined);
    if (kv === undefined || row === undefined || kv.modRevision !== rowRevision) {
      throw claimTakenOver(claim.id, stepOf(claim));
    }
    const written = await this.#ask(() =>
      this.#client.txn(this.#held(claim.id, busyRevision, rowRevision), [
        ...(patch.node === undefined || patch.node === row.node ? [] : [{
          op: "put" as const,
          key: this.#rows + claim.id,
          value: JSON.stringify({ ...row, state: "ready", node: patch.node }),
        }]),
        { op: "delete", key: this.#busy + claim.id },
      ])
    );
    if (!written.succeeded) throw claimTakenOver(claim.id, stepOf(claim));
  }

  /**
   * Removes a claimed row, its name and its marks, on the same compare as
   * {@linkcode EtcdVolumeTable.release}.
   *
   * @throws {HttpError} 409 when another gateway took the volume over: nothing is deleted.
   */
  async remove(claim: VolumeClaim): Promise<void> {
    const { busyRevision, rowRevision } = tokenOf(claim);
    const row = rowOf((await this.#read(claim.id)).row, undefined);
    if (row === undefined) throw claimTakenOver(claim.id, stepOf(claim));
    const written = await this.#ask(() =>
      this.#client.txn(this.#held(claim.id, busyRevision, rowRevision), [
        { op: "delete", key: this.#rows + claim.id },
        { op: "delete", key: this.#busy + claim.id },
        { op: "delete", key: `${this.#mounting}${claim.id}/`, prefix: true },
        { op: "delete", key: this.#nameKey(row.team, row.name) },
      ])
    );
    if (!written.succeeded) throw claimTakenOver(claim.id, stepOf(claim));
  }

  async delete(id: string): Promise<void> {
    const row = await this.get(id);
    await this.#ask(() =>
      this.#client.txn([], [
        { op: "delete", key: this.#rows + id },
        { op: "delete", key: this.#busy + id },
        { op: "delete", key: `${this.#mounting}${id}/`, prefix: true },
        ...(row === undefined
          ? []
          : [{ op: "delete" as const, key: this.#nameKey(row.team, row.name) }]),
      ])
    );
  }

  async mountStart(id: string): Promise<(() => Promise<void>) | undefined> {
    const key = `${this.#mounting}${id}/${crypto.randomUUID()}`;
    const written = await this.#withLease((lease) =>
      this.#client.txn([
        { key: this.#busy + id, target: "CREATE", result: "EQUAL", revision: "0" },
        { key: this.#rows + id, target: "CREATE", result: "NOT_EQUAL", revision: "0" },
      ], [{ op: "put", key, value: "1", lease }])
    );
    if (!written.succeeded) return undefined;
    return async () => {
      await this.#client.delete(key).catch(() => {});
    };
  }

  async mountsInFlight(id: string): Promise<number> {
    return (await this.#ask(() => this.#client.range(`${this.#mounting}${id}/`))).length;
  }

  /** The row and its busy key, read in one transaction. */
  async #read(id: string): Promise<{ row?: EtcdKv; busy?: EtcdKv }> {
    const r = await this.#ask(() =>
      this.#client.txn([], [
        { op: "range", key: this.#rows + id },
        { op: "range", key: this.#busy + id },
      ])
    );
    return { row: r.ranges[0][0], busy: r.ranges[1][0] };
  }

  /** The compares that hold while a claim is this one and its row unchanged since. */
  #held(id: string, busyRevision: string, rowRevision: string): EtcdCompare[] {
    return [
      { key: this.#busy + id, target: "CREATE", result: "EQUAL", revision: busyRevision },
      { key: this.#rows + id, target: "MOD", result: "EQUAL", revision: rowRevision },
    ];
  }

  #nameKey(team: string, name: string): string {
    return `${this.#names}${encodeURIComponent(team)}/${name}`;
  }

  /** A call under the gateway's lease, taken again once when etcd no longer knows it. */
  async #withLease<T>(call: (lease: string) => Promise<T>): Promise<T> {
    for (let attempt = 1;; attempt++) {
      const lease = await this.#ask(() => this.#session.lease());
      try {
        return await call(lease);
      } catch (error) {
        if (attempt < 2 && error instanceof EtcdRequestError && error.leaseNotFound) {
          await this.#session.invalidate(lease);
          continue;
        }
        throw volumeHttpError(error);
      }
    }
  }

  async #ask<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      throw volumeHttpError(error);
    }
  }
}

/** The 409 of a write whose row is gone or changed since it was read. */
function gone(id: string): HttpError {
  return new HttpError(
    409,
    `Volume '${id}' changed or is gone from the fleet's table since it was read (another ` +
      "gateway changed it, or this gateway's etcd lease ended mid-step): nothing was written; " +
      "GET the volume to see its state now, and retry",
  );
}

/** A claim's busy-key create revision and row mod revision. */
function tokenOf(claim: VolumeClaim): { busyRevision: string; rowRevision: string } {
  const [busyRevision, rowRevision] = claim.token.split("/");
  return { busyRevision: busyRevision ?? "0", rowRevision: rowRevision ?? "0" };
}

/** An etcd failure as the 503 a client sees; anything else passes through. */
function volumeHttpError(error: unknown): unknown {
  if (!(error instanceof EtcdUnavailableError) && !(error instanceof EtcdRequestError)) {
    return error;
  }
  return new HttpError(
    503,
    `${error.message}; the fleet's volume table lives in etcd, so volumes cannot be read or ` +
      "changed until it answers: retry",
    { headers: { "retry-after": String(etcdRetryAfterSeconds) } },
  );
}

function rowOf(kv: EtcdKv | undefined, busy: EtcdKv | undefined): VolumeRow | undefined {
  if (kv === undefined) return undefined;
  try {
    const v = JSON.parse(kv.value) as VolumeRow;
    if (typeof v?.id !== "string" || typeof v.team !== "string") return undefined;
    const state: VolumeState = v.state === "creating"
      ? "creating"
      : busy?.value === "moving" || busy?.value === "deleting"
      ? busy.value
      : "ready";
    return {
      id: v.id,
      team: v.team,
      name: String(v.name),
      node: String(v.node),
      shared: v.shared === true,
      state,
      sizeBytes: Number(v.sizeBytes ?? 0),
      createdAt: String(v.createdAt),
    };
  } catch {
    return undefined;
  }
}
