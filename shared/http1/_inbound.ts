/**
 * The request side of the bytes engine (`server.ts`): the bytes read from a client and not yet
 * consumed, with the one read that stays pending while an answer is made (so a hang-up is heard),
 * and one request's body, sized or chunked, read as the handler asks and drained after its answer.
 *
 * @module
 */
import { byteIndex, HeadError, octets, type RequestHead } from "./_head.ts";
import { type Progress, unmetered } from "./_progress.ts";
import { ChunkFraming, LINE_MAX } from "./_chunked.ts";

/** The size of one read. */
const READ_BYTES = 64 * 1024;
/** A body piece at least this long still to come is read into a buffer of its own. */
const OWN_READ = 64 * 1024;
/** Longest time spent reading and dropping a body the handler left unread. */
const DRAIN_MAX_MS = 10_000;

/** The bytes read from the client and not yet consumed, and the one read that may be pending. */
export class Inbound {
  readonly conn: Deno.Conn;
  buf = new Uint8Array(READ_BYTES);
  start = 0;
  end = 0;
  /** A read started while the answer is made, so a hang-up is heard: its result comes first. */
  #pending: Promise<number | null> | undefined;
  /** Settles `true` when the client hung up (or the socket failed). */
  #hungUp: (() => void) | undefined;
  closed = false;
  /**
   * Set while a parsed head (and maybe a body) are views of `buf`: the bytes before `start` stay
   * where they are until the next head is read, so a later read goes after them or into a new
   * buffer, never over them.
   */
  #held = false;

  /** Counts the reads that wait for the client (not the hang-up watch's): the guard's stall bound. */
  readonly #progress: Progress;

  constructor(conn: Deno.Conn, progress: Progress = unmetered()) {
    this.conn = conn;
    this.#progress = progress;
  }

  get size(): number {
    return this.end - this.start;
  }

  /** Keeps every byte read so far in place until {@linkcode release}: a head was parsed. */
  hold(): void {
    this.#held = true;
  }

  /** The views of the last head are no longer used: their bytes may be reused. */
  release(): void {
    this.#held = false;
  }

  /** Makes room for `n` more bytes after `end` (moving or growing the buffer). */
  #room(n: number): void {
    if (this.#held) {
      if (this.buf.length - this.end >= n) return;
      // The old buffer stays with the views into it; the live bytes move to a new one.
      this.#renew(n);
      return;
    }
    if (this.start === this.end) this.start = this.end = 0;
    if (this.buf.length - this.end >= n) return;
    const live = this.end - this.start;
    if (live + n > this.buf.length) {
      const grown = new Uint8Array(live + n);
      grown.set(this.buf.subarray(this.start, this.end));
      this.buf = grown;
    } else this.buf.copyWithin(0, this.start, this.end);
    this.start = 0;
    this.end = live;
  }

  /** Moves the live bytes to a new buffer with room for `n` more; views into the old one stay. */
  #renew(n: number): void {
    const fresh = new Uint8Array(Math.max(READ_BYTES, this.size + n));
    fresh.set(this.buf.subarray(this.start, this.end));
    this.buf = fresh;
    this.end -= this.start;
    this.start = 0;
    this.#held = false;
  }

  /** Reads more; false at the end of the stream (or when the socket failed). */
  async fill(): Promise<boolean> {
    if (this.closed) return false;
    let n: number | null;
    if (this.#pending !== undefined) {
      n = await this.#pending;
      this.#pending = undefined;
    } else {
      this.#room(READ_BYTES / 4);
      this.#progress.reads++;
      n = await this.conn.read(this.buf.subarray(this.end)).catch(() => null);
      this.#progress.readsDone++;
    }
    if (n === null) {
      this.closed = true;
      return false;
    }
    this.end += n;
    return true;
  }

  /**
   * Reads at most `max` bytes into a buffer of their own, handed over whole: a bulk body's piece
   * then costs no copy out of the connection's buffer. Only when nothing is buffered or pending;
   * null at the end of the stream.
   */
  async readOwn(max: number): Promise<Uint8Array<ArrayBuffer> | null> {
    if (this.closed) return null;
    const own = new Uint8Array(max);
    this.#progress.reads++;
    const n = await this.conn.read(own).catch(() => null);
    this.#progress.readsDone++;
    if (n === null) {
      this.closed = true;
      return null;
    }
    return own.subarray(0, n);
  }

  /** What is buffered, or the next read's bytes, as a copy; null at the end (a splice's reads). */
  async next(): Promise<Uint8Array<ArrayBuffer> | null> {
    if (this.size === 0 && !(await this.fill())) return null;
    return this.take(this.size);
  }

  /** Whether a read is pending (`watch`): `fill` must take its result first. */
  get pending(): boolean {
    return this.#pending !== undefined;
  }

  /**
   * Starts a read that settles when the client sends more (a pipelined request, kept) or hangs
   * up (`onHangUp` runs). At most one is pending; `fill` takes its result.
   */
  watch(onHangUp: () => void): void {
    this.#hungUp = onHangUp;
    if (this.#pending !== undefined || this.closed) return;
    // Nothing read so far moves or is overwritten while the answer is made: the head and a lane's
    // body are views of it. Short of room, the read goes into a new buffer instead.
    if (this.buf.length - this.end < READ_BYTES / 4) this.#renew(READ_BYTES / 4);
    // One promise, not a catch and a then: a failed read is a hang-up as an end is.
    this.#pending = this.conn.read(this.buf.subarray(this.end)).then(this.#heard, this.#failed);
  }

  /** A watched read's result: an end tells the watcher. */
  readonly #heard = (n: number | null): number | null => {
    if (n === null) this.#hungUp?.();
    return n;
  };
  /** A watched read that failed: a hang-up too. */
  readonly #failed = (): null => {
    this.#hungUp?.();
    return null;
  };

  /** Stops telling the last watcher. */
  unwatch(): void {
    this.#hungUp = undefined;
  }

  /** Takes `n` buffered bytes as a view, valid until the next head is read. */
  view(n: number): Uint8Array<ArrayBuffer> {
    const out = this.buf.subarray(this.start, this.start + n);
    this.start += n;
    return out;
  }

  /** Takes `n` buffered bytes as a copy (a body chunk handed to the app outlives the buffer). */
  take(n: number): Uint8Array<ArrayBuffer> {
    const out = this.buf.slice(this.start, this.start + n);
    this.start += n;
    return out;
  }

  /** One CRLF-ended line (a chunk size, a trailer), without its CRLF, or null at the end. */
  async line(): Promise<string | null> {
    for (;;) {
      const nl = byteIndex(this.buf, 10, this.start, this.end);
      if (nl !== -1) {
        if (nl === this.start || this.buf[nl - 1] !== 13) {
          throw new HeadError(400, "A chunked body has a line that ends with a bare LF");
        }
        const text = octets(this.buf, this.start, nl - 1);
        this.start = nl + 1;
        return text;
      }
      if (this.size > LINE_MAX) {
        throw new HeadError(400, `A chunked body has a line longer than ${LINE_MAX} bytes`);
      }
      if (!(await this.fill())) return null;
    }
  }
}

/**
 * Reads one request's body from `inbound` as it is asked for: by the handler's stream, then by
 * the engine, which drops what the handler left unread before the next request's head.
 */
export class BodyReader {
  readonly #in: Inbound;
  /** Bytes left in the body (sized) or in the current chunk (chunked). */
  #left: number;
  /** A chunked body's framing; undefined for a sized one. */
  readonly #framing: ChunkFraming | undefined;
  /** The read in progress, which a drain waits for before reading on its own. */
  #reading: Promise<unknown> | undefined;
  /** Set once the engine drains: the handler's stream reads nothing more. */
  #abandoned = false;
  /** Runs once when the body's last byte has been read. */
  onEnd: (() => void) | undefined;
  /** Runs when the client ends the connection before the body's end (a hang-up). */
  onCut: (() => void) | undefined;
  done: boolean;
  /** Bytes read of the body so far. */
  read = 0;

  constructor(inbound: Inbound, head: RequestHead) {
    this.#in = inbound;
    const chunked = head.contentLength === -1;
    this.#left = chunked ? 0 : head.contentLength;
    this.#framing = chunked ? new ChunkFraming(badChunk) : undefined;
    this.done = head.contentLength === 0;
  }

  /**
   * The whole of a sized body as a view, when it has all been read with the head (the usual
   * small request): no copy. `undefined` otherwise.
   */
  whole(): Uint8Array<ArrayBuffer> | undefined {
    if (this.#framing !== undefined || this.done || this.read > 0 || this.#in.size < this.#left) {
      return undefined;
    }
    const out = this.#in.view(this.#left);
    this.read = this.#left;
    this.#left = 0;
    this.#ended();
    return out;
  }

  /** The next piece of the body for the handler, or null at its end. */
  next(): Promise<Uint8Array<ArrayBuffer> | null> {
    if (this.#abandoned) {
      return Promise.reject(new Deno.errors.BadResource("the request's answer was already sent"));
    }
    const reading = this.#next();
    this.#reading = reading;
    // Only a chunked body can be malformed (a sized one can only be cut short).
    if (this.#framing !== undefined) reading.catch(this.#refused);
    return reading;
  }

  /**
   * The refusal the body's own bytes earned (a bad chunk line), once a read met it: the engine
   * answers it whatever the handler made of the failed read.
   */
  refusal: HeadError | undefined;
  readonly #refused = (error: unknown): void => {
    if (error instanceof HeadError) this.refusal ??= error;
  };

  async #next(): Promise<Uint8Array<ArrayBuffer> | null> {
    const inbound = this.#in;
    if (this.done) return null;
    if (this.#framing !== undefined) {
      const ready = await this.#framing.ready(inbound, this.#cutError);
      if (ready === 0) return this.#ended();
      this.#left = ready;
    }
    if (inbound.size === 0 && !this.#abandoned && !inbound.pending && this.#left >= OWN_READ) {
      // A bulk body with nothing buffered: read straight into a piece of its own.
      const own = await inbound.readOwn(Math.min(this.#left, 4 * OWN_READ));
      if (own === null) throw this.#cut();
      this.#left -= own.length;
      this.#framing?.took(own.length);
      this.read += own.length;
      if (this.#framing === undefined && this.#left === 0) this.#ended();
      return own;
    }
    if (inbound.size === 0 && !(await inbound.fill())) throw this.#cut();
    const n = Math.min(this.#left, inbound.size);
    this.#left -= n;
    this.#framing?.took(n);
    this.read += n;
    // Dropped bytes are skipped, not copied: a refused 128 MiB body costs no garbage.
    const piece = this.#abandoned ? SKIPPED : inbound.take(n);
    if (this.#abandoned) inbound.start += n;
    if (this.#framing === undefined && this.#left === 0) this.#ended();
    return piece;
  }

  /** `#cut` as the framing calls it. */
  readonly #cutError = (): Error => this.#cut();

  /** The client ended the request before the body's end: its hang-up is told, and the read fails. */
  #cut(): Error {
    this.onCut?.();
    return new Deno.errors.UnexpectedEof("the client ended the request before its body's end");
  }

  #ended(): null {
    this.done = true;
    const onEnd = this.onEnd;
    this.onEnd = undefined;
    onEnd?.();
    return null;
  }

  /**
   * Takes the body from the handler and reads and drops the rest, within DRAIN_MAX_MS; false
   * when it could not (the connection must then end).
   */
  async drain(): Promise<boolean> {
    this.#abandoned = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<false>((r) => timer = setTimeout(() => r(false), DRAIN_MAX_MS));
    const rest = async () => {
      await this.#reading;
      while (!this.done) await this.#next();
      return true;
    };
    try {
      return await Promise.race([rest(), late]);
    } catch {
      return false;
    } finally {
      clearTimeout(timer);
    }
  }
}

/** A chunked request body that breaks the coding: a 400. */
function badChunk(message: string): HeadError {
  return new HeadError(400, message);
}

/** What a drained read returns: the bytes were dropped. */
const SKIPPED = new Uint8Array(0);
