/**
 * The per-name slots the two creators and destroy run in: in memory for one gateway
 * ({@linkcode LocalSlots}), or a lease-backed lock in etcd shared by every gateway of the fleet
 * ({@linkcode EtcdSlots}).
 *
 * @module
 */
import { NameQueue } from "../../shared/name_queue.ts";
import { HttpError } from "../../shared/http_error.ts";
import type { EtcdClient, EtcdKv } from "../etcd/client.ts";
import type { EtcdSession } from "../etcd/session.ts";
import { EtcdRequestError } from "../etcd/client.ts";
import { etcdHttpError, etcdRetryAfterSeconds } from "../etcd/answers.ts";
import type { RecentCreates } from "../etcd/recent.ts";

/**
 * What a task holding a name's slot knows of it: nothing for one gateway's slots; for slots
 * shared through etcd, the take's token and a check that the slot is still this take's.
 */
export interface SlotHold {
  /**
   * The take's slot token (etcd's revision of it), larger for every later take of the name:
   * sent to the nodes with the create's lookups and the create (`x-dormice-slot-token`).
   */
  readonly token: string;
  /**
   * Resolves while the slot is still this take's in etcd (so the gateway's lease is alive).
   * Given the node the create goes to, and slots that keep records of recent creates, the same
   * transaction writes the name's record naming that node (docs/lookup-digest.md).
   *
   * @throws {HttpError} 503 when the slot was lost (the lease lapsed: another gateway may be
   *   creating the name) or etcd cannot be asked.
   */
  check(nodeId?: string): Promise<void>;
}

/**
 * Where a name's create or destroy waits its turn. Tasks for one key never overlap, across
 * every gateway sharing the slots; other keys run concurrently.
 */
export interface Slots {
  /**
   * Runs `task` once it holds `key`'s slot. A `signal` that aborts while waiting gives up the
   * wait (the task never runs) with the signal's reason. Slots shared across gateways pass the
   * task its {@linkcode SlotHold}; one gateway's pass nothing.
   *
   * @throws {HttpError} 503 with Retry-After when the slot's store cannot be reached.
   */
  run<T>(key: string, task: (hold?: SlotHold) => Promise<T>, signal?: AbortSignal): Promise<T>;
  /**
   * Resolves when a create that takes no slot (unnamed) may go ahead.
   *
   * @throws {HttpError} 503 when the slots' store is unreachable.
   */
  ready(): Promise<void>;
  /** How many keys this gateway holds or waits for now (the busy-slots gauge). */
  readonly size: number;
  /** Whether this gateway holds or waits for `key` now. */
  isBusy(key: string): boolean;
}

/**
 * One gateway's slots: a {@linkcode NameQueue}, the embedded default.
 *
 * @example
 * ```ts
 * import { LocalSlots } from "./slots.ts";
 * const slots = new LocalSlots();
 * console.log(await slots.run("default/agent-1", () => Promise.resolve(1))); // 1
 * ```
 */
export class LocalSlots extends NameQueue implements Slots {
  /** Always ready: nothing outside the process is asked. */
  ready(): Promise<void> {
    return Promise.resolve();
  }
}

/** Options of {@linkcode EtcdSlots}. */
export interface EtcdSlotsOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The gateway's lease: every slot it holds is tied to it. */
  session: EtcdSession;
  /** The fleet's key prefix (`DORMICE_GATEWAY_ETCD_PREFIX`), e.g. `/dormice/`. */
  prefix: string;
  /**
   * How often a waiter asks whether the holder let go. Default 20 ms: a handoff costs at most
   * that, and each gateway has at most one waiter per name in etcd (its own queue is in memory),
   * so a busy name costs etcd one small read per gateway per 20 ms.
   */
  pollMs?: number;
  /**
   * Longest wait for a slot held by another gateway. Default 150,000 ms: a holder may keep it for
   * the node's create bound (120 s) and a dead holder's lease lapses within its TTL; past that
   * the client gets a 503 rather than an open request for ever.
   */
  waitMs?: number;
  /**
   * Where a create's node is published before the create is sent (the check of a hold given a
   * node id), so every gateway's lookup asks that node; none by default.
   */
  recent?: RecentCreates;
}

/**
 * Slots shared by every gateway through etcd: a name's slot is the key
 * `<prefix>slots/<team>/<name>`, created only when absent and tied to the gateway's lease, then
 * deleted when the task ends. A gateway killed while it holds one loses it when its lease lapses
 * (one TTL, 10 s by default), and the next holder still asks the fleet first, so whatever the
 * dead one built is found, not built again.
 *
 * A live gateway renews its lease, so a key it leaves behind would hold the name for every
 * gateway as long as it lives: the put is never tied to the client's signal, a take that failed
 * deletes the key if it holds that take's value, and a take that finds a value of its own
 * gateway's (a failed release, a put applied after its take gave up) deletes it.
 *
 * Within one gateway, callers first queue in memory, so etcd sees one waiter per gateway per
 * name (and a lease's keys never collide).
 *
 * @example
 * ```ts ignore
 * const slots = new EtcdSlots({ client, session, prefix: "/dormice/" });
 * await slots.run("default/agent-1", async () => { ... });
 * ```
 */
export class EtcdSlots implements Slots {
  readonly #local = new NameQueue();
  readonly #client: EtcdClient;
  readonly #session: EtcdSession;
  readonly #prefix: string;
  readonly #pollMs: number;
  readonly #waitMs: number;
  readonly #recent?: RecentCreates;
  /**
   * Written before every value these slots put, unique to this object: a holder with it is a
   * take of ours, which the memory queue says is over when another take of the name runs.
   */
  readonly #owner: string;

  /** Builds the slots; nothing is written until the first `run`. */
  constructor(options: EtcdSlotsOptions) {
    this.#client = options.client;
    this.#session = options.session;
    this.#prefix = options.prefix;
    this.#pollMs = options.pollMs ?? 20;
    this.#waitMs = options.waitMs ?? 150_000;
    this.#recent = options.recent;
    this.#owner = `${options.session.owner}/${crypto.randomUUID()}`;
  }

  get size(): number {
    return this.#local.size;
  }

  isBusy(key: string): boolean {
    return this.#local.isBusy(key);
  }

  async ready(): Promise<void> {
    try {
      await this.#session.lease();
    } catch (error) {
      throw etcdHttpError(error);
    }
  }

  run<T>(key: string, task: (hold?: SlotHold) => Promise<T>, signal?: AbortSignal): Promise<T> {
    return this.#local.run(key, async () => {
      const slotKey = `${this.#prefix}slots/${key}`;
      // Unique to this take, so a value found in the key is ours only when this take wrote it.
      const attempt = `${this.#owner}/${crypto.randomUUID()}`;
      let token: string;
      try {
        token = await this.#take(slotKey, attempt, signal);
      } catch (error) {
        throw etcdHttpError(error);
      }
      try {
        // A client that left while the put was on its way: the slot is given back below.
        signal?.throwIfAborted();
        return await task({
          token,
          check: (nodeId) =>
            this.#check(
              slotKey,
              attempt,
              nodeId === undefined ? undefined : {
                scopedName: key,
                nodeId,
              },
            ),
        });
      } finally {
        // A failed delete leaves the key to the lease, or to this gateway's next take of the
        // name; compared on the value so a slot that lapsed and was taken by another gateway is
        // never deleted from under it.
        await this.#client.deleteIfValue(slotKey, attempt).catch(() => {});
      }
    });
  }

  /**
   * Whether the slot is still this take's: a gateway paused or cut off past its lease has lost
   * it (etcd deleted it with the lease, and another gateway may hold it now).
   */
  async #check(
    slotKey: string,
    attempt: string,
    publish?: { scopedName: string; nodeId: string },
  ): Promise<void> {
    let holder: EtcdKv | null;
    try {
      if (publish !== undefined && this.#recent !== undefined) {
        const lost = await this.#recent.publishName(
          slotKey,
          attempt,
          publish.scopedName,
          publish.nodeId,
        );
        if (lost === null) return;
        holder = lost ?? null;
      } else {
        holder = await this.#client.get(slotKey);
      }
    } catch (error) {
      throw etcdHttpError(error);
    }
    if (holder?.value === attempt) return;
    throw new HttpError(
      503,
      `This gateway lost the name's slot in etcd before its create reached the node: its lease ` +
        `(${this.#session.ttlSeconds} s) lapsed while it was paused or cut off from etcd, and ` +
        `${holder === null ? "the slot is free" : "another gateway holds it"} now. Nothing was ` +
        "built; retry, and the retry finds whatever another gateway built",
      { headers: { "retry-after": String(etcdRetryAfterSeconds) } },
    );
  }

  /** Takes the slot; resolves with its token (the take's etcd revision). */
  async #take(slotKey: string, attempt: string, signal?: AbortSignal): Promise<string> {
    const deadline = Date.now() + this.#waitMs;
    for (;;) {
      signal?.throwIfAborted();
      const lease = await this.#session.lease();
      let holder: EtcdKv;
      try {
        // Never tied to the client's signal: a put etcd applied after the client left would
        // stay under this gateway's lease, renewed for as long as the gateway lives, and every
        // gateway's create or destroy of the name would wait for it.
        holder = await this.#client.createIfAbsent(slotKey, attempt, lease);
      } catch (error) {
        // etcd was away longer than the lease: take a new one and try again.
        if (error instanceof EtcdRequestError && error.leaseNotFound) {
          await this.#session.invalidate(lease);
          continue;
        }
        // The put may have been applied with its answer lost: given back if it holds this
        // take's value, without holding up the client's 503.
        void this.#client.deleteIfValue(slotKey, attempt).catch(() => {});
        throw error;
      }
      if (holder.value === attempt) return holder.createRevision;
      if (holder.value.startsWith(`${this.#owner}/`)) {
        // Written by a take of these slots, yet every take of this name here runs one after
        // another in the memory queue, and this one holds it: an earlier take whose put was
        // applied after it gave up, or whose release failed. Nobody works under it.
        await this.#client.deleteIfValue(slotKey, holder.value);
        continue;
      }
      if (Date.now() >= deadline) {
        throw new HttpError(
          503,
          `Another gateway has held this name's slot in etcd for more than ` +
            `${this.#waitMs / 1000} s: try again, and check that gateway's log`,
          { headers: { "retry-after": String(etcdRetryAfterSeconds) } },
        );
      }
      await new Promise((r) => setTimeout(r, this.#pollMs));
    }
  }
}
