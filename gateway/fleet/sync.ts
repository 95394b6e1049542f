/**
 * Shared mode's Fleet: every check-in a gateway accepts is written to etcd, and every gateway
 * reads the whole node table back every second, so one check-in with any gateway makes the node
 * known to all of them, and "down" is judged on the same last check-in time everywhere.
 *
 * @module
 */
import type { CheckIn } from "../../shared/schemas.ts";
import { ChangeLog, type Log, silentLog } from "../../shared/log.ts";
import { type EtcdClient, jsonValues } from "../etcd/client.ts";
import type { Fleet } from "./fleet.ts";
import { Poller } from "../etcd/poller.ts";

/** What one node's key in etcd holds. */
interface NodeRecord {
  /** The check-in as the accepting gateway validated it (events stripped: they were handled). */
  checkIn: CheckIn;
  /** When that gateway accepted it (ms since the epoch). */
  at: number;
}

/** Options of {@linkcode FleetSync}. */
export interface FleetSyncOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The fleet's key prefix, e.g. `/dormice/`; node records live under `<prefix>nodes/`. */
  prefix: string;
  /** This gateway's Fleet, which the records are applied to. */
  fleet: Fleet;
  /**
   * How often the node table is read back. Default 1000 ms: a node that checked in elsewhere is
   * placeable here within a second, and a thousand-node table is one small range read.
   */
  pollMs?: number;
  /** Where etcd's outages and recoveries go (once per change). */
  log?: Log;
}

/**
 * Keeps a Fleet in step with etcd. `written(body, at)` (the Fleet's `onCheckIn`) queues the
 * record; writes that fail while etcd is away are kept (the latest per node, so the queue is
 * bounded by the fleet's size) and written when it returns. `removed(id)` (the Fleet's
 * `onRemove`) deletes the record, and a node whose record is gone is forgotten here too. The
 * Fleet is told when the last whole read began (`Fleet.replicaAsOf`), so no node is judged
 * silent or down here because a read is slow or etcd is away.
 *
 * @example
 * ```ts ignore
 * const sync = new FleetSync({ client, prefix: "/dormice/", fleet });
 * sync.start();
 * await sync.stop();
 * ```
 */
export class FleetSync {
  readonly #client: EtcdClient;
  readonly #prefix: string;
  readonly #fleet: Fleet;
  readonly #changes: ChangeLog;
  /** Records not yet in etcd, one per node: the latest replaces an older one. */
  readonly #pending = new Map<string, NodeRecord>();
  /** Removals not yet in etcd. */
  readonly #removals = new Set<string>();
  readonly #poller: Poller;

  /** Builds the sync; nothing is read or written until `start()` or `syncOnce()`. */
  constructor(options: FleetSyncOptions) {
    this.#client = options.client;
    this.#prefix = `${options.prefix}nodes/`;
    this.#fleet = options.fleet;
    this.#poller = new Poller(() => this.syncOnce(), options.pollMs ?? 1000);
    this.#changes = new ChangeLog(options.log ?? silentLog);
    // Until the first read, what other gateways heard is unknown here, not absent.
    this.#fleet.replicaAsOf(this.#fleet.now());
  }

  /** Queues a check-in this gateway accepted and writes it now. */
  written(body: CheckIn, at: number): void {
    const { events: _events, ...checkIn } = body as CheckIn & { events?: unknown };
    this.#removals.delete(body.nodeId);
    this.#pending.set(body.nodeId, { checkIn: checkIn as CheckIn, at });
    void this.#flushOne(body.nodeId);
  }

  /** Queues the removal of a node's record and deletes it now. */
  removed(id: string): void {
    this.#pending.delete(id);
    this.#removals.add(id);
    void this.#client.delete(this.#prefix + id).then(
      () => this.#removals.delete(id),
      () => {},
    );
  }

  /** Reads etcd now and every `pollMs` after, until `stop()`. */
  start(): void {
    this.#poller.start();
  }

  /** Stops reading; a write in flight ends on its own bound. */
  stop(): Promise<void> {
    return this.#poller.stop();
  }

  /**
   * Writes what is pending, then applies etcd's node table to the Fleet. Never rejects: an
   * unreachable etcd is logged once per change, and the Fleet keeps what it knows.
   */
  async syncOnce(): Promise<void> {
    try {
      for (const id of [...this.#removals]) {
        await this.#client.delete(this.#prefix + id);
        this.#removals.delete(id);
      }
      for (const id of [...this.#pending.keys()]) await this.#flushOne(id, true);
      const asked = this.#fleet.now();
      const kvs = await this.#client.range(this.#prefix);
      const seen = new Set<string>();
      for (const record of jsonValues(kvs) as NodeRecord[]) {
        const id = record?.checkIn?.nodeId;
        if (typeof id !== "string" || typeof record.at !== "number") continue;
        seen.add(id);
        const known = this.#fleet.get(id);
        if (known !== undefined && known.lastCheckIn >= record.at) continue;
        try {
          this.#fleet.checkIn(record.checkIn, { at: record.at, replicated: true });
        } catch {
          /* a record this Fleet cannot apply stays as it is; the next check-in fixes it */
        }
      }
      for (const node of [...this.#fleet.nodes()]) {
        // A node heard here after the read began may not be in etcd yet; anything older whose
        // record is gone was removed by another gateway.
        if (seen.has(node.id) || this.#pending.has(node.id) || node.lastCheckIn >= asked) continue;
        this.#fleet.forgetRemoved(node.id);
      }
      this.#fleet.replicaAsOf(asked);
      this.#changes.report("etcd", "ok", "info", "the node table is in step with etcd", {
        nodes: kvs.length,
      });
    } catch (error) {
      this.#changes.report(
        "etcd",
        "failing",
        "error",
        "cannot read or write the node table in etcd: check-ins are accepted and written when it returns",
        { error: (error as Error)?.message ?? String(error), pending: this.#pending.size },
      );
    }
  }

  async #flushOne(id: string, rethrow = false): Promise<void> {
    const record = this.#pending.get(id);
    if (record === undefined) return;
    try {
      await this.#client.put(this.#prefix + id, JSON.stringify(record));
      // A newer check-in queued meanwhile stays pending for its own write.
      if (this.#pending.get(id) === record) this.#pending.delete(id);
    } catch (error) {
      if (rethrow) throw error;
    }
  }
}
