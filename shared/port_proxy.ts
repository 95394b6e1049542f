/**
 * The two ways a request crosses a hop to a sandbox port, shared by the gateway (client → node)
 * and the node (node → sandbox): an HTTP request streamed both ways, and a WebSocket relayed
 * message by message between the client's socket and one opened to the next hop.
 *
 * @module
 */

import {
  connectWebSocket,
  fromBytesEngine,
  openSplice,
  RelayOpenError,
  type WireListener,
} from "./http1/mod.ts";

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
  /**
   * The Host the next hop's handshake shows, instead of the URL's authority (E2B's
   * `maskRequestHost`): the hop is then opened with our own client (`connectWebSocket`), since
   * Deno's `WebSocket` sends the URL's.
   */
  host?: string;
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
  const headers = options.headers ?? new Headers();
  if (fromBytesEngine(request)) {
    // The bytes engine splices: the client's handshake goes on to the next hop, then bytes.
    return await openSplice(request, url, headers, openTimeoutMs, options.host);
  }
  const protocols = (request.headers.get("sec-websocket-protocol") ?? "").split(",")
    .map((p) => p.trim()).filter((p) => p !== "");
  const upstream = options.host === undefined
    ? await openStandard(url, headers, protocols, openTimeoutMs)
    : await connectWebSocket(url, { host: options.host, headers, protocols, openTimeoutMs });
  return bridge(request, upstream, options.maxQueuedBytes ?? 4 * 1024 * 1024);
}

/** The next hop as the relay drives it, whichever client opened it. */
interface Hop {
  readonly protocol: string;
  readonly open: boolean;
  send(data: string | ArrayBuffer): void;
  close(code: number, reason?: string): void;
  /** Starts handing over messages and the end; nothing is lost before it is called. */
  listen(listener: WireListener): void;
}

/** Opens the next hop with Deno's `WebSocket`, resolved once it is open. */
async function openStandard(
  url: string,
  headers: Headers,
  protocols: string[],
  openTimeoutMs: number,
): Promise<Hop> {
  const init: Record<string, string> = {};
  for (const [k, v] of headers) init[k] = v;
  // Deno's WebSocket takes handshake headers as a second-argument option.
  const ws = new WebSocket(url, { headers: init, protocols } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      ws.close();
      reject(new RelayOpenError(`no WebSocket handshake within ${openTimeoutMs} ms`, true));
    }, openTimeoutMs);
    ws.onopen = () => {
      clearTimeout(timer);
      resolve();
    };
    ws.onerror = (e) => {
      clearTimeout(timer);
      reject(
        new RelayOpenError((e as ErrorEvent).message || "the WebSocket handshake failed", false),
      );
    };
  });
  // A message may be dispatched before this function's caller runs again (it can come with the
  // 101): what arrives before `listen` waits for it, as the end does.
  let listener: WireListener | undefined;
  const waiting: (string | ArrayBuffer)[] = [];
  let ended: [number, string] | undefined;
  ws.onmessage = (e) => listener ? listener.message(e.data) : waiting.push(e.data);
  ws.onclose = (e) => listener ? listener.close(e.code, e.reason) : ended ??= [e.code, e.reason];
  ws.onerror = () => listener ? listener.close(1006, "") : ended ??= [1006, ""];
  return {
    protocol: ws.protocol,
    get open() {
      return ws.readyState === WebSocket.OPEN;
    },
    send: (data) => ws.send(data),
    close: (code, reason) => closeQuietly(ws, code, reason ?? ""),
    listen(l) {
      listener = l;
      for (const m of waiting.splice(0)) l.message(m);
      if (ended) l.close(...ended);
    },
  };
}

/**
 * Upgrades the client's `request` with the subprotocol `upstream` chose and relays messages
 * both ways; what the next hop sends while the client's socket opens waits, up to
 * `maxQueuedBytes`.
 */
function bridge(request: Request, upstream: Hop, maxQueuedBytes: number): Response {
  const early: (string | ArrayBuffer)[] = [];
  let earlyBytes = 0;
  const upgraded = Deno.upgradeWebSocket(request, {
    protocol: upstream.protocol === "" ? undefined : upstream.protocol,
    idleTimeout: 0,
  });
  const socket = upgraded.socket;
  socket.binaryType = "arraybuffer";
  upstream.listen({
    message(data) {
      if (socket.readyState === WebSocket.OPEN) return socket.send(data);
      early.push(data);
      earlyBytes += typeof data === "string" ? data.length : data.byteLength;
      if (earlyBytes > maxQueuedBytes) {
        upstream.close(1009, "too much data before the client's socket opened");
        closeQuietly(socket, 1009, "");
      }
    },
    close(code, reason) {
      if (socket.readyState === WebSocket.OPEN) closeQuietly(socket, code, reason);
    },
  });
  socket.onopen = () => {
    for (const m of early.splice(0)) socket.send(m);
    earlyBytes = 0;
    // The next hop may have closed while the client's socket was opening.
    if (!upstream.open) socket.close(1000);
  };
  socket.onmessage = (e) => {
    if (upstream.open) upstream.send(e.data);
  };
  socket.onclose = (e) => upstream.close(e.code, e.reason);
  socket.onerror = () => upstream.close(1000, "");
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
