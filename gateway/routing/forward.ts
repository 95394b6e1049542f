/**
 * Forwarding a client's request to the node that holds its sandbox: streamed both ways, or
 * captured when the gateway must read the node's answer (create and destroy).
 *
 * @module
 */
import { HOP_HEADER, nextHop } from "../door.ts";
import { describeFetchFailure } from "../../shared/fetch_failure.ts";
import { HttpError } from "../../shared/http_error.ts";
import { hopByHopHeaders } from "../../shared/port_proxy.ts";
import { LEDGER_SEQ_HEADER } from "../../shared/schemas.ts";
import { systemTimers, type TimerHandle, type Timers } from "../../shared/clock.ts";
import { type ForwardTarget, type HangUpWatch, headTimeout } from "../../shared/hang_up_watch.ts";

// The watch over the forwards waiting for their head is the gateway's too: its names stay here.
export {
  type ForwardTarget,
  HangUpWatch,
  type HangUpWatchOptions,
  WatchedForward,
} from "../../shared/hang_up_watch.ts";

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
  /** The timers the head's bound runs on without `hangUps` (default the real ones). */
  timers?: Timers;
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

/** `body`, passed on as it comes, calling `onEnd` once its last byte has been read. */
function noticingEnd(body: ReadableStream<Uint8Array>, onEnd: () => void): ReadableStream {
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({ flush: () => onEnd() }),
  );
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
  const { hangUps, headTimeoutMs, timers = systemTimers } = options;
  const watched = options.signal === undefined
    ? hangUps?.watch(request, target, headTimeoutMs)
    : undefined;
  // Without a watch, the head's bound gets a timer of its own.
  let bound: AbortController | undefined;
  let boundTimer: TimerHandle | undefined;
  const startBound = () => {
    if (watched !== undefined) hangUps!.bodySent(watched);
    else if (bound !== undefined && boundTimer === undefined) {
      boundTimer = timers.setTimer(
        () => bound!.abort(headTimeout(target, headTimeoutMs!)),
        headTimeoutMs!,
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
    timers.clearTimer(boundTimer);
    if (signal.aborted) {
      // The head's bound or a gone node: the 504 it was aborted with. A hang-up: as it came.
      const reason = signal.reason;
      throw reason instanceof HttpError ? reason : error;
    }
    throw unreachable(target, error);
  }
  timers.clearTimer(boundTimer);
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
 * import { unreachable } from "./forward.ts";
 * const e = unreachable({ nodeId: "a", endpoint: "http://10.0.0.5:3676" }, new TypeError("Connection refused"));
 * console.log(e.status); // 502
 * ```
 */
export function unreachable(target: ForwardTarget, error: unknown): HttpError {
  return new HttpError(
    502,
    `Node '${target.nodeId}' at ${target.endpoint} did not answer (${
      describeFetchFailure(error)
    }): ` +
      `check that it is running, or remove it with removeNode once it is down`,
    { details: { nodeId: target.nodeId } },
  );
}
