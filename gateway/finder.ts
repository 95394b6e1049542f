/**
 * The Finder: which node holds a sandbox, by name or by id. This file holds the cache, the
 * lookup rounds (shared by concurrent callers, one deadline each) and their four outcomes;
 * asking one node over the wire is `lookup_client.ts`.
 *
 * @module
 */
import type { FleetNode, NodeDirectory } from "./fleet.ts";
import {
  EveryCallerLeft,
  type FoundSandbox,
  type LookupAnswer,
  LookupClient,
} from "./lookup_client.ts";
import { newGatewayInstanceId } from "./door.ts";
import { LruCache } from "./lru.ts";
import type { FinderMetrics } from "./metrics.ts";
import { type Clock, systemClock } from "../shared/clock.ts";
import { type Log, silentLog } from "../shared/log.ts";
import { splitTeamScopedName, teamScopedName } from "../shared/teams.ts";
import { digestProbe, idDigestKey } from "../shared/lookup_digest.ts";

export type { FoundSandbox } from "./lookup_client.ts";

/**
 * What a lookup is keyed by: the sandbox name or its id. A name key is the name within its team
 * (`teamScopedName(team, name)`: the bare name in the default team, `team/name` otherwise), since
 * two teams may each hold an `agent-1`; an id key is the bare id, which is unique fleet-wide, and
 * the answer says the sandbox's team so the caller can tell whether it may see it.
 */
export type FindBy = "name" | "id";

/** Found on exactly one node: route there. */
export interface FindOne {
  /** `"one"`: route to `node`. A round's `one` is cached by name and id (unless the node left). */
  readonly kind: "one";
  /** The node (live: its endpoint follows check-ins). */
  readonly node: FleetNode;
  /** The sandbox it reported. */
  readonly sandbox: FoundSandbox;
}

/** Found on two or more nodes: a 409 naming them. */
export interface FindConflict {
  /** `"conflict"`: answer a 409 with `message`; nothing is cached or routed. */
  readonly kind: "conflict";
  /** Every node that reported it, with what it reported. */
  readonly nodes: ReadonlyArray<{ node: FleetNode; sandbox: FoundSandbox }>;
  /** A sentence naming both nodes and what to do. */
  readonly message: string;
}

/** Every node answered and none has it: absent (a creator may place it). */
export interface FindNone {
  /** `"none"`: absent everywhere; never cached, so the next miss asks the fleet again. */
  readonly kind: "none";
}

/** Nobody who answered has it, but some nodes did not answer: a 503 with Retry-After. */
export interface FindUnsure {
  /** `"unsure"`: answer a 503 with `message`; a creator must not build the name elsewhere. */
  readonly kind: "unsure";
  /** The nodes that did not answer, each with why. */
  readonly silent: ReadonlyArray<{ node: FleetNode; cause: string }>;
  /** A sentence naming the silent nodes and what to do. */
  readonly message: string;
  /** Seconds for the 503's Retry-After. */
  readonly retryAfterSeconds: number;
}

/** The outcome of a lookup. */
export type FindResult = FindOne | FindConflict | FindNone | FindUnsure;

/** Timer functions, injectable so tests fire the deadline themselves. */
export interface FinderTimers {
  /** Like `setTimeout`: schedules `fn`, returning a handle for `clearTimeout`. */
  setTimeout(fn: () => void, ms: number): unknown;
  /** Like `clearTimeout`: the round finished before its deadline. */
  clearTimeout(handle: unknown): void;
}

/** Options for {@linkcode Finder}. */
export interface FinderOptions {
  /** The nodes to ask (a `Fleet`). */
  fleet: NodeDirectory;
  /** The fleet token, sent as `Authorization: Bearer <token>` to every node. */
  token: string;
  /**
   * One deadline for a whole lookup round, connect included. Default 2000 ms
   * (`DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS`): a healthy node answers in milliseconds, and a client
   * waits at most this long before hearing that a node is silent, where a plain connect timeout
   * would hold it 10 s for a SYN that never comes back.
   */
  timeoutMs?: number;
  /**
   * Cache entries per index (one index by name, one by id). Default 100,000: an entry is a few
   * hundred bytes, so each index stays in the tens of megabytes while covering every live
   * sandbox of a large fleet; a miss only costs one round.
   */
  cacheSize?: number;
  /** The HTTP client; the global `fetch` by default. */
  fetch?: typeof fetch;
  /** Time source for the round's duration in logs; the real clock by default. */
  clock?: Clock;
  /** Where events go; silent by default. */
  log?: Log;
  /** Timer functions for the deadline; the globals by default. */
  timers?: FinderTimers;
  /**
   * Lookups in flight to one node at once; the rest queue (first in, first out) and their wait
   * counts against the round's deadline. Default 16: a burst of 1,000 acquires over 10 nodes
   * otherwise opens about 10,000 connections at once, and the nodes spend longer than the
   * deadline accepting them, so whole rounds come back unsure (measured: 41-50% of a 1,000
   * burst failed; with 16 per node none did, at 2.5x the throughput).
   */
  maxLookupsPerNode?: number;
  /** Counts cache hits and misses and times lookup rounds (`GatewayMetrics`); none by default. */
  metrics?: FinderMetrics;
  /**
   * The gateway's id in the hop marker every lookup carries, so a lookup that comes back to the
   * gateway is refused (see `door.ts`). A fresh random id by default; `createGateway` passes its
   * own, the one its door checks.
   */
  hopMarker?: string;
  /**
   * Whether a miss may skip nodes whose check-in digest says they cannot hold the key:
   * `"off"` (the default) asks every node; `"sole-writer"` skips them, which is sound only
   * while this gateway is the one way sandboxes are created on its nodes: no other gateway
   * (shared mode), no client calling a node directly. docs/lookup-digest.md has the argument
   * and the cases where every node is asked anyway.
   */
  lookupDigests?: "off" | "sole-writer";
}

/** Why a round asked a node rather than trusting its digest (tests and the bench read it). */
export type AskReason =
  | "may-hold"
  | "no-digest"
  | "down"
  | "first-check-in"
  | "own-create";

/** Options for one call. */
export interface FindOptions {
  /**
   * The client's signal. When it aborts, this call rejects with its reason; the shared round
   * goes on for other callers and is aborted (stopping the nodes' work) once every caller left.
   */
  signal?: AbortSignal;
  /**
   * Start a new round even when one for this key is in flight (later callers may share it).
   * `confirm()` always does: a round that began before a creator entered its name's slot may
   * predate a create that an earlier holder of the slot made, and must not let it build twice.
   */
  fresh?: boolean;
}

interface Round {
  promise: Promise<FindResult>;
  /** Callers waiting that may still leave; when the last one leaves, the round is aborted. */
  leavers: number;
  /** Callers that can never leave (no signal): the round is never abandoned for them. */
  pinned: boolean;
  controller: AbortController;
}

const defaultTimers: FinderTimers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle as number),
};

/**
 * Finds the node that holds a sandbox. A bounded LRU cache answers first; on a miss one lookup
 * round asks every registered node in parallel (`POST <endpoint>/lookupSandbox`) under one
 * deadline, and the answers become one of four outcomes:
 * - `one` — exactly one node has it (cached; route there);
 * - `conflict` — two or more nodes have it (409 naming them);
 * - `none` — every node answered no (a creator may place it; never cached);
 * - `unsure` — nobody who answered has it but some node was silent (503 with Retry-After):
 *   a name that lives only on a silent node must never be built a second time.
 *
 * Down nodes are asked too. A node the Fleet calls down may still be running (the gateway just
 * restarted, or only its check-ins fail), and it may hold the name: skipping it would let a
 * creator build the name again elsewhere. If it answers, its answer counts like any other; if
 * not, it is silent and the outcome is `unsure`. The price is that a down node which swallows
 * packets makes a miss cost the full deadline, and the way out is `removeNode` — once the
 * operator says the node is gone, its sandboxes are gone with it.
 *
 * Concurrent misses for one key share one round. Hot path: `cached()` is two `Map` hits and no
 * allocation.
 *
 * @example
 * ```ts
 * import { Finder, Fleet } from "@dormice/cluster/gateway";
 * const fleet = new Fleet();
 * const finder = new Finder({ fleet, token: "a".repeat(32) });
 * const result = finder.cached("name", "agent-1") ?? await finder.find("name", "agent-1");
 * console.log(result.kind); // "none": no node has checked in
 * fleet.close();
 * ```
 */
export class Finder {
  #fleet: NodeDirectory;
  #timeoutMs: number;
  #clock: Clock;
  #log: Log;
  #timers: FinderTimers;
  #client: LookupClient;
  #byName: LruCache<string, FindOne>;
  #byId: LruCache<string, FindOne>;
  #roundsByName = new Map<string, Round>();
  #roundsById = new Map<string, Round>();
  #metrics?: FinderMetrics;
  #digests: "off" | "sole-writer";
  /**
   * node id → this gateway's creates there that the node's digest may not show yet. An entry
   * goes once its node's digest is sure to include them (two check-ins after the last one
   * ended) or the node leaves (`forgetNode`), so it never outgrows the fleet.
   */
  #ownCreates = new Map<string, { inFlight: number; cleanAt: number }>();
  #lastAsked = 0;

  /**
   * Builds a finder over `fleet`.
   *
   * @throws {RangeError} when `timeoutMs` is not positive.
   */
  constructor(options: FinderOptions) {
    const {
      fleet,
      token,
      timeoutMs = 2000,
      cacheSize = 100_000,
      fetch: fetchFn = globalThis.fetch,
      clock = systemClock,
      log = silentLog,
      timers = defaultTimers,
      maxLookupsPerNode = 16,
      hopMarker = newGatewayInstanceId(),
    } = options;
    if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      throw new RangeError(
        `Cannot create Finder as 'timeoutMs' must be a positive number: received ${timeoutMs}`,
      );
    }
    this.#fleet = fleet;
    this.#timeoutMs = timeoutMs;
    this.#clock = clock;
    this.#log = log;
    this.#timers = timers;
    this.#client = new LookupClient({ token, fetch: fetchFn, log, maxLookupsPerNode, hopMarker });
    this.#byName = new LruCache({ max: cacheSize });
    this.#byId = new LruCache({ max: cacheSize });
    this.#metrics = options.metrics;
    this.#digests = options.lookupDigests ?? "off";
  }

  /** Nodes asked by the last lookup round that started (the bench and tests read it). */
  get lastRoundAsked(): number {
    return this.#lastAsked;
  }

  /**
   * Tells the Finder a create is being sent to `nodeId`, so lookups keep asking that node until
   * its digest must show the create; call the returned function once the create ended, with
   * whether the node answered. A create the node never answered may still land there at any
   * time, so the node is asked on every miss for the rest of this process.
   *
   * @example
   * ```ts ignore
   * const ended = finder.placing(node.id);
   * try { answer = await send(node); ended(true); } catch (e) { ended(false); throw e; }
   * ```
   */
  placing(nodeId: string): (answered: boolean) => void {
    let entry = this.#ownCreates.get(nodeId);
    if (entry === undefined) this.#ownCreates.set(nodeId, entry = { inFlight: 0, cleanAt: 0 });
    entry.inFlight++;
    const own = entry;
    let ended = false;
    return (answered) => {
      if (ended) return;
      ended = true;
      own.inFlight--;
      const node = this.#fleet.get(nodeId);
      // The next check-in may have been built before the create committed; the one after was
      // built after that check-in's answer, so after the create's answer (docs/lookup-digest.md).
      const at = answered && node !== undefined ? (node.checkInsSinceStart ?? 0) + 2 : Infinity;
      own.cleanAt = Math.max(own.cleanAt, at);
    };
  }

  /**
   * Why a miss for `key` must ask `node`, or `undefined` when its digest proves it cannot hold
   * the key (only in `"sole-writer"` mode). Exported for the Finder's table tests.
   *
   * @example
   * ```ts ignore
   * finder.mustAsk(node, "name", "agent-1"); // "may-hold" | … | undefined
   * ```
   */
  mustAsk(node: FleetNode, by: FindBy, key: string): AskReason | undefined {
    return this.#mustAsk(node, digestProbe(by === "name" ? `n:${key}` : idDigestKey(key)));
  }

  #mustAsk(
    node: FleetNode,
    probe: ReturnType<typeof digestProbe>,
    now = this.#fleet.now(),
  ): AskReason | undefined {
    const digest = node.lookupDigest ?? null;
    if (digest === null) return "no-digest";
    if (digest.mayHoldProbe(probe)) return "may-hold";
    // A down node's last digest is old: whatever it did since is unknown, so it is asked, and
    // silence from it is unsure as before.
    if (this.#fleet.isDown(node, now)) return "down";
    // The first check-in to this process may predate a create the previous process sent.
    const checkIns = node.checkInsSinceStart ?? 0;
    if (checkIns < 2) return "first-check-in";
    const own = this.#ownCreates.get(node.id);
    if (own !== undefined) {
      if (own.inFlight > 0 || checkIns < own.cleanAt) return "own-create";
      this.#ownCreates.delete(node.id);
    }
    return undefined;
  }

  /** How many entries each cache index holds. */
  get cacheSize(): { name: number; id: number } {
    return { name: this.#byName.size, id: this.#byId.size };
  }

  /** How many nodes the lookup client remembers as failing (diagnostics and tests). */
  get failingNodes(): number {
    return this.#client.failingNodes;
  }

  /**
   * Lets go of a node that left the fleet (`Fleet`'s `onRemove` calls it): its cache entries
   * under both keys (one pass over the cache, fine for an operator's removeNode) and its failure
   * record. Without it the entries would only go when next hit or pushed out by the bound.
   *
   * @example
   * ```ts ignore
   * const fleet = new Fleet({ onRemove: (node) => finder.forgetNode(node.id) });
   * ```
   */
  forgetNode(nodeId: string): void {
    const ofNode = (v: FindOne) => v.node.id === nodeId;
    this.#byName.deleteWhere(ofNode);
    this.#byId.deleteWhere(ofNode);
    this.#client.forget(nodeId);
    this.#ownCreates.delete(nodeId);
  }

  /**
   * The cached answer for a key, or `undefined` (a miss, or its node was removed). A hit moves
   * the entry to the young end. The hot path: no allocation, no await.
   *
   * @example
   * ```ts ignore
   * const hit = finder.cached("name", "agent-1");
   * if (hit) forwardTo(hit.node.endpoint);
   * ```
   */
  cached(by: FindBy, key: string): FindOne | undefined {
    const hit = (by === "name" ? this.#byName : this.#byId).get(key);
    if (hit === undefined) return undefined;
    // A removed node (or one removed and joined again) is a different object: the entry is stale.
    if (this.#fleet.get(hit.node.id) !== hit.node) {
      this.#evictEntry(hit);
      return undefined;
    }
    this.#metrics?.cacheHit();
    return hit;
  }

  /**
   * The cache first, then one lookup round on a miss.
   *
   * @example
   * ```ts ignore
   * const r = await finder.find("id", sandboxId, { signal: request.signal });
   * ```
   */
  find(by: FindBy, key: string, options: FindOptions = {}): Promise<FindResult> {
    const hit = this.cached(by, key);
    if (hit !== undefined) return Promise.resolve(hit);
    return this.lookup(by, key, options);
  }

  /**
   * One lookup round, ignoring the cache (concurrent calls for one key share a round). A `one`
   * answer is cached.
   *
   * @example
   * ```ts ignore
   * const r = await finder.lookup("name", "agent-1");
   * ```
   */
  lookup(by: FindBy, key: string, options: FindOptions = {}): Promise<FindResult> {
    const { signal } = options;
    if (signal?.aborted) return Promise.reject(signal.reason);
    this.#metrics?.cacheMiss();
    const rounds = by === "name" ? this.#roundsByName : this.#roundsById;
    let round = options.fresh ? undefined : rounds.get(key);
    if (round === undefined) {
      const controller = new AbortController();
      const started = this.#round(by, key, controller);
      const created: Round = { promise: started, leavers: 0, pinned: false, controller };
      round = created;
      rounds.set(key, created);
      started.finally(() => {
        if (rounds.get(key) === created) rounds.delete(key);
      }).catch(() => {});
    }
    if (signal === undefined) {
      round.pinned = true;
      return round.promise;
    }
    return this.#waitFor(round, signal, () => {
      if (rounds.get(key) === round) rounds.delete(key);
    });
  }

  /**
   * For the creators (acquire, E2B named create): a cache hit is confirmed with its node by id
   * before anyone builds on it. Found = the sandbox exists, wake it (`one`); absent = evict and
   * ask the whole fleet; silent = `unsure` naming that node. A miss is a fresh lookup round.
   *
   * @example
   * ```ts ignore
   * const r = await finder.confirm("name", "agent-1", { signal: request.signal });
   * if (r.kind === "none") placer.place("agent-1");
   * ```
   */
  async confirm(by: FindBy, key: string, options: FindOptions = {}): Promise<FindResult> {
    const fresh = { signal: options.signal, fresh: true };
    const hit = this.cached(by, key);
    if (hit === undefined) return this.lookup(by, key, fresh);
    const answer = await this.#askOne(hit.node, hit.sandbox.id, options.signal);
    if (answer.kind === "found") return hit;
    if (answer.kind === "silent") {
      return this.#unsure(key, [{ node: hit.node, cause: answer.cause }]);
    }
    this.#evictEntry(hit);
    return this.lookup(by, key, fresh);
  }

  /**
   * After a node answered 404 for a cached entry: asks that node by id whether the sandbox is
   * still there, and evicts the entry when it is not. (A 404 can also mean a missing file inside
   * a live sandbox, so it alone does not evict.) A silent node keeps the entry: silence proves
   * nothing, and the next request will be a 502 naming the node.
   *
   * @example
   * ```ts ignore
   * if (answer.status === 404) await finder.recheck("name", "agent-1");
   * ```
   */
  async recheck(
    by: FindBy,
    key: string,
    options: FindOptions = {},
  ): Promise<"evicted" | "kept" | "uncached"> {
    const hit = (by === "name" ? this.#byName : this.#byId).peek(key);
    if (hit === undefined) return "uncached";
    if (this.#fleet.get(hit.node.id) !== hit.node) {
      this.#evictEntry(hit);
      return "evicted";
    }
    const answer = await this.#askOne(hit.node, hit.sandbox.id, options.signal);
    if (answer.kind !== "absent") return "kept";
    this.#evictEntry(hit);
    return "evicted";
  }

  /**
   * Forgets a key (and the same sandbox under its other key), e.g. after a destroy.
   *
   * @example
   * ```ts ignore
   * finder.evict("name", "agent-1");
   * ```
   */
  evict(by: FindBy, key: string): void {
    const hit = (by === "name" ? this.#byName : this.#byId).peek(key);
    if (hit !== undefined) this.#evictEntry(hit);
  }

  /**
   * Caches what a create just built on `node`, so the next request is a cache hit.
   *
   * @example
   * ```ts ignore
   * finder.remember(node, { id: body.sandbox.id, name: body.sandbox.name, state: "active" });
   * ```
   */
  remember(node: FleetNode, sandbox: FoundSandbox): FindOne {
    const one: FindOne = {
      kind: "one",
      node,
      sandbox: { id: sandbox.id, name: sandbox.name, state: sandbox.state, team: sandbox.team },
    };
    const nameKey = teamScopedName(sandbox.team, sandbox.name);
    // A name rebuilt under a new id: the old id must not keep routing to the old sandbox.
    const before = this.#byName.peek(nameKey);
    if (before !== undefined && before.sandbox.id !== sandbox.id) this.#evictEntry(before);
    this.#byName.set(nameKey, one);
    this.#byId.set(sandbox.id, one);
    return one;
  }

  /**
   * The sandboxes the cache places on `nodeId` (a walk of the id index, so call it rarely: the
   * lifecycle events name a lost node's sandboxes with it).
   *
   * @example
   * ```ts ignore
   * for (const one of finder.cachedOn("node-a")) console.log(one.sandbox.id);
   * ```
   */
  cachedOn(nodeId: string): FindOne[] {
    const out: FindOne[] = [];
    for (const id of this.#byId.keys()) {
      const entry = this.#byId.peek(id);
      if (entry !== undefined && entry.node.id === nodeId) out.push(entry);
    }
    return out;
  }

  #evictEntry(hit: FindOne): void {
    const same = (v: FindOne) => v.node.id === hit.node.id && v.sandbox.id === hit.sandbox.id;
    this.#byName.evictIf(teamScopedName(hit.sandbox.team, hit.sandbox.name), same);
    this.#byId.evictIf(hit.sandbox.id, same);
  }

  #waitFor(round: Round, signal: AbortSignal, forget: () => void): Promise<FindResult> {
    round.leavers++;
    return new Promise<FindResult>((resolve, reject) => {
      let done = false;
      const onAbort = () => {
        if (done) return;
        done = true;
        round.leavers--;
        if (round.leavers === 0 && !round.pinned) {
          // Nobody wants this answer any more: stop the nodes' work, and let the next caller
          // start a fresh round instead of joining an aborted one.
          forget();
          round.controller.abort(new EveryCallerLeft());
        }
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      round.promise.then((result) => {
        if (done) return;
        done = true;
        signal.removeEventListener("abort", onAbort);
        resolve(result);
      }, (error) => {
        if (done) return;
        done = true;
        signal.removeEventListener("abort", onAbort);
        reject(error);
      });
    });
  }

  async #decide(
    by: FindBy,
    key: string,
    controller: AbortController,
    nodes: FleetNode[],
    fleetSize: number,
  ): Promise<FindResult> {
    const started = this.#clock.now();
    // Failure records of nodes that left without forgetNode (an embedder's own directory).
    if (this.#client.failingNodes > fleetSize) {
      this.#client.retainOnly((id) => this.#fleet.get(id) !== undefined);
    }
    if (nodes.length === 0) return { kind: "none" };
    // A name is asked within its team; an id is asked of every team, and the answer names it.
    const scoped = by === "name" ? splitTeamScopedName(key) : undefined;
    const body = JSON.stringify(scoped ? { name: scoped.name } : { id: key });
    const timer = this.#timers.setTimeout(
      () => controller.abort(timeoutError(this.#timeoutMs)),
      this.#timeoutMs,
    );
    let answers: LookupAnswer[];
    try {
      answers = await Promise.all(
        nodes.map((node) => this.#client.ask(node, body, controller.signal, scoped?.team)),
      );
    } finally {
      this.#timers.clearTimeout(timer);
    }
    const found: { node: FleetNode; sandbox: FoundSandbox }[] = [];
    const silent: { node: FleetNode; cause: string }[] = [];
    for (let i = 0; i < nodes.length; i++) {
      const a = answers[i];
      if (a.kind === "found") found.push({ node: nodes[i], sandbox: a.sandbox });
      else if (a.kind === "silent") silent.push({ node: nodes[i], cause: a.cause });
    }
    this.#log("debug", "lookup round", {
      by,
      key,
      nodes: nodes.length,
      found: found.length,
      silent: silent.length,
      ms: this.#clock.now() - started,
    });
    if (found.length === 1) {
      // A removed node's answer must not be cached: the next cached() would drop it anyway.
      if (this.#fleet.get(found[0].node.id) === found[0].node) {
        return this.remember(found[0].node, found[0].sandbox);
      }
      return { kind: "one", node: found[0].node, sandbox: found[0].sandbox };
    }
    if (found.length > 1) return this.#conflict(by, key, found);
    if (silent.length > 0) return this.#unsure(key, silent);
    return { kind: "none" };
  }

  /** `#decide` timed: the round's outcome, duration and fan-out go to the metrics. */
  async #round(by: FindBy, key: string, controller: AbortController): Promise<FindResult> {
    const started = performance.now();
    const all = [...this.#fleet.nodes()];
    let nodes = all;
    if (this.#digests === "sole-writer") {
      const probe = digestProbe(by === "name" ? `n:${key}` : idDigestKey(key));
      const now = this.#fleet.now();
      nodes = all.filter((node) => this.#mustAsk(node, probe, now) !== undefined);
      // Entries whose node left without forgetNode (an embedder's own directory).
      if (this.#ownCreates.size > all.length) {
        for (const id of [...this.#ownCreates.keys()]) {
          if (this.#fleet.get(id) === undefined) this.#ownCreates.delete(id);
        }
      }
    }
    this.#lastAsked = nodes.length;
    const result = await this.#decide(by, key, controller, nodes, all.length);
    this.#metrics?.lookupRound(result.kind, (performance.now() - started) / 1000, nodes.length);
    return result;
  }

  #conflict(
    by: FindBy,
    key: string,
    found: { node: FleetNode; sandbox: FoundSandbox }[],
  ): FindConflict {
    const named = found.map(({ node, sandbox }) =>
      `'${node.id}' (${node.endpoint}, sandbox id ${sandbox.id})`
    ).join(" and ");
    const byEndpoint = new Map<string, FleetNode[]>();
    for (const { node } of found) {
      const list = byEndpoint.get(node.endpoint) ?? [];
      list.push(node);
      byEndpoint.set(node.endpoint, list);
    }
    const shared = [...byEndpoint.values()].find((list) => list.length > 1);
    let message: string;
    if (shared !== undefined) {
      // Two ids at one endpoint are one daemon answering twice, not two copies of the sandbox.
      const now = this.#fleet.now();
      const endpoint = shared[0].endpoint;
      const stale = shared.filter((n) => this.#fleet.isDown(n, now)).map((n) => `'${n.id}'`);
      const whoAnswers = `GET ${endpoint}/healthz names the id that really runs there`;
      message = `Sandbox ${by} '${key}' is reported by ${named}, which share the endpoint ` +
        `${endpoint}: one daemon answers for several node ids. ` +
        (stale.length > 0
          ? `Remove the id that no longer checks in (${stale.join(", ")}) with removeNode; if ` +
            `that node does still run elsewhere, its DORMICE_NODE_ENDPOINT names the wrong ` +
            `machine: correct it (${whoAnswers})`
          // Both check in, so neither will ever show down: waiting for one to do so is no remedy.
          : `Every one of them still checks in, so all but one name a machine they do not run ` +
            `on: correct the DORMICE_NODE_ENDPOINT of the others (${whoAnswers}); the gateway ` +
            `takes a corrected endpoint one check-in interval after the wrong one stops`);
    } else {
      message = `Sandbox ${by} '${key}' exists on ${found.length} nodes: ${named}. ` +
        `Destroy the copy you do not want by calling destroySandbox on that node directly`;
    }
    this.#log("warn", "sandbox found on several nodes", {
      by,
      key,
      nodeIds: found.map((f) => f.node.id),
    });
    return { kind: "conflict", nodes: found, message };
  }

  #unsure(key: string, silent: { node: FleetNode; cause: string }[]): FindUnsure {
    let interval = Infinity;
    for (const s of silent) interval = Math.min(interval, s.node.intervalSeconds);
    const names = silent.slice(0, 10).map((s) => `'${s.node.id}' (${s.node.endpoint}: ${s.cause})`)
      .join(", ");
    const more = silent.length > 10 ? ` and ${silent.length - 10} more` : "";
    return {
      kind: "unsure",
      silent,
      message: `Cannot tell whether '${key}' exists: ${names}${more} did not answer, and it may ` +
        `live there. Retry shortly; if a node is gone for good, stop it and remove it with ` +
        `removeNode once it is down`,
      // Within one check-in interval the fleet knows whether the silent node is back.
      retryAfterSeconds: Math.min(60, Math.max(1, Math.ceil(interval))),
    };
  }

  /** Asks one node by id under its own deadline (the creators' confirm and the 404 re-check). */
  async #askOne(node: FleetNode, id: string, signal?: AbortSignal): Promise<LookupAnswer> {
    const controller = new AbortController();
    const timer = this.#timers.setTimeout(
      () => controller.abort(timeoutError(this.#timeoutMs)),
      this.#timeoutMs,
    );
    const onAbort = () => controller.abort(signal!.reason);
    if (signal?.aborted) onAbort();
    else signal?.addEventListener("abort", onAbort, { once: true });
    let answer: LookupAnswer;
    try {
      answer = await this.#client.ask(node, JSON.stringify({ id }), controller.signal);
    } finally {
      this.#timers.clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
    // The caller left: its own signal's reason is what it should see, not "silent".
    if (signal?.aborted) throw signal.reason;
    return answer;
  }
}

function timeoutError(ms: number): DOMException {
  return new DOMException(`No answer within ${ms} ms`, "TimeoutError");
}
