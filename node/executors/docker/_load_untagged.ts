/**
 * What another node sends to `docker load`, with every tag taken out on the way. `docker load`
 * applies the tags an archive's `manifest.json` names (and its `repositories`, and on newer
 * engines the names in `index.json`), moving a tag this engine already has onto the loaded
 * image: an archive naming `dormice-base:latest` would make every later sandbox of that
 * template start from it. A node loads images only to adopt them by image id, so none of their
 * tags is wanted: the filter rewrites `manifest.json` and `index.json` without them and drops
 * `repositories`, streaming everything else (the layers) through as it comes.
 *
 * @module
 */
import { ExecutorError } from "../contract.ts";

const BLOCK = 512;
/** The most bytes a metadata entry (a manifest, an extended header) may have. */
export const MAX_LOAD_METADATA_BYTES = 4 * 1024 * 1024;

const decoder = new TextDecoder();
const encoder = new TextEncoder();

function bad(why: string): ExecutorError {
  return new ExecutorError("invalid", `What another node sent is no image archive: ${why}`);
}

/** Reads exact byte counts from a stream of chunks. */
class Bytes {
  #reader: ReadableStreamDefaultReader<Uint8Array>;
  #head: Uint8Array = new Uint8Array(0);
  constructor(body: ReadableStream<Uint8Array>) {
    this.#reader = body.getReader();
  }

  /** Up to `max` bytes, at least one; undefined at the end of the stream. */
  async some(max: number): Promise<Uint8Array | undefined> {
    while (this.#head.length === 0) {
      const { done, value } = await this.#reader.read();
      if (done) return undefined;
      this.#head = value;
    }
    const out = this.#head.subarray(0, max);
    this.#head = this.#head.subarray(out.length);
    return out;
  }

  /** Exactly `n` bytes, or undefined when the stream ends first. */
  async exactly(n: number): Promise<Uint8Array | undefined> {
    const out = new Uint8Array(n);
    let at = 0;
    while (at < n) {
      const chunk = await this.some(n - at);
      if (chunk === undefined) return undefined;
      out.set(chunk, at);
      at += chunk.length;
    }
    return out;
  }

  cancel(): Promise<void> {
    return this.#reader.cancel().catch(() => {});
  }
}

function field(block: Uint8Array, offset: number, length: number): string {
  const raw = block.subarray(offset, offset + length);
  const end = raw.indexOf(0);
  return decoder.decode(end === -1 ? raw : raw.subarray(0, end));
}

function sizeOf(block: Uint8Array): number {
  if (block[124] & 0x80) {
    // Base-256, Go's archive/tar form for sizes past the 11 octal digits.
    let n = 0;
    for (let i = 125; i < 136; i++) n = n * 256 + block[i];
    return n;
  }
  const text = field(block, 124, 12).trim();
  if (!/^[0-7]*$/.test(text)) throw bad(`an entry's size '${text}' is not octal`);
  return text === "" ? 0 : parseInt(text, 8);
}

function paxOf(data: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  const text = decoder.decode(data);
  for (const line of text.split("\n")) {
    const m = /^\d+ ([^=]+)=(.*)$/s.exec(line);
    if (m) out[m[1]] = m[2];
  }
  return out;
}

function plainHeader(name: string, size: number, mtime: Uint8Array): Uint8Array {
  const block = new Uint8Array(BLOCK);
  block.set(encoder.encode(name), 0);
  block.set(encoder.encode("0000644\0"), 100);
  block.set(encoder.encode("0000000\0"), 108);
  block.set(encoder.encode("0000000\0"), 116);
  block.set(encoder.encode(size.toString(8).padStart(11, "0") + "\0"), 124);
  block.set(mtime, 136);
  block.fill(0x20, 148, 156);
  block[156] = 0x30; // "0": a regular file
  block.set(encoder.encode("ustar\x0000"), 257);
  let sum = 0;
  for (const byte of block) sum += byte;
  block.set(encoder.encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
  return block;
}

function padding(size: number): Uint8Array {
  const rest = size % BLOCK;
  return new Uint8Array(rest === 0 ? 0 : BLOCK - rest);
}

/** `manifest.json` or `index.json` without the names they would tag the image with. */
function untagged(name: "manifest.json" | "index.json", data: Uint8Array): Uint8Array {
  let json: unknown;
  try {
    json = JSON.parse(decoder.decode(data));
  } catch {
    throw bad(`its ${name} is not JSON`);
  }
  if (name === "manifest.json") {
    if (!Array.isArray(json)) throw bad("its manifest.json is not a list");
    for (const entry of json) {
      if (entry && typeof entry === "object") (entry as Record<string, unknown>).RepoTags = null;
    }
  } else {
    const manifests = (json as { manifests?: unknown } | null)?.manifests;
    if (Array.isArray(manifests)) {
      for (const m of manifests) {
        if (m && typeof m === "object") delete (m as Record<string, unknown>).annotations;
      }
    }
  }
  return encoder.encode(JSON.stringify(json));
}

/**
 * `body` (a `docker save` archive) with no tag left in it, streamed; a malformed or cut
 * archive ends the stream with an `invalid` {@linkcode ExecutorError}.
 *
 * @example
 * ```ts ignore
 * await engine.request("POST", "/images/load", { body: withoutImageTags(body) });
 * ```
 */
export function withoutImageTags(body: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  const bytes = new Bytes(body);
  async function* run(): AsyncGenerator<Uint8Array> {
    // Extended headers (PAX, GNU long names) held until the entry they describe is seen.
    let held: Uint8Array[] = [];
    let pax: Record<string, string> = {};
    let longName: string | undefined;
    try {
      while (true) {
        const block = await bytes.exactly(BLOCK);
        if (block === undefined) throw bad("it ended before its end-of-archive blocks");
        if (block.every((b) => b === 0)) {
          // The end: what may follow is no business of the load.
          yield new Uint8Array(BLOCK * 2);
          return;
        }
        const type = String.fromCharCode(block[156]);
        let size = sizeOf(block);
        const prefix = field(block, 257, 6) === "ustar" ? field(block, 345, 155) : "";
        let name = longName ?? pax.path ?? (prefix ? `${prefix}/` : "") + field(block, 0, 100);
        if (pax.size !== undefined && !["x", "g", "L", "K"].includes(type)) {
          if (!/^\d+$/.test(pax.size)) throw bad(`an extended size '${pax.size}' is no number`);
          size = Number(pax.size);
        }
        const data = async (cap: number) => {
          if (size > cap) {
            throw bad(`its ${name || "extended header"} has ${size} bytes (most ${cap})`);
          }
          const read = await bytes.exactly(size + padding(size).length);
          if (read === undefined) throw bad(`it ended inside ${name || "an extended header"}`);
          return read.subarray(0, size);
        };
        if (type === "x" || type === "g" || type === "L" || type === "K") {
          const content = await data(MAX_LOAD_METADATA_BYTES);
          if (type === "g") {
            const global = paxOf(content);
            if (global.path !== undefined || global.size !== undefined) {
              throw bad("a global extended header names a path or size");
            }
          } else if (type === "x") pax = { ...pax, ...paxOf(content) };
          else if (type === "L") longName = field(content, 0, content.length);
          held.push(block, content, padding(content.length));
          continue;
        }
        name = name.replace(/^(\.?\/)+/, "");
        if (name === "manifest.json" || name === "index.json" || name === "repositories") {
          const content = await data(MAX_LOAD_METADATA_BYTES);
          if (name !== "repositories") {
            const rewritten = untagged(name, content);
            yield plainHeader(name, rewritten.length, block.subarray(136, 148));
            yield rewritten;
            yield padding(rewritten.length);
          }
        } else {
          for (const part of held) yield part;
          yield block;
          let left = size + padding(size).length;
          while (left > 0) {
            const chunk = await bytes.some(Math.min(left, 1 << 20));
            if (chunk === undefined) throw bad(`it ended inside ${name}`);
            left -= chunk.length;
            yield chunk;
          }
        }
        held = [];
        pax = {};
        longName = undefined;
      }
    } finally {
      await bytes.cancel();
    }
  }
  return ReadableStream.from(run());
}
