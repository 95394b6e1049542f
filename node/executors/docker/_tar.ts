/**
 * A minimal, binary-safe ustar writer and reader for Docker's archive API (`putArchive` /
 * `getArchive`). Only what that API produces and accepts: regular files, directories, symlinks,
 * and PAX headers for long names (Go's archive/tar, which Docker uses, writes PAX for them).
 * Why not `npm:tar-stream`: the README's dependency table.
 *
 * @module
 */

const BLOCK = 512;
const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** One entry to write into a tar. */
export interface TarInput {
  /** The path inside the archive, relative (no leading slash). */
  name: string;
  /** `"file"` (with `data`) or `"dir"`. */
  type: "file" | "dir";
  /** The file's bytes (files only). */
  data?: Uint8Array;
  /** Permission bits; 0o644 for files and 0o755 for directories by default. */
  mode?: number;
  /** Modification time, ms since the epoch; now by default. */
  mtimeMs?: number;
  /** Owner user id (0 by default); the engine extracts as root and applies it. */
  uid?: number;
  /** Owner group id (0 by default). */
  gid?: number;
}

/** One entry read from a tar. */
export interface TarEntry {
  /** The path inside the archive. */
  name: string;
  /** Kind of entry; `"other"` for devices, fifos and hard links. */
  type: "file" | "dir" | "symlink" | "other";
  /** Permission bits. */
  mode: number;
  /** Size in bytes. */
  size: number;
  /** Modification time, ms since the epoch. */
  mtimeMs: number;
  /** The target of a symlink. */
  linkName: string;
  /** The file's bytes (empty for anything but files). */
  data: Uint8Array;
}

function writeString(block: Uint8Array, offset: number, length: number, value: string): void {
  const bytes = encoder.encode(value);
  if (bytes.length > length) throw new RangeError(`Cannot write tar field: '${value}' is too long`);
  block.set(bytes, offset);
}

function writeOctal(block: Uint8Array, offset: number, length: number, value: number): void {
  // length - 1 octal digits then a NUL, the form every tar reader accepts.
  writeString(block, offset, length, value.toString(8).padStart(length - 1, "0"));
}

function header(
  name: string,
  typeflag: string,
  size: number,
  mode: number,
  mtimeMs: number,
  uid = 0,
  gid = 0,
) {
  const block = new Uint8Array(BLOCK);
  writeString(block, 0, 100, name);
  writeOctal(block, 100, 8, mode & 0o7777);
  writeOctal(block, 108, 8, uid);
  writeOctal(block, 116, 8, gid);
  writeOctal(block, 124, 12, size);
  writeOctal(block, 136, 12, Math.floor(mtimeMs / 1000));
  block.fill(0x20, 148, 156);
  writeString(block, 156, 1, typeflag);
  writeString(block, 257, 6, "ustar");
  writeString(block, 263, 2, "00");
  let sum = 0;
  for (const byte of block) sum += byte;
  writeString(block, 148, 8, sum.toString(8).padStart(6, "0") + "\0 ");
  return block;
}

function padded(data: Uint8Array): Uint8Array[] {
  const padding = tarPadding(data.length);
  return padding.length === 0 ? [data] : [data, padding];
}

/**
 * The zero bytes that round a file's data of `size` bytes up to whole blocks.
 *
 * @example
 * ```ts
 * tarPadding(10).length; // 502
 * ```
 */
export function tarPadding(size: number): Uint8Array {
  const rest = size % BLOCK;
  return new Uint8Array(rest === 0 ? 0 : BLOCK - rest);
}

/** The two zero blocks that end an archive. */
export const TAR_END: Uint8Array = new Uint8Array(BLOCK * 2);

function paxRecord(key: string, value: string): string {
  // A record is "<length> <key>=<value>\n" where length counts itself.
  const body = ` ${key}=${value}\n`;
  const bodyLength = encoder.encode(body).length;
  let length = bodyLength + String(bodyLength).length;
  if (String(length).length !== String(bodyLength).length) {
    length = bodyLength + String(length).length;
  }
  return `${length}${body}`;
}

/**
 * Builds a tar archive from entries, binary-safe, with PAX headers for names over 100 bytes.
 *
 * @example
 * ```ts
 * const tar = writeTar([{ name: "a.bin", type: "file", data: new Uint8Array([0, 255]) }]);
 * ```
 */
export function writeTar(entries: TarInput[]): Uint8Array {
  const parts: Uint8Array[] = [];
  for (const entry of entries) {
    const data = entry.type === "file" ? entry.data ?? new Uint8Array() : new Uint8Array();
    parts.push(tarHeader(entry, data.length));
    if (data.length) parts.push(...padded(data));
  }
  parts.push(TAR_END);
  return concat(parts);
}

/**
 * The header blocks of one entry whose data is `size` bytes (a PAX record first for a name over
 * 100 bytes): what a streamed archive sends before the data, then {@linkcode tarPadding} and
 * {@linkcode TAR_END}. Its `data` is ignored.
 *
 * @example
 * ```ts
 * tarHeader({ name: "big.bin", type: "file" }, 1024 ** 3).length; // 512
 * ```
 */
export function tarHeader(entry: TarInput, size: number): Uint8Array {
  const now = entry.mtimeMs ?? Date.now();
  const mode = entry.mode ?? (entry.type === "dir" ? 0o755 : 0o644);
  let name = entry.name + (entry.type === "dir" && !entry.name.endsWith("/") ? "/" : "");
  const parts: Uint8Array[] = [];
  if (encoder.encode(name).length > 100) {
    const pax = encoder.encode(paxRecord("path", name));
    parts.push(header("PaxHeader", "x", pax.length, 0o644, now), ...padded(pax));
    name = "long-name";
  }
  parts.push(header(name, entry.type === "dir" ? "5" : "0", size, mode, now, entry.uid, entry.gid));
  return concat(parts);
}

/** Joins byte chunks into one array. */
export function concat(chunks: Uint8Array[]): Uint8Array {
  let total = 0;
  for (const chunk of chunks) total += chunk.length;
  const out = new Uint8Array(total);
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

function readString(block: Uint8Array, offset: number, length: number): string {
  const field = block.subarray(offset, offset + length);
  const end = field.indexOf(0);
  return decoder.decode(end === -1 ? field : field.subarray(0, end));
}

function readNumber(block: Uint8Array, offset: number, length: number): number {
  if (block[offset] & 0x80) {
    // GNU base-256 for values that do not fit in octal.
    let value = 0;
    for (let i = offset + 1; i < offset + length; i++) value = value * 256 + block[i];
    return value;
  }
  const text = readString(block, offset, length).trim();
  return text ? parseInt(text, 8) : 0;
}

function parsePax(data: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  let at = 0;
  while (at < data.length) {
    const space = data.indexOf(0x20, at);
    if (space === -1) break;
    const length = parseInt(decoder.decode(data.subarray(at, space)), 10);
    if (!(length > 0)) break;
    const record = decoder.decode(data.subarray(space + 1, at + length - 1));
    const eq = record.indexOf("=");
    if (eq > 0) out[record.slice(0, eq)] = record.slice(eq + 1);
    at += length;
  }
  return out;
}

/**
 * Reads every entry of a tar archive (ustar, PAX and GNU long names).
 *
 * @throws {RangeError} When the archive is cut short or a header checksum is wrong.
 * @example
 * ```ts
 * const [entry] = readTar(writeTar([{ name: "a", type: "file", data: new Uint8Array([1]) }]));
 * ```
 */
export function readTar(tar: Uint8Array): TarEntry[] {
  const entries: TarEntry[] = [];
  let at = 0;
  let pax: Record<string, string> = {};
  let longName: string | undefined;
  let longLink: string | undefined;
  while (at + BLOCK <= tar.length) {
    const block = tar.subarray(at, at + BLOCK);
    if (block.every((byte) => byte === 0)) break;
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : block[i];
    if (sum !== readNumber(block, 148, 8)) {
      throw new RangeError(`Cannot read tar: bad header checksum at byte ${at}`);
    }
    const typeflag = String.fromCharCode(block[156] || 0x30);
    let size = readNumber(block, 124, 12);
    if (pax.size !== undefined) size = Number(pax.size);
    const start = at + BLOCK;
    if (start + size > tar.length) {
      throw new RangeError("Cannot read tar: the archive is cut short");
    }
    const data = tar.slice(start, start + size);
    at = start + Math.ceil(size / BLOCK) * BLOCK;
    if (typeflag === "x") {
      pax = { ...pax, ...parsePax(data) };
      continue;
    }
    if (typeflag === "g") continue;
    if (typeflag === "L" || typeflag === "K") {
      const text = decoder.decode(data).replace(/\0+$/, "");
      if (typeflag === "L") longName = text;
      else longLink = text;
      continue;
    }
    const prefix = readString(block, 345, 155);
    const shortName = readString(block, 0, 100);
    const name = pax.path ?? longName ?? (prefix ? `${prefix}/${shortName}` : shortName);
    const linkName = pax.linkpath ?? longLink ?? readString(block, 157, 100);
    const type = typeflag === "0" || typeflag === "7"
      ? "file"
      : typeflag === "5"
      ? "dir"
      : typeflag === "2"
      ? "symlink"
      : "other";
    const mtime = pax.mtime !== undefined ? Number(pax.mtime) : readNumber(block, 136, 12);
    entries.push({
      name,
      type,
      mode: readNumber(block, 100, 8) & 0o7777,
      size,
      mtimeMs: Math.round(mtime * 1000),
      linkName,
      data: type === "file" ? data : new Uint8Array(),
    });
    pax = {};
    longName = undefined;
    longLink = undefined;
  }
  return entries;
}

/**
 * How many bytes of `prefix` the first entry of its archive ends at (its PAX and long-name
 * headers, its header and its data), or `undefined` when `prefix` is too short to say.
 */
function firstEntryLength(prefix: Uint8Array): number | undefined {
  let at = 0;
  let paxSize: number | undefined;
  while (at + BLOCK <= prefix.length) {
    const block = prefix.subarray(at, at + BLOCK);
    if (block.every((byte) => byte === 0)) return at + BLOCK;
    const typeflag = String.fromCharCode(block[156] || 0x30);
    const size = paxSize ?? readNumber(block, 124, 12);
    const start = at + BLOCK;
    if (typeflag !== "x" && typeflag !== "g" && typeflag !== "L" && typeflag !== "K") {
      return start + size;
    }
    if (start + size > prefix.length) return undefined;
    if (typeflag === "x") {
      const pax = parsePax(prefix.subarray(start, start + size));
      if (pax.size !== undefined) paxSize = Number(pax.size);
    }
    at = start + Math.ceil(size / BLOCK) * BLOCK;
  }
  return undefined;
}

/**
 * The first entry of a tar archive read from `body`, read no further than its end: the rest of
 * the archive (a directory's whole tree, when the path was one) is never fetched, and the
 * bytes are joined once, not as each chunk arrives. Leaving the loop early ends `body`.
 *
 * @throws {RangeError} When the archive is cut short or a header checksum is wrong.
 * @example
 * ```ts
 * async function* once(bytes: Uint8Array) { yield bytes; }
 * const tar = writeTar([{ name: "a", type: "file", data: new Uint8Array([1]) }]);
 * (await readFirstTarEntry(once(tar)))?.data; // Uint8Array [1]
 * ```
 */
export async function readFirstTarEntry(
  body: AsyncIterable<Uint8Array>,
): Promise<TarEntry | undefined> {
  const chunks: Uint8Array[] = [];
  let have = 0;
  let needed: number | undefined;
  for await (const chunk of body) {
    chunks.push(chunk);
    have += chunk.length;
    if (needed === undefined) needed = firstEntryLength(concat(chunks));
    if (needed !== undefined && have >= needed) break;
  }
  const bytes = concat(chunks);
  return readTar(bytes.subarray(0, Math.min(needed ?? bytes.length, bytes.length)))[0];
}
