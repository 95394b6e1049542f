/**
 * A streaming `multipart/form-data` reader for `POST /files`. `Request.formData()` holds the
 * whole body (every part, as a Blob) before it answers, so a 1 GiB upload cost the node 1 GiB;
 * here each part is a stream read from the body as the caller reads it, and only a part's
 * headers and a boundary's worth of bytes are ever held.
 *
 * @module
 */
import { HttpError } from "../../../shared/http_error.ts";

/** One part of a multipart body, its bytes still on the wire. */
export interface MultipartPart {
  /** The form field's name (`name` of its Content-Disposition); `""` when it has none. */
  name: string;
  /** The part's `filename` (as sent: the SDK sends the file's path), or undefined for a plain field. */
  filename?: string;
  /**
   * The part's bytes as they arrive. Read it to its end or cancel it before asking for the next
   * part; whatever is left unread is skipped then.
   */
  body: ReadableStream<Uint8Array>;
}

/** Most bytes of one part's header block: a filename is a path, never kilobytes long. */
const MAX_HEADER_BYTES = 16 * 1024;

const CRLF = new Uint8Array([13, 10]);
const HEADERS_END = new Uint8Array([13, 10, 13, 10]);
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * The boundary of a `multipart/form-data` Content-Type.
 *
 * @throws {HttpError} 400 when the header names no usable boundary.
 * @example
 * ```ts
 * import { multipartBoundary } from "./multipart.ts";
 * multipartBoundary('multipart/form-data; boundary="abc"'); // "abc"
 * ```
 */
export function multipartBoundary(contentType: string): string {
  const boundary = parameters(contentType).get("boundary");
  // RFC 2046: 1 to 70 characters.
  if (!boundary || boundary.length > 70) {
    throw new HttpError(
      400,
      "The multipart Content-Type names no boundary (or one over 70 characters): send the " +
        "header the multipart encoder wrote, e.g. multipart/form-data; boundary=----x",
    );
  }
  return boundary;
}

/**
 * Reads the parts of a multipart body one at a time, each as a stream (see
 * {@linkcode MultipartPart}). The preamble and the epilogue are skipped.
 *
 * @throws {HttpError} 400 (from the generator or from a part's stream) when the body is not
 * multipart with this boundary, a part's headers run past 16 KiB, or the body ends inside a part.
 * @example
 * ```ts
 * import { readMultipart } from "./multipart.ts";
 * const form = new FormData();
 * form.append("file", new Blob(["hi"]), "/tmp/a.txt");
 * const encoded = new Response(form);
 * const boundary = encoded.headers.get("content-type")!.split("boundary=")[1];
 * for await (const part of readMultipart(encoded.body!, boundary)) {
 *   console.log(part.filename, await new Response(part.body).text()); // "/tmp/a.txt" "hi"
 * }
 * ```
 */
export async function* readMultipart(
  body: ReadableStream<Uint8Array>,
  boundary: string,
): AsyncGenerator<MultipartPart> {
  const input = new Input(body);
  // Every delimiter but the first follows a CRLF that belongs to it; with one in front, the
  // first (at the very start of the body) is found by the same search.
  input.unshift(CRLF);
  const delimiter = encoder.encode(`\r\n--${boundary}`);
  let current: PartReader | undefined;
  try {
    if (!await input.skipPast(delimiter)) {
      throw new HttpError(
        400,
        `The multipart body has no boundary '${boundary}': send the body its Content-Type describes`,
      );
    }
    for (;;) {
      if (!await afterDelimiter(input)) return;
      const headers = await readHeaders(input);
      const disposition = headers.get("content-disposition") ?? "";
      const params = parameters(disposition);
      current = new PartReader(input, delimiter);
      yield { name: params.get("name") ?? "", filename: filenameOf(params), body: current.stream };
      await current.finish();
      current = undefined;
    }
  } finally {
    // An early return (the caller stopped, or refused a part) leaves the rest of the body unread.
    current?.abandon();
    await input.cancel();
  }
}

/**
 * After a delimiter: `--` ends the body (false), otherwise optional whitespace and a CRLF
 * start the next part's headers (true).
 */
async function afterDelimiter(input: Input): Promise<boolean> {
  await input.need(2, "after a boundary");
  if (input.peek(0) === 0x2d && input.peek(1) === 0x2d) return false;
  while (input.peek(0) === 0x20 || input.peek(0) === 0x09) {
    input.take(1);
    await input.need(2, "after a boundary");
  }
  if (input.peek(0) !== 13 || input.peek(1) !== 10) {
    throw new HttpError(400, "A multipart boundary line does not end in CRLF: send a valid body");
  }
  input.take(2);
  return true;
}

/** The header block of one part, names lowercased. */
async function readHeaders(input: Input): Promise<Map<string, string>> {
  await input.need(2, "in a part's headers");
  let block: Uint8Array;
  if (input.peek(0) === 13 && input.peek(1) === 10) {
    input.take(2);
    block = new Uint8Array();
  } else {
    const end = await input.find(HEADERS_END, MAX_HEADER_BYTES);
    if (end === -1) {
      throw new HttpError(
        400,
        `A multipart part's headers run past ${MAX_HEADER_BYTES} bytes or the body ends in them: ` +
          "send a valid multipart body",
      );
    }
    block = input.take(end);
    input.take(HEADERS_END.length);
  }
  const headers = new Map<string, string>();
  for (const line of decoder.decode(block).split("\r\n")) {
    const colon = line.indexOf(":");
    if (colon > 0) {
      headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
    }
  }
  return headers;
}

/** `filename`, else an RFC 5987 `filename*` (`UTF-8''%2Ftmp%2Fa`). */
function filenameOf(params: Map<string, string>): string | undefined {
  const plain = params.get("filename");
  if (plain !== undefined) return plain;
  const extended = params.get("filename*");
  const quote = extended?.indexOf("''") ?? -1;
  if (extended === undefined || quote === -1) return undefined;
  try {
    return decodeURIComponent(extended.slice(quote + 2));
  } catch {
    return extended.slice(quote + 2);
  }
}

/**
 * The `; key=value` parameters of a header value, keys lowercased; a quoted value keeps what is
 * between its quotes (a backslash escapes the next character, RFC 9110 quoted-pair). Browsers
 * and undici send a quote in a filename as `%22`, which is kept as sent (as `formData()` did).
 */
function parameters(value: string): Map<string, string> {
  const out = new Map<string, string>();
  let at = value.indexOf(";");
  while (at !== -1 && at < value.length) {
    at++;
    while (value[at] === " " || value[at] === "\t") at++;
    const eq = value.indexOf("=", at);
    if (eq === -1) break;
    const key = value.slice(at, eq).trim().toLowerCase();
    at = eq + 1;
    let text = "";
    if (value[at] === '"') {
      at++;
      while (at < value.length && value[at] !== '"') {
        if (value[at] === "\\" && at + 1 < value.length) at++;
        text += value[at++];
      }
      at = value.indexOf(";", at);
    } else {
      const end = value.indexOf(";", at);
      text = value.slice(at, end === -1 ? undefined : end).trim();
      at = end;
    }
    if (key && !out.has(key)) out.set(key, text);
  }
  return out;
}

/** The body of one part: bytes up to the next delimiter, handed out as the consumer pulls. */
class PartReader {
  readonly stream: ReadableStream<Uint8Array>;
  #input: Input;
  #delimiter: Uint8Array;
  #done = false;
  #cancelled = false;

  constructor(input: Input, delimiter: Uint8Array) {
    this.#input = input;
    this.#delimiter = delimiter;
    this.stream = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        try {
          const chunk = await this.#next();
          if (chunk === null) controller.close();
          else controller.enqueue(chunk);
        } catch (error) {
          controller.error(error);
        }
      },
      cancel: () => {
        this.#cancelled = true;
      },
    }, { highWaterMark: 0 });
  }

  /** Skips what the consumer left unread, so the next part's headers come next. */
  async finish(): Promise<void> {
    while (!this.#done) await this.#next();
  }

  /** The generator ended early: a consumer still reading this part gets an error, not a hang. */
  abandon(): void {
    if (this.#done || this.#cancelled) return;
    this.#done = true;
    try {
      // The stream may already be closed or errored by its consumer.
      this.stream.cancel().catch(() => {});
    } catch { /* locked by a reader: it sees the input's cancel */ }
  }

  /** The next run of part bytes, or null at the delimiter (which is consumed). */
  async #next(): Promise<Uint8Array | null> {
    for (;;) {
      if (this.#done) return null;
      const input = this.#input;
      const at = input.indexOf(this.#delimiter);
      if (at !== -1) {
        const chunk = input.take(at);
        input.take(this.#delimiter.length);
        this.#done = true;
        return chunk.length > 0 ? chunk : null;
      }
      // Bytes that cannot be the start of a delimiter are the part's for sure.
      const safe = input.length - (this.#delimiter.length - 1);
      if (safe > 0) return input.take(safe);
      if (!await input.fill()) {
        throw new HttpError(
          400,
          "The multipart body ends inside a part (no closing boundary): the upload was cut short; send it again",
        );
      }
    }
  }
}

/** The body's bytes not yet consumed, read a chunk at a time from the source. */
class Input {
  #reader: ReadableStreamDefaultReader<Uint8Array>;
  #buffer: Uint8Array = new Uint8Array();
  #ended = false;

  constructor(body: ReadableStream<Uint8Array>) {
    this.#reader = body.getReader();
  }

  get length(): number {
    return this.#buffer.length;
  }

  unshift(bytes: Uint8Array): void {
    this.#buffer = join(bytes, this.#buffer);
  }

  peek(index: number): number {
    return this.#buffer[index];
  }

  /** The first `n` bytes, consumed. */
  take(n: number): Uint8Array {
    const out = this.#buffer.subarray(0, n);
    this.#buffer = this.#buffer.subarray(n);
    return out;
  }

  /** Reads one more chunk from the source; false at its end. */
  async fill(): Promise<boolean> {
    while (!this.#ended) {
      const { done, value } = await this.#reader.read();
      if (done) {
        this.#ended = true;
        break;
      }
      if (value.length === 0) continue;
      this.#buffer = this.#buffer.length === 0 ? value : join(this.#buffer, value);
      return true;
    }
    return false;
  }

  /** Waits until `n` bytes are buffered. @throws {HttpError} 400 when the body ends first. */
  async need(n: number, where: string): Promise<void> {
    while (this.#buffer.length < n) {
      if (!await this.fill()) {
        throw new HttpError(400, `The multipart body ends ${where}: send the whole body`);
      }
    }
  }

  indexOf(pattern: Uint8Array, from = 0): number {
    return indexOf(this.#buffer, pattern, from);
  }

  /** Where `pattern` starts, reading more until it shows or `limit` bytes are buffered (-1). */
  async find(pattern: Uint8Array, limit: number): Promise<number> {
    let from = 0;
    for (;;) {
      const at = this.indexOf(pattern, from);
      if (at !== -1) return at;
      if (this.#buffer.length > limit) return -1;
      from = Math.max(0, this.#buffer.length - pattern.length + 1);
      if (!await this.fill()) return -1;
    }
  }

  /** Consumes everything up to and including `pattern`, holding at most a pattern's length. */
  async skipPast(pattern: Uint8Array): Promise<boolean> {
    for (;;) {
      const at = this.indexOf(pattern);
      if (at !== -1) {
        this.take(at + pattern.length);
        return true;
      }
      this.take(Math.max(0, this.#buffer.length - pattern.length + 1));
      if (!await this.fill()) return false;
    }
  }

  async cancel(): Promise<void> {
    if (this.#ended) return;
    this.#ended = true;
    await this.#reader.cancel().catch(() => {});
  }
}

function join(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}

/** The first index of `pattern` in `bytes` at or after `from`, or -1. */
function indexOf(bytes: Uint8Array, pattern: Uint8Array, from = 0): number {
  const first = pattern[0];
  const last = bytes.length - pattern.length;
  for (
    let at = bytes.indexOf(first, from);
    at !== -1 && at <= last;
    at = bytes.indexOf(first, at + 1)
  ) {
    let i = 1;
    while (i < pattern.length && bytes[at + i] === pattern[i]) i++;
    if (i === pattern.length) return at;
  }
  return -1;
}
