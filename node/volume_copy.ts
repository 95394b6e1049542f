/**
 * A volume as a stream of entries, for a move between nodes: each entry is a 4-byte big-endian
 * header length, a JSON header `{path, type, mode, size?, target?}` and, for a file, `size`
 * bytes; a zero length ends the stream. A file with holes (it takes fewer blocks than its size)
 * is sent as `type: "sparse"`: its header's `size` is its apparent size, and its body is records
 * of its data only, each a 4-byte length, an 8-byte offset and that many bytes, ended by a zero
 * length; what no record covers is a hole on the target too, and only the records' bytes count
 * against the cap. (A node from before sparse entries refuses one as a bad header, so a move to
 * it fails whole and the volume stays where it was.) The importer writes into a hidden directory and renames
 * it into place only once the whole stream arrived, so a volume is advertised whole or not at
 * all; links are made last, so no write of the import goes through one.
 *
 * @module
 */
import { join } from "node:path";
import { statfs } from "node:fs/promises";
import { HttpError } from "../shared/http_error.ts";
import { splitVolumePath } from "./volume_paths.ts";

interface EntryHeader {
  path: string;
  type: "file" | "sparse" | "dir" | "symlink";
  mode: number;
  size?: number;
  target?: string;
  /** The owner (a sandbox's commands run as its image's user, who must own its files still). */
  uid?: number;
  gid?: number;
}

const MAX_HEADER_BYTES = 16 * 1024;

/** The most bytes one record of a sparse file carries. */
const MAX_RECORD_BYTES = 1024 * 1024;

/**
 * Files smaller than this are always sent whole: a filesystem may keep a small file's bytes in its
 * inode (ext4's inline_data, btrfs's inline extents), taking no block though it holds data.
 */
const MIN_SPARSE_BYTES = 64 * 1024;

/** `statfs`'s type of ext2, ext3 and ext4. */
const EXT4_MAGIC = 0xef53;

/** The unit holes are found in: a sector, so any block size's holes are found. */
const SECTOR = 512;

/** The volume's data directory as an entry stream (directories before what they hold). */
export function exportVolume(dataDir: string): ReadableStream<Uint8Array> {
  /** The block size when the volume is on ext4 (see {@linkcode sparseRecords}), else null. */
  let ext4Block: Promise<number | null> | undefined;
  const blockSize = () =>
    ext4Block ??= statfs(dataDir).then((s) => s.type === EXT4_MAGIC ? s.bsize : null, () => null);
  const encoder = new TextEncoder();
  const header = (h: EntryHeader): Uint8Array => {
    const json = encoder.encode(JSON.stringify(h));
    const out = new Uint8Array(4 + json.length);
    new DataView(out.buffer).setUint32(0, json.length);
    out.set(json, 4);
    return out;
  };
  async function* entries(dir: string, rel: string): AsyncGenerator<Uint8Array> {
    for await (const e of Deno.readDir(dir)) {
      const path = join(dir, e.name);
      const relPath = rel === "" ? e.name : `${rel}/${e.name}`;
      const info = await Deno.lstat(path);
      const mode = (info.mode ?? 0o644) & 0o7777;
      const owner = info.uid === null ? {} : { uid: info.uid, gid: info.gid ?? undefined };
      if (info.isSymlink) {
        yield header({ path: relPath, type: "symlink", mode, target: await Deno.readLink(path) });
      } else if (info.isDirectory) {
        yield header({ path: relPath, type: "dir", mode, ...owner });
        yield* entries(path, relPath);
      } else if (info.isFile && hasHoles(info)) {
        yield header({ path: relPath, type: "sparse", mode, size: info.size, ...owner });
        yield* sparseRecords(path, info.blocks!, await blockSize());
      } else if (info.isFile) {
        const file = await Deno.open(path, { read: true });
        const size = (await file.stat()).size;
        yield header({ path: relPath, type: "file", mode, size, ...owner });
        let left = size;
        for await (const chunk of file.readable) {
          const part = chunk.length > left ? chunk.subarray(0, left) : chunk;
          left -= part.length;
          yield part;
          if (left === 0) break;
        }
        // A file that shrank while it was read is padded, so the stream stays in step.
        if (left > 0) yield new Uint8Array(left);
      }
    }
  }
  const it = entries(dataDir, "");
  return new ReadableStream({
    async pull(controller) {
      const { done, value } = await it.next();
      if (done) {
        controller.enqueue(new Uint8Array(4));
        controller.close();
      } else controller.enqueue(value);
    },
    async cancel() {
      await it.return(undefined);
    },
  });
}

/** Whether a file takes fewer blocks than its size says (and is large enough to tell). */
function hasHoles(info: Deno.FileInfo): boolean {
  return info.size >= MIN_SPARSE_BYTES && typeof info.blocks === "number" &&
    info.blocks * 512 < info.size;
}

/**
 * The data of a file with holes as records (see the module doc). Deno cannot seek to data or
 * holes (SEEK_DATA), so the file is read and each all-zero sector left out: a hole, or zeros
 * written, both read back as zeros on the target.
 *
 * On ext4 (`blockSize` given: every volume kept in an image) the read stops once the non-zero
 * blocks found account for every block the file takes (`st_blocks`): each such block is one of
 * the file's own (ext4 neither compresses nor keeps a file this large in its inode), so what is
 * left reads as zeros, and a file of holes only is not read at all. Elsewhere a filesystem may
 * compress (btrfs, ZFS: fewer blocks than data), so the file is read to its end.
 */
async function* sparseRecords(
  path: string,
  blocks: number,
  blockSize: number | null,
): AsyncGenerator<Uint8Array> {
  const file = await Deno.open(path, { read: true });
  // A block size that does not divide the buffer (every ext4 one does) reads to the end.
  const unit = blockSize !== null && MAX_RECORD_BYTES % blockSize === 0 &&
      blockSize % SECTOR === 0
    ? blockSize
    : null;
  try {
    const buf = new Uint8Array(MAX_RECORD_BYTES);
    const words = new Uint32Array(buf.buffer);
    let at = 0;
    /** Non-zero blocks found, in 512-byte units (as `st_blocks` counts). */
    let found = 0;
    let counted = -1;
    while (unit === null || found < blocks) {
      let n = 0;
      while (n < buf.length) {
        const got = await file.read(buf.subarray(n));
        if (got === null) break;
        n += got;
      }
      if (n === 0) break;
      // Runs of non-zero sectors become records.
      let start = -1;
      for (let i = 0; i < n; i += SECTOR) {
        const end = Math.min(n, i + SECTOR);
        let zero = true;
        if (end - i === SECTOR) {
          for (let w = i / 4; w < end / 4; w++) {
            if (words[w] !== 0) {
              zero = false;
              break;
            }
          }
        } else {
          for (let b = i; b < end; b++) {
            if (buf[b] !== 0) {
              zero = false;
              break;
            }
          }
        }
        if (!zero) {
          // Counted once per block: at the first non-zero sector of it.
          const block = unit === null ? -1 : Math.floor((at + i) / unit);
          if (unit !== null && block !== counted) {
            found += unit / SECTOR;
            counted = block;
          }
          if (start < 0) start = i;
        } else if (start >= 0) {
          yield record(at + start, buf.slice(start, i));
          start = -1;
        }
      }
      if (start >= 0) yield record(at + start, buf.slice(start, n));
      at += n;
      if (n < buf.length) break;
    }
    yield new Uint8Array(4);
  } finally {
    file.close();
  }
}

/** One record of a sparse file: length, offset, bytes. */
function record(offset: number, bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(12 + bytes.length);
  const view = new DataView(out.buffer);
  view.setUint32(0, bytes.length);
  view.setBigUint64(4, BigInt(offset));
  out.set(bytes, 12);
  return out;
}

/** Reads exact byte counts off a stream. */
class ExactReader {
  #reader: ReadableStreamDefaultReader<Uint8Array>;
  #buf = new Uint8Array(0);
  constructor(stream: ReadableStream<Uint8Array>) {
    this.#reader = stream.getReader();
  }
  async #fill(n: number): Promise<void> {
    while (this.#buf.length < n) {
      const { done, value } = await this.#reader.read();
      if (done) throw new HttpError(400, "The volume stream ended in the middle of an entry");
      const next = new Uint8Array(this.#buf.length + value.length);
      next.set(this.#buf);
      next.set(value, this.#buf.length);
      this.#buf = next;
    }
  }
  async read(n: number): Promise<Uint8Array> {
    await this.#fill(n);
    const out = this.#buf.slice(0, n);
    this.#buf = this.#buf.subarray(n);
    return out;
  }
  /** Up to `max` bytes, at least one. */
  async some(max: number): Promise<Uint8Array> {
    await this.#fill(1);
    const n = Math.min(max, this.#buf.length);
    const out = this.#buf.slice(0, n);
    this.#buf = this.#buf.subarray(n);
    return out;
  }
  cancel(): void {
    this.#reader.cancel().catch(() => {});
  }
}

/**
 * Writes an entry stream into `target` (which must not exist), through `staging` (a sibling),
 * refusing more than `capBytes` of file content.
 *
 * @throws {HttpError} 400 for a malformed stream or a path that leaves the volume, 507 past the cap.
 */
export async function importVolume(
  stream: ReadableStream<Uint8Array>,
  staging: string,
  capBytes: number,
): Promise<number> {
  await Deno.remove(staging, { recursive: true }).catch(() => {});
  await Deno.mkdir(staging, { recursive: true, mode: 0o777 });
  await Deno.chmod(staging, 0o777);
  const reader = new ExactReader(stream);
  const links: EntryHeader[] = [];
  let total = 0;
  try {
    for (;;) {
      const len = new DataView((await reader.read(4)).buffer).getUint32(0);
      if (len === 0) break;
      if (len > MAX_HEADER_BYTES) throw new HttpError(400, "A volume stream header is too long");
      const h = JSON.parse(new TextDecoder().decode(await reader.read(len))) as EntryHeader;
      const parts = splitVolumePath(String(h.path));
      if (parts.length === 0) throw new HttpError(400, "A volume stream entry names the root");
      const path = join(staging, ...parts);
      const mode = typeof h.mode === "number" ? h.mode & 0o7777 : 0o644;
      if (h.type === "dir") {
        await Deno.mkdir(path, { recursive: true });
        await chownAsSent(path, h);
        await Deno.chmod(path, mode);
      } else if (h.type === "symlink" && typeof h.target === "string") {
        links.push(h);
      } else if (h.type === "file" && Number.isSafeInteger(h.size) && h.size! >= 0) {
        total += h.size!;
        if (total > capBytes) {
          throw new HttpError(507, `The volume holds more than its cap of ${capBytes} bytes`);
        }
        const file = await Deno.open(path, { write: true, create: true, truncate: true, mode });
        try {
          let left = h.size!;
          while (left > 0) {
            const chunk = await reader.some(left);
            left -= chunk.length;
            let written = 0;
            while (written < chunk.length) written += await file.write(chunk.subarray(written));
          }
        } finally {
          file.close();
        }
        // Owner first: a chown clears the set-id bits the mode then puts back.
        await chownAsSent(path, h);
        await Deno.chmod(path, mode);
      } else if (h.type === "sparse" && Number.isSafeInteger(h.size) && h.size! >= 0) {
        const file = await Deno.open(path, { write: true, create: true, truncate: true, mode });
        try {
          await file.truncate(h.size!).catch((error) => {
            if (!/File too large|os error 27\b/.test((error as Error).message)) throw error;
            throw new HttpError(
              507,
              `File '/${h.path}' is ${h.size} bytes long (sparse), more than this node's ` +
                "filesystem keeps in one file",
            );
          });
          let next = 0;
          for (;;) {
            const n = new DataView((await reader.read(4)).buffer).getUint32(0);
            if (n === 0) break;
            const offset = Number(new DataView((await reader.read(8)).buffer).getBigUint64(0));
            if (n > MAX_RECORD_BYTES || offset < next || offset + n > h.size!) {
              throw new HttpError(400, `A sparse entry of '/${h.path}' has a bad record`);
            }
            total += n;
            if (total > capBytes) {
              throw new HttpError(507, `The volume holds more than its cap of ${capBytes} bytes`);
            }
            await file.seek(offset, Deno.SeekMode.Start);
            let left = n;
            while (left > 0) {
              const chunk = await reader.some(left);
              left -= chunk.length;
              let written = 0;
              while (written < chunk.length) written += await file.write(chunk.subarray(written));
            }
            next = offset + n;
          }
        } finally {
          file.close();
        }
        await chownAsSent(path, h);
        await Deno.chmod(path, mode);
      } else throw new HttpError(400, `A volume stream entry has a bad header: ${len} bytes`);
    }
    try {
      for (const h of links) {
        await Deno.symlink(h.target!, join(staging, ...splitVolumePath(h.path)));
      }
    } catch (error) {
      // Deno makes links only under unscoped --allow-read and --allow-write: a node granted
      // its data dir alone cannot, and a move that dropped the links would lose data quietly.
      if (!(error instanceof Deno.errors.NotCapable)) throw error;
      throw new HttpError(
        409,
        `The volume holds ${links.length} symbolic link(s) (${
          links.slice(0, 5).map((l) => `'/${l.path}'`).join(", ")
        }), which this node cannot make under path-scoped --allow-read/--allow-write: remove ` +
          "the links, or run the target node with unscoped --allow-read and --allow-write",
      );
    }
  } catch (error) {
    reader.cancel();
    await Deno.remove(staging, { recursive: true }).catch(() => {});
    if (error instanceof SyntaxError) {
      throw new HttpError(400, `A volume stream header is not JSON: ${error.message}`);
    }
    throw error;
  }
  return total;
}

/**
 * Gives `path` the owner its entry names, when it names one and this node may (a node not running
 * as root keeps its own): a copy owned by the node's user would leave a sandbox running as its
 * image's user unable to write the files it wrote before the move.
 */
async function chownAsSent(path: string, h: EntryHeader): Promise<void> {
  const id = (v: unknown) =>
    Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) < 2 ** 32 - 1
      ? v as number
      : null;
  const uid = id(h.uid);
  const gid = id(h.gid);
  if (uid === null && gid === null) return;
  await Deno.chown(path, uid, gid).catch((error) => {
    if (!(error instanceof Deno.errors.PermissionDenied)) throw error;
  });
}
