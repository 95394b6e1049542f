/**
 * The chunked transfer coding (RFC 9112 §7.1), both ways, for requests and answers alike: the
 * framing of a chunked body read from a client (`_inbound.ts`) and from a node (`_wire.ts`), and
 * the frames written around a body sent chunked. Each rule of the coding lives here once: a size
 * line is hex digits and well-formed extensions (`chunkSize`, beside the head rules in
 * `_head.ts`), each chunk's data is followed by a CRLF, the trailers are read and dropped within
 * a cap.
 *
 * @module
 */
import { chunkSize } from "./_head.ts";

/** Longest chunk-size line or trailer line, and most trailer bytes, of a chunked body. */
export const LINE_MAX = 8 * 1024;

/** Where a chunked body's lines come from: one CRLF-ended line, without its CRLF. */
export interface LineSource {
  /**
   * The next line, or null at the end of the stream. Refuses (throws) a bare LF and a line
   * longer than {@linkcode LINE_MAX}.
   */
  line(): Promise<string | null>;
}

/**
 * One chunked body's framing, read from its source between the data: what is left of the current
 * chunk, and the lines that come before the next one. The reader takes the data itself (its own
 * way: a view, a copy, a read of its own) and says how much it took.
 */
export class ChunkFraming {
  /** Data bytes left in the current chunk; -1 before the first chunk. */
  #left = -1;
  /** Set once the last chunk and the trailers have been read. */
  done = false;
  readonly #fail: (message: string) => Error;

  /** `fail` makes the error of a body that breaks the coding (a 400, or a failed answer). */
  constructor(fail: (message: string) => Error) {
    this.#fail = fail;
  }

  /**
   * How many data bytes may be taken now: what is left of the current chunk or, when it is all
   * taken, the next chunk's size, read after the previous chunk's CRLF. 0 once the body has
   * ended (the last chunk and the trailers read).
   *
   * @throws the `fail` error on a malformed line; `cut()` of the caller when the source ends.
   */
  async ready(source: LineSource, cut: () => Error): Promise<number> {
    if (this.done) return 0;
    if (this.#left > 0) return this.#left;
    if (this.#left === 0) {
      const after = await source.line();
      if (after === null) throw cut();
      if (after !== "") throw this.#fail("A chunk's data is not followed by CRLF");
    }
    const line = await source.line();
    if (line === null) throw cut();
    const n = chunkSize(line);
    if (n < 0) {
      throw this.#fail(`A chunk size '${line.slice(0, 20)}' is not a hex length`);
    }
    if (n > 0) {
      this.#left = n;
      return n;
    }
    let trailers = 0;
    for (;;) {
      const t = await source.line();
      if (t === null) throw cut();
      if (t === "") break;
      trailers += t.length;
      if (trailers > LINE_MAX) {
        throw this.#fail(`A chunked body's trailers pass ${LINE_MAX} bytes`);
      }
    }
    this.done = true;
    return 0;
  }

  /** `n` data bytes of the current chunk were taken. */
  took(n: number): void {
    this.#left -= n;
  }
}

/** The CRLF after a chunk's data. */
export const CRLF: Uint8Array = Uint8Array.of(13, 10);
/** The last chunk with no trailers: the end of a chunked body. */
export const LAST_CHUNK: Uint8Array = Uint8Array.of(48, 13, 10, 13, 10);

/** The size line that goes before `n` bytes of chunk data. */
export function sizeLine(n: number): Uint8Array {
  const hex = n.toString(16);
  const out = new Uint8Array(hex.length + 2);
  writeSize(out, hex);
  return out;
}

/** Writes `hex` and a CRLF at the start of `out`; resolves where the data goes. */
function writeSize(out: Uint8Array, hex: string): number {
  // Char codes, not a TextEncoder: its call into the runtime cost more than the frame.
  for (let i = 0; i < hex.length; i++) out[i] = hex.charCodeAt(i);
  out[hex.length] = 13;
  out[hex.length + 1] = 10;
  return hex.length + 2;
}

/**
 * `data` framed as one chunk, in `into` when it is large enough (each frame is written before
 * the next is made, so one scratch buffer can serve a whole body) or in a new buffer.
 */
export function frame(data: Uint8Array, into?: Uint8Array): Uint8Array {
  const hex = data.length.toString(16);
  const needed = hex.length + data.length + 4;
  const out = into !== undefined && into.length >= needed
    ? into.subarray(0, needed)
    : new Uint8Array(needed);
  const at = writeSize(out, hex);
  out.set(data, at);
  out[needed - 2] = 13;
  out[needed - 1] = 10;
  return out;
}
