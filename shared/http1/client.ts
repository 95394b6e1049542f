/**
 * A small HTTP/1.1 client over `Deno.connect`, shaped like `fetch` so the gateway can inject it
 * where it injects `fetch` (issue 16's comparison of the runtime's clients, bench/RESULTS.md).
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
  ChunkDecoder,
  closedEarly,
  Conn,
  encoder,
  type Head,
  type Pool,
  readHead,
  StaleConnection,
  type Waiter,
  wrap,
  writeRequest,
} from "./_wire.ts";
import { joined, latin1 } from "./_answer.ts";

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
}

/** A node's answer read on the wire (see {@linkcode H1Client.sendBytes}). */
export interface BytesAnswer {
  /**
   * The status line and the header lines, framing ones included, as bytes: valid only until the
   * body is first asked for.
   */
  readonly head: RawHead;
  /** The body's length; `-1` when it is chunked, `-2` when it ends with the connection. */
  readonly length: number;
  /**
   * The next piece of the body (de-chunked), or null at its end. A piece is valid until the
   * next call: write it out before asking for more. Rejects when the body fails.
   */
  next(): Promise<Uint8Array | null>;
  /**
   * The length of a sized body that arrived whole with the head (the usual small answer), or
   * `-1` (then read it with `next`).
   */
  wholeLength(): number;
  /**
   * Copies that whole body into `into` at `at`, and hands the connection back to its pool.
   * Copy what is wanted of `head.raw` first: the connection's next read may reuse its bytes.
   */
  copyWhole(into: Uint8Array, at: number): void;
  /**
   * The answer as the node sent it, head and whole body (a sized body that arrived whole:
   * `wholeLength() >= 0`), without a copy: the bytes are lent, so the connection's next read
   * lands after them, and the connection goes back to its pool at once.
   */
  asSent(): Uint8Array<ArrayBuffer>;
  /** Drops the rest of the answer, and its connection with it. */
  cancel(): void;
}

/**
 * What ends a `sendBytes` exchange without an AbortSignal's cost (a forward's watch entry,
 * `WatchedForward`): its one `onAbort` hook is the exchange's, and `signal` is made only for the
 * waits that need one (a connect, a turn in a full pool).
 */
export interface Cancel {
  readonly aborted: boolean;
  readonly reason: unknown;
  readonly signal: AbortSignal;
  onAbort(hook: (() => void) | undefined): void;
}

/** The signal of `s`, made now if it is a {@linkcode Cancel}. */
function signalOf(s: AbortSignal | Cancel | null): AbortSignal | null {
  return s === null || s instanceof AbortSignal ? s : s.signal;
}

/** Tells `hook` of an abort of `s` (or, with `on` false, stops telling it). */
function listen(s: AbortSignal | Cancel | null, hook: () => void, on: boolean): void {
  if (s === null) return;
  if (!(s instanceof AbortSignal)) s.onAbort(on ? hook : undefined);
  else if (on) s.addEventListener("abort", hook, { once: true });
  else s.removeEventListener("abort", hook);
}

/**
 * What a failed bytes exchange rejects with: the abort's reason, a stale connection as it is
 * (`sendBytes` retries it once), anything else as fetch's TypeError.
 */
function failure(signal: AbortSignal | Cancel | null, error: unknown): unknown {
  return signal?.aborted ? signal.reason : error instanceof StaleConnection ? error : wrap(error);
}

/** A node's answer to `sendBytes`, read on the wire as its reader asks. */
class WireAnswer implements BytesAnswer {
  readonly head: RawHead;
  readonly length: number;
  readonly #conn: Conn;
  readonly #finish: (reuse: boolean) => void;
  readonly #signal: AbortSignal | Cancel | null;
  readonly #keepAlive: boolean;
  readonly #decode: ChunkDecoder | undefined;
  /** Body bytes still to come; -1 chunked, -2 until the close. */
  #remaining: number;

  constructor(
    conn: Conn,
    head: RawHead,
    framing: { remaining: number; keepAlive: boolean; chunked: boolean },
    finish: (reuse: boolean) => void,
    signal: AbortSignal | Cancel | null,
  ) {
    this.#conn = conn;
    this.head = head;
    this.#finish = finish;
    this.#signal = signal;
    this.#keepAlive = framing.keepAlive;
    this.#remaining = this.length = framing.remaining;
    this.#decode = framing.chunked ? new ChunkDecoder(conn) : undefined;
  }

  wholeLength(): number {
    const n = this.#remaining;
    return n >= 0 && this.#conn.buffered.length >= n ? n : -1;
  }

  copyWhole(into: Uint8Array, at: number): void {
    const n = this.wholeLength();
    if (n < 0) throw new TypeError("copyWhole: the body has not arrived whole; read it with next");
    // Copied, not lent: the read buffer serves the connection's next answer from its start, where
    // a view handed on made each answer leave its bytes behind (a new slab every few dozen).
    if (n > 0) into.set(this.#conn.consume(n), at);
    this.#remaining = 0;
    this.#finish(this.#keepAlive);
  }

  asSent(): Uint8Array<ArrayBuffer> {
    const n = this.wholeLength();
    if (n < 0) throw new TypeError("asSent: the body has not arrived whole; read it with next");
    // The head was consumed from the bytes the body is taken from now: they are adjacent.
    const raw = this.head.raw;
    const rest = this.#conn.buffered;
    if (n > 0 && (rest.buffer !== raw.buffer || rest.byteOffset !== raw.byteOffset + raw.length)) {
      throw new TypeError("asSent: the body does not follow the head in the read buffer");
    }
    this.#conn.take(n);
    this.#remaining = 0;
    this.#finish(this.#keepAlive);
    return new Uint8Array(raw.buffer as ArrayBuffer, raw.byteOffset, raw.length + n);
  }

  async next(): Promise<Uint8Array | null> {
    const conn = this.#conn;
    const remaining = this.#remaining;
    if (remaining === 0) {
      this.#finish(this.#keepAlive);
      return null;
    }
    try {
      if (this.#decode !== undefined) {
        const chunk = await this.#decode.next();
        if (chunk === null) this.#finish(this.#keepAlive);
        return chunk;
      }
      if (conn.buffered.length === 0 && !(await conn.fill())) {
        if (remaining === -2) {
          this.#finish(false);
          this.#remaining = 0;
          return null;
        }
        throw new TypeError("error reading response: the node closed the body early");
      }
      const n = remaining === -2 ? conn.buffered.length : Math.min(remaining, conn.buffered.length);
      // Not lent, as the caller writes it out before asking for more, so the read buffer is
      // reused; but the last piece is, since the connection goes back to the pool with it.
      const piece = n === remaining ? conn.take(n) : conn.consume(n);
      if (remaining > 0) {
        this.#remaining = remaining - n;
        if (this.#remaining === 0) this.#finish(this.#keepAlive);
      }
      return piece;
    } catch (error) {
      this.#remaining = 0;
      this.#finish(false);
      throw failure(this.#signal, error);
    }
  }

  cancel(): void {
    this.#finish(false);
  }
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

/** Headers the client frames itself; the caller's are dropped (RFC 9112 §6, §9.6). */
const framing = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
]);
const unsafe = /[\r\n\0]/;
/** A character no octet stands for: a header sent one byte a character cannot carry it. */
const notOctets = /[\u0100-\uffff]/;

/**
 * How an answer's body is framed, from its head: `remaining` is its length, `-1` when chunked,
 * `-2` when it ends with the connection (`0` for an answer without a body), and whether the
 * connection may carry the next request after it. `undefined` for a Content-Length that is no
 * length.
 */
function framingOf(
  bodiless: boolean,
  { transferEncoding, contentLength, connection, http11, length }: {
    transferEncoding: string | null | undefined;
    contentLength: string | null | undefined;
    /** A Content-Length already read as a number (a raw head's plain one). */
    length?: number;
    connection: string | null | undefined;
    http11: boolean;
  },
): { remaining: number; keepAlive: boolean; chunked: boolean } | undefined {
  const chunked = transferEncoding != null && /(^|,)\s*chunked\s*$/i.test(transferEncoding);
  const remaining = bodiless
    ? 0
    : chunked
    ? -1
    : length !== undefined
    ? length
    : contentLength == null
    ? -2
    : Number(contentLength);
  if (!(remaining >= -2) || (remaining >= 0 && !Number.isSafeInteger(remaining))) return undefined;
  const keepAlive = http11 && remaining !== -2 && !(connection && /\bclose\b/i.test(connection));
  return { remaining, keepAlive, chunked };
}

/**
 * The Response of an answer `head` and its `body`, the head's headers appended to the Response's
 * own: a Headers given in the init is copied through its iterator (2.6x the cost of appending,
 * measured for a request). A body of bytes or a stream gets no content-type either way.
 */
function answerOf(body: BodyInit | null, head: Head): Response {
  const response = new Response(body, { status: head.status, statusText: head.statusText });
  const headers = response.headers;
  const pairs = head.pairs;
  for (let i = 0; i < pairs.length; i += 2) headers.append(pairs[i], pairs[i + 1]);
  return response;
}

/** The error for an answer whose Content-Length is no length. */
function badLength(contentLength: string | null | undefined): TypeError {
  return new TypeError(`error reading response: bad content-length '${contentLength}'`);
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
  const maxWaiting = options.maxWaiting ?? 4096;
  const idleTimeoutMs = options.idleTimeoutMs ?? 4000;
  const idleReadAfterMs = options.idleReadAfterMs ?? 100;
  const maxHeaderBytes = options.maxHeaderBytes ?? 64 * 1024;
  const otherSchemes = options.otherSchemes;
  const hostFromHeaders = options.hostFromHeaders ?? false;
  if (!Number.isInteger(maxConnections) || maxConnections < 1) {
    throw new RangeError(
      `Cannot create the HTTP/1.1 client as 'maxConnections' must be a positive integer: ` +
        `received ${maxConnections}`,
    );
  }
  const pools = new Map<string, Pool>();
  let open = 0;
  let sweeper: ReturnType<typeof setInterval> | undefined;

  const sweep = () => {
    const now = performance.now();
    let idle = 0;
    for (const [origin, pool] of pools) {
      pool.idle = pool.idle.filter((c) => {
        if (!c.dead && now - c.idleSince < idleTimeoutMs) return true;
        c.destroy();
        return false;
      });
      idle += pool.idle.length;
      if (pool.idle.length === 0 && pool.busy === 0 && pool.waiting.length === 0) {
        pools.delete(origin);
      }
    }
    if (idle === 0 && sweeper !== undefined) {
      clearInterval(sweeper);
      sweeper = undefined;
    }
  };

  // Connections released whose idle read has not started yet. It starts once the next request
  // (to any node) is written, while that node works, or at the latest `idleReadAfterMs` later:
  // a connection taken again before then (the next request at one connection) needs none, its
  // answer's read starting after its request is written. Started at release, the idle read was an
  // op call of about 2 µs between the node's answer and the client's, on a request's latency; an
  // immediate to start it cost more than the read (3 µs). One timer at a time, never set again
  // per request (a timeout set again before it fires cost a loaded proxy 5 µs a request).
  let unwatched: Conn[] = [];
  let idleReader: ReturnType<typeof setTimeout> | undefined;
  const watchUnwatched = () => {
    const those = unwatched;
    unwatched = [];
    for (let i = 0; i < those.length; i++) {
      const c = those[i];
      if (c.idle && !c.dead) c.watchIdle();
    }
  };
  const idleRead = () => {
    idleReader = undefined;
    watchUnwatched();
  };
  const watchSoon = (c: Conn) => {
    unwatched.push(c);
    if (idleReader === undefined) {
      idleReader = setTimeout(idleRead, idleReadAfterMs);
      Deno.unrefTimer(idleReader);
    }
  };

  /** A connection to `pool`'s origin, pooled or new, waiting while the pool is full. */
  const acquire = (pool: Pool, stop: AbortSignal | Cancel | null): Promise<Conn> | Conn => {
    while (pool.idle.length > 0) {
      const c = pool.idle.pop()!;
      if (!c.dead) {
        pool.busy++;
        c.idle = false;
        return c;
      }
    }
    const signal = signalOf(stop);
    if (pool.busy < maxConnections) {
      pool.busy++;
      return connect(pool, signal);
    }
    if (pool.waiting.length >= maxWaiting) {
      throw new TypeError(
        `error sending request: ${pool.waiting.length} requests already wait for a connection ` +
          `to ${pool.origin} (maxWaiting)`,
      );
    }
    return new Promise<Conn>((resolve, reject) => {
      const waiter: Waiter = { resolve, reject, signal };
      pool.waiting.push(waiter);
      signal?.addEventListener("abort", () => {
        const at = pool.waiting.indexOf(waiter);
        if (at >= 0) pool.waiting.splice(at, 1);
        reject(signal.reason);
      }, { once: true });
    });
  };

  const connect = async (pool: Pool, signal: AbortSignal | null): Promise<Conn> => {
    try {
      const tcp = await Deno.connect({
        hostname: pool.hostname,
        port: pool.port,
        signal: signal ?? undefined,
      });
      tcp.setNoDelay(true);
      open++;
      return new Conn(tcp, () => open--);
    } catch (error) {
      release(pool, undefined);
      if (signal?.aborted) throw signal.reason;
      throw new TypeError(`error sending request: ${(error as Error).message}`, { cause: error });
    }
  };

  /** Returns a finished connection (or a freed slot when `c` is undefined) to the pool. */
  const release = (pool: Pool, c: Conn | undefined) => {
    pool.busy--;
    if (c !== undefined && c.dead) c = undefined;
    while (pool.waiting.length > 0) {
      const waiter = pool.waiting.shift()!;
      if (waiter.signal?.aborted) continue;
      pool.busy++;
      if (c !== undefined) waiter.resolve(c);
      else connect(pool, waiter.signal).then(waiter.resolve, waiter.reject);
      return;
    }
    if (c === undefined) return;
    c.idleSince = performance.now();
    c.idle = true;
    // The next answer starts from nothing read: a failure before its first byte is a stale
    // connection (reset here, not when the idle read starts, which a connection taken again skips).
    c.answered = 0;
    pool.idle.push(c);
    watchSoon(c);
    if (sweeper === undefined) {
      const timer = setInterval(sweep, Math.max(50, idleTimeoutMs / 2));
      Deno.unrefTimer(timer);
      sweeper = timer;
    }
  };

  /** The pool of `origin`, made when it has none (`url` parses it when given). */
  const poolOf = (origin: string, url?: URL): Pool => {
    let pool = pools.get(origin);
    if (pool === undefined) {
      const parsed = url ?? new URL(origin);
      pool = {
        origin,
        hostname: parsed.hostname.replace(/^\[|\]$/g, ""),
        port: Number(parsed.port || 80),
        idle: [],
        busy: 0,
        waiting: [],
      };
      pools.set(origin, pool);
    }
    return pool;
  };

  const send = async (input: RequestInfo | URL, init: RequestInit = {}): Promise<Response> => {
    const request = input instanceof Request ? input : undefined;
    const url = new URL(request?.url ?? String(input));
    if (url.protocol !== "http:") {
      if (otherSchemes !== undefined) return otherSchemes(input, init);
      throw new TypeError(
        `Cannot send to ${url.origin}: the HTTP/1.1 client speaks plain http only`,
      );
    }
    const method = (init.method ?? request?.method ?? "GET").toUpperCase();
    const signal = init.signal ?? request?.signal ?? null;
    signal?.throwIfAborted();
    let body: BodyInit | null = init.body ?? (request ? request.body : null) ?? null;
    const pairs: [string, string][] = [];
    const given = init.headers ?? request?.headers;
    let contentType = false;
    let declared: string | undefined;
    let host = url.host;
    const take = (k: string, v: string) => {
      const name = k.toLowerCase();
      if (name === "content-length") declared = v;
      if (framing.has(name) && !(name === "host" && hostFromHeaders)) return;
      if (unsafe.test(name) || unsafe.test(v)) {
        throw new TypeError(`Cannot send header '${name}': it holds a line break or NUL`);
      }
      if (notOctets.test(name) || notOctets.test(v)) {
        throw new TypeError(
          `Cannot send header '${name}': it holds a character past \\xff (a header is octets)`,
        );
      }
      if (name === "host") {
        host = v;
        return;
      }
      if (name === "content-type") contentType = true;
      pairs.push([name, v]);
    };
    // A Headers by forEach: the same entries as its iterator, without its result objects.
    if (given instanceof Headers) given.forEach((v, k) => take(k, v));
    else if (Array.isArray(given)) { for (const [k, v] of given as [string, string][]) take(k, v); }
    else if (given !== undefined) { for (const [k, v] of Object.entries(given)) take(k, v); }
    // Fixed bodies as bytes, everything else (a Blob, FormData) through Response's encoder.
    let bytes: Uint8Array | undefined;
    let stream: ReadableStream<Uint8Array> | undefined;
    if (body === null) {
      if (method !== "GET" && method !== "HEAD") bytes = new Uint8Array(0);
    } else if (typeof body === "string") bytes = encoder.encode(body);
    else if (body instanceof Uint8Array) bytes = body;
    else if (body instanceof ArrayBuffer) bytes = new Uint8Array(body);
    else if (ArrayBuffer.isView(body)) {
      bytes = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    } else if (body instanceof ReadableStream) stream = body;
    else {
      const wrapped = new Response(body);
      const type = wrapped.headers.get("content-type");
      if (type !== null && !contentType) pairs.push(["content-type", type]);
      stream = wrapped.body ?? undefined;
    }
    body = null;
    // A stream whose length the caller declared goes out with that length, unframed: the node
    // then reads it without chunk framing, and a small one is sent in the head's write.
    let length: number | undefined;
    if (stream !== undefined && declared !== undefined && /^\d{1,15}$/.test(declared.trim())) {
      length = Number(declared);
    }
    let head = `${method} ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${host}\r\n`;
    for (let i = 0; i < pairs.length; i++) head += `${pairs[i][0]}: ${pairs[i][1]}\r\n`;
    head += length !== undefined
      ? `content-length: ${length}\r\n\r\n`
      : stream !== undefined
      ? "transfer-encoding: chunked\r\n\r\n"
      : bytes !== undefined
      ? `content-length: ${bytes.length}\r\n\r\n`
      : "\r\n";
    // One byte a character: a header value is octets (a ByteString), not text to make UTF-8 of.
    const headBytes = latin1(head);

    const pool = poolOf(url.origin, url);
    // A reused connection the node closed while it sat idle fails before any byte of an answer;
    // a fixed body is then sent once more on a new connection (the node never read it).
    for (let attempt = 0;; attempt++) {
      // An idle connection is taken at once, without a turn of the event loop.
      const got = acquire(pool, signal);
      const conn = got instanceof Conn ? got : await got;
      const reused = conn.used;
      conn.used = true;
      try {
        return await exchange(conn, pool, method, headBytes, bytes, stream, length, signal);
      } catch (error) {
        if (
          error instanceof StaleConnection && reused && stream === undefined && attempt === 0
        ) continue;
        throw error instanceof StaleConnection ? error.cause : error;
      }
    }
  };

  /**
   * One request's hold on `conn`: the returned `finish` frees the pool slot once, keeping the
   * connection for the next request only on a clean end; an abort of `signal` closes the
   * connection (which tells the node), runs `aborted`, and finishes.
   */
  const hold = (
    conn: Conn,
    pool: Pool,
    signal: AbortSignal | Cancel | null,
    aborted?: () => void,
  ): (reuse: boolean) => void => {
    let finished = false;
    const finish = (reuse: boolean) => {
      if (finished) return;
      finished = true;
      listen(signal, onAbort, false);
      // Bytes past the answer's end break the framing of the next one.
      if (!reuse || conn.buffered.length > 0) {
        conn.destroy();
        release(pool, undefined);
      } else release(pool, conn);
    };
    const onAbort = () => {
      conn.destroy();
      aborted?.();
      finish(false);
    };
    listen(signal, onAbort, true);
    return finish;
  };

  const exchange = async (
    conn: Conn,
    pool: Pool,
    method: string,
    head: Uint8Array,
    bytes: Uint8Array | undefined,
    stream: ReadableStream<Uint8Array> | undefined,
    length: number | undefined,
    signal: AbortSignal | null,
  ): Promise<Response> => {
    let bodyController: ReadableStreamDefaultController<Uint8Array> | undefined;
    const finish = hold(conn, pool, signal, () => bodyController?.error(signal!.reason));
    if (signal?.aborted) {
      finish(false);
      throw signal.reason;
    }
    let sent: Promise<boolean>;
    // Set while a body is still being written; stops it (the upload's reader is cancelled).
    let stopUpload: (() => void) | undefined;
    if (stream === undefined && (bytes === undefined || bytes.length <= 16 * 1024)) {
      try {
        const writing = conn.writeAll(
          bytes === undefined || bytes.length === 0 ? head : joined(head, bytes),
        );
        if (unwatched.length > 0) watchUnwatched();
        await writing;
      } catch (error) {
        finish(false);
        if (signal?.aborted) throw signal.reason;
        throw new StaleConnection("write failed", { cause: wrap(error) });
      }
      sent = Promise.resolve(true);
    } else {
      // A large or streamed body goes out while the answer is read: a node may answer early. A
      // write that fails closes the connection, so the answer's read fails with it.
      let uploading = true;
      sent = writeRequest(conn, head, bytes, stream, length, (stop) => {
        if (uploading) stopUpload = stop;
      }).then(() => true, () => {
        conn.destroy();
        return false;
      }).finally(() => {
        uploading = false;
        stopUpload = undefined;
      });
    }
    let parsed: Head;
    try {
      do parsed = await readHead(conn, maxHeaderBytes); while (
        parsed.status >= 100 && parsed.status < 200 && parsed.status !== 101
      );
    } catch (error) {
      finish(false);
      if (signal?.aborted) throw signal.reason;
      throw error instanceof StaleConnection ? error : wrap(error);
    }
    const status = parsed.status;
    const noBody = method === "HEAD" || status === 204 || status === 304;
    const framing = framingOf(noBody, parsed);
    if (framing === undefined) {
      finish(false);
      throw badLength(parsed.contentLength);
    }
    /** The answer of `body`; a header its Headers refuses fails the exchange, as a bad head. */
    const answer = (body: BodyInit | null): Response => {
      try {
        return answerOf(body, parsed);
      } catch (error) {
        finish(false);
        throw wrap(error);
      }
    };
    let { remaining } = framing;
    const { keepAlive, chunked } = framing;
    // The connection goes back only once the request body is out too (a node may answer first).
    // An answer that ends while the body still goes out (a node refusing an upload it never
    // read) ends the upload too, and the connection with it: waiting would hold the pool slot
    // until the client's upload ends, which may be never (RFC 9112 §9.6: cease sending).
    const done = () => {
      if (stopUpload === undefined) return void sent.then((ok) => finish(keepAlive && ok));
      conn.destroy();
      stopUpload();
      finish(false);
    };
    if (remaining === 0) {
      const empty = answer(noBody ? null : new Uint8Array(0));
      done();
      return empty;
    }
    // A small sized answer already read whole is handed over as bytes, which Deno's server
    // writes in one go instead of pumping a stream.
    if (remaining > 0 && conn.buffered.length >= remaining) {
      // Not lent: Response copies a byte body (the Fetch standard's BufferSource rule, a test
      // holds it to that), so the read buffer serves the connection's next answer.
      const whole = answer(conn.consume(remaining));
      done();
      return whole;
    }
    const decode = chunked ? new ChunkDecoder(conn) : undefined;
    const out = new ReadableStream<Uint8Array>({
      start(controller) {
        bodyController = controller;
      },
      async pull(controller) {
        try {
          if (decode !== undefined) {
            const chunk = await decode.next();
            if (chunk === null) {
              controller.close();
              done();
            } else controller.enqueue(chunk);
            return;
          }
          if (conn.buffered.length === 0 && !(await conn.fill())) {
            if (remaining === -2) {
              controller.close();
              finish(false);
              return;
            }
            throw new TypeError("error reading response: the node closed the body early");
          }
          const n = remaining === -2
            ? conn.buffered.length
            : Math.min(remaining, conn.buffered.length);
          controller.enqueue(conn.take(n));
          if (remaining > 0) remaining -= n;
          if (remaining === 0) {
            controller.close();
            done();
          }
        } catch (error) {
          finish(false);
          controller.error(signal?.aborted ? signal.reason : wrap(error));
        }
      },
      cancel() {
        finish(false);
      },
    }, { highWaterMark: 0 });
    return answer(out);
  };

  // One async frame per exchange: the connection, the write and the head are awaited here, and
  // the answer is a WireAnswer (an async helper per step was a frame and a promise each).
  const sendBytes = async (
    origin: string,
    bytes: Uint8Array,
    signal: AbortSignal | Cancel | null,
  ): Promise<BytesAnswer> => {
    if (signal?.aborted) throw signal.reason;
    const pool = poolOf(origin);
    for (let attempt = 0;; attempt++) {
      // An idle connection is taken at once, without a turn of the event loop.
      const got = acquire(pool, signal);
      const conn = got instanceof Conn ? got : await got;
      const reused = conn.used;
      conn.used = true;
      const finish = hold(conn, pool, signal);
      let head: RawHead | undefined;
      try {
        if (signal?.aborted) throw signal.reason;
        try {
          // One write takes a small request whole; the rest of a larger one follows. The
          // connections left without an idle read get theirs while the node works.
          const writing = conn.writeOnce(bytes);
          if (unwatched.length > 0) watchUnwatched();
          const n = await writing;
          if (n < bytes.length) await conn.writeAll(bytes.subarray(n));
        } catch (error) {
          throw new StaleConnection("write failed", { cause: wrap(error) });
        }
        // The head; an interim 1xx answer is skipped (a 101 is final). The reads are awaited
        // here, not in `fill`: its frame was one more promise a request.
        for (let from = 0;;) {
          head = bufferedRawHead(conn, maxHeaderBytes, from);
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

  return {
    fetch: send as typeof fetch,
    sendBytes,
    get open() {
      return open;
    },
    close() {
      for (const pool of pools.values()) {
        for (const c of pool.idle) c.destroy();
        pool.idle = [];
      }
      if (sweeper !== undefined) clearInterval(sweeper);
      sweeper = undefined;
      if (idleReader !== undefined) clearTimeout(idleReader);
      idleReader = undefined;
      unwatched = [];
    },
  };
}
