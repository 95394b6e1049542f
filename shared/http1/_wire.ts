/**
 * The wire side of {@linkcode createH1Client} (client.ts): one pooled TCP connection and its
 * read buffer, the answer head's reader with its cap (the parser is `_head.ts`'s), the chunked
 * body's reader (the coding is `_chunked.ts`'s), and the request writer. The pools and their
 * waits are `_pool.ts`'s, the fetch shape the client's.
 *
 * @module
 */
import { blankLineAt, byteIndex, octets, parseAnswerHead, type RawHead } from "./_head.ts";
import { joined, writeAll } from "./_answer.ts";
import { ChunkFraming, frame, LAST_CHUNK, LINE_MAX } from "./_chunked.ts";

export const encoder = new TextEncoder();

/** An answer head read for the fetch shape: its status text and header lines as pairs too. */
export interface Head extends RawHead {
  statusText: string;
  /** Each header line's name and value in turn, as sent (the value trimmed). */
  pairs: string[];
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

/** A new connection's first read size (see `Conn`'s `#readSize`). */
export const INITIAL_READ_BYTES = 4 * 1024;

/** One TCP connection and the bytes read from it but not yet consumed. */
export class Conn {
  readonly #tcp: Deno.Conn;
  readonly #onClose: () => void;
  buffered: Uint8Array<ArrayBuffer> = NOTHING;
  dead = false;
  used = false;
  idle = false;
  idleSince = 0;
  /** Bytes read so far in the current answer: none means a failure may be a stale connection. */
  answered = 0;
  /**
   * The next read's size: 4 KiB on a new connection, doubled by each read that fills it (up to
   * 256 KiB). A lookup's or a verb's answer fits in 4 KiB; a gateway in front of 10,000 nodes
   * keeps a connection (and its slab) to each between rounds, and at 16 KiB a slab those were
   * 160 MB of its memory (measured 2026-12-07), most of its resident size.
   */
  #readSize = INITIAL_READ_BYTES;
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

  constructor(tcp: Deno.Conn, onClose: () => void) {
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

  /**
   * One CRLF-ended line of a chunked body, without its CRLF, or null at the end of the stream;
   * a bare LF or a line past `LINE_MAX` fails the answer.
   */
  async line(): Promise<string | null> {
    for (let from = 0;;) {
      const b = this.buffered;
      const nl = byteIndex(b, 10, from);
      if (nl !== -1) {
        if (nl === 0 || b[nl - 1] !== 13) {
          throw answerError("a chunked body has a line that ends with a bare LF");
        }
        const text = octets(b, 0, nl - 1);
        this.consume(nl + 1);
        return text;
      }
      if (b.length > LINE_MAX) {
        throw answerError(`a chunked body has a line longer than ${LINE_MAX} bytes`);
      }
      from = b.length;
      if (!(await this.fill())) return null;
    }
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

/**
 * The server closed its connection before its answer ended: an event of that server (a node
 * whose sandbox was killed mid-stream, a server that crashed), not a bug of this process, so a
 * server passing such an answer on tells it apart from an unexpected error.
 */
export class ClosedEarly extends TypeError {}

export function closedEarly(): TypeError {
  return new ClosedEarly("error sending request: connection closed before message completed");
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
      return fetchShape(parseAnswerHead(conn.consume(end + 4)));
    }
    from = Math.max(0, conn.buffered.length - 3);
    if (!(await conn.fill())) throw closedEarly();
  }
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
  return end >= 0 ? parseAnswerHead(conn.consume(end + 4)) : undefined;
}

/**
 * `head` with its reason and its header lines decoded, one character a byte, as Headers takes
 * header bytes (UTF-8 decoding made U+FFFD of them). Pairs, not a Headers: the Response they go
 * into appends them to its own (a Headers given in its init is copied through the iterator, the
 * costliest part of making the Response).
 */
function fetchShape(head: RawHead): Head {
  const { raw, spans, statusEnd } = head;
  const statusText = raw[12] === 32 ? octets(raw, 13, statusEnd - 2) : "";
  const pairs: string[] = [];
  for (let i = 0; i < spans.length; i += 3) {
    pairs.push(
      octets(raw, spans[i], spans[i + 1]),
      octets(raw, spans[i + 1] + 1, spans[i + 2] - 2).trim(),
    );
  }
  return { ...head, statusText, pairs };
}

/** A chunked answer body, read by read (the coding's rules are `_chunked.ts`'s). */
export class ChunkDecoder {
  readonly #conn: Conn;
  readonly #framing = new ChunkFraming(answerError);

  constructor(conn: Conn) {
    this.#conn = conn;
  }

  /** The next piece of data, lent (valid until the connection's next answer), or null at the end. */
  async next(): Promise<Uint8Array | null> {
    const conn = this.#conn;
    const ready = await this.#framing.ready(conn, closedEarly);
    if (ready === 0) return null;
    if (conn.buffered.length === 0 && !(await conn.fill())) throw closedEarly();
    const n = Math.min(ready, conn.buffered.length);
    this.#framing.took(n);
    return conn.take(n);
  }
}

/** The error of an answer that breaks HTTP/1.1's framing. */
function answerError(message: string): TypeError {
  return new TypeError(`error reading response: ${message}`);
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
        // Room for the data and its size line and CRLF (a 13-digit size at most).
        const needed = value.length + 17;
        if (scratch.length < needed) scratch = new Uint8Array(Math.max(needed, 2 * scratch.length));
        framed = frame(value, scratch);
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
