/**
 * The node's snapshots: taking one of a sandbox inside its name's slot (so a destroy cannot
 * interleave) and within the data-disk floor, finding one by id or name for a team, listing,
 * deleting, and the ids the check-in advertises. The snapshots themselves are the executor's
 * (Docker: local images); this file keeps none of their state besides the advertised ids.
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import type { NameQueue } from "../shared/name_queue.ts";
import { MAX_CHECK_IN_SNAPSHOTS } from "../shared/snapshots.ts";
import type { HostReading } from "../shared/schemas.ts";
import { teamScopedName } from "../shared/teams.ts";
import {
  type Executor,
  executorErrorToHttp,
  SNAPSHOT_ID_PATTERN,
  type SnapshotInfo,
} from "./executors/contract.ts";
import type { SandboxOps, SandboxRef } from "./service_contract.ts";
import type { HealSource, ImageMoves } from "./image_moves.ts";

/** How many snapshot names a check-in carries (the newest first). */
const MAX_CHECK_IN_SNAPSHOT_NAMES = 256;

/** A snapshot name: what a team calls it, 1–64 characters, no spaces or slashes. */
export const SNAPSHOT_NAME_PATTERN: RegExp = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/** The default data-disk floor below which a snapshot is refused, GB (`DORMICE_SNAPSHOT_MIN_DISK_GB`). */
export const DEFAULT_SNAPSHOT_MIN_DISK_GB = 1;

/** Options of {@linkcode NodeSnapshots}. */
export interface NodeSnapshotsOptions {
  /** Holds the snapshots. */
  executor: Executor;
  /** Finds the sandbox a snapshot is taken of. */
  service: Pick<SandboxOps, "get">;
  /** The per-name slots of the service, so a take never interleaves with a destroy. */
  queue: NameQueue;
  /** The node's host reading, for the data disk's free bytes; no floor is checked when absent. */
  hostReading?: () => HostReading;
  /** Bytes the data disk must keep free after a snapshot (`DORMICE_SNAPSHOT_MIN_DISK_GB`). */
  minDiskBytes?: number;
  /** Templates a snapshot may not be named after (a create names templates and snapshots alike). */
  templates?: () => Promise<string[] | undefined>;
  /** Gets snapshots this node lacks from other nodes or the registry, and pushes new ones. */
  moves?: ImageMoves;
  /**
   * How long a snapshot lives, ms from when it was taken (`DORMICE_SNAPSHOT_TTL_HOURS`): past
   * it {@linkcode NodeSnapshots.expire} deletes it here and from the registry. None when absent.
   */
  ttlMs?: number;
  /**
   * Tells the gateway at once of every snapshot taken (a new one, or a build under an id
   * another node holds: a name taken again, `take`'s `rebuild.snapshotId`), before the take
   * answers (`CheckInLoop.pushRetaken`); none without a gateway.
   */
  announceRetaken?: (snapshotId: string) => Promise<unknown>;
  /** Where takes and deletes are logged. */
  log?: Log;
}

/**
 * The node's snapshot verbs over its executor.
 *
 * @example
 * ```ts
 * import { FakeExecutor, SandboxService, Ledger } from "@dormice/cluster/node";
 * import { NodeSnapshots } from "./snapshots.ts";
 * const executor = new FakeExecutor();
 * const service = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "n1", endpoint: "http://127.0.0.1:1" }),
 *   executor,
 * });
 * const snapshots = new NodeSnapshots({ executor, service, queue: service.queue });
 * const { sandbox } = await service.acquire({ name: "a" });
 * const snap = await snapshots.take({ id: sandbox.id }, "ready");
 * console.log((await snapshots.find("ready", "default"))?.snapshotId === snap.snapshotId); // true
 * ```
 */
export class NodeSnapshots {
  #options: NodeSnapshotsOptions;
  #log: Log;
  /** What the last refresh saw, oldest first: the check-in's ids, and which names exist. */
  #known: SnapshotInfo[] = [];
  #refreshing: Promise<void> | undefined;

  /** The node's snapshots over its executor; `refresh()` reads them. */
  constructor(options: NodeSnapshotsOptions) {
    this.#options = options;
    this.#log = options.log ?? silentLog;
  }

  /**
   * Takes a snapshot of the sandbox `ref` names, for the sandbox's own team.
   *
   * With `rebuild`, a name the team uses here is a new build of that snapshot (E2B), kept
   * under its id (or under `rebuild.snapshotId`, the id another node holds the name under).
   *
   * @throws {HttpError} 404 for a sandbox not found, 400 for a bad name, 409 for a name the
   * team uses (without `rebuild`), 507 when the data disk would fall below the floor.
   */
  async take(
    ref: SandboxRef,
    name?: string,
    rebuild?: { snapshotId?: string },
  ): Promise<SnapshotInfo> {
    if (name !== undefined) {
      if (!SNAPSHOT_NAME_PATTERN.test(name)) {
        throw new HttpError(
          400,
          `'name' must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or ` +
            `digit: received '${name.slice(0, 80)}'`,
        );
      }
      if (SNAPSHOT_ID_PATTERN.test(name)) {
        throw new HttpError(400, `'name' must not look like a snapshot id: received '${name}'`);
      }
      const templates = await this.#options.templates?.();
      if (templates?.includes(name)) {
        throw new HttpError(
          400,
          `'name' '${name}' is a template on this node, and a create names both: choose ` +
            `another name`,
        );
      }
    }
    const row = this.#options.service.get(ref);
    const id = "id" in ref ? ref.id : ref.name;
    if (!row) throw new HttpError(404, `Sandbox '${id}' not found on this node`);
    if (row.state === "archived") {
      throw new HttpError(
        409,
        `Sandbox '${id}' is paused to disk (pause with keepMemory: false): connect to resume ` +
          "it, then take the snapshot or fork it",
      );
    }
    const info = await this.#options.queue.run(teamScopedName(row.team, row.name), async () => {
      await this.checkDisk(row.id);
      try {
        return await this.#options.executor.snapshot(row.id, {
          team: row.team,
          name,
          // Only a name carries an id over: an unnamed take is a new snapshot.
          ...(name !== undefined && rebuild !== undefined
            ? {
              rebuild: true,
              ...(rebuild.snapshotId === undefined ? {} : { snapshotId: rebuild.snapshotId }),
            }
            : {}),
        });
      } catch (error) {
        throw executorErrorToHttp(error);
      }
    });
    this.#log("info", "snapshot taken", {
      snapshot: info.snapshotId,
      sandbox: row.id,
      team: row.team,
      name,
    });
    // With a registry, the snapshot is there before the take answers: a create from it then
    // works while this node is down.
    await this.#options.moves?.push(info.snapshotId);
    await this.refresh();
    // The gateways hear of the snapshot before the client does: they ask only the nodes that
    // advertise a snapshot (by id or name), so a create, delete or lookup that follows the take
    // finds it, and for a name taken again (another node holds an older build under this id)
    // a create from the id is placed on the newest build, through any gateway.
    await this.#options.announceRetaken?.(info.snapshotId);
    return info;
  }

  /** Pushes snapshot `snapshotId` to the registry when one is set (a failure is logged). */
  async push(snapshotId: string): Promise<void> {
    await this.#options.moves?.push(snapshotId);
  }

  /** The snapshots of `team` (every team's when absent), oldest first. */
  async list(team?: string): Promise<SnapshotInfo[]> {
    try {
      return await this.#options.executor.listSnapshots(team);
    } catch (error) {
      throw executorErrorToHttp(error);
    }
  }

  /**
   * The snapshot of `team` whose id or name is `idOrName`, or undefined. A name no snapshot had
   * at the last refresh (every take and delete refreshes) is answered without asking the
   * executor, so a create from a template costs no engine call here.
   */
  async find(idOrName: string, team?: string): Promise<SnapshotInfo | undefined> {
    if (
      !SNAPSHOT_ID_PATTERN.test(idOrName) && !this.#known.some((s) => s.name === idOrName)
    ) return undefined;
    return (await this.list(team)).find((s) => s.snapshotId === idOrName || s.name === idOrName);
  }

  /**
   * As {@linkcode find}, and when this node lacks snapshot id `idOrName`, gets it first: from
   * the registry when one is set, else from `sources` (the holders a gateway named). A name is
   * only ever found locally: the gateway resolves names to ids before it asks for a heal.
   *
   * @throws {HttpError} 503 when the heal failed (see `ImageMoves.heal`).
   */
  async findOrHeal(
    idOrName: string,
    team: string | undefined,
    sources: readonly HealSource[],
    newestCreatedAt?: number,
  ): Promise<SnapshotInfo | undefined> {
    const found = await this.find(idOrName, team);
    const moves = this.#options.moves;
    // A copy older than the newest build (its template was built again since this node got
    // it) is got again, as a missing one is.
    const stale = found !== undefined && newestCreatedAt !== undefined &&
      found.createdAt < newestCreatedAt;
    if ((found && !stale) || !SNAPSHOT_ID_PATTERN.test(idOrName) || !moves?.canHeal) {
      return found;
    }
    if (sources.length === 0 && moves.registry === undefined) return found;
    await moves.heal(idOrName, sources, team);
    await this.refresh();
    return await this.find(idOrName, team);
  }

  /**
   * Deletes a snapshot of `team` (any team's when absent) here and from the registry when one
   * is set; false when neither held one by that id.
   *
   * @throws {HttpError} 503 when the registry could not be told.
   */
  async delete(snapshotId: string, team?: string): Promise<boolean> {
    this.#options.moves?.deleted(snapshotId);
    let deleted: boolean;
    try {
      deleted = await this.#options.executor.deleteSnapshot(snapshotId, team);
    } catch (error) {
      throw executorErrorToHttp(error);
    }
    if (SNAPSHOT_ID_PATTERN.test(snapshotId) && this.#options.moves?.registry !== undefined) {
      deleted = (await this.#options.moves.unpublish(snapshotId, team)) || deleted;
    }
    if (deleted) this.#log("info", "snapshot deleted", { snapshot: snapshotId, team });
    await this.refresh();
    return deleted;
  }

  /**
   * Deletes every snapshot taken `ttlMs` or longer before `now` (a healed copy keeps the time
   * its snapshot was taken, so every node's copy goes together), here and in the registry;
   * the ids deleted. Nothing without a TTL. Failures are logged and left to the next sweep.
   */
  async expire(now: number): Promise<string[]> {
    const ttl = this.#options.ttlMs;
    if (ttl === undefined || ttl <= 0) return [];
    const expired: string[] = [];
    let all: SnapshotInfo[] = [];
    try {
      all = await this.#options.executor.listSnapshots();
    } catch (error) {
      this.#log("warn", "could not list snapshots to expire them", { error });
    }
    for (const s of all) {
      if (s.createdAt + ttl > now) continue;
      try {
        if (await this.#options.executor.deleteSnapshot(s.snapshotId)) expired.push(s.snapshotId);
        if (this.#options.moves?.registry !== undefined) {
          await this.#options.moves.unpublish(s.snapshotId);
        }
      } catch (error) {
        this.#log("warn", "could not expire a snapshot", { snapshot: s.snapshotId, error });
      }
    }
    for (const id of (await this.#options.moves?.expireRegistry(ttl, now)) ?? []) {
      if (!expired.includes(id)) expired.push(id);
    }
    if (expired.length > 0) {
      this.#log("info", "snapshots expired", { snapshots: expired, ttlMs: ttl });
      await this.refresh();
    }
    return expired;
  }

  /**
   * The ids for the check-in (and the names of the newest named ones): the newest {@linkcode MAX_CHECK_IN_SNAPSHOTS} as of the last
   * refresh, and whether more were left out.
   */
  advertised(): { snapshots: string[]; snapshotsTruncated?: true; snapshotNames?: string[] } {
    const newest = this.#known.map((s) => s.snapshotId).reverse();
    // The operator's fleet view shows which nodes hold a template by its name, not only its id.
    const names = [
      ...new Set(
        this.#known.filter((s) => s.name).map((s) => `${s.team}/${s.name}`).reverse(),
      ),
    ].slice(0, MAX_CHECK_IN_SNAPSHOT_NAMES);
    return {
      ...(names.length > 0 ? { snapshotNames: names } : {}),
      snapshots: newest.slice(0, MAX_CHECK_IN_SNAPSHOTS),
      ...(newest.length > MAX_CHECK_IN_SNAPSHOTS ? { snapshotsTruncated: true } : {}),
    };
  }

  /**
   * Reads the executor's snapshots again for {@linkcode advertised} and {@linkcode find}; a call
   * while one read runs waits for a fresh one after it, so a take's refresh sees the take.
   */
  async refresh(): Promise<void> {
    const before = this.#refreshing ?? Promise.resolve();
    const run = before.then(async () => {
      try {
        this.#known = await this.#options.executor.listSnapshots();
      } catch (error) {
        this.#log("warn", "could not list the executor's snapshots", { error });
      }
    });
    this.#refreshing = run;
    await run;
    if (this.#refreshing === run) this.#refreshing = undefined;
  }

  /**
   * Refuses a snapshot, or a pause to disk, that would leave the data disk below the floor: the
   * sandbox's writable layer is about what either adds.
   *
   * @throws {HttpError} 507 naming the floor.
   */
  async checkDisk(id: string, what = "A snapshot"): Promise<void> {
    const floor = this.#options.minDiskBytes ?? 0;
    const disk = this.#options.hostReading?.().dataDisk;
    if (!disk || floor <= 0) return;
    const size = await this.#options.executor.stats(id).then((s) => s.diskUsedBytes, () => 0);
    if (disk.availableBytes - size >= floor) return;
    const gb = (bytes: number) => (bytes / 1e9).toFixed(1);
    throw new HttpError(
      507,
      `${what} of sandbox '${id}' (about ${gb(size)} GB) would leave the data disk ` +
        `(${disk.path}) with ${gb(Math.max(0, disk.availableBytes - size))} GB available, ` +
        `below the snapshot floor ${gb(floor)} GB (DORMICE_SNAPSHOT_MIN_DISK_GB): delete ` +
        `snapshots you no longer need (DELETE /templates/{id}) or free space on that disk`,
    );
  }
}
