/**
 * The watch over forwards waiting for their node's head: it ties a client's hang-up to the node's
 * request once the node is slow to answer, ends a wait past its head bound with a 504 naming the
 * node, and ends the waits for a node that can no longer answer. Its entries are the `Cancel` the
 * HTTP/1.1 client's bytes exchanges take (`http1/client.ts`), so it lives beside that client
 * rather than in the gateway that wires it.
 *
 * @module
 */
import { HttpError } from "./http_error.ts";
import { type Clock, systemTimers, type TimerHandle, type Timers } from "./clock.ts";

/** The node a request goes to. */
export interface ForwardTarget {
  /** The node's id, named in errors. */
  nodeId: string;
  /** The node's origin, e.g. `http://10.0.0.5:3676`. */
  endpoint: string;
}

/**
 * A node request waiting for its head, and the client's request it serves. Its controller is
 * made when first asked for: the bytes lane's exchanges never ask, and hear of an abort through
 * `onAbort` instead (an AbortController and its listener were 1–2 µs of a forward's JavaScript).
 */
export class WatchedForward {
  /** The client's request (its signal is what a hang-up aborts). */
  readonly request: { readonly signal: AbortSignal };
  /** The watch's tick when it started. */
  readonly tick: number;
  /** Whether the client's signal is tied to the controller. */
  linked = false;
  /** The node it waits for, which the watch's `gone` check is asked about. */
  readonly target: ForwardTarget;
  /** The head's bound, on the watch's clock; `Infinity` until the request body is sent. */
  deadline: number = Infinity;
  /** The bound in ms, started by `bodySent`. */
  readonly headTimeoutMs: number | undefined;
  /** Whether the node's request has been aborted, and why. */
  aborted = false;
  /** Why it was aborted (the abort's reason); `undefined` while it was not. */
  reason: unknown = undefined;
  /** Where it sits in its watch's list of pending forwards; -1 when it is not pending. */
  slot: number = -1;
  #controller: AbortController | undefined;
  #hook: (() => void) | undefined;

  /** A forward of `request` to `target`, started at `tick`, bound by `headTimeoutMs` once sent. */
  constructor(
    request: { readonly signal: AbortSignal },
    target: ForwardTarget,
    tick: number,
    headTimeoutMs: number | undefined,
  ) {
    this.request = request;
    this.target = target;
    this.tick = tick;
    this.headTimeoutMs = headTimeoutMs;
  }

  /** Aborts the node's request (made when first asked for, aborted already if it was). */
  get controller(): AbortController {
    if (this.#controller === undefined) {
      this.#controller = new AbortController();
      if (this.aborted) this.#controller.abort(this.reason);
    }
    return this.#controller;
  }

  /** The controller's signal. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Sets the one hook told of an abort (or clears it): the exchange that holds a connection. */
  onAbort(hook: (() => void) | undefined): void {
    this.#hook = hook;
  }

  /** Aborts the node's request with `reason`; a second abort does nothing. */
  abort(reason: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.#controller?.abort(reason);
    const hook = this.#hook;
    this.#hook = undefined;
    hook?.();
  }
}

/** Options of {@linkcode HangUpWatch}. */
export interface HangUpWatchOptions {
  /** How often pending forwards are checked. Default 10 ms. */
  tickMs?: number;
  /**
   * How long the watch's timer waits while forwards keep starting, and so keep running the ticks
   * themselves. Default 250 ms: a forward pending when they stop is checked that much later.
   */
  busyTimerMs?: number;
  /**
   * Why a node can no longer answer (e.g. it stopped checking in), or `undefined` while it may:
   * a forward still waiting for that node's head is then aborted with a 504 carrying the
   * sentence. Asked about each pending forward every `goneEveryTicks` ticks.
   */
  gone?: (target: ForwardTarget) => string | undefined;
  /** Default 10: with the default tick, a node that went silent is noticed within 100 ms. */
  goneEveryTicks?: number;
  /** The clock (milliseconds, any origin) and timers; `performance.now()` and `setTimeout`. */
  clock?: Clock & Timers;
}

/** `performance.now()` and the runtime's timers. */
const monotonic: Clock & Timers = { now: () => performance.now(), ...systemTimers };

/**
 * Watches forwards until their node's head arrives, checking the pending ones once a tick:
 * - it ties a client's hang-up to the node's request lazily. Reading `request.signal` costs
 *   Deno.serve an abort (with an error and its stack) at the end of every request without
 *   `--unstable-no-legacy-abort`, about a fifth of a fast forward; a request whose node answers
 *   within a tick never needs it, since after the head a hang-up cancels the streamed body and
 *   with it the node's request. So each forward gets its own controller, linked to the client's
 *   signal once it has waited a full tick: a hang-up reaches the node at most two ticks later
 *   than it would with the signal attached at once;
 * - it ends a wait past the forward's head bound (`headTimeoutMs`) with a 504 naming the node;
 * - it ends the waits for a node that `gone` says can no longer answer (a frozen node stops
 *   checking in), with a 504 carrying that sentence, rather than letting them wait for ever.
 *
 * While forwards keep starting, the tick runs in `watch` (when one starts a tick or more after
 * the last check), and the one timer waits `busyTimerMs`; when none started since it was set,
 * the timer runs the ticks. An interval of 10 ms cost the bytes-framed floor a median 3.4 µs a
 * request on the wire (nine head-to-head runs, 0.4 to 4.2: a tenth of its CPU), a timeout set
 * again before it fires more, one of 100 ms or longer about nothing (docs/forwarding-engine.md).
 * So while forwards flow every rule holds to the tick, and a forward left pending when they stop
 * is checked at most `busyTimerMs` later.
 *
 * @example
 * ```ts ignore
 * const hangUps = new HangUpWatch();
 * const res = await forward(request, target, { path: "/execCommand", hangUps });
 * ```
 */
export class HangUpWatch {
  /**
   * The forwards waiting for their head, each knowing its slot: removed by moving the last one
   * into its place. Not a Set: a Set that each request adds to and deletes from makes a new table
   * every few dozen requests, and the table it leaves behind (in the old generation, until a
   * full collection) still points at the forwards pending then, so the young collector kept
   * every request's exchange, head and body alive into the old generation: a megabyte and more
   * promoted a second, and scavenges eight times as long (bench/probes/lane_js.ts with --trace-gc).
   */
  readonly #pending: WatchedForward[] = [];
  readonly #tickMs: number;
  readonly #busyMs: number;
  readonly #gone: ((target: ForwardTarget) => string | undefined) | undefined;
  readonly #goneEvery: number;
  readonly #clock: Clock & Timers;
  #tick = 0;
  /** When the pending forwards were last checked. */
  #checkedAt = -Infinity;
  /** Whether a forward started since the timer was set (other than the one that set it). */
  #startedSinceTimer = false;
  #timer: TimerHandle | undefined;

  /** Builds an idle watch: its timer starts with the first pending forward. */
  constructor(options: HangUpWatchOptions = {}) {
    this.#tickMs = options.tickMs ?? 10;
    this.#busyMs = Math.max(this.#tickMs, options.busyTimerMs ?? 250);
    this.#gone = options.gone;
    this.#goneEvery = Math.max(1, options.goneEveryTicks ?? 10);
    this.#clock = options.clock ?? monotonic;
  }

  /** Forwards waiting for their node's head. */
  get size(): number {
    return this.#pending.length;
  }

  /**
   * Starts watching `request` to `target`; the returned controller aborts once the client hangs
   * up, the head's bound passes (counted from `bodySent`), or the node is gone. `now` is the
   * clock's reading when the caller has one already.
   */
  watch(
    request: { readonly signal: AbortSignal },
    target: ForwardTarget,
    headTimeoutMs?: number,
    now: number = this.#clock.now(),
  ): WatchedForward {
    if (now - this.#checkedAt >= this.#tickMs) this.#check(now);
    const entry = new WatchedForward(request, target, this.#tick, headTimeoutMs);
    entry.slot = this.#pending.length;
    this.#pending.push(entry);
    if (this.#timer === undefined) this.#timer = this.#clock.setTimer(this.#fire, this.#tickMs);
    else this.#startedSinceTimer = true;
    return entry;
  }

  /**
   * Starts the head's bound: the request's body has been handed to the node (at `now`, the
   * clock's reading when the caller has one already).
   */
  bodySent(entry: WatchedForward, now?: number): void {
    if (entry.headTimeoutMs !== undefined && entry.slot >= 0) {
      entry.deadline = (now ?? this.#clock.now()) + entry.headTimeoutMs;
    }
  }

  /**
   * Stops watching: the node's head arrived, or it failed. `linkNow` ties the client's signal at
   * once, for an answer that may stream for long.
   */
  done(entry: WatchedForward, linkNow = false): void {
    // The timer stops when it fires with nothing pending and no forward started since it was
    // set, not here: one request at a time would otherwise set and clear a timer per request.
    const at = entry.slot;
    if (at >= 0) {
      const last = this.#pending.pop()!;
      if (last !== entry) {
        this.#pending[at] = last;
        last.slot = at;
      }
      entry.slot = -1;
    }
    if (linkNow) link(entry);
  }

  /**
   * The timer. When forwards started since it was set, they keep running the ticks: it ticks only
   * if a tick went unchecked, and waits `busyTimerMs` again. Otherwise it runs the tick, and waits
   * a tick again while any forward is pending.
   */
  readonly #fire = (): void => {
    this.#timer = undefined;
    const busy = this.#startedSinceTimer;
    this.#startedSinceTimer = false;
    if (!busy && this.#pending.length === 0) return;
    const now = this.#clock.now();
    if (!busy || now - this.#checkedAt >= this.#tickMs) this.#check(now);
    if (busy || this.#pending.length > 0) {
      this.#timer = this.#clock.setTimer(this.#fire, busy ? this.#busyMs : this.#tickMs);
    }
  };

  #check(now: number): void {
    this.#checkedAt = now;
    const tick = this.#tick++;
    const askGone = this.#gone !== undefined && tick % this.#goneEvery === 0;
    // From the end: one that ends here is replaced by the last, which has been checked already.
    for (let i = this.#pending.length - 1; i >= 0; i--) {
      const entry = this.#pending[i];
      if (!entry.linked && entry.tick < tick) link(entry);
      let reason: HttpError | undefined;
      if (now >= entry.deadline) reason = headTimeout(entry.target, entry.headTimeoutMs!);
      else if (askGone) {
        const why = this.#gone!(entry.target);
        if (why !== undefined) {
          reason = new HttpError(504, why, { details: { nodeId: entry.target.nodeId } });
        }
      }
      if (reason !== undefined) {
        this.done(entry);
        entry.abort(reason);
      }
    }
  }
}

/** The 504 for a node whose head did not come within its bound. */
export function headTimeout(target: ForwardTarget, ms: number): HttpError {
  return new HttpError(
    504,
    `Node '${target.nodeId}' at ${target.endpoint} sent no answer within ${ms} ms of the ` +
      "request (DORMICE_GATEWAY_HEAD_TIMEOUT_MS): it may be frozen or overloaded, and the " +
      "request may still run there. Check the node, or give a command a timeoutSeconds that " +
      "covers its run",
    { details: { nodeId: target.nodeId } },
  );
}

/** Ties the client's signal to `entry`: a hang-up aborts the node's request from now on. */
function link(entry: WatchedForward): void {
  if (entry.linked) return;
  entry.linked = true;
  const { signal } = entry.request;
  if (signal.aborted) entry.abort(signal.reason);
  else signal.addEventListener("abort", () => entry.abort(signal.reason), { once: true });
}
