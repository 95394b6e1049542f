/**
 * Checks an uploaded template file context (the SDK's gzipped tar) before a build unpacks it:
 * every entry stays inside the context (no absolute path, no `..`, no hard link leaving it), it
 * holds only files, directories and symbolic links (no device, fifo or other special file), and
 * it is bounded once unpacked (bytes and entries), so a small upload cannot fill the node's disk
 * or its engine's inode table. The archive is read as a stream: its headers are looked at, its
 * data skipped, so the check holds a block at a time whatever the upload's size.
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";

/** How many entries one context may hold. */
export const DEFAULT_CONTEXT_ENTRIES = 100_000;
/** How many times its upload cap a context may grow to once unpacked. */
export const CONTEXT_UNPACKED_RATIO = 4;

const BLOCK = 512;
const decoder = new TextDecoder();

/** The bounds {@linkcode checkContext} holds an archive to. */
export interface ContextBounds {
  /** Bytes of file data, unpacked. */
  maxBytes: number;
  /** Entries (files, directories, links). */
  maxEntries: number;
}

/**
 * Reads the tar (gzipped or not) `stream` and throws an `HttpError` (400 or 413) naming the
 * first entry that breaks a rule or the bound that was passed.
 */
export async function checkContext(
  stream: ReadableStream<Uint8Array>,
  bounds: ContextBounds,
): Promise<void> {
  const reader = blocks(await maybeGunzip(stream));
  let entries = 0;
  let bytes = 0;
  let pax: Record<string, string> = {};
  let longName: string | undefined;
  let longLink: string | undefined;
  for (;;) {
    const block = await reader.next(BLOCK);
    if (!block || block.every((b) => b === 0)) return;
    const type = String.fromCharCode(block[156] || 48);
    const size = octal(block, 124, 12);
    if (type === "x" || type === "g" || type === "L" || type === "K") {
      if (size > 1048576) bad(`an extended header of ${size} bytes`);
      const data = await reader.next(padded(size));
      if (!data) bad("an archive cut short in a header");
      const text = decoder.decode(data!.subarray(0, size));
      if (type === "x") pax = parsePax(text);
      if (type === "L") longName = text.replace(/\0.*$/s, "");
      if (type === "K") longLink = text.replace(/\0.*$/s, "");
      continue;
    }
    const prefix = str(block, 345, 155);
    const name = pax.path ?? longName ?? (prefix ? `${prefix}/` : "") + str(block, 0, 100);
    const link = pax.linkpath ?? longLink ?? str(block, 157, 100);
    const length = pax.size !== undefined ? Number(pax.size) : size;
    pax = {};
    longName = longLink = undefined;
    checkPath(name, "an entry");
    if (type === "1") checkPath(link, `hard link '${name}' to`);
    else if (!["0", "\0", "7", "2", "5"].includes(type)) {
      bad(
        `'${clip(name)}', a special file (tar type '${type}'); a context holds files, ` +
          "directories and symbolic links only",
      );
    }
    if (++entries > bounds.maxEntries) {
      throw new HttpError(
        413,
        `The file context holds over ${bounds.maxEntries} entries: copy fewer files, or add ` +
          "a .dockerignore",
      );
    }
    if (!Number.isSafeInteger(length) || length < 0) bad(`'${clip(name)}' with a bad size`);
    bytes += length;
    if (bytes > bounds.maxBytes) {
      throw new HttpError(
        413,
        `The file context unpacks to over ${Math.round(bounds.maxBytes / 1048576)} MB ` +
          `(${CONTEXT_UNPACKED_RATIO}x DORMICE_TEMPLATE_CONTEXT_LIMIT_MB): copy fewer files`,
      );
    }
    if (!(await reader.skip(padded(length)))) bad("an archive cut short in a file's data");
  }
}

/** A path inside the context: relative, with no `..` part. */
function checkPath(path: string, what: string): void {
  if (path.startsWith("/") || path.split("/").includes("..") || path.includes("\0")) {
    bad(`${what} '${clip(path)}', which leaves the context; paths stay inside it`);
  }
}

function bad(what: string): never {
  throw new HttpError(
    400,
    `The file context is refused: it holds ${what}. Upload the tar the SDK makes`,
  );
}

function clip(text: string): string {
  return text.length > 120 ? `${text.slice(0, 120)}…` : text;
}

function padded(size: number): number {
  return Math.ceil(size / BLOCK) * BLOCK;
}

function str(block: Uint8Array, offset: number, length: number): string {
  const field = block.subarray(offset, offset + length);
  const end = field.indexOf(0);
  return decoder.decode(end < 0 ? field : field.subarray(0, end));
}

function octal(block: Uint8Array, offset: number, length: number): number {
  if (block[offset] & 0x80) {
    // Base-256 (GNU): big sizes.
    let n = 0;
    for (let i = offset + 1; i < offset + length; i++) n = n * 256 + block[i];
    return n;
  }
  const text = str(block, offset, length).trim();
  return text === "" ? 0 : parseInt(text, 8);
}

function parsePax(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const m = /^\d+ ([^=]+)=(.*)$/s.exec(line);
    if (m) out[m[1]] = m[2];
  }
  return out;
}

/** The stream, gunzipped when it starts with gzip's magic bytes. */
async function maybeGunzip(
  stream: ReadableStream<Uint8Array>,
): Promise<ReadableStream<Uint8Array>> {
  const reader = stream.getReader();
  const first = await reader.read();
  const gz = first.value !== undefined && first.value[0] === 0x1f && first.value[1] === 0x8b;
  const whole = new ReadableStream<Uint8Array>({
    start(controller) {
      if (first.value !== undefined) controller.enqueue(first.value);
      if (first.done) controller.close();
    },
    async pull(controller) {
      const next = await reader.read();
      if (next.done) controller.close();
      else controller.enqueue(next.value);
    },
    cancel(reason) {
      return reader.cancel(reason);
    },
  });
  return gz
    ? whole.pipeThrough(new DecompressionStream("gzip") as TransformStream<Uint8Array, Uint8Array>)
    : whole;
}

/** Reads exact byte counts from `stream`. */
function blocks(stream: ReadableStream<Uint8Array>) {
  const reader = stream.getReader();
  let buf = new Uint8Array(0);
  const fill = async (n: number): Promise<boolean> => {
    while (buf.length < n) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (error) {
        bad(`bytes that are no gzip stream (${error instanceof Error ? error.message : error})`);
      }
      if (chunk.done) return false;
      const next = new Uint8Array(buf.length + chunk.value.length);
      next.set(buf);
      next.set(chunk.value, buf.length);
      buf = next;
    }
    return true;
  };
  return {
    async next(n: number): Promise<Uint8Array | undefined> {
      if (!(await fill(n))) return undefined;
      const out = buf.slice(0, n);
      buf = buf.subarray(n);
      return out;
    },
    async skip(n: number): Promise<boolean> {
      while (n > 0) {
        if (buf.length === 0 && !(await fill(1))) return false;
        const take = Math.min(n, buf.length);
        buf = buf.subarray(take);
        n -= take;
      }
      return true;
    },
  };
}
