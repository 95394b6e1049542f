/**
 * The HTTP server both daemons listen with: an HTTP engine (Deno's own, `deno`, or ours,
 * `bytes`) behind an accept loop of our own, because `Deno.serve` alone lets anyone without a token end the process. Measured on
 * Deno 2.9.6: under the usual 1024-descriptor limit, about a thousand idle TCP connections make
 * its accept fail with EMFILE, and that error ends its accept loop for good (the process stops
 * answering); and it never closes a connection that sends nothing, trickles its head or sits
 * idle after a request.
 *
 * Here every connection is watched: one that has not completed a request head within
 * `headerTimeoutMs` of its accept (or of its last answer) is closed, a kept-alive one with nothing
 * in flight is closed after `idleTimeoutMs`, at most `maxConnections` are open (the longest idle
 * one makes room for a new one), and running out of descriptors sheds the idle connections and
 * backs off instead of ending anything.
 *
 * The `deno` engine hands each accepted connection to Deno's own per-connection HTTP server
 * (`serveHttpOnConnection`, the one `node:http` uses), reached through `Deno[Deno.internal]`
 * because Deno has no public API that serves one connection. The Deno version is pinned
 * (`deno.lock`, `npx -y deno@2.9.6`); when a runtime lacks it this falls back to plain
 * `Deno.serve` and logs that the guard is off.
 *
 * That server cannot keep a WebSocket: it closes an upgraded socket once the handshake is
 * answered. With `upgrades` each connection goes to `Deno.serveHttp` instead, under the same
 * guard. Its differences, each measured and each handled here: it ends a connection's request
 * loop the moment the client hangs up but never aborts the `request.signal` of an answer still
 * being made (so the loop's end aborts it here); it compresses answers unasked (turned off with
 * `Cache-Control: no-transform`); it stops reading a request body once the answer is handed over
 * and resets the connection if the body was begun, so an early answer (a 413 at a cap) first
 * reads the rest, within a bound. What stays is its speed: 0.6–0.7× the requests per second.
 *
 * With `engine: "bytes"` each connection goes to the bytes engine instead (`server.ts`), with
 * `upgrades` or without: HTTP/1.1 written here on the socket, under the same guard, which can hand the
 * requests a `lane` claims to it before any `Request` is made (the gateway's routed verbs).
 * That engine counts its socket calls (`_progress.ts`), so a request in flight is bounded too:
 * a body that stops arriving is cut after `bodyTimeoutMs`, an answer the client stops reading
 * after `writeTimeoutMs`, each measured since the last call that ended, while a handler that is
 * merely slow (a long command) is never cut by the guard.
 *
 * The guard and its bounds are `_guard.ts`'s; each server behind it is one back end: Deno's
 * per-connection server and the bytes engine in `_backends.ts`, `Deno.serveHttp` in
 * `_serve_upgrading.ts`. TLS is the listener's (`tls`), the same for all three.
 *
 * @module
 */
import { type Clock, systemClock } from "../clock.ts";
import { type Log, silentLog } from "../log.ts";
import { StreamCut } from "../stream_cut.ts";
import type { BytesLane } from "./server.ts";
import { type Backend, ConnectionGuard, guardBounds } from "./_guard.ts";
import { bytesBackend, denoBackend, type OnError, serveOnConnection } from "./_backends.ts";
import { serveHttpBackend, serveHttpLegacy } from "./_serve_upgrading.ts";
import { ClosedEarly } from "./_wire.ts";

/**
 * Reads a daemon's WebSocket switch (`DORMICE_GATEWAY_WEBSOCKETS`, `DORMICE_WEBSOCKETS`):
 * `on` serves with {@linkcode GuardedServeOptions.upgrades}, `off` without, and unset (or
 * `auto`) gives `fallback`: the daemon's default (`false` when absent). Returns an Error naming
 * the variable for anything else.
 *
 * @example
 * ```ts
 * import { parseWebSocketSwitch } from "./serve.ts";
 * parseWebSocketSwitch("DORMICE_WEBSOCKETS", "on"); // true
 * parseWebSocketSwitch("DORMICE_WEBSOCKETS", undefined, true); // true: the default
 * ```
 */
export function parseWebSocketSwitch(
  name: string,
  raw: string | undefined,
  fallback = false,
): boolean | Error {
  const value = (raw ?? "").trim().toLowerCase();
  if (value === "" || value === "auto") return fallback;
  if (value === "off") return false;
  if (value === "on") return true;
  return new Error(
    `${name}='${(raw ?? "").slice(0, 20)}' is not a switch: set 'on' (WebSocket upgrades are ` +
      "relayed; on Deno's engine plain requests are then served by Deno.serveHttp, about 0.7x " +
      `the requests per second), 'off' (upgrades are answered 501) or leave it unset for the default (${
        fallback ? "on" : "off"
      } here)`,
  );
}

/** Options of {@linkcode serveGuarded}. */
export interface GuardedServeOptions {
  /** The address to listen on. */
  hostname: string;
  /** The port to listen on; `0` picks a free one (see {@linkcode GuardedServer.addr}). */
  port: number;
  /** The app: `app.fetch` of a Hono app fits. */
  handler: (
    request: Request,
    info: Deno.ServeHandlerInfo<Deno.NetAddr>,
  ) => Response | Promise<Response>;
  /**
   * Time a connection gets to deliver a whole request head, from its accept or from the end of
   * its last answer: 10 s, so a client on a slow link still gets in while a head trickled a
   * byte at a time (slowloris) is cut off.
   */
  headerTimeoutMs?: number;
  /**
   * Time a kept-alive connection may sit with nothing in flight after a request: 60 s, longer
   * than the SDKs' pools keep a socket idle, so a client's pooled socket is rarely closed under it.
   */
  idleTimeoutMs?: number;
  /**
   * Time the bytes engine waits for the next piece of a request's body it is reading: 60 s (as
   * nginx's `client_body_timeout`), so an upload on a slow link goes through while a body that
   * trickles to a halt (a slow POST) gives its connection back. A handler still at work, with
   * no read pending, is never cut by it.
   */
  bodyTimeoutMs?: number;
  /**
   * Time the bytes engine waits for one write of an answer to be taken by the client: 60 s (as
   * nginx's `send_timeout`), so a client that never reads its answer gives its connection, and
   * the node's answer behind it, back.
   */
  writeTimeoutMs?: number;
  /**
   * Most connections open at once: 8,192. At the cap the longest-idle connection is closed to
   * admit a new one; when every one is busy the new one is closed at once.
   */
  maxConnections?: number;
  /**
   * PEM certificate chain and private key (the text, not paths): the server then speaks HTTPS
   * (HTTP/1.1 over TLS, the same guard on every connection, a handshake counted against the
   * head timeout). Plain HTTP when absent.
   */
  tls?: { cert: string; key: string };
  /**
   * Whether a handler may upgrade a connection (`Deno.upgradeWebSocket`). Deno's per-connection
   * server (the `deno` engine's) closes an upgraded socket the moment its request loop ends, so
   * a WebSocket opens and then cannot carry a frame (measured on 2.9.6). With `true` each
   * connection is served by `Deno.serveHttp`, which keeps it, at a cost to plain requests
   * (measured: 0.6–0.7× the requests per second of a bare handler; see bench/RESULTS.md), or,
   * with `engine: "bytes"`, by the bytes engine, which splices `relayWebSocket`'s upgrades at no
   * cost to plain requests. With `false` (the default) an upgrade request is answered 501.
   */
  upgrades?: boolean;
  /**
   * The HTTP engine: `"deno"` (the default: Deno's per-connection server, or `Deno.serveHttp`
   * with `upgrades`) or `"bytes"` (`server.ts`, HTTP/1.1 written here on the socket, which
   * serves `lane`'s requests from their bytes). With `upgrades` the bytes engine takes the
   * upgrades `relayWebSocket` makes, as byte splices to the next hop (`_splice.ts`); a handler
   * that calls `Deno.upgradeWebSocket` itself needs the `"deno"` engine.
   */
  engine?: "deno" | "bytes";
  /** Called once the listener is bound. */
  onListen?: (addr: Deno.NetAddr) => void;
  /**
   * Answers an exception that escaped `handler`, or hears of an answer's body that failed (a
   * 500 saying so when absent; a body that failed with `StreamCut` is logged at `info`).
   */
  onError?: (error: unknown) => Response | Promise<Response>;
  /** Where descriptor exhaustion and evictions are logged (on change, not per connection). */
  log?: Log;
  /** Time source of the timeouts; `systemClock` when absent. */
  clock?: Clock;
  /**
   * How often the timeouts are checked, in ms; `0` turns the timer off and leaves it to
   * {@linkcode GuardedServer.sweep} (tests with a fake clock). A quarter of the shorter timeout,
   * between 250 ms and 5 s, when absent.
   */
  sweepIntervalMs?: number;
}

/**
 * {@linkcode serveGuarded}'s options with the gateway daemon's `lane`: a lane is built from the
 * gateway's internals, so it is not part of the package's surface.
 */
export interface DaemonServeOptions extends GuardedServeOptions {
  /** Requests the bytes engine answers from their bytes (the gateway's routed verbs). */
  lane?: BytesLane;
}

/** The running server. */
export interface GuardedServer {
  /** The bound address (the real port when `port` was 0). */
  readonly addr: Deno.NetAddr;
  /** Resolves when the server has stopped and every connection is closed. */
  readonly finished: Promise<void>;
  /** Connections open now. */
  connections(): number;
  /** Closes the connections past a timeout now; returns how many it closed. */
  sweep(): number;
  /**
   * Stops accepting, closes idle connections, and resolves once every in-flight request has
   * finished (bound it with `boundedShutdown`).
   */
  shutdown(): Promise<void>;
}

/**
 * Serves `handler` on `hostname:port` with the connection guard described in the module doc.
 *
 * Requires `--allow-net` for the address.
 *
 * @example
 * ```ts
 * import { serveGuarded } from "@dormice/cluster/shared";
 * const server = serveGuarded({ hostname: "127.0.0.1", port: 0, handler: () => new Response("ok") });
 * const res = await fetch(`http://127.0.0.1:${server.addr.port}/`);
 * console.log(await res.text()); // "ok"
 * await server.shutdown();
 * ```
 */
export function serveGuarded(options: GuardedServeOptions): GuardedServer {
  return serveDaemon(options);
}

/** {@linkcode serveGuarded} with a bytes lane: what the gateway daemon listens with. */
export function serveDaemon(options: DaemonServeOptions): GuardedServer {
  const log = options.log ?? silentLog;
  const onError = options.onError ?? logged(log);
  const serveOne = serveOnConnection();
  const serveLegacy = serveHttpLegacy();
  if (options.upgrades && !serveLegacy) {
    log("warn", "this Deno has no Deno.serveHttp: WebSocket upgrades are answered 501", {
      deno: Deno.version.deno,
    });
  }
  if (!serveOne) return unguarded(options, onError, log);

  const closing = new AbortController();
  const backend: Backend = options.engine === "bytes"
    ? bytesBackend(options.handler, onError, {
      upgrades: options.upgrades,
      tls: Boolean(options.tls),
      lane: options.lane,
      closing: closing.signal,
    })
    : options.upgrades && serveLegacy
    ? serveHttpBackend(serveLegacy, options.handler, onError)
    : denoBackend(serveOne, options.handler, onError);
  const guard = new ConnectionGuard(listen(options), backend, {
    bounds: guardBounds(options),
    clock: options.clock ?? systemClock,
    log,
    closing,
  });
  options.onListen?.(guard.addr);
  return {
    addr: guard.addr,
    finished: guard.finished,
    connections: () => guard.connections(),
    sweep: () => guard.sweep(),
    shutdown: () => guard.shutdown(),
  };
}

/** The default `onError`: a 500 saying the log has the details, and the error logged. */
function logged(log: Log): OnError {
  return (error: unknown) => {
    if (error instanceof StreamCut) {
      // A stream cut on purpose (its sandbox died): an event of the sandbox, not a failure.
      log("info", "a streamed answer was cut off", { reason: error.message });
    } else if (error instanceof ClosedEarly) {
      // An answer passed on from a server (the node behind the gateway) that closed before it
      // ended, usually because its sandbox was killed mid-stream: the client's connection is
      // closed unterminated, as the cut demands; nothing here failed.
      log("debug", "an upstream closed its answer before it ended", { reason: error.message });
      // Seen only when no byte was sent yet: the server behind did not answer whole.
      return new Response("Bad gateway: the server behind this one closed its answer early", {
        status: 502,
      });
    } else {
      log("error", "unexpected error answering a request", { error: String(error) });
    }
    return new Response("Internal error: the server's log has the details", { status: 500 });
  };
}

/** The listener: TLS when `tls` is given, plain TCP otherwise. */
function listen(options: GuardedServeOptions): Deno.Listener<Deno.TcpConn | Deno.TlsConn> {
  return options.tls
    ? Deno.listenTls({
      hostname: options.hostname,
      port: options.port,
      cert: options.tls.cert,
      key: options.tls.key,
      // HTTP/1.1 only: the per-connection server speaks it, and WebSocket upgrades need it.
      alpnProtocols: ["http/1.1"],
    })
    : Deno.listen({ hostname: options.hostname, port: options.port });
}

/** Plain `Deno.serve`, for a runtime without Deno's per-connection server: no guard. */
function unguarded(options: GuardedServeOptions, onError: OnError, log: Log): GuardedServer {
  log(
    "warn",
    "this Deno has no per-connection server: idle and slow connections are not bounded",
    {
      deno: Deno.version.deno,
    },
  );
  const server = Deno.serve({
    hostname: options.hostname,
    port: options.port,
    ...(options.tls ?? {}),
    onListen: (addr) => options.onListen?.(addr),
    onError,
  }, options.handler);
  return {
    addr: server.addr,
    finished: server.finished,
    connections: () => 0,
    sweep: () => 0,
    shutdown: () => server.shutdown(),
  };
}
