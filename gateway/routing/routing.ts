/**
 * `gateway/routing/` owns a request's way to its node: the rules every face shares (`routing.ts`),
 * a new sandbox's admission and placement (`create.ts`), the errors the rules answer with
 * (`answers.ts`), the per-name slots (`slots.ts`), forwarding, streamed or captured (`forward.ts`),
 * and the health probes of nodes this gateway cannot hear of (`node_probes.ts`).
 *
 * The gateway's routing core, shared by its faces: find the node that holds a sandbox, stream a
 * request to it, and run the two creators and destroy inside the per-name slots. What a create
 * that builds a new sandbox does once its name is known to be absent (admission, placement,
 * counting back) is `create.ts`; the HTTP errors these rules answer with are
 * `answers.ts`.
 *
 * @module
 */
import type { Fleet, FleetNode } from "../fleet/fleet.ts";
import type { FindBy, Finder, FindNone, FindOne } from "../finder/finder.ts";
import type { Placer } from "../placer/placer.ts";
import { boundedFanOut, workerSignals } from "../finder/fan_out.ts";
import { RoundWidth } from "../finder/round_width.ts";
import { HOP_HEADER, newGatewayInstanceId } from "../door.ts";
import { capture, forward, HangUpWatch } from "./forward.ts";
import { describeFetchFailure } from "../../shared/fetch_failure.ts";
import { LocalSlots, type SlotHold, type Slots } from "./slots.ts";
import { NodeProbes } from "./node_probes.ts";
import {
  clientGone,
  notAskedSilent,
  ownedBy,
  settle,
  silentNodeError,
  silentWhileWaiting,
  statusOf,
  unheardNodeError,
  unheardWhileWaiting,
} from "./answers.ts";
import {
  type CapturedAnswer,
  type CreateOptions,
  type CreateParts,
  placeNew,
  publishIdOf,
  rememberCreated,
} from "./create.ts";
import { HttpError } from "../../shared/http_error.ts";
import { ABSENT_HEADER } from "../../shared/native_schemas.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import { TEAM_HEADER, teamScopedName } from "../../shared/teams.ts";
import type {
  DestroyOptions,
  FanOutAnswer,
  GatewayRoutingOptions,
  RoutingObserver,
  StreamOptions,
} from "./options.ts";

export type * from "./options.ts";

/**
 * The routing rules of DESIGN §5 as one object the faces share:
 * - `resolve`/`locate`: the cache, then one lookup round; conflict → 409, unsure → 503;
 * - `stream`: forward to the node as bytes come, a node's 404 triggers the Finder's re-check;
 * - `create`: the per-name slot, the creators' confirm, then wake or place and capture;
 * - `destroy`: the slot, capture, evict and give the placement back.
 *
 * @example
 * ```ts ignore
 * const routing = new GatewayRouting({ fleet, finder, placer, token });
 * const found = await routing.locate("name", "agent-1", request.signal);
 * return routing.stream(request, { found, by: "name", key: "agent-1", path: "/execCommand", body });
 * ```
 */
export class GatewayRouting {
  /** Per-name slots: twenty simultaneous acquires of one name build one sandbox. */
  readonly slots: Slots;
  /**
   * Watches streamed node requests until their head: ties a client's hang-up to them once the
   * node is slow to answer, and ends those past their head's bound or whose node fell silent.
   */
  readonly hangUps: HangUpWatch;
  /** The credentials and content type every node request carries. */
  readonly nodeHeaders: Readonly<Record<string, string>>;
  /** The HTTP client to the nodes (`fetch` option), for a face that forwards on its own. */
  readonly nodeFetch: typeof fetch;
  /** This gateway's id in the hop marker, for a face that forwards on its own. */
  readonly hop: string;
  /** The bound of a forward's wait for its node's head (`headTimeoutMs`). */
  readonly headTimeoutMs: number;
  readonly #fleet: Fleet;
  readonly #finder: Finder;
  readonly #placer: Placer;
  readonly #fetch: typeof fetch;
  readonly #log: Log;
  readonly #fanOutTimeoutMs: number;
  readonly #fanOutConcurrency: number;
  /** The width rule of fleet-wide calls, fed by their own answers (`gateway/finder/round_width.ts`). */
  readonly #fanOutWidth: RoundWidth;
  readonly #captureTimeoutMs: number;
  readonly #onDestroyed?: (found: FindOne, answer: CapturedAnswer) => void;
  readonly #observer: RoutingObserver;
  /** Health checks of nodes this gateway cannot hear of while etcd is unreadable. */
  readonly #probes: NodeProbes;
  /** What a create that builds a new sandbox works with (`create.ts`). */
  readonly #creates: CreateParts;

  /** Builds the rules over one Fleet, Finder and Placer; `nodeHeaders` is fixed from `token`. */
  constructor(options: GatewayRoutingOptions) {
    this.#fleet = options.fleet;
    this.#finder = options.finder;
    this.#placer = options.placer;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.nodeFetch = this.#fetch;
    this.#log = options.log ?? silentLog;
    this.#fanOutTimeoutMs = options.fanOutTimeoutMs ?? 5000;
    this.#fanOutConcurrency = options.fanOutConcurrency ?? 128;
    this.#fanOutWidth = new RoundWidth({
      floor: this.#fanOutConcurrency,
      ceiling: options.fanOutConcurrencyMax ?? Math.max(1024, this.#fanOutConcurrency),
      clock: options.clock ?? { now: () => performance.now() },
    });
    this.#captureTimeoutMs = options.captureTimeoutMs ?? 120_000;
    this.#onDestroyed = options.onDestroyed;
    this.#observer = options.observer ?? {};
    this.hop = options.hopMarker ?? newGatewayInstanceId();
    this.headTimeoutMs = options.headTimeoutMs ?? 120_000;
    this.hangUps = new HangUpWatch({
      gone: (target) => this.#wentSilent(target.nodeId),
      clock: options.hangUpClock,
    });
    this.#probes = new NodeProbes({ fetch: this.#fetch, now: () => this.#fleet.now() });
    this.slots = options.slots ?? new LocalSlots();
    this.nodeHeaders = Object.freeze({
      "authorization": `Bearer ${options.token}`,
      "content-type": "application/json",
    });
    this.#creates = {
      fleet: this.#fleet,
      finder: this.#finder,
      placer: this.#placer,
      log: this.#log,
      defaultHeaders: this.nodeHeaders,
      placed: (key, pick) => this.#observer.placed?.(key, pick),
      created: (node, sandbox, path) => this.#observer.created?.(node, sandbox, path),
      capture: (node, path, init) => this.#capture(node, path, init),
      publishId: options.publishId,
    };
  }

  /**
   * The node headers for a caller limited to `team` (its key's), which the node filters by; the
   * operator (`undefined`) gets {@linkcode nodeHeaders}, which name no team.
   *
   * @example
   * ```ts ignore
   * const headers = routing.nodeHeadersFor("acme"); // with x-dormice-team: acme
   * ```
   */
  nodeHeadersFor(team: string | undefined): Readonly<Record<string, string>> {
    return team === undefined ? this.nodeHeaders : { ...this.nodeHeaders, [TEAM_HEADER]: team };
  }

  /**
   * The cache, then (when the client is still there) one lookup round. Returns `one` or `none`.
   * With `team`, a sandbox of another team found by id is `none`, as if it did not exist (a name
   * key already names its team).
   *
   * @throws {HttpError} 409 when several nodes hold it, 503 with Retry-After when a node that
   *   may hold it is silent, 499 when the client left.
   * @example
   * ```ts ignore
   * const r = await routing.resolve("id", sandboxId, request.signal);
   * ```
   */
  async resolve(
    by: FindBy,
    key: string,
    signal: AbortSignal,
    team?: string,
  ): Promise<FindOne | FindNone> {
    const hit = this.#finder.cached(by, key);
    if (hit !== undefined) return ownedBy(hit, team);
    // A client that already left must not cost every node a lookup.
    if (signal.aborted) throw clientGone();
    const result = await this.#finder.find(by, key, { signal });
    if (signal.aborted) throw clientGone();
    return ownedBy(settle(result), team);
  }

  /**
   * Like `resolve`, and `none` is a 404 naming the key.
   *
   * @throws {HttpError} 404, 409, 503 or 499.
   * @example
   * ```ts ignore
   * const one = await routing.locate("name", "agent-1", request.signal);
   * ```
   */
  async locate(by: FindBy, key: string, signal: AbortSignal, team?: string): Promise<FindOne> {
    const r = await this.resolve(by, key, signal, team);
    if (r.kind === "one") return r;
    const shown = by === "name" ? key.slice(key.indexOf("/") + 1) : key;
    throw new HttpError(
      404,
      `No sandbox with ${by} '${shown}' on any node of the fleet` +
        (by === "name" ? ": create it with acquireSandbox" : ""),
    );
  }

  /**
   * Streams `request` to the node that holds the sandbox: the head goes out when the node's
   * arrives and a client that hangs up aborts the node's request. A node's 404 makes the Finder
   * ask that node whether the sandbox is still there (and evict it when not) before answering.
   *
   * @throws {HttpError} 503 with Retry-After when the node stopped checking in; 504 when its head
   *   does not come within its bound (or it stops checking in meanwhile); 502 when it does not
   *   answer; 499 when the client left.
   * @example
   * ```ts ignore
   * return await routing.stream(request, {
   *   found: one, by: "name", key: "agent-1", path: "/execCommand", body: text,
   * });
   * ```
   */
  async stream(request: Request, options: StreamOptions): Promise<Response> {
    const { found, by, key, path, body, headers = this.nodeHeaders } = options;
    // A cache hit reaches here without any await: a client that already hung up must not have a
    // short command run for nobody. (Reading the signal is free under --unstable-no-legacy-abort,
    // as the daemon runs: measured 86-88k req/s with the read, 88-95k without, on wrk -c32.)
    if (request.signal.aborted) throw clientGone();
    this.#refuseSilent(found.node);
    const started = performance.now();
    let response: Response;
    try {
      response = await forward(request, {
        nodeId: found.node.id,
        endpoint: found.node.endpoint,
      }, {
        path,
        headers,
        body,
        fetch: this.#fetch,
        hangUps: this.hangUps,
        hop: this.hop,
        headTimeoutMs: options.headTimeoutMs ?? this.headTimeoutMs,
      });
    } catch (error) {
      this.#observer.forwarded?.(path, statusOf(error), (performance.now() - started) / 1000);
      throw error;
    }
    this.#observer.forwarded?.(
      path,
      response.status,
      (performance.now() - started) / 1000,
      found,
    );
    if (response.status === 404) {
      const stale = await this.recheckNotFound(by, key, found, response.headers.has(ABSENT_HEADER));
      const again = stale ? await this.#elsewhere(request, options, found) : undefined;
      if (again !== undefined) {
        await response.body?.cancel().catch(() => {});
        return again;
      }
    }
    return response;
  }

  /**
   * A node's 404 to a request routed to `found` (the object path's and the bytes lane's one
   * rule): the sandbox may have been destroyed behind the gateway's back, and only the node can
   * say, so the Finder asks it and evicts the entry when the sandbox is gone. True when the entry
   * was stale and the node marked its 404 as the sandbox's absence (`absent`, the
   * `x-dormice-absent` header: it did nothing), so the request may go to the node that holds the
   * name now; false when the 404 is the answer.
   */
  async recheckNotFound(
    by: FindBy,
    key: string,
    found: FindOne,
    absent: boolean,
  ): Promise<boolean> {
    const rechecked = await this.#finder.recheck(by, key, { entry: found })
      .catch(() => undefined);
    return rechecked === "evicted" && absent;
  }

  /**
   * The same request sent once more, to the node that holds the name now, when the node it went
   * to said the sandbox is not there (so it did nothing) and the cache entry was stale: another
   * gateway destroyed and made the name again elsewhere. `undefined` when it cannot be sent
   * again (a body that streamed through, an id, which names one sandbox on one node for good)
   * or the name is on no other node: the first 404 stands.
   */
  async #elsewhere(
    request: Request,
    options: StreamOptions,
    was: FindOne,
  ): Promise<Response | undefined> {
    const { by, key, body } = options;
    if (by !== "name" || !(typeof body === "string" || body instanceof Uint8Array)) return;
    const now = await this.resolve(by, key, request.signal).catch(() => undefined);
    if (now?.kind !== "one" || now.node.id === was.node.id) return;
    // Sent as any routed request, and once: its own 404 is the answer, whatever it says.
    return await this.stream(request, { ...options, found: now, by: "id", key: now.sandbox.id });
  }

  /**
   * Tells the observer of a forward a face made on its own (the bytes lane), as `stream` does
   * of its own: `status` 502 when the node did not answer, `seconds` the time to its head.
   */
  forwarded(path: string, status: number, seconds: number, found?: FindOne): void {
    this.#observer.forwarded?.(path, status, seconds, found);
  }

  /**
   * Create-or-wake through the name's slot: inside it, the client is checked, the cache hit is
   * confirmed with its node (or the fleet asked), the client checked again; a found sandbox is
   * woken where it lives, an absent one placed and created there. The node's answer is read so
   * the placement can be counted back (4xx) or cached (2xx).
   *
   * @throws {HttpError} 409 (conflict), 503 (unsure, or no node fits), 502 (node silent), 499.
   * @example
   * ```ts ignore
   * const answer = await routing.create({ name: "agent-1", path: "/acquireSandbox", body,
   *   signal: request.signal, identify: (t) => JSON.parse(t).sandbox });
   * ```
   */
  create(options: CreateOptions): Promise<CapturedAnswer> {
    const { name, signal } = options;
    if (name === undefined) {
      if (signal.aborted) return Promise.reject(clientGone());
      // No slot to take, yet shared slots refuse it too while their store is unreachable: the
      // fleet's rule is one answer for every create while etcd is away.
      return this.slots.ready().then(() => placeNew(this.#creates, undefined, options));
    }
    return this.#inSlot(name, signal, async (hold) => {
      // A client that hung up while queued behind other holders must not build anything.
      if (signal.aborted) throw clientGone();
      // Cached on a node that stopped checking in: it may still hold the name, so nothing is
      // built elsewhere, and the confirm would only wait out its deadline.
      const hit = this.#finder.cached("name", name);
      if (hit !== undefined) this.#refuseSilent(hit.node);
      // The slot token goes with the round's lookups: each node asked refuses from then on a
      // build of the name by a gateway whose take is older (one that lost its slot).
      const result = await this.#finder.confirm("name", name, { signal, slotToken: hold?.token });
      if (signal.aborted) throw clientGone();
      const r = settle(result);
      if (r.kind === "none") return await placeNew(this.#creates, name, options, hold);
      this.#refuseSilent(r.node);
      // A wake is not a placement: nothing is counted.
      const answer = await this.#capture(r.node, options.path, {
        body: options.body,
        headers: options.headers,
      });
      if (answer.status >= 200 && answer.status < 300) {
        rememberCreated(this.#creates, r.node, answer, options);
      }
      return answer;
    });
  }

  /**
   * Destroy through the slot: the node's answer is read; on success the cache entry is evicted
   * and a placement made in this interval given back. Returns `null` when no node has it.
   *
   * @throws {HttpError} 409, 503, 502 or 499.
   * @example
   * ```ts ignore
   * const answer = await routing.destroy({ by: "name", key: "agent-1", path: "/destroySandbox",
   *   body, signal: request.signal });
   * ```
   */
  async destroy(options: DestroyOptions): Promise<CapturedAnswer | null> {
    const { by, key, signal, team } = options;
    let slot = key;
    if (by === "id") {
      // An id names no slot of its own: the destroy takes its name's, found first (the cache, or
      // a lookup round), so it waits for an acquire of that name, whose confirm-then-wake would
      // otherwise rebuild on the node the sandbox this destroys, skipping placement.
      const first = await this.resolve(by, key, signal, team);
      if (first.kind === "none") return null;
      slot = teamScopedName(first.sandbox.team, first.sandbox.name);
    }
    return this.#inSlot(slot, signal, async () => {
      if (signal.aborted) throw clientGone();
      const r = await this.resolve(by, key, signal, team);
      if (r.kind === "none") return null;
      this.#refuseSilent(r.node);
      const answer = await this.#capture(r.node, options.path, {
        method: options.method,
        body: options.body,
        headers: options.headers,
      });
      if (answer.status >= 200 && answer.status < 300) {
        this.#finder.evict(by, key);
        this.#placer.release(teamScopedName(r.sandbox.team, r.sandbox.name));
        this.#onDestroyed?.(r, answer);
        this.#observer.destroyed?.(r, options.path);
      } else if (answer.status === 404) {
        await this.#finder.recheck(by, key).catch(() => {});
      }
      return answer;
    });
  }

  /**
   * Shared mode: publishes the ids of sandboxes a node built outside `create` (a fork's copies)
   * for every gateway's lookups by id, before the client hears of them. Does nothing with one
   * gateway; a failure is logged.
   *
   * @example
   * ```ts ignore
   * await routing.publishCreated(["sbx_1"], found.node);
   * ```
   */
  async publishCreated(ids: readonly string[], node: FleetNode): Promise<void> {
    for (const id of ids) await publishIdOf(this.#creates, id, node);
  }

  /**
   * One request to the node a sandbox was found on whose answer the gateway must read whole,
   * ledger change number included (a fork: its copies are counted by it); a node that stopped
   * checking in is refused first, as `stream` refuses it. Not tied to the client's signal.
   *
   * @throws {HttpError} 503 (the node is silent), 502 (it did not answer).
   * @example
   * ```ts ignore
   * const answer = await routing.send(found, "/e2b/api/sandboxes/x/fork", { body: "{}" });
   * ```
   */
  send(
    found: FindOne,
    path: string,
    init: { method?: string; body: string; headers?: Readonly<Record<string, string>> },
  ): Promise<CapturedAnswer> {
    this.#refuseSilent(found.node);
    return this.#capture(found.node, path, init);
  }

  /**
   * Asks every registered node, as many at once as the lookup rounds' width rule calls for
   * (`fanOutConcurrency` to `fanOutConcurrencyMax`, from the latency of recent answers to such
   * calls, re-sized once after this call's first answers) and all within one bound
   * (`fanOutTimeoutMs`), and returns each one's parsed JSON answer or why it did not give one: a
   * node silent past two check-in intervals is not asked (the fleet reads it as down, and waiting
   * on it held every listing for the whole bound), and a node not asked before the bound is
   * named as such. The answer is therefore bounded at any fleet size, and says which nodes were
   * not heard.
   *
   * @example
   * ```ts ignore
   * const answers = await routing.fanOut("/listSandboxes", "{}", request.signal);
   * ```
   */
  async fanOut(
    path: string,
    body: string | null,
    signal: AbortSignal,
    init: {
      method?: string;
      headers?: Readonly<Record<string, string>>;
      /** The nodes to ask; every registered node when absent. */
      nodes?: readonly FleetNode[];
    } = {},
  ): Promise<FanOutAnswer[]> {
    const nodes = init.nodes ?? [...this.#fleet.nodes()];
    const now = this.#fleet.now();
    const started = this.#fanOutWidth.now();
    const bound = AbortSignal.any([signal, AbortSignal.timeout(this.#fanOutTimeoutMs)]);
    // One signal per worker, as a lookup round's: a listener on one signal shared by a thousand
    // asks in flight costs in proportion to the others there (gateway/finder/fan_out.ts).
    const signalOf = workerSignals(bound);
    const first = this.#fanOutWidth.firstAnswers();
    const headers = { ...(init.headers ?? this.nodeHeaders), [HOP_HEADER]: this.hop };
    const askNode = async (node: FleetNode, worker: number): Promise<FanOutAnswer> => {
      if (this.#fleet.isSilent(node, now)) return notAskedSilent(node, now);
      try {
        const res = await this.#fetch(node.endpoint + path, {
          method: init.method ?? "POST",
          headers,
          body,
          signal: signalOf(worker),
          redirect: "manual",
        });
        const text = await res.text();
        if (res.status < 200 || res.status >= 300) {
          return { node, ok: false, cause: `HTTP ${res.status}: ${text.slice(0, 200)}` };
        }
        // A 204 (a delete told to every node) has no body to read.
        const json = text === "" ? null : JSON.parse(text);
        return { node, ok: true, status: res.status, headers: res.headers, json };
      } catch (error) {
        if (signal.aborted) return { node, ok: false, cause: "the client left" };
        return { node, ok: false, cause: describeFetchFailure(error) };
      }
    };
    // Only the nodes that answered time the fleet: a refusal or the bound is not their latency.
    const ask = this.#fanOutWidth.timed(askNode, (a) => a.ok, first.add);
    // The width rule of lookup rounds, over this call's own bound: the nodes fit in half of it
    // at the recent answers' latency, re-sized once when this call's first answers are in.
    const left = () => this.#fanOutTimeoutMs - (this.#fanOutWidth.now() - started);
    let width = this.#fanOutWidth.width(nodes.length, left());
    const widen = first.widen(width, left);
    const notAsked = (node: FleetNode): FanOutAnswer => ({
      node,
      ok: false,
      cause: `not asked within the ${this.#fanOutTimeoutMs} ms bound of a fleet-wide call ` +
        `(${width} nodes were asked at once; the least is DORMICE_GATEWAY_LOOKUP_CONCURRENCY)`,
    });
    const answers = await boundedFanOut(
      nodes,
      width,
      bound,
      ask,
      notAsked,
      undefined,
      widen && {
        after: widen.after,
        to: (n) => width = Math.max(width, widen.to(n)),
      },
    );
    if (signal.aborted) throw clientGone();
    return answers;
  }

  /**
   * A node that stopped checking in is answered at once: a 503 naming it, with Retry-After one
   * of its intervals (by then it has checked in again, or it is still gone). Waiting on it would
   * hold the client until some timeout; the sandbox is not built elsewhere meanwhile.
   */
  #refuseSilent(node: FleetNode): void {
    const now = this.#fleet.now();
    if (this.#fleet.isSilent(node, now)) throw silentNodeError(node, now);
    const cause = this.#unheardFailure(node, now);
    if (cause !== undefined) throw unheardNodeError(node, now, cause);
  }

  /**
   * Shared mode while etcd is unreadable: a node this gateway has not heard of for two of its
   * intervals may be checking in elsewhere, so it is still served, but it is asked itself (a
   * health check, 2 s bound, at most every 5 s); a failed check is why its requests end.
   */
  #unheardFailure(node: FleetNode, now: number): string | undefined {
    if (!this.#fleet.isUnheard(node, now)) {
      if (this.#probes.size > 0) this.#probes.forget(node.id);
      return undefined;
    }
    return this.#probes.failure(node);
  }

  /** Why a forward still waiting for `nodeId`'s head should stop: the node fell silent. */
  #wentSilent(nodeId: string): string | undefined {
    const node = this.#fleet.get(nodeId);
    const now = this.#fleet.now();
    if (node === undefined) return undefined;
    if (this.#fleet.isSilent(node, now)) return silentWhileWaiting(node, now);
    const cause = this.#unheardFailure(node, now);
    return cause === undefined ? undefined : unheardWhileWaiting(node, now, cause);
  }

  /** Runs `task` in `key`'s slot; a client that left while waiting for it gets `clientGone`. */
  #inSlot<T>(
    key: string,
    signal: AbortSignal,
    task: (hold?: SlotHold) => Promise<T>,
  ): Promise<T> {
    return this.slots.run(key, task, signal).catch((error) => {
      if (signal.aborted && !(error instanceof HttpError)) throw clientGone();
      throw error;
    });
  }

  async #capture(
    node: FleetNode,
    path: string,
    init: { method?: string; body: string; headers?: Readonly<Record<string, string>> },
  ): Promise<CapturedAnswer> {
    // Not tied to the client's signal: once a create or destroy is sent, the gateway must learn
    // its outcome (to count or cache it) even if the client left.
    const started = performance.now();
    let r: Awaited<ReturnType<typeof capture>>;
    try {
      r = await capture({ nodeId: node.id, endpoint: node.endpoint }, path, {
        method: init.method ?? "POST",
        headers: { ...(init.headers ?? this.nodeHeaders), [HOP_HEADER]: this.hop },
        body: init.body,
        fetch: this.#fetch,
        timeoutMs: this.#captureTimeoutMs,
      });
    } catch (error) {
      this.#observer.forwarded?.(path, statusOf(error), (performance.now() - started) / 1000);
      throw error;
    }
    this.#observer.forwarded?.(path, r.status, (performance.now() - started) / 1000);
    return { ...r, node };
  }
}
