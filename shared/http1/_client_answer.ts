/**
 * The answer side of {@linkcode createH1Client} (client.ts), once a node's head has been read:
 * how its body is framed, the bytes lane's {@linkcode WireAnswer} that hands the body on read by
 * read, and the `Response` the fetch shape makes of it (whole when it arrived with the head, a
 * stream pulled as its reader asks otherwise).
 *
 * @module
 */
import type { RawHead } from "./_head.ts";
import { ChunkDecoder, ClosedEarly, type Conn, type Head, StaleConnection, wrap } from "./_wire.ts";
import type { Cancel } from "./_pool.ts";

/** A node's answer read on the wire (see the client's `sendBytes`). */
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
import type { Upload } from "./_client_request.ts";

/**
 * How an answer's body is framed: `remaining` is its length, `-1` when chunked, `-2` when it ends
 * with the connection (`0` for an answer without a body), and whether the connection may carry
 * the next request after it.
 */
export interface Framing {
  remaining: number;
  keepAlive: boolean;
  chunked: boolean;
}

/**
 * What a failed bytes exchange rejects with: the abort's reason, a stale connection as it is
 * (`sendBytes` retries it once), anything else as fetch's TypeError.
 */
export function failure(signal: AbortSignal | Cancel | null, error: unknown): unknown {
  return signal?.aborted ? signal.reason : error instanceof StaleConnection ? error : wrap(error);
}

/** A node's answer to `sendBytes`, read on the wire as its reader asks. */
export class WireAnswer implements BytesAnswer {
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
    framing: Framing,
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
        throw new ClosedEarly("error reading response: the node closed the body early");
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

/**
 * How an answer's body is framed, from its head (see {@linkcode Framing}); `undefined` for a
 * Content-Length that is no length.
 */
export function framingOf(
  bodiless: boolean,
  { transferEncoding, contentLength, connection, http11, length }: {
    transferEncoding: string | null | undefined;
    contentLength: string | null | undefined;
    /** A Content-Length already read as a number (a raw head's plain one). */
    length?: number;
    connection: string | null | undefined;
    http11: boolean;
  },
): Framing | undefined {
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
export function badLength(contentLength: string | null | undefined): TypeError {
  return new TypeError(`error reading response: bad content-length '${contentLength}'`);
}

/**
 * The `Response` of the answer whose head `parsed` was read on `conn` for a `method` request,
 * resolved with the head while the body is handed on as it arrives. `finish` frees the
 * connection (keeping it only on a clean end, once `upload` is out too); the body stream's
 * controller goes to `onBody`, so that an abort can fail it.
 */
export function responseOf(
  conn: Conn,
  parsed: Head,
  method: string,
  upload: Upload,
  finish: (reuse: boolean) => void,
  signal: AbortSignal | null,
  onBody: (controller: ReadableStreamDefaultController<Uint8Array>) => void,
): Response {
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
  const { remaining, keepAlive } = framing;
  // The connection goes back only once the request body is out too (a node may answer first).
  // An answer that ends while the body still goes out (a node refusing an upload it never
  // read) ends the upload too, and the connection with it: waiting would hold the pool slot
  // until the client's upload ends, which may be never (RFC 9112 §9.6: cease sending).
  const done = () => {
    if (upload.stop === undefined) return void upload.sent.then((ok) => finish(keepAlive && ok));
    conn.destroy();
    upload.stop();
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
  return answer(bodyStream(conn, framing, done, finish, signal, onBody));
}

/**
 * The answer's body as a stream pulled as its reader asks: `done` once it has all come, `finish`
 * without reuse when it fails, ends with the connection or is cancelled.
 */
function bodyStream(
  conn: Conn,
  framing: Framing,
  done: () => void,
  finish: (reuse: boolean) => void,
  signal: AbortSignal | null,
  onBody: (controller: ReadableStreamDefaultController<Uint8Array>) => void,
): ReadableStream<Uint8Array> {
  let { remaining } = framing;
  const decode = framing.chunked ? new ChunkDecoder(conn) : undefined;
  return new ReadableStream<Uint8Array>({
    start(controller) {
      onBody(controller);
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
          throw new ClosedEarly("error reading response: the node closed the body early");
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
}
