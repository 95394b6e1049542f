/**
 * `gateway/finder/` owns the answer to "which node holds this sandbox", by name or by id. This
 * file, the Finder, holds the order of the rules: the cache first, then one lookup round under
 * one deadline, its answers judged into an outcome, and the creators' confirm and the 404
 * re-check. The pieces it orders have their own files: the cache (`cache.ts`), the outcomes and
 * their sentences (`outcomes.ts`), rounds shared by concurrent callers (`rounds.ts`), the nodes a
 * round may skip by their digests (`digests.ts`), the nodes shared mode's records add
 * (`recorded.ts`), the ask to one node (`lookup_client.ts`), the per-node cap on asks in flight
 * (`node_limit.ts`) and what an embedder passes in (`options.ts`).
 *
 * @module
 */
import { asFetch } from "../../shared/fetch_handler.ts";
import type { FleetNode, NodeDirectory } from "../fleet/fleet.ts";
import {
  type FoundSandbox,
  type LookupAnswer,
  LookupClient,
  timeoutError,
} from "./lookup_client.ts";
import { newGatewayInstanceId } from "../door.ts";
import { SharedRounds } from "./rounds.ts";
import { boundedFanOut, workerSignals } from "./fan_out.ts";
import { RoundWidth } from "./round_width.ts";
import { FoundCache } from "./cache.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import {
  defaultTimers,
  type FinderMetrics,
  type FinderOptions,
  type FinderTimers,
  type FindOptions,
  type LookupDigestMode,
  type RecentLookup,
} from "./options.ts";
import { askRecorded, type MoreNodes, recordedNodes } from "./recorded.ts";
import { splitTeamScopedName } from "../../shared/teams.ts";
import { DigestSkips } from "./digests.ts";
import { registerProbes } from "./_probes.ts";
import {
  conflictOf,
  type FindBy,
  type FindOne,
  type FindResult,
  NOT_ASKED_CAUSE,
  unsureOf,
} from "./outcomes.ts";

export type { FoundSandbox } from "./lookup_client.ts";
export type { AskReason } from "./digests.ts";
export type {
  FindBy,
  FindConflict,
  FindNone,
  FindOne,
  FindResult,
  FindUnsure,
} from "./outcomes.ts";
export type {
  FinderMetrics,
  FinderOptions,
  FinderTimers,
  FindOptions,
  LookupDigestMode,
  RecentLookup,
} from "./options.ts";

/**
 * Finds the node that holds a sandbox. A bounded LRU cache answers first; on a miss one lookup
 * round asks every registered node (`POST <endpoint>/lookupSandbox`), `lookupConcurrency` at a
 * time, under one deadline, and the answers become one of four outcomes:
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
 * packets makes a miss cost the full deadline, until the Fleet declares it dead (`isDead`, after
 * `DORMICE_GATEWAY_NODE_DEAD_AFTER_S`) or the operator runs `removeNode`: either way its
 * sandboxes are gone with it, it is not asked, and its names are free. With lookup digests, a
 * down node is judged by its last digest like any other, so its silence blocks only the names
 * that digest may hold (docs/lookup-digest.md).
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
  #cache: FoundCache;
  #rounds = new SharedRounds();
  #metrics?: FinderMetrics;
  #digests: LookupDigestMode;
  /** Which nodes a miss may skip by their digests (`digests.ts`). */
  #skips: DigestSkips;
  #lastAsked = 0;
  /** How many nodes a round asks at once (`round_width.ts`). */
  #width: RoundWidth;
  #recent?: RecentLookup;

  /**
   * Builds a finder over `fleet`.
   *
   * @throws {RangeError} when `timeoutMs` is not positive or `lookupConcurrency` not a positive
   *   integer.
   */
  constructor(options: FinderOptions) {
    const {
      fleet,
      token,
      timeoutMs = 2000,
      cacheSize = 100_000,
      fetch: fetchOption = globalThis.fetch,
      clock = systemClock,
      log = silentLog,
      timers = defaultTimers,
      maxLookupsPerNode = 16,
      lookupConcurrency = 128,
      lookupConcurrencyMax = Math.max(1024, lookupConcurrency),
      hopMarker = newGatewayInstanceId(),
    } = options;
    if (!(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      throw new RangeError(
        `Cannot create Finder as 'timeoutMs' must be a positive number: received ${timeoutMs}`,
      );
    }
    if (!Number.isInteger(lookupConcurrency) || lookupConcurrency < 1) {
      throw new RangeError(
        `Cannot create Finder as 'lookupConcurrency' must be a positive integer: received ${lookupConcurrency}`,
      );
    }
    if (!Number.isInteger(lookupConcurrencyMax) || lookupConcurrencyMax < lookupConcurrency) {
      throw new RangeError(
        `Cannot create Finder as 'lookupConcurrencyMax' must be an integer of at least 'lookupConcurrency' (${lookupConcurrency}): received ${lookupConcurrencyMax}`,
      );
    }
    this.#width = new RoundWidth({
      floor: lookupConcurrency,
      ceiling: lookupConcurrencyMax,
      // Latencies of a few ms: a finer clock than Date.now unless one is injected.
      clock: options.clock ?? { now: () => performance.now() },
    });
    this.#fleet = fleet;
    this.#timeoutMs = timeoutMs;
    this.#clock = clock;
    this.#log = log;
    this.#timers = timers;
    this.#client = new LookupClient({
      token,
      fetch: asFetch(fetchOption),
      log,
      maxLookupsPerNode,
      hopMarker,
    });
    this.#cache = new FoundCache(cacheSize);
    this.#metrics = options.metrics;
    this.#digests = options.lookupDigests ?? "off";
    this.#recent = options.recent;
    this.#skips = new DigestSkips(fleet, this.#digests === "on", options.recent?.trustMs);
    registerProbes(this, {
      mustAsk: (node, by, key) => this.#skips.mustAsk(node, by, key),
      lastRoundAsked: () => this.#lastAsked,
    });
  }

  /** The lookup digest mode in force (a node's check-in answer names it). */
  get digestMode(): LookupDigestMode {
    return this.#digests;
  }

  /**
   * Tells the Finder a create is being sent to `nodeId`, so lookups keep asking that node until
   * its digest must show the create; call the returned function once the create ended, with
   * whether the node answered (see {@linkcode DigestSkips.placing}).
   *
   * @example
   * ```ts ignore
   * const ended = finder.placing(node.id);
   * try { answer = await send(node); ended(true); } catch (e) { ended(false); throw e; }
   * ```
   */
  placing(nodeId: string): (answered: boolean) => void {
    return this.#skips.placing(nodeId);
  }

  /** How many entries each cache index holds. */
  get cacheSize(): { name: number; id: number } {
    return this.#cache.size;
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
    this.#cache.forgetNode(nodeId);
    this.#client.forget(nodeId);
    this.#skips.forget(nodeId);
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
    const hit = this.#cache.get(by, key);
    if (hit === undefined) return undefined;
    // A removed node (or one removed and joined again) is a different object: the entry is stale.
    // A dead node's sandboxes are taken as gone with it (`Fleet.isDead`).
    if (this.#fleet.get(hit.node.id) !== hit.node || this.#fleet.isDead?.(hit.node)) {
      this.#cache.evict(hit);
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
    return this.#rounds.join(
      by,
      key,
      options,
      (controller) => this.#round(by, key, controller, options.slotToken),
    );
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
    const fresh = { signal: options.signal, fresh: true, slotToken: options.slotToken };
    const hit = this.cached(by, key);
    if (hit === undefined) return this.lookup(by, key, fresh);
    const answer = await this.#askOne(hit.node, hit.sandbox.id, options.signal);
    if (answer.kind === "found") return hit;
    if (answer.kind === "silent") {
      return unsureOf(key, [{ node: hit.node, cause: answer.cause }]);
    }
    this.#cache.evict(hit);
    return this.lookup(by, key, fresh);
  }

  /**
   * After a node answered 404 for a cached entry: asks that node by id whether the sandbox is
   * still there, and evicts the entry when it is not. (A 404 can also mean a missing file inside
   * a live sandbox, so it alone does not evict.) A silent node keeps the entry: silence proves
   * nothing, and the next request will be a 502 naming the node.
   *
   * `entry` is the entry the request went by. When the cache no longer holds it (several
   * requests met the same stale entry: the first one's re-check evicted it, and its lookup may
   * have cached the name's new place already), the answer is `"evicted"` at once: this request
   * went by a stale entry just as the first did, and must not take the new entry for its own.
   *
   * @example
   * ```ts ignore
   * if (answer.status === 404) await finder.recheck("name", "agent-1", { entry: found });
   * ```
   */
  async recheck(
    by: FindBy,
    key: string,
    options: FindOptions & { entry?: FindOne } = {},
  ): Promise<"evicted" | "kept" | "uncached"> {
    const hit = this.#cache.peek(by, key);
    const went = options.entry;
    if (
      went !== undefined &&
      (hit === undefined || hit.node.id !== went.node.id || hit.sandbox.id !== went.sandbox.id)
    ) return "evicted";
    if (hit === undefined) return "uncached";
    if (this.#fleet.get(hit.node.id) !== hit.node) {
      this.#cache.evict(hit);
      return "evicted";
    }
    const answer = await this.#askOne(hit.node, hit.sandbox.id, options.signal);
    if (answer.kind !== "absent") return "kept";
    this.#cache.evict(hit);
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
    const hit = this.#cache.peek(by, key);
    if (hit !== undefined) this.#cache.evict(hit);
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
    return this.#cache.set(node, sandbox);
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
    return this.#cache.on(nodeId);
  }

  async #decide(
    by: FindBy,
    key: string,
    controller: AbortController,
    nodes: FleetNode[],
    fleetSize: number,
    slotToken?: string,
    more?: MoreNodes,
    asked: { count: number } = { count: 0 },
  ): Promise<FindResult> {
    const started = this.#clock.now();
    // Failure records of nodes that left without forgetNode (an embedder's own directory).
    if (this.#client.failingNodes > fleetSize) {
      this.#client.retainOnly((id) => this.#fleet.get(id) !== undefined);
    }
    asked.count = nodes.length;
    if (nodes.length === 0 && more === undefined) return { kind: "none" };
    // A name is asked within its team; an id is asked of every team, and the answer names it.
    const scoped = by === "name" ? splitTeamScopedName(key) : undefined;
    const body = JSON.stringify(scoped ? { name: scoped.name } : { id: key });
    // The round ends at its deadline (or when every caller left); an ask in flight then is given
    // one deadline more to answer, so its connection is kept for the next round instead of cut
    // (at 10,000 nodes a cut round left up to its width of connections to open again, and the
    // cuts themselves kept the answer waiting), and its answer still times the nodes.
    const deadline = new AbortController();
    const roundSignal = AbortSignal.any([controller.signal, deadline.signal]);
    const grace = new AbortController();
    const askSignal = AbortSignal.any([controller.signal, grace.signal]);
    const timer = this.#timers.setTimeout(
      () => deadline.abort(timeoutError(this.#timeoutMs)),
      this.#timeoutMs,
    );
    const graceTimer = this.#timers.setTimeout(
      () => grace.abort(timeoutError(2 * this.#timeoutMs)),
      2 * this.#timeoutMs,
    );
    let inFlight = 0, over = false;
    // One signal per fan-out worker, made when it first asks: every ask adds a listener to its
    // signal and removes it, and on one signal shared by 1,024 asks in flight that alone cost a
    // third of a second per round of 10,000 nodes (fan_out.ts).
    const signalOf = workerSignals(askSignal);
    const first = this.#width.firstAnswers();
    const notAsked = (): LookupAnswer => ({ kind: "silent", cause: NOT_ASKED_CAUSE });
    const late = (): LookupAnswer => ({
      kind: "silent",
      cause: timeoutError(this.#timeoutMs).message,
    });
    const ask = this.#width.timed(
      async (node: FleetNode, worker: number) => {
        inFlight++;
        try {
          return await this.#client.ask(node, body, signalOf(worker), scoped?.team, slotToken);
        } finally {
          if (--inFlight === 0 && over) this.#timers.clearTimeout(graceTimer);
        }
      },
      (answer) => answer.kind !== "silent",
      first.add,
    );
    // The width is chosen as each list is asked, from the time left then, and re-sized once when
    // its first answers are in (nodes slow since the rounds before: the history sized it too
    // narrow); never continuously.
    let width = 0;
    const left = () => this.#timeoutMs - (this.#clock.now() - started);
    const fanOut = (list: FleetNode[]) => {
      const w = this.#width.width(list.length, left());
      const widen = first.widen(w, left);
      width = Math.max(width, w);
      return boundedFanOut(
        list,
        w,
        roundSignal,
        ask,
        notAsked,
        late,
        widen && {
          after: widen.after,
          to: (n) => {
            const to = widen.to(n);
            width = Math.max(width, to);
            return to;
          },
        },
      );
    };
    let answers: LookupAnswer[];
    try {
      // Shared mode: the key's record is read while the digests' nodes are asked, under the same
      // deadline; the nodes it adds are asked as soon as it is read.
      const [first, second] = await Promise.all([
        fanOut(nodes),
        more === undefined
          ? Promise.resolve({ nodes: [] as FleetNode[], answers: [] as LookupAnswer[] })
          : askRecorded(more, roundSignal, fanOut),
      ]);
      nodes = [...nodes, ...second.nodes];
      answers = [...first, ...second.answers];
    } finally {
      this.#timers.clearTimeout(timer);
      over = true;
      if (inFlight === 0) this.#timers.clearTimeout(graceTimer);
    }
    asked.count = this.#lastAsked = nodes.length;
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
      width,
      ms: this.#clock.now() - started,
    });
    if (found.length === 1) {
      // A removed node's answer must not be cached: the next cached() would drop it anyway.
      if (this.#fleet.get(found[0].node.id) === found[0].node) {
        return this.remember(found[0].node, found[0].sandbox);
      }
      return { kind: "one", node: found[0].node, sandbox: found[0].sandbox };
    }
    if (found.length > 1) {
      const conflict = conflictOf(by, key, found, this.#fleet);
      this.#log("warn", "sandbox found on several nodes", {
        by,
        key,
        nodeIds: found.map((f) => f.node.id),
      });
      return conflict;
    }
    if (silent.length > 0) return unsureOf(key, silent);
    return { kind: "none" };
  }
  /** `#decide` timed: the round's outcome, duration and fan-out go to the metrics. */
  async #round(
    by: FindBy,
    key: string,
    controller: AbortController,
    slotToken?: string,
  ): Promise<FindResult> {
    const started = performance.now();
    const all = [...this.#fleet.nodes()];
    // A dead node is not asked: its sandboxes are taken as gone, so its silence makes no name
    // unsure (a down node's does, until it is declared dead).
    const now = this.#fleet.now();
    const alive = this.#fleet.isDead ? all.filter((node) => !this.#fleet.isDead!(node, now)) : all;
    let nodes = alive;
    let more: MoreNodes | undefined;
    if (this.#digests !== "off") {
      nodes = this.#skips.toAsk(alive, by, key);
      if (this.#recent !== undefined) {
        more = recordedNodes(
          {
            recent: this.#recent,
            timers: this.#timers,
            timeoutMs: this.#timeoutMs,
            log: this.#log,
          },
          by,
          key,
          alive,
          nodes,
        );
      }
    }
    this.#lastAsked = nodes.length;
    const asked = { count: nodes.length };
    const result = await this.#decide(
      by,
      key,
      controller,
      nodes,
      all.length,
      slotToken,
      more,
      asked,
    );
    this.#metrics?.lookupRound(result.kind, (performance.now() - started) / 1000, asked.count);
    return result;
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
