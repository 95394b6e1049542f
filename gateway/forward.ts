/**
 * Forwarding a client's request to the node that holds its sandbox: streamed both ways, or
 * captured when the gateway must read the node's answer (create and destroy).
 *
 * @module
 */
import { HOP_HEADER, nextHop } from "./door.ts";
import { HttpError } from "../shared/http_error.ts";
import { hopByHopHeaders } from "../shared/port_proxy.ts";
import { LEDGER_SEQ_HEADER } from "../shared/schemas.ts";
import { type Clock, systemTimers, type TimerHandle, type Timers } from "../shared/clock.ts";

const hopByHop = new Set(hopByHopHeaders);

/**
 * The hop-by-hop headers that make a node's answer be re-wrapped. Content-Length and
 * Transfer-Encoding are left out: Deno's server frames the body it sends itself (a decoded body
 * drops them), so an answer carrying only those can go back to the client as it came.
 */
export const answerHopByHop: readonly string[] = [
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "upgrade",
  // The node's ledger change number is for this gateway's team counts, not for its clients.
  LEDGER_SEQ_HEADER,
];

/** The node a request goes to. */
export interface ForwardTarget {
  /** The node's id, named in errors. */
  nodeId: string;
  /** The node's origin, e.g. `http://10.0.0.5:3676`. */
  endpoint: string;
}

/** Options of {@linkcode forward}. */
export interface ForwardOptions {
  /** The path and query on the node, e.g. `/execCommand` or `/e2b/envd/files?path=/a`. */
  path: string;
  /** Headers to set or replace (e.g. the node's credentials). */
  headers?: Readonly<Record<string, string>>;
  /** A body to send instead of the client's (e.g. one already read to route on). */
  body?: BodyInit | null;
  /** The fetch to use (injected in tests). */
  fetch?: typeof fetch;
  /** Aborts the node's request; defaults to the client's own signal (a hang-up stops the node). */
  signal?: AbortSignal;
  /**
   * Ties the client's hang-up to the node's request only once the node is slow to answer (see
   * {@linkcode HangUpWatch}); without it the client's signal is attached at once.
   */
  hangUps?: HangUpWatch;
  /**
   * This gateway's id for the hop marker (`x-dormice-hop`), appended to the one the client's
   * request carried, so a forward that loops back (through one gateway or several) is refused.
   */
  hop?: string;
  /**
   * The longest wait for the node's head, counted from when the request's body has been sent
   * (at once for a body the gateway already holds, when the client's streamed body ends
   * otherwise): past it the node's request is aborted and the answer is a 504 naming the node.
   * Once the head has come the body flows without a bound (a command's output, a download).
   * No bound when absent.
   */
  headTimeoutMs?: number;
}

/**
 * The client's end-to-end headers as pairs, then `extra` (which replaces same-named ones), then
 * the hop marker with `hop` appended.
 */
function requestHeaders(
  from: Headers,
  extra?: Readonly<Record<string, string>>,
  hop?: string,
): [string, string][] {
  const out: [string, string][] = [];
  const replaced = extra === undefined ? [] : Object.keys(extra);
  for (let i = 0; i < replaced.length; i++) replaced[i] = replaced[i].toLowerCase();
  if (hop !== undefined) replaced.push(HOP_HEADER);
  // forEach: the iterator's result objects were most of what copying the headers cost.
  from.forEach((value, name) => {
    if (!hopByHop.has(name) && !replaced.includes(name)) out.push([name, value]);
  });
  if (extra !== undefined) { for (const k in extra) out.push([k, extra[k]]); }
  if (hop !== undefined) out.push([HOP_HEADER, nextHop(from.get(HOP_HEADER), hop)]);
  return out;
}

/** What an answer's copy leaves out: the hop's own headers, the ones that make the copy included. */
const notCopied = new Set([...hopByHopHeaders, ...answerHopByHop]);

function copyHeaders(from: Headers): Headers {
  const out = new Headers();
  from.forEach((v, k) => {
    if (!notCopied.has(k)) out.append(k, v);
  });
  return out;
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
  deadline = Infinity;
  /** The bound in ms, started by `bodySent`. */
  readonly headTimeoutMs: number | undefined;
  /** Whether the node's request has been aborted, and why. */
  aborted = false;
  reason: unknown = undefined;
  /** Where it sits in its watch's list of pending forwards; -1 when it is not pending. */
  slot = -1;
  #controller: AbortController | undefined;
  #hook: (() => void) | undefined;

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
   * promoted a second, and scavenges eight times as long (bench/_lane_js.ts with --trace-gc).
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
function headTimeout(target: ForwardTarget, ms: number): HttpError {
  return new HttpError(
    504,
    `Node '${target.nodeId}' at ${target.endpoint} sent no answer within ${ms} ms of the ` +
      "request (DORMICE_GATEWAY_HEAD_TIMEOUT_MS): it may be frozen or overloaded, and the " +
      "request may still run there. Check the node, or give a command a timeoutSeconds that " +
      "covers its run",
    { details: { nodeId: target.nodeId } },
  );
}

/** `body`, passed on as it comes, calling `onEnd` once its last byte has been read. */
function noticingEnd(body: ReadableStream<Uint8Array>, onEnd: () => void): ReadableStream {
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({ flush: () => onEnd() }),
  );
}

function link(entry: WatchedForward): void {
  if (entry.linked) return;
  entry.linked = true;
  const { signal } = entry.request;
  if (signal.aborted) entry.abort(signal.reason);
  else signal.addEventListener("abort", () => entry.abort(signal.reason), { once: true });
}

/**
 * Sends `request` to `target` and answers with the node's response as soon as its head arrives,
 * the body flowing as it comes. A client that hangs up aborts the node's request; a node that
 * does not answer is a 502 naming it, one whose head does not come within `headTimeoutMs` (or
 * that the watch's `gone` check gives up on) a 504 naming it. The node's response is passed back
 * as it is unless it carries a hop-by-hop header, which is then dropped.
 *
 * @throws {HttpError} 502 when the node cannot be reached; 504 when its head does not come.
 * @example
 * ```ts ignore
 * import { forward } from "@dormice/cluster/gateway";
 * const res = await forward(req, { nodeId: "a", endpoint: "http://10.0.0.5:3676" }, { path: "/execCommand" });
 * ```
 */
export async function forward(
  request: Request,
  target: ForwardTarget,
  options: ForwardOptions,
): Promise<Response> {
  const doFetch = options.fetch ?? fetch;
  const { hangUps, headTimeoutMs } = options;
  const watched = options.signal === undefined
    ? hangUps?.watch(request, target, headTimeoutMs)
    : undefined;
  // Without a watch, the head's bound gets a timer of its own.
  let bound: AbortController | undefined;
  let boundTimer: ReturnType<typeof setTimeout> | undefined;
  const startBound = () => {
    if (watched !== undefined) hangUps!.bodySent(watched);
    else if (bound !== undefined && boundTimer === undefined) {
      boundTimer = setTimeout(
        () => bound!.abort(headTimeout(target, headTimeoutMs!)),
        headTimeoutMs,
      );
    }
  };
  let signal = options.signal ?? watched?.signal ?? request.signal;
  if (watched === undefined && headTimeoutMs !== undefined) {
    bound = new AbortController();
    signal = AbortSignal.any([signal, bound.signal]);
  }
  const hasBody = request.method !== "GET" && request.method !== "HEAD";
  let body = options.body !== undefined ? options.body : hasBody ? request.body : null;
  if (headTimeoutMs !== undefined) {
    // A client still uploading is no sign of a slow node: the bound starts once the body is sent.
    if (body instanceof ReadableStream) body = noticingEnd(body, startBound);
    else startBound();
  }
  let upstream: Response;
  try {
    upstream = await doFetch(target.endpoint + options.path, {
      method: request.method,
      headers: requestHeaders(request.headers, options.headers, options.hop),
      body,
      signal,
      redirect: "manual",
      // Streaming request bodies need half duplex in the fetch standard.
      ...(body instanceof ReadableStream ? { duplex: "half" } : {}),
    } as RequestInit);
  } catch (error) {
    if (watched !== undefined) hangUps!.done(watched);
    clearTimeout(boundTimer);
    if (signal.aborted) {
      // The head's bound or a gone node: the 504 it was aborted with. A hang-up: as it came.
      const reason = signal.reason;
      throw reason instanceof HttpError ? reason : error;
    }
    throw unreachable(target, error);
  }
  clearTimeout(boundTimer);
  const headers = upstream.headers;
  // A sized answer is on its way, and a hang-up while it flows cancels it (and the node's
  // connection with it); a streamed one (execCommand) may run long, so it is tied at once.
  if (watched !== undefined) hangUps!.done(watched, !headers.has("content-length"));
  for (const name of answerHopByHop) {
    if (headers.has(name)) {
      return new Response(upstream.body, {
        status: upstream.status,
        statusText: upstream.statusText,
        headers: copyHeaders(headers),
      });
    }
  }
  return upstream;
}

/**
 * Sends a request to a node and reads the whole answer (for create and destroy, whose outcome
 * the gateway must know). Returns the status, headers and the body text.
 *
 * @throws {HttpError} 502 when the node cannot be reached or stops answering mid-body.
 * @example
 * ```ts ignore
 * import { capture } from "@dormice/cluster/gateway";
 * const { status, text } = await capture({ nodeId: "a", endpoint: "http://127.0.0.1:3676" },
 *   "/acquireSandbox", { method: "POST", body: JSON.stringify({ name: "x" }) });
 * ```
 */
export async function capture(
  target: ForwardTarget,
  path: string,
  init: RequestInit & { fetch?: typeof fetch; timeoutMs?: number },
): Promise<{ status: number; headers: Headers; text: string }> {
  const { fetch: doFetch = fetch, timeoutMs, ...rest } = init;
  const bound = timeoutMs === undefined ? undefined : AbortSignal.timeout(timeoutMs);
  const signal = bound && rest.signal
    ? AbortSignal.any([rest.signal, bound])
    : bound ?? rest.signal;
  try {
    const res = await doFetch(target.endpoint + path, { ...rest, signal, redirect: "manual" });
    const text = await res.text();
    return { status: res.status, headers: res.headers, text };
  } catch (error) {
    if (bound?.aborted) {
      // The node may still finish what it was asked: say so rather than claim it failed.
      throw new HttpError(
        504,
        `Node '${target.nodeId}' at ${target.endpoint} did not finish ${path} within ` +
          `${timeoutMs} ms; it may still complete there: retry the same call, which is safe`,
        { details: { nodeId: target.nodeId } },
      );
    }
    if (rest.signal?.aborted) throw error;
    throw unreachable(target, error);
  }
}

/**
 * The 502 for a node that did not answer, with the cause an operator can act on.
 *
 * @example
 * ```ts
 * import { unreachable } from "@dormice/cluster/gateway";
 * const e = unreachable({ nodeId: "a", endpoint: "http://10.0.0.5:3676" }, new TypeError("Connection refused"));
 * console.log(e.status); // 502
 * ```
 */
export function unreachable(target: ForwardTarget, error: unknown): HttpError {
  return new HttpError(
    502,
    `Node '${target.nodeId}' at ${target.endpoint} did not answer (${
      describeFetchError(error)
    }): ` +
      `check that it is running, or remove it with removeNode once it is down`,
    { details: { nodeId: target.nodeId } },
  );
}

/**
 * A short cause for a failed fetch: ECONNREFUSED, a DNS failure, a timeout, or the message.
 *
 * @example
 * ```ts
 * import { describeFetchError } from "@dormice/cluster/gateway";
 * describeFetchError(new TypeError("tcp connect error: Connection refused")); // "connection refused"
 * ```
 */
export function describeFetchError(error: unknown): string {
  const e = error as { name?: string; message?: string; cause?: { code?: string } };
  if (e?.name === "TimeoutError") return "timed out";
  const text = `${e?.message ?? error} ${e?.cause?.code ?? ""}`;
  if (/ECONNREFUSED|Connection refused/i.test(text)) return "connection refused";
  if (/ECONNRESET|reset/i.test(text)) return "connection reset";
  if (/dns|ENOTFOUND|failed to lookup/i.test(text)) return "name not resolved";
  if (/certificate|tls|ssl/i.test(text)) return "TLS failure";
  return (e?.message ?? String(error)).slice(0, 200);
}
