/**
 * The answer side of the bytes engine (`server.ts`): a `Response` written as HTTP/1.1, sized
 * when its length is known at once, chunked (or, to HTTP/1.0, ended by the close) when it streams,
 * its head out before its first body byte; and the byte helpers the gateway's lane shares.
 *
 * @module
 */
import type { RequestHead } from "./_head.ts";
import { CRLF, frame, LAST_CHUNK, sizeLine } from "./_chunked.ts";

/** Answer headers the engine frames itself. */
const framing = new Set(["connection", "keep-alive", "transfer-encoding", "content-length"]);

/** The largest piece carved from a {@linkcode Carver}'s slab; a longer one is its own buffer. */
export const CARVE_MAX = 2048;
/** A slab's size: a stuck write pins at most one slab. */
const SLAB_BYTES = 16 * 1024;

/**
 * Buffers for the bytes lane's writes (a node's request, a client's answer head), carved one after
 * the other from a slab and never reused: a new buffer per write was two ArrayBuffers a request
 * for the runtime to allocate and the GC to sweep. A slab is dropped once it is carved out, and
 * lives on only while a write of one of its pieces does.
 */
export class Carver {
  #slab = new Uint8Array(0);
  #at = 0;

  /** `n` bytes of room that no other piece shares. */
  take(n: number): Uint8Array<ArrayBuffer> {
    if (n > CARVE_MAX) return new Uint8Array(n);
    if (this.#slab.length - this.#at < n) {
      this.#slab = new Uint8Array(SLAB_BYTES);
      this.#at = 0;
    }
    const out = this.#slab.subarray(this.#at, this.#at + n);
    this.#at += n;
    return out;
  }
}

let dateText = "";
let dateSecond = 0;
/** The Date header's value (RFC 9110 §6.6.1: a server with a clock sends it), made once a second. */
function httpDate(): string {
  const now = Date.now();
  const second = Math.floor(now / 1000);
  if (second !== dateSecond) {
    dateSecond = second;
    dateText = new Date(now).toUTCString();
  }
  return dateText;
}

const reasons: Record<number, string> = {
  200: "OK",
  201: "Created",
  204: "No Content",
  206: "Partial Content",
  301: "Moved Permanently",
  302: "Found",
  304: "Not Modified",
  400: "Bad Request",
  401: "Unauthorized",
  403: "Forbidden",
  404: "Not Found",
  405: "Method Not Allowed",
  409: "Conflict",
  413: "Content Too Large",
  417: "Expectation Failed",
  429: "Too Many Requests",
  431: "Request Header Fields Too Large",
  500: "Internal Server Error",
  501: "Not Implemented",
  502: "Bad Gateway",
  503: "Service Unavailable",
  504: "Gateway Timeout",
  505: "HTTP Version Not Supported",
  508: "Loop Detected",
};

/** Where an answer is written: a socket, or one whose writes are counted. */
export interface Writer {
  write(p: Uint8Array): Promise<number>;
}

/** Writes all of `bytes` to `conn` (a write may take fewer). */
export function writeAll(
  conn: Writer,
  bytes: Uint8Array,
): Promise<void> {
  // Not an async function: its frame, its promise and a view per call were a tenth of what a
  // lane request allocated, and a small write is written whole by its first call.
  try {
    return conn.write(bytes).then((n) => n < bytes.length ? writeRest(conn, bytes, n) : undefined);
  } catch (error) {
    return Promise.reject(error);
  }
}

/** The rest of `bytes` from `at`, written call by call. */
async function writeRest(
  conn: Writer,
  bytes: Uint8Array,
  at: number,
): Promise<void> {
  while (at < bytes.length) at += await conn.write(bytes.subarray(at));
}

/** `a` then `b` in one new buffer, for one write. */
export function joined(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** Pieces at least this long are written as they are, not copied into a frame or a head. */
const COPY_MAX = 16 * 1024;

/**
 * The bytes of head text whose characters are octets (a `Headers` value is a ByteString):
 * one byte each, as HTTP sends them. TextEncoder made UTF-8 of a value's bytes past 0x7f, and its
 * call into the runtime was a twentieth of the object path's time.
 */
export function latin1(text: string): Uint8Array<ArrayBuffer> {
  const out = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i++) out[i] = text.charCodeAt(i);
  return out;
}

/** Resolves after a few microtask turns: long enough for a fixed body's stream to end. */
export function soon(): Promise<"later"> {
  return Promise.resolve().then(() => 0).then(() => 0).then(() => 0).then(() => "later" as const);
}

/**
 * Writes a body after `head` (an answer's head, not yet written): the pieces `next` gives until
 * null, sized when `length` is 0 or more (and held to it), chunked when `chunked`, as they come
 * otherwise (an answer ended by the close). `first` is the first piece's read, already begun: when
 * it is not there at once, the head goes out before it. Each piece is written before the next is
 * asked for, so `next` may reuse the bytes it handed out; a large piece is written as it is, not
 * copied into a frame or joined to the head.
 */
export async function writeBody(
  write: (bytes: Uint8Array) => Promise<void>,
  head: Uint8Array,
  first: Promise<Uint8Array | null>,
  next: () => Promise<Uint8Array | null>,
  length: number,
  chunked: boolean,
): Promise<void> {
  let pending: Uint8Array | undefined = head;
  const ready = await Promise.race([first, soon()]);
  if (ready === "later") {
    await write(head);
    pending = undefined;
  }
  /** Writes one piece after what is pending, framed; a large one is not copied to be joined. */
  const put = async (piece: Uint8Array) => {
    if (piece.length >= COPY_MAX) {
      // Its size line (or the head) in one write, the piece as it is in the next.
      const before = chunked ? sizeLine(piece.length) : undefined;
      const lead = before === undefined
        ? pending
        : pending === undefined
        ? before
        : joined(pending, before);
      if (lead !== undefined) await write(lead);
      await write(piece);
      pending = chunked ? CRLF : undefined;
      return;
    }
    const out = chunked ? frame(piece) : piece;
    await write(pending === undefined ? out : joined(pending, out));
    pending = undefined;
  };
  let sent = 0;
  for (let piece = ready === "later" ? await first : ready; piece !== null; piece = await next()) {
    if (piece.length === 0) continue;
    sent += piece.length;
    if (length >= 0 && sent > length) {
      throw new TypeError("the answer's body is longer than its length");
    }
    await put(piece);
  }
  if (length >= 0 && sent !== length) {
    throw new TypeError("the answer's body ended before its length");
  }
  const tail = chunked ? LAST_CHUNK : undefined;
  if (pending !== undefined || tail !== undefined) {
    await write(
      pending === undefined ? tail! : tail === undefined ? pending : joined(pending, tail),
    );
  }
}

/**
 * Writes `response` as the answer to `head`. Resolves whether the connection may carry another
 * request. Rejects when the client went away mid-write or the body failed (its source is
 * cancelled first).
 */
export async function writeResponse(
  conn: Writer,
  head: RequestHead,
  response: Response,
  close: boolean,
): Promise<boolean> {
  const status = response.status;
  let text = `HTTP/1.1 ${status} ${response.statusText || reasons[status] || "Status"}\r\n`;
  let declared = -1;
  let hasDate = false;
  // forEach, not for-of: the same sorted, combined entries, without the iterator's result
  // objects and arrays (6x faster over four headers, measured).
  response.headers.forEach((value, name) => {
    if (framing.has(name)) {
      if (name === "content-length" && /^\d{1,16}$/.test(value)) declared = Number(value);
      if (name === "connection" && /\bclose\b/i.test(value)) close = true;
      return;
    }
    if (name === "date") hasDate = true;
    text += `${name}: ${value}\r\n`;
  });
  if (!hasDate) text += `date: ${httpDate()}\r\n`;
  const bodiless = head.method === "HEAD" || status === 204 || status === 304 ||
    (status >= 100 && status < 200);
  const body = response.body;
  if (bodiless || body === null) {
    text += close ? "connection: close\r\n" : head.http11 ? "" : "connection: keep-alive\r\n";
    if (!bodiless) text += "content-length: 0\r\n";
    else if (head.method === "HEAD" && declared >= 0) text += `content-length: ${declared}\r\n`;
    await body?.cancel().catch(() => {});
    await writeAll(conn, latin1(text + "\r\n"));
    return !close;
  }
  const reader = body.getReader();
  try {
    // A body that is all there at once (a string, bytes, a relayed answer read whole) goes in
    // the head's write, sized; one still coming gets its head at once, before its first byte.
    const first = reader.read();
    const ready = await Promise.race([first, soon()]);
    let length = declared;
    let second: Promise<ReadableStreamReadResult<Uint8Array>> | undefined;
    if (length < 0 && ready !== "later") {
      if (ready.done) length = 0;
      else {
        second = reader.read();
        const quick = await Promise.race([second, soon()]);
        if (quick !== "later" && quick.done) length = ready.value.length;
      }
    }
    // A streamed answer to an HTTP/1.0 client cannot be chunked: it ends with the connection.
    if (length < 0 && !head.http11) close = true;
    text += close ? "connection: close\r\n" : head.http11 ? "" : "connection: keep-alive\r\n";
    const chunked = length < 0 && head.http11;
    const headBytes = latin1(
      length >= 0
        ? `${text}content-length: ${length}\r\n\r\n`
        : chunked
        ? `${text}transfer-encoding: chunked\r\n\r\n`
        : `${text}\r\n`,
    );
    // The usual answer, whole at once: its head and body in one write, then only the end is
    // awaited (a race of timers and a frame per piece were a tenth of the object path's time).
    if (
      ready !== "later" && length >= 0 && length < COPY_MAX &&
      (ready.done ? length === 0 : ready.value.length === length)
    ) {
      await writeAll(conn, ready.done ? headBytes : joined(headBytes, ready.value));
      for (let r = await (second ?? reader.read()); !r.done; r = await reader.read()) {
        if (r.value.length > 0) throw new TypeError("the answer's body is longer than its length");
      }
      return !close;
    }
    const piece = (r: ReadableStreamReadResult<Uint8Array>) => r.done ? null : r.value;
    await writeBody(
      (bytes) => writeAll(conn, bytes),
      headBytes,
      ready === "later" ? first.then(piece) : Promise.resolve(piece(ready)),
      () => {
        const read = second ?? reader.read();
        second = undefined;
        return read.then(piece);
      },
      length,
      chunked,
    );
    return !close;
  } catch (error) {
    await reader.cancel(error).catch(() => {});
    throw error;
  }
  // The reader is not released: the stream is done with, and a release makes an Error (with its
  // stack) for the reader's closed promise, 6% of the object path's time (measured).
}
