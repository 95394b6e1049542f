/**
 * A volume as a stream of entries, for a move between nodes: each entry is a 4-byte big-endian
 * header length, a JSON header `{path, type, mode, size?, target?}` and, for a file, `size`
 * bytes; a zero length ends the stream. The importer writes into a hidden directory and renames
 * it into place only once the whole stream arrived, so a volume is advertised whole or not at
 * all; links are made last, so no write of the import goes through one.
 *
 * @module
 */
import { join } from "node:path";
import { HttpError } from "../shared/http_error.ts";
import { splitVolumePath } from "./volume_paths.ts";

interface EntryHeader {
  path: string;
  type: "file" | "dir" | "symlink";
  mode: number;
  size?: number;
  target?: string;
  /** The owner (a sandbox's commands run as its image's user, who must own its files still). */
  uid?: number;
  gid?: number;
}

const MAX_HEADER_BYTES = 16 * 1024;

/** The volume's data directory as an entry stream (directories before what they hold). */
export function exportVolume(dataDir: string): ReadableStream<Uint8Array> {
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
