/**
 * The tags of the E2B templates built on this node, kept on its data disk so they outlive a
 * restart of the node and of every gateway: one JSON file per template
 * (`<data dir>/template-tags/<template id>.json`), written whole, flushed to the disk, renamed
 * into place and the rename flushed too (the directory), so a crash or a power loss leaves the
 * old file or the new one, never an empty record that would read as "no tags" (and a `.part`
 * file, removed at the store's first write after the restart). A gateway reads and writes them through the node's
 * tag routes (`faces/e2b_template_routes.ts`); the node's check-in carries none of it.
 *
 * A record names its team, the template's newest build (what `default` names unless it was
 * pointed elsewhere) and each tag's build, and when it was last written: when a template was
 * rebuilt on another node, each node keeps a record, and the gateway takes the newest.
 *
 * @module
 */
import { join } from "node:path";
import type { Clock } from "../shared/clock.ts";
import { systemClock } from "../shared/clock.ts";
import { SNAPSHOT_ID_PATTERN } from "./executors/contract.ts";

/** How many templates' records a node keeps; the least recently written go first. */
export const KEPT_TAG_RECORDS = 5000;
/** How many tags one template keeps; a write past it is refused. */
export const MAX_TAGS_PER_TEMPLATE = 256;

/** Where a tag points: a build of the template and when it was pointed there. */
export interface TagTarget {
  buildID: string;
  createdAt: string;
}

/** An open file as the store writes and flushes it. */
export interface TagFile {
  write(bytes: Uint8Array): Promise<number>;
  /** Flushes the file (or directory) to the disk: `fsync`. */
  sync(): Promise<void>;
  close(): void;
}

/** The file operations the store writes through (a test wraps them to see each flush). */
export interface TagFiles {
  /** Opens `path` to write (`create`, `truncate`) or, for a directory, to read. */
  open(path: string, options: Deno.OpenOptions): Promise<TagFile>;
  rename(from: string, to: string): Promise<void>;
}

const denoFiles: TagFiles = { open: Deno.open, rename: Deno.rename };

/** The tags of one template, as a node keeps them. */
export interface TagRecord {
  team: string;
  /** When it was last written, ms since the epoch (the newest record of a template wins). */
  updatedAt: number;
  /** The newest build requested of the template, which `default` names unless pointed. */
  latest?: TagTarget;
  /** Tag → the build it names. */
  tags: Record<string, TagTarget>;
}

/** The tag records of the node's templates. */
export class TemplateTagStore {
  #dir: string;
  #clock: Clock;
  /** Writes of one record in turn: a read-modify-write never interleaves with another. */
  #chain = new Map<string, Promise<unknown>>();
  /** The `.part` files this store is writing now; any other is a crashed write's leftover. */
  #partials = new Set<string>();
  /** Whether the leftovers of an earlier process were removed (at the first write). */
  #swept = false;

  #files: TagFiles;

  /** A store in `dir` (made on the first write). */
  constructor(dir: string, clock: Clock = systemClock, files: TagFiles = denoFiles) {
    this.#dir = dir;
    this.#clock = clock;
    this.#files = files;
  }

  /** The record of `templateId`, or undefined. */
  async get(templateId: string): Promise<TagRecord | undefined> {
    if (!SNAPSHOT_ID_PATTERN.test(templateId)) return undefined;
    try {
      const parsed = JSON.parse(await Deno.readTextFile(this.#path(templateId)));
      return typeof parsed?.team === "string" && typeof parsed.tags === "object"
        ? parsed as TagRecord
        : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Changes the record of `templateId` with `fn` (given the current one, or undefined) and writes
   * what it returns, stamped now; returns that. `fn` throws to refuse the change.
   */
  update(
    templateId: string,
    fn: (held: TagRecord | undefined) => Omit<TagRecord, "updatedAt">,
  ): Promise<TagRecord> {
    if (!SNAPSHOT_ID_PATTERN.test(templateId)) {
      return Promise.reject(new RangeError(`'${templateId.slice(0, 80)}' is not a template id`));
    }
    const before = this.#chain.get(templateId) ?? Promise.resolve();
    const run = before.catch(() => {}).then(async () => {
      const held = await this.get(templateId);
      const next = { ...fn(held), updatedAt: this.#clock.now() };
      if (Object.keys(next.tags).length > MAX_TAGS_PER_TEMPLATE) {
        throw new RangeError(
          `A template keeps at most ${MAX_TAGS_PER_TEMPLATE} tags: remove some with ` +
            "DELETE /templates/tags first",
        );
      }
      await Deno.mkdir(this.#dir, { recursive: true });
      if (!this.#swept) {
        this.#swept = true;
        await this.#removeLeftovers();
      }
      const path = this.#path(templateId);
      const partial = `${path}.${crypto.randomUUID().slice(0, 8)}.part`;
      this.#partials.add(partial);
      try {
        await this.#writeDurably(partial, JSON.stringify(next));
        await this.#files.rename(partial, path);
      } catch (error) {
        // A failed write (a full disk) leaves no partial file behind, attempt after attempt.
        await Deno.remove(partial).catch(() => {});
        throw error;
      } finally {
        this.#partials.delete(partial);
      }
      // The rename is on the disk once the directory is: until then a power loss may bring back
      // the old record (never an empty one).
      await this.#sync(this.#dir, { read: true });
      if (!held) await this.#evict();
      return next;
    });
    this.#chain.set(templateId, run);
    run.finally(() => {
      if (this.#chain.get(templateId) === run) this.#chain.delete(templateId);
    }).catch(() => {});
    return run;
  }

  /** Drops the record of a deleted template. */
  async drop(templateId: string): Promise<void> {
    if (!SNAPSHOT_ID_PATTERN.test(templateId)) return;
    await Deno.remove(this.#path(templateId)).catch(() => {});
  }

  /** Writes `text` to `path` whole and flushes it before it is renamed into place. */
  async #writeDurably(path: string, text: string): Promise<void> {
    const file = await this.#files.open(path, { write: true, create: true, truncate: true });
    try {
      const bytes = new TextEncoder().encode(text);
      for (let at = 0; at < bytes.length;) at += await file.write(bytes.subarray(at));
      await file.sync();
    } finally {
      file.close();
    }
  }

  /** Flushes `path` (a directory: its entries) to the disk. */
  async #sync(path: string, options: Deno.OpenOptions): Promise<void> {
    const file = await this.#files.open(path, options);
    try {
      await file.sync();
    } finally {
      file.close();
    }
  }

  #path(templateId: string): string {
    return join(this.#dir, `${templateId}.json`);
  }

  /**
   * Removes the `.part` files a crash left between a write and its rename (none is read; each
   * would stay for good): every one this store is not writing now.
   */
  async #removeLeftovers(): Promise<void> {
    let read = 0;
    for await (const entry of Deno.readDir(this.#dir)) {
      if (++read > KEPT_TAG_RECORDS * 4) break;
      const path = join(this.#dir, entry.name);
      if (entry.isFile && entry.name.endsWith(".part") && !this.#partials.has(path)) {
        await Deno.remove(path).catch(() => {});
      }
    }
  }

  /** Past {@linkcode KEPT_TAG_RECORDS} records, the least recently written are removed. */
  async #evict(): Promise<void> {
    const files: { path: string; at: number }[] = [];
    for await (const entry of Deno.readDir(this.#dir)) {
      if (!entry.isFile || !entry.name.endsWith(".json")) continue;
      if (files.length >= KEPT_TAG_RECORDS * 2) break;
      const path = join(this.#dir, entry.name);
      const at = (await Deno.stat(path).catch(() => undefined))?.mtime?.getTime() ?? 0;
      files.push({ path, at });
    }
    if (files.length <= KEPT_TAG_RECORDS) return;
    files.sort((a, b) => a.at - b.at);
    for (const f of files.slice(0, files.length - KEPT_TAG_RECORDS)) {
      await Deno.remove(f.path).catch(() => {});
    }
  }
}
