/**
 * The two ways a request crosses a hop to a sandbox port, shared by the gateway (client → node)
 * and the node (node → sandbox): an HTTP request streamed both ways, and a WebSocket relayed
 * message by message between the client's socket and one opened to the next hop.
 *
 * @module
 */

import { fromBytesEngine, openSplice, RelayOpenError } from "./http1/mod.ts";

/**
 * Headers that describe one hop, never the message (RFC 9110 §7.6.1), so no proxy passes them
 * on: the gateway's forward to a node and both port hops use this one list.
 */
export const hopByHopHeaders: readonly string[] = [
  "connection",
  "keep-alive",
  "proxy-connection",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "host",
  "content-length",
];

/** A port hop's: the hop's own, and WebSocket's handshake, which each hop makes anew. */
const hopByHop = new Set([
  ...hopByHopHeaders,
  "sec-websocket-key",
  "sec-websocket-version",
  "sec-websocket-extensions",
  "sec-websocket-protocol",
  "sec-websocket-accept",
]);

/**
 * The request's end-to-end headers, without those named in `drop`, then `extra` over them.
 *
 * @example
 * ```ts
 * import { endToEndHeaders } from "./port_proxy.ts";
 * const h = endToEndHeaders(new Headers({ connection: "close", "x-a": "1" }), { "x-b": "2" });
 * console.log([...h.keys()]); // ["x-a", "x-b"]
 * ```
 */
export function endToEndHeaders(
  from: Headers,
  extra: Readonly<Record<string, string>> = {},
  drop: readonly string[] = [],
): Headers {
  const out = new Headers();
  for (const [k, v] of from) if (!hopByHop.has(k) && !drop.includes(k)) out.append(k, v);
  for (const k in extra) out.set(k, extra[k]);
  return out;
}

/**
 * True when the request asks to become a WebSocket.
 *
 * @example
 * ```ts
 * import { isWebSocketUpgrade } from "./port_proxy.ts";
 * isWebSocketUpgrade(new Request("http://x/", { headers: { upgrade: "websocket" } })); // true
 * ```
 */
export function isWebSocketUpgrade(request: Request): boolean {
  return request.headers.get("upgrade")?.toLowerCase() === "websocket";
}

/** Options of {@linkcode relayWebSocket}. */
export interface RelayOptions {
  /** Headers for the next hop's handshake (end-to-end ones, and the hop's own). */
  headers?: Headers;
  /** How long the next hop gets to accept the handshake: 10 s. */
  openTimeoutMs?: number;
  /**
   * Bytes from the next hop held while the client's socket is still opening: 4 MiB. Past it
   * both sockets are closed with 1009 (message too big) rather than buffered without bound.
   */
  maxQueuedBytes?: number;
}

export { RelayOpenError } from "./http1/mod.ts";

/**
 * Opens a WebSocket to `url` first (so a next hop that refuses is an HTTP error the caller can
 * shape), then upgrades the client's `request` with the subprotocol the next hop chose and
 * relays messages both ways; a close on either side closes the other with the same code where
 * the code may be sent on (1000, 3000–4999), 1000 otherwise.
 *
 * @throws {RelayOpenError} when the next hop refuses the handshake or does not answer in time.
 * @example
 * ```ts ignore
 * import { relayWebSocket } from "./port_proxy.ts";
 * Deno.serve((request) => relayWebSocket(request, "ws://127.0.0.1:8000/socket"));
 * ```
 */
export async function relayWebSocket(
  request: Request,
  url: string,
  options: RelayOptions = {},
): Promise<Response> {
  const openTimeoutMs = options.openTimeoutMs ?? 10_000;
  if (fromBytesEngine(request)) {
    // The bytes engine splices: the client's handshake goes on to the next hop, then bytes.
    return await openSplice(request, url, options.headers ?? new Headers(), openTimeoutMs);
  }
  const maxQueuedBytes = options.maxQueuedBytes ?? 4 * 1024 * 1024;
  const protocols = (request.headers.get("sec-websocket-protocol") ?? "").split(",")
    .map((p) => p.trim()).filter((p) => p !== "");
  const headers: Record<string, string> = {};
  for (const [k, v] of options.headers ?? []) headers[k] = v;
  // Deno's WebSocket takes handshake headers as a second-argument option.
  const upstream = new WebSocket(url, { headers, protocols } as unknown as string[]);
  upstream.binaryType = "arraybuffer";
  const early: (string | ArrayBuffer)[] = [];
  let earlyBytes = 0;
  const held: { client?: WebSocket } = {};
  upstream.onmessage = (e) => {
    if (held.client?.readyState === WebSocket.OPEN) return held.client.send(e.data);
    early.push(e.data);
    earlyBytes += typeof e.data === "string" ? e.data.length : e.data.byteLength;
    if (earlyBytes > maxQueuedBytes) {
      upstream.close(1009, "too much data before the client's socket opened");
      held.client?.close(1009);
    }
  };
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      upstream.close();
      reject(new RelayOpenError(`no WebSocket handshake within ${openTimeoutMs} ms`, true));
    }, openTimeoutMs);
    upstream.onopen = () => {
      clearTimeout(timer);
      resolve();
    };
    upstream.onerror = (e) => {
      clearTimeout(timer);
      reject(
        new RelayOpenError((e as ErrorEvent).message || "the WebSocket handshake failed", false),
      );
    };
  });
  const upgraded = Deno.upgradeWebSocket(request, {
    protocol: upstream.protocol === "" ? undefined : upstream.protocol,
    idleTimeout: 0,
  });
  const socket = upgraded.socket;
  held.client = socket;
  socket.binaryType = "arraybuffer";
  socket.onopen = () => {
    for (const m of early.splice(0)) socket.send(m);
    earlyBytes = 0;
    // The next hop may have closed while the client's socket was opening.
    if (upstream.readyState >= WebSocket.CLOSING) socket.close(1000);
  };
  socket.onmessage = (e) => {
    if (upstream.readyState === WebSocket.OPEN) upstream.send(e.data);
  };
  socket.onclose = (e) => closeQuietly(upstream, e.code, e.reason);
  socket.onerror = () => closeQuietly(upstream, 1000, "");
  upstream.onclose = (e) => {
    if (socket.readyState === WebSocket.OPEN) closeQuietly(socket, e.code, e.reason);
  };
  upstream.onerror = () => closeQuietly(socket, 1000, "");
  return upgraded.response;
}

function closeQuietly(ws: WebSocket, code: number, reason: string): void {
  if (ws.readyState >= WebSocket.CLOSING) return;
  const sendable = code === 1000 || (code >= 3000 && code <= 4999);
  try {
    ws.close(sendable ? code : 1000, sendable ? reason.slice(0, 120) : undefined);
  } catch {
    // Already closing on its own.
  }
}
