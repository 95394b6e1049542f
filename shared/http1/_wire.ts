/**
 * The wire side of {@linkcode createH1Client} (client.ts): one pooled TCP connection and its
 * read buffer, the answer head's reader and parser with its cap, the chunked decoder, and the
 * request writer. The client keeps the pools, the waits and the fetch shape.
 *
 * @module
 */
import { blankLineAt, byteIndex, chunkSize, digitsAt, isToken, octets, sameName } from "./_head.ts";
import { joined, writeAll } from "./_answer.ts";

export const encoder = new TextEncoder();
const decoder = new TextDecoder();
const CRLF = encoder.encode("\r\n");
const LAST_CHUNK = encoder.encode("0\r\n\r\n");

/** A request waiting for one of its origin's connections. */
export interface Waiter {
  resolve(c: Conn): void;
  reject(e: unknown): void;
  signal: AbortSignal | null;
}

/** One origin's connections: the idle ones, how many are busy, and who waits for one. */
export interface Pool {
  origin: string;
  hostname: string;
  port: number;
  idle: Conn[];
  busy: number;
  waiting: Waiter[];
}

/** An answer head read for the fetch shape: its header lines as pairs, the framing ones read. */
export interface Head {
  status: number;
  statusText: string;
  /** Each header line's name and value in turn, as sent (the value trimmed). */
  pairs: string[];
  /** The framing headers' values as `Headers.get` gives them (repeats joined by ", "), or null. */
  transferEncoding: string | null;
  contentLength: string | null;
  connection: string | null;
  http11: boolean;
}

/** A connection closed before any byte of the answer: safe to retry a fixed body once. */
export class StaleConnection extends Error {}

export function wrap(error: unknown): TypeError {
  if (error instanceof TypeError) return error;
  return new TypeError(`error sending request: ${(error as Error)?.message ?? error}`, {
    cause: error,
  });
}

const NOTHING = new Uint8Array(0);

/** One TCP connection and the bytes read from it but not yet consumed. */
export class Conn {
  readonly #tcp: Deno.TcpConn;
  readonly #onClose: () => void;
  buffered: Uint8Array<ArrayBuffer> = NOTHING;
  dead = false;
  used = false;
  idle = false;
  idleSince = 0;
  /** Bytes read so far in the current answer: none means a failure may be a stale connection. */
  answered = 0;
  #readSize = 16 * 1024;
  /**
   * The buffer reads go into, and how much of it may still be referred to (`#slabAt`): while no
   * view of it was handed out (`take`) it is reused from its start, as a fresh 16 KiB per request
   * was most of the gateway's garbage on small answers; once views were handed out, the next
   * read goes into the room after them, as a fresh 256 KiB per read of a bulk answer was a
   * seventh of a relaying gateway's CPU (a loopback read returns about 64 KiB).
   */
  #slab: Uint8Array<ArrayBuffer> | undefined;
  #slabAt = 0;
  #lent = false;
  #peek: Promise<number | null> | undefined;
  #peekBuf: Uint8Array<ArrayBuffer> | undefined;
  /** `idleSince` when the pending idle read began. */
  #peekSince = -1;
  /** The buffer of the read `read` started, until `landed` takes its result. */
  #reading: Uint8Array<ArrayBuffer> | undefined;

  constructor(tcp: Deno.TcpConn, onClose: () => void) {
    this.#tcp = tcp;
    this.#onClose = onClose;
  }

  /**
   * Starts a read while the connection sits idle, so a node that closes it is noticed (and the
   * connection dropped) before a request is written into it; the next answer starts from it.
   */
  watchIdle(): void {
    if (this.#peek !== undefined || this.buffered.length > 0) return;
    const buf = this.#readBuffer();
    this.#peekBuf = buf;
    this.#peekSince = this.idleSince;
    this.#peek = this.#tcp.read(buf).then(this.#settled, this.#broke);
  }

  /**
   * An idle read's end: when the connection is still idle since the read began, an end, a failure
   * or bytes nobody asked for all make it useless. Taken meanwhile, the answer's reader reads the
   * result itself. (Methods made once: two closures a request were a tenth of the pool's garbage.)
   */
  readonly #settled = (n: number | null): number | null => {
    if (this.idle && this.idleSince === this.#peekSince) this.destroy();
    return n;
  };
  readonly #broke = (): number | null => this.#settled(null);

  writeAll(bytes: Uint8Array): Promise<void> {
    return writeAll(this.#tcp, bytes);
  }

  /** What one write call takes of `bytes`: an async caller writes the rest (`writeAll`). */
  writeOnce(bytes: Uint8Array): Promise<number> {
    return this.#tcp.write(bytes);
  }

  /** Reads more bytes into `buffered`; false at the end of the stream. */
  async fill(): Promise<boolean> {
    return this.landed(await this.read());
  }

  /**
   * The next read: the idle one when it is pending, else a new one. Its result goes to `landed`
   * at once (`fill` is both): an exchange that awaits the read itself saves fill's frame.
   */
  read(): Promise<number | null> {
    const peek = this.#peek;
    if (peek !== undefined) {
      this.#reading = this.#peekBuf!;
      this.#peek = undefined;
      this.#peekBuf = undefined;
      return peek;
    }
    const buf = this.#readBuffer();
    this.#reading = buf;
    return this.#tcp.read(buf);
  }

  /** Takes in the result of `read`; false at the end of the stream. */
  landed(n: number | null): boolean {
    const buf = this.#reading!;
    this.#reading = undefined;
    if (n === null) {
      if (this.answered === 0) throw new StaleConnection("closed", { cause: closedEarly() });
      return false;
    }
    this.#slabAt += n;
    this.answered += n;
    // A socket that fills whole reads is a bulk transfer: read larger, up to 256 KiB.
    if (n === buf.length && this.#readSize < 256 * 1024) this.#readSize *= 2;
    const got = buf.subarray(0, n);
    if (this.buffered.length === 0) this.buffered = got;
    else {
      // Copied out: the joined bytes are what views are taken of, so the read buffer stays free.
      const joined = new Uint8Array(this.buffered.length + n);
      joined.set(this.buffered);
      joined.set(got, this.buffered.length);
      this.buffered = joined;
    }
    return true;
  }

  /** The next `n` buffered bytes as a view handed on: their read buffer is then never reused. */
  take(n: number): Uint8Array<ArrayBuffer> {
    this.#lent = true;
    const out = this.buffered.subarray(0, n);
    this.buffered = this.buffered.subarray(n);
    return out;
  }

  /** The next `n` buffered bytes, read then dropped at once (a head, a chunk line). */
  consume(n: number): Uint8Array<ArrayBuffer> {
    const all = this.buffered;
    // The usual last piece of an answer takes all: no view is made of the nothing after it.
    if (n === all.length) {
      this.buffered = NOTHING;
      return all;
    }
    this.buffered = all.subarray(n);
    return all.subarray(0, n);
  }

  /**
   * Room for the next read: the slab from its start when nothing refers to its bytes, else the
   * room after the bytes that may be referred to, else a new slab.
   */
  #readBuffer(): Uint8Array<ArrayBuffer> {
    const size = this.#readSize;
    let slab = this.#slab;
    if (slab !== undefined && !this.#lent && this.buffered.length === 0) this.#slabAt = 0;
    if (slab === undefined || slab.length - this.#slabAt < size / 4) {
      slab = new Uint8Array(size);
      this.#slab = slab;
      this.#slabAt = 0;
      this.#lent = false;
    }
    // The whole slab, the usual case, is read into as it is: a view of all of it is one more object.
    if (this.#slabAt === 0 && slab.length <= size) return slab;
    return slab.subarray(this.#slabAt, Math.min(slab.length, this.#slabAt + size));
  }

  destroy(): void {
    if (this.dead) return;
    this.dead = true;
    try {
      this.#tcp.close();
    } catch { /* already closed */ }
    this.#onClose();
  }
}

export function closedEarly(): TypeError {
  return new TypeError("error sending request: connection closed before message completed");
}

/**
 * Where the answer head buffered in `conn` ends (its blank line's start), searched from `from`,
 * or -1 while it is not all there (read more, then search again from the length before the
 * read, less three). Throws past `maxHeaderBytes`.
 */
function headEndIn(conn: Conn, maxHeaderBytes: number, from: number): number {
  const end = blankLineAt(conn.buffered, from);
  if (end > maxHeaderBytes || (end < 0 && conn.buffered.length > maxHeaderBytes)) {
    throw new TypeError(
      `error reading response: the head is longer than ${maxHeaderBytes} bytes`,
    );
  }
  return end;
}

/** Reads and parses one answer head, leaving the body's first bytes buffered. */
export async function readHead(conn: Conn, maxHeaderBytes: number): Promise<Head> {
  for (let from = 0;;) {
    const end = headEndIn(conn, maxHeaderBytes, from);
    if (end >= 0) {
      // One character a byte, as Headers takes header bytes: UTF-8 decoding made U+FFFD of them.
      return parseHead(octets(conn.consume(end + 4), 0, end));
    }
    from = Math.max(0, conn.buffered.length - 3);
    if (!(await conn.fill())) throw closedEarly();
  }
}

/**
 * An answer head as bytes, for the bytes lane, which relays it without a Headers object: only
 * the status and the framing headers are decoded.
 */
export interface RawHead {
  status: number;
  http11: boolean;
  /**
   * The head's bytes, status line to blank line: a view of the connection's buffer, valid only
   * until the body is first read (copy it out before).
   */
  raw: Uint8Array;
  /** Where the status line ends (after its CRLF), in `raw`. */
  statusEnd: number;
  /** Per header line, three offsets in `raw`: its start, its colon, its end after the CRLF. */
  spans: number[];
  /** The Content-Length when it was a plain number (read from its digits), else undefined. */
  length: number | undefined;
  /** Any other Content-Length value, as text (`framingOf` refuses what is no length). */
  contentLength: string | undefined;
  transferEncoding: string | undefined;
  connection: string;
}

/**
 * The answer head buffered in `conn` as bytes, consumed, or `undefined` while it is not all
 * there: read more, then ask again from `from` (where the blank line may start: the length
 * before the read, less three). Not async, so the exchange that reads it keeps one frame.
 */
export function bufferedRawHead(
  conn: Conn,
  maxHeaderBytes: number,
  from: number,
): RawHead | undefined {
  const end = headEndIn(conn, maxHeaderBytes, from);
  return end >= 0 ? parseRawHead(conn.consume(end + 4)) : undefined;
}

const HTTP1 = encoder.encode("HTTP/1.");

/** Whether `raw` starts with `HTTP/1.`, exactly (the version's name is case-sensitive). */
function startsHttp1(raw: Uint8Array): boolean {
  for (let i = 0; i < HTTP1.length; i++) if (raw[i] !== HTTP1[i]) return false;
  return true;
}

function isDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

function parseRawHead(raw: Uint8Array): RawHead {
  const statusEnd = byteIndex(raw, 10, 0) + 1;
  // "HTTP/1.x NNN" and a CRLF: the rest of the status line is the reason, passed on as it came.
  // Read from the bytes: a TextDecoder call per answer was two calls into the runtime.
  const ok = statusEnd >= 14 && raw[statusEnd - 2] === 13 && startsHttp1(raw) &&
    (raw[7] === 48 || raw[7] === 49) && raw[8] === 32 &&
    (raw[12] === 32 || raw[12] === 13) && isDigit(raw[9]) && isDigit(raw[10]) &&
    isDigit(raw[11]);
  const status = ok ? (raw[9] - 48) * 100 + (raw[10] - 48) * 10 + raw[11] - 48 : NaN;
  if (!(status >= 100)) {
    throw new TypeError(
      `error reading response: bad status line '${
        decoder.decode(raw.subarray(0, 80)).split("\r")[0]
      }'`,
    );
  }
  const spans: number[] = [];
  let contentLength: string | undefined, transferEncoding: string | undefined, connection = "";
  let length: number | undefined;
  const stop = raw.length - 2;
  for (let at = statusEnd; at < stop;) {
    const nl = byteIndex(raw, 10, at);
    const colon = byteIndex(raw, 58, at, nl);
    // A name that is no token (a space in it, say) is a broken head: it is not relayed.
    if (nl <= at || raw[nl - 1] !== 13 || colon <= at || colon > nl || !isToken(raw, at, colon)) {
      throw new TypeError("error reading response: bad header line");
    }
    for (let k = colon; k < nl - 1; k++) {
      if (raw[k] === 13 || raw[k] === 0) {
        throw new TypeError("error reading response: bad header line");
      }
    }
    spans.push(at, colon, nl + 1);
    const n = colon - at;
    // The framing headers' values only (a closure per line to decode one was a heap object).
    if (n === 14 && sameName(raw, at, colon, "content-length")) {
      // The usual value, digits between optional blanks, is read from the bytes: no string.
      length = digitsBetweenBlanks(raw, colon + 1, nl - 1);
      contentLength = length === undefined ? octets(raw, colon + 1, nl - 1).trim() : undefined;
    } else if (n === 17 && sameName(raw, at, colon, "transfer-encoding")) {
      transferEncoding = octets(raw, colon + 1, nl - 1).trim();
    } else if (n === 10 && sameName(raw, at, colon, "connection")) {
      connection += `,${octets(raw, colon + 1, nl - 1).trim()}`;
    }
    at = nl + 1;
  }
  return {
    status,
    http11: raw[7] === 49,
    raw,
    statusEnd,
    spans,
    length,
    contentLength,
    transferEncoding,
    connection,
  };
}

/** The number `b[from, to)` spells: at most 15 digits between spaces or tabs; else undefined. */
function digitsBetweenBlanks(b: Uint8Array, from: number, to: number): number | undefined {
  while (from < to && (b[from] === 32 || b[from] === 9)) from++;
  while (to > from && (b[to - 1] === 32 || b[to - 1] === 9)) to--;
  const n = digitsAt(b, from, to);
  return n < 0 ? undefined : n;
}

function parseHead(text: string): Head {
  const lines = text.split("\r\n");
  const m = /^HTTP\/1\.([01]) (\d{3})(?: (.*))?$/.exec(lines[0]);
  if (m === null) {
    throw new TypeError(`error reading response: bad status line '${lines[0].slice(0, 80)}'`);
  }
  // Pairs, not a Headers: the Response they go into appends them to its own (a Headers given in
  // its init is copied through the iterator, the costliest part of making the Response).
  const pairs: string[] = [];
  let transferEncoding: string | null = null, contentLength: string | null = null;
  let connection: string | null = null;
  const joinedWith = (seen: string | null, value: string) =>
    seen === null ? value : `${seen}, ${value}`;
  for (let i = 1; i < lines.length; i++) {
    const line = lines[i];
    const colon = line.indexOf(":");
    if (colon <= 0) throw new TypeError(`error reading response: bad header line`);
    const name = line.slice(0, colon), value = line.slice(colon + 1).trim();
    pairs.push(name, value);
    const n = name.length;
    if (n !== 10 && n !== 14 && n !== 17) continue;
    const lower = name.toLowerCase();
    if (lower === "transfer-encoding") transferEncoding = joinedWith(transferEncoding, value);
    else if (lower === "content-length") contentLength = joinedWith(contentLength, value);
    else if (lower === "connection") connection = joinedWith(connection, value);
  }
  return {
    status: Number(m[2]),
    statusText: m[3] ?? "",
    pairs,
    transferEncoding,
    contentLength,
    connection,
    http11: m[1] === "1",
  };
}

/** Decodes a chunked body read by read; trailers are read and dropped. */
export class ChunkDecoder {
  readonly #conn: Conn;
  #left = 0;
  #ended = false;

  constructor(conn: Conn) {
    this.#conn = conn;
  }

  async next(): Promise<Uint8Array | null> {
    const conn = this.#conn;
    for (;;) {
      if (this.#ended) return null;
      if (this.#left > 0) {
        if (conn.buffered.length === 0 && !(await conn.fill())) throw closedEarly();
        const n = Math.min(this.#left, conn.buffered.length);
        this.#left -= n;
        const out = conn.take(n);
        if (this.#left === 0) await this.#line(); // the CRLF after the data
        return out;
      }
      const sizeLine = await this.#line();
      const size = chunkSize(sizeLine);
      if (size < 0) {
        throw new TypeError(`error reading response: bad chunk size '${sizeLine.slice(0, 20)}'`);
      }
      if (size === 0) {
        while ((await this.#line()) !== "") { /* trailers */ }
        this.#ended = true;
        return null;
      }
      this.#left = size;
    }
  }

  /** One CRLF-ended line (a size line or a trailer), at most 8 KiB. */
  async #line(): Promise<string> {
    const conn = this.#conn;
    for (;;) {
      const b = conn.buffered;
      for (let i = 0; i + 1 < b.length; i++) {
        if (b[i] === 13 && b[i + 1] === 10) {
          // One character a byte, as the chunk line's grammar is written for octets.
          const text = octets(b, 0, i);
          conn.consume(i + 2);
          return text;
        }
      }
      if (b.length > 8192) throw new TypeError("error reading response: a chunk line is too long");
      if (!(await conn.fill())) throw closedEarly();
    }
  }
}

/**
 * Writes the head and the body. A stream's first chunk shares the head's write (a small body
 * whose length was declared is then one write, as a fixed one is); each further chunk is one
 * write as it comes, chunk-framed unless `length` was declared, whose count is then held to.
 */
export async function writeRequest(
  conn: Conn,
  head: Uint8Array,
  bytes: Uint8Array | undefined,
  stream: ReadableStream<Uint8Array> | undefined,
  length: number | undefined,
  onStoppable: (stop: () => void) => void = () => {},
): Promise<void> {
  if (stream === undefined) {
    await conn.writeAll(head);
    if (bytes !== undefined) await conn.writeAll(bytes);
    return;
  }
  const reader = stream.getReader();
  onStoppable(() => void reader.cancel(closedEarly()).catch(() => {}));
  let pending: Uint8Array | undefined = head;
  let sent = 0;
  // One buffer for framing every chunk of this body: each write is awaited before the next
  // chunk is framed, so it is free again by then (a fresh 64 KiB per chunk was a fifth of the
  // gateway's CPU on a streamed upload, with the GC it fed).
  let scratch = new Uint8Array(0);
  try {
    for (;;) {
      if (length !== undefined && sent === length) break;
      const { value, done } = await reader.read();
      if (done) break;
      if (value.length === 0) continue;
      sent += value.length;
      if (length !== undefined && sent > length) {
        throw new TypeError(`error sending request: the body is longer than its ${length} bytes`);
      }
      let framed: Uint8Array = value;
      if (length === undefined) {
        const size = encoder.encode(`${value.length.toString(16)}\r\n`);
        const needed = size.length + value.length + 2;
        if (scratch.length < needed) scratch = new Uint8Array(Math.max(needed, 2 * scratch.length));
        framed = scratch.subarray(0, needed);
        framed.set(size);
        framed.set(value, size.length);
        framed.set(CRLF, size.length + value.length);
      }
      await conn.writeAll(pending === undefined ? framed : joined(pending, framed));
      pending = undefined;
    }
    if (length !== undefined && sent !== length) {
      throw new TypeError(`error sending request: the body ended ${length - sent} bytes short`);
    }
    const tail = length === undefined ? LAST_CHUNK : new Uint8Array(0);
    const last = pending === undefined ? tail : joined(pending, tail);
    if (last.length > 0) await conn.writeAll(last);
  } catch (error) {
    await reader.cancel(error).catch(() => {});
    throw error;
  } finally {
    reader.releaseLock();
  }
}
