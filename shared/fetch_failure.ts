/**
 * The one sentence for why a fetch failed, used wherever a failure names its cause (a node's
 * check-in, the gateway's forward to a node, a webhook delivery, an etcd member): the error's
 * code with what it means (ECONNREFUSED, ECONNRESET), DNS, TLS, a timeout, or the error's own
 * text cut to a bounded length.
 *
 * @module
 */

const cut = (text: string, n = 400): string => text.length > n ? text.slice(0, n) + "…" : text;

/**
 * Names the real cause of a failed fetch: ECONNREFUSED, DNS, TLS, ECONNRESET, a timeout, or the
 * error's text (at most 400 characters). `timeoutMs`, when the caller knows its bound, is named
 * in the timeout's sentence.
 *
 * @example
 * ```ts
 * import { describeFetchFailure } from "./fetch_failure.ts";
 * describeFetchFailure(new DOMException("t", "TimeoutError"), 5000); // "timeout: no answer within 5000 ms"
 * describeFetchFailure(new TypeError("tcp connect error: Connection refused")); // "ECONNREFUSED: …"
 * ```
 */
export function describeFetchFailure(error: unknown, timeoutMs?: number): string {
  const e = error as { name?: string; message?: string; cause?: unknown };
  if (e?.name === "TimeoutError") {
    return timeoutMs === undefined
      ? "timeout: no answer in time"
      : `timeout: no answer within ${timeoutMs} ms`;
  }
  const cause = e?.cause as { code?: unknown } | undefined;
  const causeText = cause instanceof Error || typeof cause === "string"
    ? String(cause)
    : typeof cause?.code === "string"
    ? cause.code
    : "";
  const text = `${e?.message ?? String(error)} ${causeText}`.trim();
  if (/connection refused|ECONNREFUSED/i.test(text)) {
    return "ECONNREFUSED: nothing listens at that address and port";
  }
  if (/dns error|failed to lookup|ENOTFOUND|EAI_AGAIN|name or service not known/i.test(text)) {
    return `DNS: the host name does not resolve (${cut(text, 200)})`;
  }
  if (/certificate|tls|ssl|handshake/i.test(text)) return `TLS: ${cut(text, 300)}`;
  if (/connection reset|ECONNRESET/i.test(text)) return "ECONNRESET: the connection was reset";
  return cut(text);
}
