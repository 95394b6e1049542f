/**
 * Two of the back ends {@linkcode serveGuarded} (serve.ts) hands a guarded connection to: the
 * `deno` engine's Deno's per-connection server (`serveHttpOnConnection`, the one `node:http`
 * uses), and the `bytes` engine (`server.ts`, HTTP/1.1 written here on the socket). The third,
 * `Deno.serveHttp` for the `deno` engine with upgrades, is `_serve_upgrading.ts`'s.
 *
 * @module
 */
import type { Backend } from "./_guard.ts";
import { type BytesLane, serveH1 } from "./server.ts";

/** A request handler, as `serveGuarded` takes it. */
export type Handler = (
  request: Request,
  info: Deno.ServeHandlerInfo<Deno.NetAddr>,
) => Response | Promise<Response>;

/** What answers an exception that escaped the handler. */
export type OnError = (error: unknown) => Response | Promise<Response>;

type ServeOnConnection = (
  conn: Deno.Conn,
  signal: AbortSignal,
  handler: Handler,
  onError: OnError,
  onListen: (scheme: string) => void,
) => { finished: Promise<void> };

/**
 * Deno's per-connection server, reached through `Deno[Deno.internal]` because Deno has no public
 * API that serves one connection; undefined on a runtime without it.
 */
export function serveOnConnection(): ServeOnConnection | undefined {
  // deno-lint-ignore no-explicit-any
  const internal = (Deno as any)[(Deno as any).internal];
  const fn = internal?.serveHttpOnConnection;
  return typeof fn === "function" ? fn : undefined;
}

/**
 * Whether `request` asks to become a WebSocket. Other upgrades (`h2c` from `curl --http2`) are
 * offers a server may ignore, and both engines answer them as HTTP/1.1.
 */
function asksWebSocket(request: Request): boolean {
  return request.headers.get("upgrade")?.toLowerCase() === "websocket";
}

function notUpgradable(): Response {
  return Response.json({
    code: 501,
    message: "This server takes no WebSocket upgrades: a daemon takes them on sandbox ports " +
      "unless they are turned off (DORMICE_GATEWAY_WEBSOCKETS=on on a gateway without a " +
      "sandbox domain, DORMICE_WEBSOCKETS unset or on for nodes); an embedder passes " +
      "`upgrades: true` to serveGuarded",
  }, { status: 501 });
}

/**
 * The `deno` engine without upgrades: Deno's per-connection server `serveOne`. It closes an
 * upgraded socket once the handshake is answered, so a WebSocket upgrade is answered 501.
 */
export function denoBackend(
  serveOne: ServeOnConnection,
  handler: Handler,
  onError: OnError,
): Backend {
  return (conn, c, answered) =>
    serveOne(
      conn,
      c.stop.signal,
      (request, info) => {
        c.inFlight++;
        info.completed.catch(() => {}).finally(() => answered(c));
        if (asksWebSocket(request)) return notUpgradable();
        return handler(request, info);
      },
      onError,
      () => {},
    ).finished;
}

/**
 * The `bytes` engine: HTTP/1.1 of our own on the socket (`server.ts`), which serves `lane`'s
 * requests from their bytes and counts its socket calls. With `upgrades`, `relayWebSocket`
 * splices them (`_splice.ts`); without, a WebSocket upgrade is answered 501. `closing` ends the
 * splices at shutdown.
 */
export function bytesBackend(
  handler: Handler,
  onError: OnError,
  options: { upgrades?: boolean; tls: boolean; lane?: BytesLane; closing: AbortSignal },
): Backend {
  return (conn, c, answered) => {
    // An answer is one write, sent at once: nothing to gain from Nagle's wait for an ACK.
    if ("setNoDelay" in conn) conn.setNoDelay(true);
    return serveH1(conn, {
      handler: options.upgrades
        ? handler
        : (request, info) => asksWebSocket(request) ? notUpgradable() : handler(request, info),
      closing: options.closing,
      onError,
      scheme: options.tls ? "https" : "http",
      stop: c.stop.signal,
      begun: () => c.inFlight++,
      ended: () => answered(c),
      lane: options.lane,
      progress: c.progress,
    });
  };
}
