/**
 * Stale copies of a volume: a node that holds a volume the table records on another node. A move
 * leaves one when its target dies after taking the image but before the gateway records it there
 * (the target mounts the whole copy again as it starts, and the table still names the source), or
 * when the source is down as the move deletes its old copy. Nothing else ever removes such a copy:
 * it holds the node's disk and a loop device, and is advertised in its check-ins.
 *
 * Each pass compares the up nodes' check-ins (`volumes`: the ids each holds) with the table. A
 * copy on a node the table does not name is dropped (the node's `destroyVolume`) only when all of
 * these hold, so the only copy, or one a move is making, is never deleted:
 *
 * - it was seen at the previous pass too (a move that just finished has its target advertise the
 *   volume within a check-in; a pass apart, every step in flight has settled or is claimed);
 * - the volume's row is `ready` and not on a shared root, and is claimed for the drop (as a move
 *   or delete claims it, so none can start meanwhile), and after the claim still names another node;
 * - both endpoints answer, asked right then, as the node they are listed for (`/volumeUsers`
 *   names its node), the copy's that it still holds it, the recorded node's that it holds it too,
 *   and the two name different volume roots (two nodes over one root hold one copy).
 *
 * Otherwise the copy is kept and logged once with why and the command that drops it by hand: a
 * volume no row names (the gateway's database was lost or restored, or the volume was deleted while
 * its node was out of the fleet), or whose recorded node is down or lacks it (then this copy may
 * be the only one).
 *
 * @module
 */
import { VOLUME_ID } from "../../shared/volumes.ts";
import type { Fleet } from "../fleet/fleet.ts";
import type { FleetNode } from "../fleet/node.ts";
import type { Log } from "../../shared/log.ts";
import type { VolumeRow, VolumeStore } from "./table.ts";

/**
 * What a pass uses of the gateway's volumes (`fleet_volumes.ts`, whose `FleetVolumes` is one):
 * named here so this file does not import them, as they hold a `VolumeReconciler` themselves.
 */
export interface ReconcileVolumes {
  /** The table of who owns each volume and where it lives. */
  readonly table: VolumeStore;
  /** A node call whose whole answer is read. */
  call(
    node: FleetNode,
    path: string,
    body: unknown,
    signal?: AbortSignal,
  ): Promise<{ status: number; text: string; json: Record<string, unknown> }>;
}

/** How often a pass runs (the gateway's sweep asks; see {@linkcode VolumeReconciler.tick}). */
export const RECONCILE_INTERVAL_MS = 60_000;

/** The most copies one pass drops (the rest wait for the next pass). */
const MAX_DROPS_PER_PASS = 16;

/**
 * The most copies one pass checks with their nodes (a claim and two node requests each); the rest,
 * those checked longest ago first, wait for the next pass. A fleet of thousands of nodes holding
 * copies that stay kept (a restored database) costs at most this many checks a minute.
 */
const MAX_CHECKS_PER_PASS = 64;

/** How long one node request of a check may take (a slow node is asked again next pass). */
const CHECK_CALL_TIMEOUT_MS = 10_000;

/** The most stale copies remembered between passes (every map has a bound). */
const MAX_TRACKED = 10_000;

/** One stale copy: the volume, the node holding it, where the table records it. */
export interface StaleCopy {
  volume: string;
  node: string;
  /** The node the table names; absent when no row names the volume. */
  recordedOn?: string;
}

/** What one pass found and did. */
export interface ReconcileReport {
  /** Copies dropped from the node holding them. */
  dropped: StaleCopy[];
  /** Copies kept, each with why. */
  kept: (StaleCopy & { why: string })[];
}

/** Finds and drops stale copies (see the module doc). */
export class VolumeReconciler {
  readonly #volumes: ReconcileVolumes;
  readonly #fleet: Fleet;
  readonly #log: Log;
  /** `node/volume` of the copies seen at the last pass. */
  #seen = new Set<string>();
  /** Those already logged as kept (pruned to the copies still seen). */
  #reported = new Set<string>();
  /** When each copy still seen was last checked (the pass's number), for the order of checks. */
  #checked = new Map<string, number>();
  #passes = 0;
  #last = -Infinity;
  #running: Promise<unknown> | undefined;

  constructor(volumes: ReconcileVolumes, fleet: Fleet, log: Log) {
    this.#volumes = volumes;
    this.#fleet = fleet;
    this.#log = log;
  }

  /**
   * Starts a pass when {@linkcode RECONCILE_INTERVAL_MS} passed since the last and none runs. A
   * clock that went back (the host's time set) counts as the interval passed, so the passes go on.
   */
  tick(now: number): void {
    const since = now - this.#last;
    if (this.#running !== undefined || (since >= 0 && since < RECONCILE_INTERVAL_MS)) return;
    this.#last = now;
    this.#running = this.pass().catch((error) => {
      this.#log("warn", "a pass over stale volume copies failed; the next one tries again", {
        error: (error as Error).message,
      });
    }).finally(() => this.#running = undefined);
  }

  /** One pass: compares the up nodes' check-ins with the table, drops what is safe to drop. */
  async pass(): Promise<ReconcileReport> {
    const fleet = this.#fleet;
    const up = [...fleet.nodes()].filter((n) => !fleet.isDown(n));
    const held = up.flatMap((n) =>
      n.volumes.filter((id) => VOLUME_ID.test(id)).map((id) => ({ node: n, id }))
    );
    const report: ReconcileReport = { dropped: [], kept: [] };
    if (held.length === 0) {
      this.#seen.clear();
      this.#reported.clear();
      return report;
    }
    const rows = new Map((await this.#volumes.table.list()).map((r) => [r.id, r]));
    const seen = new Set<string>();
    const candidates: { node: FleetNode; id: string; row: VolumeRow | undefined; key: string }[] =
      [];
    for (const { node, id } of held) {
      const row = rows.get(id);
      if (row !== undefined && (row.shared || row.node === node.id || row.state !== "ready")) {
        continue;
      }
      const key = `${node.id}/${id}`;
      if (seen.size < MAX_TRACKED) seen.add(key);
      // Seen once: a step in flight may still settle it.
      if (this.#seen.has(key)) candidates.push({ node, id, row, key });
    }
    // Those checked longest ago first, so copies kept pass after pass do not starve the rest.
    const order = (key: string) => this.#checked.get(key) ?? -1;
    candidates.sort((a, b) => order(a.key) - order(b.key));
    this.#passes++;
    let checks = 0;
    for (const { node, id, row, key } of candidates) {
      const copy: StaleCopy = { volume: id, node: node.id, recordedOn: row?.node };
      let why: string | null | undefined;
      if (row === undefined) {
        why = "no volume row names it (the gateway's database was lost or restored, or the " +
          "volume was deleted while its node was out of the fleet)";
      } else if (report.dropped.length < MAX_DROPS_PER_PASS && checks < MAX_CHECKS_PER_PASS) {
        checks++;
        this.#checked.set(key, this.#passes);
        why = await this.#drop(copy).catch((error: Error) =>
          `asking the nodes failed: ${error.message.slice(0, 300)}`
        );
      }
      if (why === null) {
        report.dropped.push(copy);
        this.#log(
          "warn",
          "a stale copy of a volume was dropped from a node the table does not name",
          {
            volume: id,
            nodeId: node.id,
            recordedOn: row?.node,
          },
        );
      } else if (why !== undefined) {
        report.kept.push({ ...copy, why });
        if (!this.#reported.has(key)) {
          this.#log(
            "warn",
            "a node holds a copy of a volume the table does not place there: kept",
            {
              volume: id,
              nodeId: node.id,
              recordedOn: row?.node ?? null,
              why,
              fix:
                `once no other copy is wanted, drop it: curl -X POST ${node.endpoint}/destroyVolume ` +
                `-H "Authorization: Bearer $DORMICE_API_TOKEN" -d '{"id":"${id}"}'`,
            },
          );
        }
      }
    }
    this.#seen = seen;
    for (const key of this.#checked.keys()) if (!seen.has(key)) this.#checked.delete(key);
    // Logged once while the copy stays seen, kept or waiting its turn.
    for (const k of report.kept) this.#reported.add(`${k.node}/${k.volume}`);
    for (const key of this.#reported) if (!seen.has(key)) this.#reported.delete(key);
    return report;
  }

  /** Drops one copy under the row's claim: `null` when dropped, else why it was kept. */
  async #drop(copy: StaleCopy): Promise<string | null> {
    const volumes = this.#volumes;
    const table = volumes.table;
    const bound = () => AbortSignal.timeout(CHECK_CALL_TIMEOUT_MS);
    const recorded = this.#fleet.get(copy.recordedOn!);
    if (recorded === undefined || this.#fleet.isDown(recorded)) {
      return `the node the table records it on ('${copy.recordedOn}') is down or gone: this ` +
        "copy may be the only one";
    }
    const holder = this.#fleet.get(copy.node);
    if (holder === undefined) return "its node left the fleet";
    const claim = await table.claim(copy.volume, "moving");
    if (claim === undefined) {
      return "the volume is busy (a move, delete or mount)";
    }
    try {
      const row = await table.get(copy.volume);
      if (
        row === undefined || row.node !== recorded.id || row.node === copy.node || row.shared
      ) {
        return "the table changed during the pass";
      }
      // Each endpoint must answer as the node it is listed for: two check-ins can name one
      // endpoint (a node restarted under a new id, or a check-in that is not the node's), and a
      // drop sent there would delete the recorded node's own copy.
      const here = await volumes.call(holder, "/volumeUsers", { id: copy.volume }, bound());
      if (here.status !== 200 || here.json.node !== holder.id) {
        return notItself(holder, here);
      }
      if (here.json.present !== true) return `node '${holder.id}' no longer holds it`;
      const there = await volumes.call(recorded, "/volumeUsers", { id: copy.volume }, bound());
      if (there.status !== 200 || there.json.node !== recorded.id) {
        return notItself(recorded, there);
      }
      if (there.json.present !== true) {
        return `the node the table records it on ('${recorded.id}') does not hold it now: this ` +
          "copy may be the only one";
      }
      // Two nodes over one volume root (one data dir or network mount, not set as shared) both
      // hold the one copy: a drop on either deletes it.
      const root = here.json.root;
      if (typeof root !== "string" || root === "" || root === there.json.root) {
        return typeof root === "string" && root !== ""
          ? `nodes '${holder.id}' and '${recorded.id}' keep their volumes in one place (volume ` +
            `root id ${root.slice(0, 64)}): this copy is the recorded one; give each node its ` +
            "own DORMICE_DATA_DIR, or set DORMICE_VOLUME_ROOT for a shared root"
          : `node '${holder.id}' does not name its volume root, so it may be the recorded ` +
            "node's: nothing is dropped there";
      }
      const gone = await volumes.call(holder, "/destroyVolume", { id: copy.volume }, bound());
      if (gone.status !== 200) {
        return `node '${holder.id}' refused the drop: ${
          String(gone.json.message ?? gone.text).slice(0, 200)
        }`;
      }
      return null;
    } finally {
      // Compared on the claim: one lost meanwhile is its new holder's to release.
      await table.release(claim).catch(() => {});
    }
  }
}

/** Why a node's answer does not prove its endpoint is that node. */
function notItself(
  node: FleetNode,
  answer: { status: number; text: string; json: Record<string, unknown> },
): string {
  if (answer.status !== 200) {
    return `node '${node.id}' answered ${answer.status} to /volumeUsers: ${
      String(answer.json.message ?? answer.text).slice(0, 200)
    }`;
  }
  return `the endpoint of node '${node.id}' (${node.endpoint}) answers as ${
    JSON.stringify(answer.json.node ?? null)
  }: two check-ins may name one node (one restarted under a new id, or a check-in that is not ` +
    "the node's), or the node is too old to name itself; nothing is dropped there";
}
