/**
 * Forwarding a client's request to the node that holds its sandbox: streamed both ways, or
 * captured when the gateway must read the node's answer (create and destroy).
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";

/** Headers that describe one hop, never the message, so they are not passed on (RFC 9110 §7.6.1). */
const hopByHop = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "host",
  "content-length",
]);

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
  headers?: Record<string, string>;
  /** A body to send instead of the client's (e.g. one already read to route on). */
  body?: BodyInit | null;
  /** The fetch to use (injected in tests). */
  fetch?: typeof fetch;
  /** Aborts the node's request; defaults to the client's own signal (a hang-up stops the node). */
  signal?: AbortSignal;
}

function copyHeaders(from: Headers, extra?: Record<string, string>): Headers {
  const out = new Headers();
  for (const [k, v] of from) if (!hopByHop.has(k)) out.set(k, v);
  if (extra) { for (const [k, v] of Object.entries(extra)) out.set(k, v); }
  return out;
}

/**
 * Sends `request` to `target` and answers with the node's response as soon as its head arrives,
 * the body flowing as it comes. A client that hangs up aborts the node's request; a node that
 * does not answer is a 502 naming it.
 *
 * @throws {HttpError} 502 when the node cannot be reached.
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
  const signal = options.signal ?? request.signal;
  const hasBody = request.method !== "GET" && request.method !== "HEAD";
  const body = options.body !== undefined ? options.body : hasBody ? request.body : null;
  let upstream: Response;
  try {
    upstream = await doFetch(target.endpoint + options.path, {
      method: request.method,
      headers: copyHeaders(request.headers, options.headers),
      body,
      signal,
      redirect: "manual",
      // Streaming request bodies need half duplex in the fetch standard.
      ...(body instanceof ReadableStream ? { duplex: "half" } : {}),
    } as RequestInit);
  } catch (error) {
    if (signal.aborted) throw error;
    throw unreachable(target, error);
  }
  return new Response(upstream.body, {
    status: upstream.status,
    statusText: upstream.statusText,
    headers: copyHeaders(upstream.headers),
  });
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

/** The 502 for a node that did not answer, with the cause an operator can act on. */
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

/** A short cause for a failed fetch: ECONNREFUSED, a DNS failure, a timeout, or the message. */
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
