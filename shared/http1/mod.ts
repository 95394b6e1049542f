/**
 * HTTP/1.1 of our own, both directions, on `Deno.Conn`: the guarded server
 * ({@linkcode serveGuarded}, which runs Deno's server or the bytes engine {@linkcode serveH1}), the
 * pooled client to the nodes ({@linkcode createH1Client}), and the framing they share. Each rule
 * about heads, Content-Length, chunked bodies and their conflicts lives once, in this folder's
 * private files; this file is the only one imported from outside it.
 *
 * @example
 * ```ts ignore
 * import { serveGuarded } from "./mod.ts";
 * const server = serveGuarded({ hostname: "127.0.0.1", port: 0, handler: () => new Response("ok") });
 * await server.shutdown();
 * ```
 *
 * @module
 */
export {
  type DaemonServeOptions,
  type GuardedServeOptions,
  type GuardedServer,
  parseWebSocketSwitch,
  serveDaemon,
  serveGuarded,
} from "./serve.ts";
export {
  type BytesLane,
  type H1ServeOptions,
  HeadError,
  type LaneExchange,
  RequestHead,
  sentUrl,
  serveH1,
} from "./server.ts";
export {
  type BytesAnswer,
  type Cancel,
  createH1Client,
  type H1Client,
  type H1ClientOptions,
} from "./client.ts";
export { type RawHead } from "./_head.ts";
export { octets, sameName } from "./_head.ts";
export { Carver, writeBody } from "./_answer.ts";
export { fromBytesEngine, openSplice, RelayOpenError } from "./_splice.ts";
export {
  connectWebSocket,
  type WireListener,
  WireWebSocket,
  type WireWebSocketOptions,
} from "./ws_client.ts";
export type { Progress } from "./_progress.ts";
