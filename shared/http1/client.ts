/**
 * A small HTTP/1.1 client over `Deno.connect`, shaped like `fetch` so the gateway can inject it
 * where it injects `fetch` (the comparison of the runtime's clients is in bench/RESULTS.md).
 * Plain `http:` only: nodes are reached inside the fleet's network. A node registered with an
 * `https:` endpoint goes to the `otherSchemes` client (the gateway passes `fetch`, which does TLS)
 * rather than being refused.
 *
 * What it keeps, and why:
 * - a bounded pool per origin (`maxConnections`, then requests wait, at most `maxWaiting` of
 *   them) whose idle connections are evicted after `idleTimeoutMs`, and an origin with nothing
 *   pooled, busy or waiting is dropped from the map;
 * - the head is read up to `maxHeaderBytes`, past which the answer is refused: a node is trusted,
 *   but a cap keeps one broken node from growing the gateway's memory;
 * - bodies stream both ways, pulled only as the reader asks (no buffering beyond one socket
 *   read): a request body that is a stream goes out chunked as it comes, the answer's
 *   content-length or chunked body is handed on read by read;
 * - the signal covers every wait, connect included (`Deno.connect`'s own signal), so a bound such
 *   as the lookup's 2 s holds against a node that drops SYNs; an abort closes the connection,
 *   which is what tells the node's server that its client has gone.
 *
 * @module
 */
import type { RawHead } from "./_head.ts";
import {
  bufferedRawHead,
  closedEarly,
  Conn,
  type Head,
  readHead,
  StaleConnection,
  wrap,
} from "./_wire.ts";
import { type Cancel, OriginPools, type Pool } from "./_pool.ts";
import {
  badLength,
  type BytesAnswer,
  failure,
  framingOf,
  responseOf,
  WireAnswer,
} from "./_client_answer.ts";

export type { BytesAnswer };
import { outgoing, type OutgoingRequest, upload } from "./_client_request.ts";
import { markFetchShaped } from "../fetch_handler.ts";

export type { Cancel } from "./_pool.ts";

/** Options of {@linkcode createH1Client}. */
export interface H1ClientOptions {
  /**
   * Connections per origin (busy and idle). Default 64: two wrk-sized bursts of 32 in flight at
   * once without queueing, far below a node's file limit.
   */
  maxConnections?: number;
  /** Requests that may wait for a connection per origin before more are refused. Default 4096. */
  maxWaiting?: number;
  /**
   * An idle connection is closed after this long. Default 4000 ms, below the 5 s keep-alive of
   * common servers so the client closes first and never writes into a socket the node closed.
   */
  idleTimeoutMs?: number;
  /**
   * How long a released connection may go without its idle read (which hears a node that closes
   * it) when no request is written meanwhile to start it. Default 100 ms.
   */
  idleReadAfterMs?: number;
  /** The longest answer head (status line and headers) read. Default 64 KiB. */
  maxHeaderBytes?: number;
  /**
   * Where a request to any other scheme than `http:` (an `https:` node) goes instead, e.g. the
   * global `fetch`. Without it such a request rejects with a TypeError.
   */
  otherSchemes?: typeof fetch;
  /**
   * Send a request's own `host` header as its Host, instead of the URL's authority: for a proxy
   * that must show the server another name than the address it connects to (E2B's
   * `maskRequestHost`), which `fetch` cannot (it sends the URL's). Off by default, so that a
   * forward carrying its client's headers never passes the client's Host on.
   */
  hostFromHeaders?: boolean;
  /**
   * Opens each new connection instead of `Deno.connect` to the URL's host and port, e.g. TCP to
   * an address judged elsewhere with TLS started on it (`Deno.startTls`). With it, `https:` URLs
   * are sent on what it returns too (port 443 unless given) rather than to `otherSchemes`.
   */
  connect?: (
    to: { hostname: string; port: number },
    signal: AbortSignal | null,
  ) => Promise<Deno.Conn>;
}

/** A `fetch`-shaped HTTP/1.1 client with its pools. */
export interface H1Client {
  /** Sends one request; the answer resolves once its head has arrived. */
  fetch: typeof fetch;
  /**
   * Sends a request already written as bytes (head and whole body) to `origin` (`http://host:port`)
   * on one of its pooled connections, and resolves the answer once its head has arrived: the
   * gateway's bytes lane, which never builds a Request or a Response. A reused connection that
   * turns out closed is retried once on a new one, as `fetch` does for a fixed body.
   */
  sendBytes(
    origin: string,
    bytes: Uint8Array,
    signal: AbortSignal | Cancel | null,
  ): Promise<BytesAnswer>;
  /** Connections open now (busy and idle) over every origin. */
  readonly open: number;
  /** Closes every idle connection and stops the eviction timer; busy ones close as they end. */
  close(): void;
}

/**
 * Builds a client with its own pools.
 *
 * @example
 * ```ts
 * import { createH1Client } from "./client.ts";
 * const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, () => new Response("hi"));
 * const client = createH1Client();
 * const res = await client.fetch(`http://127.0.0.1:${server.addr.port}/`);
 * console.log(await res.text()); // "hi"
 * client.close();
 * await server.shutdown();
 * ```
 */
export function createH1Client(options: H1ClientOptions = {}): H1Client {
  const maxConnections = options.maxConnections ?? 64;
  if (!Number.isInteger(maxConnections) || maxConnections < 1) {
    throw new RangeError(
      `Cannot create the HTTP/1.1 client as 'maxConnections' must be a positive integer: ` +
        `received ${maxConnections}`,
    );
  }
  const client = new PooledClient(options, maxConnections);
  // A plain object of own properties, as callers spread it to wrap one of its functions.
  return {
    fetch: markFetchShaped(client.fetch),
    sendBytes: client.sendBytes,
    get open() {
      return client.open;
    },
    close: () => client.close(),
  };
}

/** The client {@linkcode createH1Client} builds: its pools, and the two ways to send on them. */
class PooledClient {
  readonly #pools: OriginPools;
  readonly #maxHeaderBytes: number;
  readonly #otherSchemes: typeof fetch | undefined;
  readonly #hostFromHeaders: boolean;
  /** Whether `https:` URLs are sent on this client's own connections (its `connect` opens them). */
  readonly #https: boolean;

  constructor(options: H1ClientOptions, maxConnections: number) {
    this.#pools = new OriginPools({
      maxConnections,
      maxWaiting: options.maxWaiting ?? 4096,
      idleTimeoutMs: options.idleTimeoutMs ?? 4000,
      idleReadAfterMs: options.idleReadAfterMs ?? 100,
      connect: options.connect,
    });
    this.#https = options.connect !== undefined;
    this.#maxHeaderBytes = options.maxHeaderBytes ?? 64 * 1024;
    this.#otherSchemes = options.otherSchemes;
    this.#hostFromHeaders = options.hostFromHeaders ?? false;
  }

  get open(): number {
    return this.#pools.open;
  }

  close(): void {
    this.#pools.close();
  }

  /** A property, not a method: callers pass it on alone, where they would pass `fetch`. */
  readonly fetch = (async (input: RequestInfo | URL, init: RequestInit = {}): Promise<Response> => {
    const request = input instanceof Request ? input : undefined;
    const url = new URL(request?.url ?? String(input));
    if (url.protocol !== "http:" && !(this.#https && url.protocol === "https:")) {
      if (this.#otherSchemes !== undefined) return this.#otherSchemes(input, init);
      throw new TypeError(
        `Cannot send to ${url.origin}: the HTTP/1.1 client speaks plain http only`,
      );
    }
    const method = (init.method ?? request?.method ?? "GET").toUpperCase();
    const signal = init.signal ?? request?.signal ?? null;
    signal?.throwIfAborted();
    const out = outgoing(url, method, init, request, this.#hostFromHeaders);
    const pool = this.#pools.of(url.origin, url);
    // A reused connection the node closed while it sat idle fails before any byte of an answer;
    // a fixed body is then sent once more on a new connection (the node never read it).
    for (let attempt = 0;; attempt++) {
      // An idle connection is taken at once, without a turn of the event loop.
      const got = this.#pools.acquire(pool, signal);
      const conn = got instanceof Conn ? got : await got;
      const reused = conn.used;
      conn.used = true;
      try {
        return await this.#exchange(conn, pool, out, signal);
      } catch (error) {
        if (
          error instanceof StaleConnection && reused && out.stream === undefined && attempt === 0
        ) continue;
        throw error instanceof StaleConnection ? error.cause : error;
      }
    }
  }) as typeof fetch;

  /** One `fetch` on `conn`: the request written, the head read, the answer made a Response. */
  async #exchange(
    conn: Conn,
    pool: Pool,
    out: OutgoingRequest,
    signal: AbortSignal | null,
  ): Promise<Response> {
    let bodyController: ReadableStreamDefaultController<Uint8Array> | undefined;
    const finish = this.#pools.hold(
      conn,
      pool,
      signal,
      () => bodyController?.error(signal!.reason),
    );
    if (signal?.aborted) {
      finish(false);
      throw signal.reason;
    }
    const going = await upload(conn, out, finish, signal, this.#writing);
    let parsed: Head;
    try {
      do parsed = await readHead(conn, this.#maxHeaderBytes); while (
        parsed.status >= 100 && parsed.status < 200 && parsed.status !== 101
      );
    } catch (error) {
      finish(false);
      if (signal?.aborted) throw signal.reason;
      throw error instanceof StaleConnection ? error : wrap(error);
    }
    return responseOf(conn, parsed, out.method, going, finish, signal, (controller) => {
      bodyController = controller;
    });
  }

  /** A request's first write has started: the connections owed an idle read get theirs now. */
  readonly #writing = (): void => this.#pools.watchIdle();

  // One async frame per exchange: the connection, the write and the head are awaited here, and
  // the answer is a WireAnswer (an async helper per step was a frame and a promise each).
  readonly sendBytes = async (
    origin: string,
    bytes: Uint8Array,
    signal: AbortSignal | Cancel | null,
  ): Promise<BytesAnswer> => {
    if (signal?.aborted) throw signal.reason;
    const pool = this.#pools.of(origin);
    for (let attempt = 0;; attempt++) {
      // An idle connection is taken at once, without a turn of the event loop.
      const got = this.#pools.acquire(pool, signal);
      const conn = got instanceof Conn ? got : await got;
      const reused = conn.used;
      conn.used = true;
      const finish = this.#pools.hold(conn, pool, signal);
      let head: RawHead | undefined;
      try {
        if (signal?.aborted) throw signal.reason;
        try {
          // One write takes a small request whole; the rest of a larger one follows. The
          // connections left without an idle read get theirs while the node works.
          const writing = conn.writeOnce(bytes);
          this.#pools.watchIdle();
          const n = await writing;
          if (n < bytes.length) await conn.writeAll(bytes.subarray(n));
        } catch (error) {
          throw new StaleConnection("write failed", { cause: wrap(error) });
        }
        // The head; an interim 1xx answer is skipped (a 101 is final). The reads are awaited
        // here, not in `fill`: its frame was one more promise a request.
        for (let from = 0;;) {
          head = bufferedRawHead(conn, this.#maxHeaderBytes, from);
          if (head === undefined) {
            from = Math.max(0, conn.buffered.length - 3);
            if (!conn.landed(await conn.read())) throw closedEarly();
          } else if (head.status >= 200 || head.status === 101) break;
          else from = 0;
        }
      } catch (error) {
        finish(false);
        const reason = failure(signal, error);
        if (reason instanceof StaleConnection && reused && attempt === 0) continue;
        throw reason instanceof StaleConnection ? reason.cause : reason;
      }
      const framing = framingOf(head.status === 204 || head.status === 304, head);
      if (framing === undefined) {
        finish(false);
        throw badLength(head.contentLength);
      }
      return new WireAnswer(conn, head, framing, finish, signal);
    }
  };
}
