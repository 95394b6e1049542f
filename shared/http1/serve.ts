/**
 * The HTTP server both daemons listen with: `Deno.serve`'s HTTP engine behind an accept loop of
 * our own, because `Deno.serve` alone lets anyone without a token end the process. Measured on
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
 * It hands each accepted connection to Deno's own per-connection HTTP server
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
 * With `engine: "bytes"` (and no `upgrades`) each connection goes to the bytes engine instead
 * (`server.ts`): HTTP/1.1 written here on the socket, under the same guard, which can hand the
 * requests a `lane` claims to it before any `Request` is made (the gateway's routed verbs).
 * That engine counts its socket calls (`_progress.ts`), so a request in flight is bounded too:
 * a body that stops arriving is cut after `bodyTimeoutMs`, an answer the client stops reading
 * after `writeTimeoutMs`, each measured since the last call that ended, while a handler that is
 * merely slow (a long command) is never cut by the guard.
 *
 * @module
 */
import { type Clock, systemClock } from "../clock.ts";
import { ChangeLog, type Log, silentLog } from "../log.ts";
import { StreamCut } from "../stream_cut.ts";
import { type BytesLane, serveH1 } from "./server.ts";
import { type Progress, StallWatch, unmetered } from "./_progress.ts";
import {
  acceptsCompression,
  DrainableBody,
  type RequestEvent,
  serveHttpLegacy,
  uncompressed,
} from "./_serve_upgrading.ts";

/**
 * Reads a daemon's WebSocket switch (`DORMICE_GATEWAY_WEBSOCKETS`, `DORMICE_WEBSOCKETS`):
 * `on` serves with {@linkcode GuardedServeOptions.upgrades}, `off` without, and unset (or
 * `auto`) gives `fallback`: the daemon's default (`false` when absent). Returns an Error naming
 * the variable for anything else.
 *
 * @example
 * ```ts
 * import { parseWebSocketSwitch } from "@dormice/cluster/shared";
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
   * Whether a handler may upgrade a connection (`Deno.upgradeWebSocket`). Deno's fastest
   * per-connection server closes an upgraded socket the moment its request loop ends, so a
   * WebSocket opens and then cannot carry a frame (measured on 2.9.6). With `true` each
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
  /** Requests the bytes engine answers from their bytes (the gateway's routed verbs). */
  lane?: BytesLane;
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

/** How long a connection is left open after its last answer when it is closed for shutdown. */
const FLUSH_GRACE_MS = 100;

/** One accepted connection and what it is doing. */
interface Watched {
  /** Aborting it makes Deno's per-connection server close the connection. */
  stop: AbortController;
  /** Requests whose answer is not fully sent yet. */
  inFlight: number;
  /** Since when it has been waiting for a request head (`inFlight === 0`), in ms. */
  waitingSince: number;
  /** True once a request has been answered: it is then a kept-alive connection. */
  served: boolean;
  /** Settles when Deno's server for this connection has closed it. */
  done: Promise<void>;
  /** Its reads and writes, counted by the bytes engine (Deno's engines count none). */
  progress: Progress;
  /** What the last sweeps saw of them. */
  stalls: StallWatch;
}

type ServeOnConnection = (
  conn: Deno.Conn,
  signal: AbortSignal,
  handler: (
    request: Request,
    info: Deno.ServeHandlerInfo<Deno.NetAddr>,
  ) => Response | Promise<Response>,
  onError: (error: unknown) => Response | Promise<Response>,
  onListen: (scheme: string) => void,
) => { finished: Promise<void> };

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

function serveOnConnection(): ServeOnConnection | undefined {
  // deno-lint-ignore no-explicit-any
  const internal = (Deno as any)[(Deno as any).internal];
  const fn = internal?.serveHttpOnConnection;
  return typeof fn === "function" ? fn : undefined;
}

/** An accept error that means "out of descriptors": shed and retry, never stop. */
function outOfDescriptors(error: unknown): boolean {
  const message = (error as Error)?.message ?? "";
  return /os error (23|24)\b|Too many open files/i.test(message);
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
  const log = options.log ?? silentLog;
  const onError = options.onError ??
    ((error: unknown) => {
      if (error instanceof StreamCut) {
        // A stream cut on purpose (its sandbox died): an event of the sandbox, not a failure.
        log("info", "a streamed answer was cut off", { reason: error.message });
      } else {
        log("error", "unexpected error answering a request", { error: String(error) });
      }
      return new Response("Internal error: the server's log has the details", { status: 500 });
    });
  const serveOne = serveOnConnection();
  const serveLegacy = serveHttpLegacy();
  if (options.upgrades && !serveLegacy) {
    log("warn", "this Deno has no Deno.serveHttp: WebSocket upgrades are answered 501", {
      deno: Deno.version.deno,
    });
  }
  if (!serveOne) {
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

  const clock = options.clock ?? systemClock;
  const headerTimeoutMs = options.headerTimeoutMs ?? 10_000;
  const idleTimeoutMs = options.idleTimeoutMs ?? 60_000;
  const bodyTimeoutMs = options.bodyTimeoutMs ?? 60_000;
  const writeTimeoutMs = options.writeTimeoutMs ?? 60_000;
  const maxConnections = options.maxConnections ?? 8_192;
  const changes = new ChangeLog(log);
  const listener: Deno.Listener<Deno.TcpConn | Deno.TlsConn> = options.tls
    ? Deno.listenTls({
      hostname: options.hostname,
      port: options.port,
      cert: options.tls.cert,
      key: options.tls.key,
      // HTTP/1.1 only: the per-connection server speaks it, and WebSocket upgrades need it.
      alpnProtocols: ["http/1.1"],
    })
    : Deno.listen({ hostname: options.hostname, port: options.port });
  const addr = listener.addr as Deno.NetAddr;
  const open = new Set<Watched>();
  let stopping = false;
  /** Aborted at shutdown: the bytes engine's WebSocket splices end then, as nothing else does. */
  const closing = new AbortController();

  const close = (c: Watched) => {
    if (c.stop.signal.aborted || !open.has(c)) return;
    try {
      c.stop.abort();
    } catch {
      // The connection ended between the check and the abort: nothing left to close.
    }
  };
  // Deno reports an answer complete once it holds the bytes, not once they are on the wire:
  // closing at that moment cuts the answer off (measured), so a close right after an answer waits.
  const closeAfterFlush = (c: Watched) => setTimeout(() => close(c), FLUSH_GRACE_MS);
  const idle = (c: Watched) => c.inFlight === 0;
  /** Closes idle connections, the longest-waiting first, `limit` of them at most. */
  const shed = (limit: number): number => {
    const candidates = [...open].filter(idle).sort((a, b) => a.waitingSince - b.waitingSince);
    const victims = candidates.slice(0, limit);
    victims.forEach(close);
    return victims.length;
  };
  const sweep = (): number => {
    const now = clock.now();
    let n = 0;
    for (const c of open) {
      if (c.stop.signal.aborted) continue;
      if (!idle(c)) {
        // A request in flight: only a client that stopped sending its body or reading its
        // answer is cut; the handler's own time is the handler's to bound.
        const { waiting, ms } = c.stalls.check(c.progress, now);
        if (waiting !== undefined && ms >= (waiting === "write" ? writeTimeoutMs : bodyTimeoutMs)) {
          close(c);
          n++;
        }
        continue;
      }
      // A kept-alive connection gets the idle bound for its next head too: nobody can tell an
      // idle socket from one whose first head byte is late.
      const bound = c.served ? idleTimeoutMs : headerTimeoutMs;
      if (now - c.waitingSince >= bound) {
        close(c);
        n++;
      }
    }
    return n;
  };

  /** The end of one answer: the connection waits for its next head from now. */
  const answered = (c: Watched) => {
    c.inFlight--;
    c.served = true;
    c.waitingSince = clock.now();
    if (stopping && c.inFlight === 0) closeAfterFlush(c);
  };

  /** The fast engine: Deno's per-connection server. */
  const serveFast = (conn: Deno.TcpConn | Deno.TlsConn, c: Watched): Promise<void> =>
    serveOne!(
      conn,
      c.stop.signal,
      (request, info) => {
        c.inFlight++;
        info.completed.catch(() => {}).finally(() => answered(c));
        if (asksWebSocket(request)) return notUpgradable();
        return options.handler(request, info);
      },
      onError,
      () => {},
    ).finished;

  /**
   * The upgrading engine: `Deno.serveHttp`. Once a request upgrades, its loop ends and the
   * socket belongs to the handler's WebSocket, outside this guard's count.
   */
  const serveUpgrading = async (conn: Deno.TcpConn | Deno.TlsConn, c: Watched): Promise<void> => {
    const http = serveLegacy!(conn);
    c.stop.signal.addEventListener("abort", () => {
      try {
        http.close();
      } catch {
        // Closed already (the client left, or the connection upgraded).
      }
    }, { once: true });
    const remoteAddr = conn.remoteAddr as Deno.NetAddr;
    /** The requests of this connection whose answer is not sent: their hang-up signals. */
    const unanswered = new Set<AbortController>();
    try {
      for await (const event of http) {
        c.inFlight++;
        const hangUp = new AbortController();
        unanswered.add(hangUp);
        void answer(event, remoteAddr, hangUp, () => unanswered.delete(hangUp))
          .finally(() => {
            unanswered.delete(hangUp);
            answered(c);
          });
      }
    } finally {
      // This server ends a connection's request loop as soon as the client hangs up, even with
      // an answer still being made (measured), but never tells that answer's request.signal: a
      // proxy would wait for its upstream's head for nothing. So the loop's end is the signal.
      for (const hangUp of unanswered) {
        hangUp.abort(new Deno.errors.ConnectionReset("the client hung up"));
      }
    }
  };

  const answer = async (
    event: RequestEvent,
    remoteAddr: Deno.NetAddr,
    hangUp: AbortController,
    upgraded: () => void,
  ): Promise<void> => {
    let sent!: () => void;
    let failed!: (error: unknown) => void;
    const completed = new Promise<void>((resolve, reject) => {
      sent = resolve;
      failed = reject;
    });
    completed.catch(() => {});
    const compressible = acceptsCompression(event.request);
    const body = event.request.body === null ? null : new DrainableBody(event.request.body);
    // The server's own signal (it aborts once the answer is done) or the hang-up, first of both.
    const signal = AbortSignal.any([event.request.signal, hangUp.signal]);
    const request = new Request(
      event.request,
      (body === null ? { signal } : { body: body.stream, duplex: "half", signal }) as RequestInit,
    );
    let response: Response;
    try {
      response = await options.handler(request, { remoteAddr, completed });
    } catch (error) {
      response = await onError(error);
    }
    // An upgraded connection's loop ends with the handshake: that is no hang-up.
    if (response.status === 101) upgraded();
    if (compressible) response = uncompressed(response);
    if (body?.unfinished) await body.drain();
    try {
      await event.respondWith(response);
      sent();
    } catch (error) {
      failed(error);
      // A client that left is no error of ours; a body that failed on purpose or by a bug is.
      if (!(error instanceof Deno.errors.Http || error instanceof Deno.errors.BadResource)) {
        await onError(error);
      } else if ((error as Error).cause instanceof StreamCut) await onError((error as Error).cause);
    }
  };

  /** The bytes engine: HTTP/1.1 of our own on the socket (`server.ts`). */
  const serveBytes = (conn: Deno.TcpConn | Deno.TlsConn, c: Watched): Promise<void> => {
    // An answer is one write, sent at once: nothing to gain from Nagle's wait for an ACK.
    if ("setNoDelay" in conn) conn.setNoDelay(true);
    return serveH1(conn, {
      // With upgrades, relayWebSocket splices them (`_splice.ts`).
      handler: options.upgrades
        ? options.handler
        : (request, info) =>
          asksWebSocket(request) ? notUpgradable() : options.handler(request, info),
      closing: closing.signal,
      onError,
      scheme: options.tls ? "https" : "http",
      stop: c.stop.signal,
      begun: () => c.inFlight++,
      ended: () => answered(c),
      lane: options.lane,
      progress: c.progress,
    });
  };

  const serveConnection = options.engine === "bytes"
    ? serveBytes
    : options.upgrades && serveLegacy
    ? serveUpgrading
    : serveFast;

  const watch = (conn: Deno.TcpConn | Deno.TlsConn) => {
    const c: Watched = {
      stop: new AbortController(),
      inFlight: 0,
      waitingSince: clock.now(),
      served: false,
      done: Promise.resolve(),
      progress: unmetered(),
      stalls: new StallWatch(),
    };
    open.add(c);
    c.done = serveConnection(conn, c).catch(() => {
      // A reset or a half-written request ends this connection only; nothing to report.
    }).finally(() => open.delete(c));
  };

  const accepting = (async () => {
    let backoffMs = 10;
    // Only a recovery is news: the first connection after boot is not "again".
    let acceptFailed = false;
    while (!stopping) {
      let conn: Deno.TcpConn | Deno.TlsConn;
      try {
        conn = await listener.accept();
      } catch (error) {
        if (stopping || error instanceof Deno.errors.BadResource) break;
        const descriptors = outOfDescriptors(error);
        const shedCount = descriptors ? shed(Math.max(1, Math.ceil(open.size / 4))) : 0;
        changes.report(
          "accept",
          descriptors ? "descriptors" : String((error as Error)?.message),
          "warn",
          descriptors
            ? "out of file descriptors: closing idle connections and retrying; raise the limit " +
              "(LimitNOFILE in the systemd unit, ulimit -n) if this is real traffic"
            : "accepting a connection failed; retrying",
          { error: String((error as Error)?.message ?? error), open: open.size, shed: shedCount },
        );
        acceptFailed = true;
        await new Promise((r) => setTimeout(r, backoffMs));
        backoffMs = Math.min(backoffMs * 2, 500);
        continue;
      }
      backoffMs = 10;
      if (acceptFailed) {
        acceptFailed = false;
        changes.report("accept", "ok", "info", "accepting connections again", { open: open.size });
      }
      if (open.size >= maxConnections && shed(1) === 0) {
        // Every connection is busy: refusing this one costs less than starving the busy ones.
        conn.close();
        continue;
      }
      watch(conn);
    }
  })();

  const every = options.sweepIntervalMs ??
    Math.max(
      250,
      Math.min(
        5_000,
        Math.floor(Math.min(headerTimeoutMs, idleTimeoutMs, bodyTimeoutMs, writeTimeoutMs) / 4),
      ),
    );
  const sweeper = every > 0 ? setInterval(sweep, every) : undefined;
  options.onListen?.(addr);

  let finishedResolve!: () => void;
  const finished = new Promise<void>((r) => finishedResolve = r);
  const shutdown = async () => {
    if (!stopping) {
      stopping = true;
      closing.abort();
      clearInterval(sweeper);
      try {
        listener.close();
      } catch {
        // Already closed.
      }
      await accepting;
      for (const c of open) if (idle(c)) closeAfterFlush(c);
    }
    await Promise.all([...open].map((c) => c.done));
    finishedResolve();
  };
  return { addr, finished, connections: () => open.size, sweep, shutdown };
}
