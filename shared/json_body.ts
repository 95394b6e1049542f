/**
 * The one reader of a JSON request body that every face uses: it reads at most a cap of bytes
 * (so a huge body costs the server that cap, never its memory), refuses anything but one JSON
 * object, and says in a sentence what to send instead. A body past the cap is a 413 naming the
 * cap, the variable that sets it and the way to send more: files stream through the E2B files
 * API (`POST /files`), never through JSON.
 *
 * @module
 */
import { LoopBudget, type LoopBudgetOptions } from "./event_loop.ts";
import { HttpError } from "./http_error.ts";

/**
 * Default cap of a JSON body: 32 MiB, room for a 24 MiB file sent base64 in `writeFile`. A
 * server holds about three times the cap per request while it reads, parses and forwards one,
 * so the cap stays in the tens of MB: larger files go through `POST /files`, which streams.
 */
export const DEFAULT_JSON_BODY_LIMIT_BYTES = 32 * 1024 * 1024;

/**
 * Default cap of a one-piece JSON message (every body but a file's content): 1 MiB. A parse of
 * 1 MiB of small objects takes about 6 ms; one of 32 MiB, 130 ms and more, all of it holding the
 * event loop, so only the bodies that carry a file's bytes as one string get the larger cap.
 */
export const DEFAULT_JSON_MESSAGE_LIMIT_BYTES = 1024 * 1024;

/** What the 413 of a JSON message past its cap suggests: the verbs that take more. */
export const MESSAGE_ALTERNATIVE: string =
  "this is a small JSON message; file contents go through writeFile (up to " +
  "DORMICE_JSON_BODY_LIMIT_MB) or, larger, the E2B files API (POST /files on the sandbox's envd), " +
  "which streams them";

/** What the 413 of a JSON body suggests when the face gives no hint of its own. */
export const STREAMING_ALTERNATIVE: string =
  "send larger files through the E2B files API (the e2b SDK's files.write, or POST /files on " +
  "the sandbox's envd), which streams them";

/** How much of a body may be read, and what the 413 past it says. */
export interface BodyCapOptions {
  /** Most bytes read before the body is refused with a 413; {@linkcode DEFAULT_JSON_BODY_LIMIT_BYTES} when absent. */
  maxBytes?: number;
  /** The setting that raises the cap (e.g. `DORMICE_JSON_BODY_LIMIT_MB`), named in the 413. */
  capVariable?: string;
  /** Said after the 413 sentence: the way to send more; {@linkcode STREAMING_ALTERNATIVE} when absent. */
  tooLargeHint?: string;
}

/** Options of {@linkcode readJsonObject}. */
export interface ReadJsonObjectOptions extends BodyCapOptions {
  /** What an empty body means: `{}` (the default) or a 400 asking for an object. */
  empty?: "object" | "refuse";
  /** An example the sentences show (`{"name":"agent-1"}` when absent). */
  example?: string;
}

/** A JSON body as read: the object and its text (`"{}"` for an empty body). */
export interface JsonObjectBody {
  /** The parsed object. */
  value: Record<string, unknown>;
  /** The text it was parsed from, for a face that forwards it unchanged. */
  text: string;
}

/**
 * Reads a request's body as one JSON object under a byte cap.
 *
 * @throws {HttpError} 400 when the body is not one JSON object or cannot be read, 413 past the
 * cap, 499 when the client hung up while it was read.
 *
 * @example
 * ```ts
 * import { readJsonObject } from "./json_body.ts";
 * const { value } = await readJsonObject(new Request("http://x/", { method: "POST", body: '{"a":1}' }));
 * console.log(value.a); // 1
 * ```
 */
export async function readJsonObject(
  request: Request,
  options: ReadJsonObjectOptions = {},
): Promise<JsonObjectBody> {
  return parseJsonObject(await readBodyText(request, options), options);
}

/** `text` as one JSON object, with the sentences of {@linkcode readJsonObject}. */
function parseJsonObject(text: string, options: ReadJsonObjectOptions): JsonObjectBody {
  const example = options.example ?? `{"name":"agent-1"}`;
  if (text.trim() === "") {
    if (options.empty === "refuse") {
      throw new HttpError(400, `The request body is empty: send a JSON object such as ${example}`);
    }
    return { value: {}, text: "{}" };
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new HttpError(
      400,
      `The body is not valid JSON (${(error as Error).message}): send a JSON object such as ` +
        example,
    );
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new HttpError(400, `The body must be a JSON object such as ${example}`);
  }
  return { value: value as Record<string, unknown>, text };
}

/** Options of {@linkcode readFlatJsonObject}. */
export interface ReadFlatJsonObjectOptions extends ReadJsonObjectOptions {
  /** The most `{`, `[`, `,` and `:` outside strings (default 64): a few fields of strings. */
  maxStructure?: number;
  /** The verb named in the 400 of a body with more structure (`writeFile`, say). */
  verb?: string;
  /** Slice length, clock and yield, for tests. */
  budget?: LoopBudgetOptions;
}

/** Bytes of a large body looked at and decoded at once: 512 KiB. */
const FLAT_SLICE_BYTES = 512 * 1024;
const QUOTE = 0x22, BACKSLASH = 0x5c;
/** `{`, `[`, `,`, `:`: what a parse must build or step over besides the strings. */
const STRUCTURE = new Uint8Array(256);
for (const c of "{[,:") STRUCTURE[c.charCodeAt(0)] = 1;

/**
 * Reads a large request body that must be one JSON object of a few fields whose values may be
 * long strings (`writeFile`'s `contentBase64`, a process's stdin), without holding the event
 * loop: the bytes are looked at and decoded 512 KiB at a time with the loop let run between
 * slices, and a body with more than `maxStructure` structural characters outside its strings
 * is refused before `JSON.parse`, which is the one step left whole. A parse of one long string
 * runs at memory speed (18 ms for 24 MiB, measured 2026-12-07), but a parse of 24 MiB of small
 * objects and arrays takes 130 ms and more: those belong in a small message under the smaller cap.
 *
 * @throws {HttpError} 400 when the body is not one JSON object of a few fields or cannot be
 * read, 413 past the cap, 499 when the client hung up.
 * @example
 * ```ts
 * import { readFlatJsonObject } from "./json_body.ts";
 * const request = new Request("http://x/", { method: "POST", body: '{"content":"hi"}' });
 * (await readFlatJsonObject(request)).value.content; // "hi"
 * ```
 */
export async function readFlatJsonObject(
  request: Request,
  options: ReadFlatJsonObjectOptions = {},
): Promise<JsonObjectBody> {
  const bytes = await readBodyBytes(request, options);
  const maxStructure = options.maxStructure ?? 64;
  const loop = new LoopBudget(options.budget);
  const decoder = new TextDecoder();
  let text = "";
  let inString = false, escaped = false, structure = 0;
  for (let at = 0; at < bytes.length; at += FLAT_SLICE_BYTES) {
    await loop.pass();
    const end = Math.min(bytes.length, at + FLAT_SLICE_BYTES);
    for (let i = at; i < end; i++) {
      const b = bytes[i];
      if (inString) {
        if (escaped) escaped = false;
        else if (b === BACKSLASH) escaped = true;
        else if (b === QUOTE) inString = false;
      } else if (b === QUOTE) inString = true;
      else structure += STRUCTURE[b];
    }
    if (structure > maxStructure) {
      throw new HttpError(
        400,
        `The body of ${options.verb ?? "this request"} must be one JSON object of a few fields ` +
          `(at most ${maxStructure} of '{', '[', ',' and ':' outside strings; this one has more ` +
          `in its first ${end} bytes): send the content as one string field`,
      );
    }
    text += decoder.decode(bytes.subarray(at, end), { stream: end < bytes.length });
  }
  return parseJsonObject(text, options);
}

/**
 * Reads a request's body as UTF-8 text, at most `maxBytes` of it.
 *
 * @throws {HttpError} 413 past the cap (naming it), 400 when the body cannot be read, 499 when
 * the client hung up.
 *
 * @example
 * ```ts
 * import { readBodyText } from "./json_body.ts";
 * await readBodyText(new Request("http://x/", { method: "POST", body: "hi" }), { maxBytes: 10 }); // "hi"
 * ```
 */
export async function readBodyText(
  request: Request,
  cap: BodyCapOptions = {},
): Promise<string> {
  // The runtime's own decoder when the length is declared: 2 µs a request cheaper (measured).
  return await readCapped(
    request,
    cap,
    (r) => r.text(),
    (bytes) => new TextDecoder().decode(bytes),
  );
}

/**
 * Reads a request's body as bytes, at most `maxBytes` of them (a Connect envelope, say).
 *
 * @throws {HttpError} 413 past the cap (naming it), 400 when the body cannot be read, 499 when
 * the client hung up.
 *
 * @example
 * ```ts
 * import { readBodyBytes } from "./json_body.ts";
 * await readBodyBytes(new Request("http://x/", { method: "POST", body: "hi" }), { maxBytes: 10 });
 * ```
 */
export async function readBodyBytes(
  request: Request,
  cap: BodyCapOptions = {},
): Promise<Uint8Array> {
  return await readCapped(
    request,
    cap,
    async (r) => new Uint8Array(await r.arrayBuffer()),
    (b) => b,
  );
}

/**
 * The 413 of a body past a cap: the cap, the setting that raises it, and the way to send more.
 *
 * @example
 * ```ts
 * import { bodyTooLarge } from "./json_body.ts";
 * bodyTooLarge({ maxBytes: 1024, capVariable: "DORMICE_JSON_BODY_LIMIT_MB" }).status; // 413
 * ```
 */
export function bodyTooLarge(cap: BodyCapOptions = {}): HttpError {
  const maxBytes = cap.maxBytes ?? DEFAULT_JSON_BODY_LIMIT_BYTES;
  const setting = cap.capVariable ? ` (${cap.capVariable})` : "";
  return new HttpError(
    413,
    `The request body is larger than this face's cap of ${formatBytes(maxBytes)}${setting}: ` +
      (cap.tooLargeHint ?? STREAMING_ALTERNATIVE),
  );
}

/**
 * Reads the body under `cap`: `whole` when its length is declared (the HTTP server frames the
 * body by its Content-Length, so it cannot grow past what was declared), else chunk by chunk,
 * stopping at the cap.
 */
async function readCapped<T>(
  request: Request,
  cap: BodyCapOptions,
  whole: (request: Request) => Promise<T>,
  join: (bytes: Uint8Array) => T,
): Promise<T> {
  const maxBytes = cap.maxBytes ?? DEFAULT_JSON_BODY_LIMIT_BYTES;
  const declared = Number(request.headers.get("content-length") ?? NaN);
  if (declared > maxBytes) {
    // Not read at all: the client learns at once, and the server holds nothing.
    await request.body?.cancel().catch(() => {});
    throw bodyTooLarge(cap);
  }
  if (!request.body) return join(new Uint8Array());
  const failed = (error: unknown) => {
    if (error instanceof HttpError) return error;
    if (request.signal.aborted) return new HttpError(499, "The client closed the request");
    return new HttpError(400, `The body could not be read (${(error as Error)?.message})`);
  };
  if (declared <= maxBytes) {
    try {
      return await whole(request);
    } catch (error) {
      throw failed(error);
    }
  }
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      size += value.byteLength;
      if (size > maxBytes) {
        await reader.cancel().catch(() => {});
        throw bodyTooLarge(cap);
      }
      chunks.push(value);
    }
  } catch (error) {
    throw failed(error);
  }
  const bytes = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, at);
    at += chunk.byteLength;
  }
  return join(bytes);
}

/**
 * A byte count as an operator reads it: `32 MiB`, `512 KiB`, `100 bytes`.
 *
 * @example
 * ```ts
 * import { formatBytes } from "./json_body.ts";
 * formatBytes(32 * 1024 * 1024); // "32 MiB"
 * ```
 */
export function formatBytes(bytes: number): string {
  if (bytes >= 1024 ** 3 && bytes % 1024 ** 3 === 0) return `${bytes / 1024 ** 3} GiB`;
  if (bytes >= 1024 ** 2 && bytes % 1024 ** 2 === 0) return `${bytes / 1024 ** 2} MiB`;
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`;
  return `${bytes} bytes`;
}
