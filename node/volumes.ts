/**
 * The node's managed volumes (E2B's `Volume`): one directory each, `<root>/<id>/data`, with its
 * cap in `<root>/<id>/volume.json`. The root is `<DORMICE_DATA_DIR>/volumes`, or
 * `DORMICE_VOLUME_ROOT` when every node mounts one shared directory. A sandbox mounts the `data`
 * directory (a bind mount under Docker); the content API (`volume_content.ts`) reads and writes
 * it from the node; a move copies it to another node as a stream of entries (`volume_copy.ts`).
 *
 * Where the node runs as root with loop devices (and not on a shared root), the kernel keeps the
 * cap: each volume is an ext4 image loop-mounted at `<root>/<id>` (`volume_images.ts`), so a
 * sandbox writing into its bind mount gets `ENOSPC` at the cap, and what the volume holds is the
 * filesystem's own count (`statfs`), not a walk. Elsewhere the cap is checked, not enforced:
 * writes through the content API and a move's copy stop at it, but a sandbox writing into its
 * bind mount is bounded only by the disk that holds the root ({@linkcode NodeVolumes.caps} says
 * which, and why).
 *
 * What a volume holds is counted by a walk of its files, which is slow for many small files
 * (10 s for 200,000 one-byte files on a 2-core host, measured 2026-12-07); the count is kept for
 * {@linkcode USAGE_TTL_MS}, or ten times as long as the walk took, and moved by the content
 * API's own writes, so walks take at most a tenth of the time of a volume written without pause
 * rather than one walk per write. Writes in flight hold the bytes they have sent, so concurrent uploads share
 * the room left instead of each seeing all of it. A body is written under
 * `<root>/<id>/uploads/`, beside `data` and out of a sandbox's sight, and renamed into the
 * volume only once it arrived whole.
 *
 * @module
 */
import { join } from "node:path";
import { HttpError } from "../shared/http_error.ts";
import { VOLUME_ID } from "../shared/volumes.ts";
import type { SandboxRecord } from "./service_contract.ts";
import type { Log } from "../shared/log.ts";
import {
  filesystemUsage,
  largestFileBytes,
  probeVolumeImages,
  VolumeImages,
} from "./volume_images.ts";

/** Options of {@linkcode NodeVolumes}. */
export interface NodeVolumesOptions {
  /** Where the volumes live: `<dataDir>/volumes`, or the shared root. */
  root: string;
  /** True when `root` is `DORMICE_VOLUME_ROOT` (every node mounts it). */
  shared: boolean;
  /** The cap of a volume created without one, in bytes. */
  defaultSizeBytes: number;
  /** The node's sandboxes (a volume mounted by one cannot be deleted or moved). */
  sandboxes: () => Iterable<Pick<SandboxRecord, "id" | "name" | "state" | "spec">>;
  /** The clock of the usage cache, in milliseconds (tests inject one). */
  now?: () => number;
  /** Called at the start of every usage walk (tests count them). */
  onWalk?: (id: string) => void;
  /** The volumes' images when the kernel keeps their caps; absent: the content API checks them. */
  images?: VolumeImages;
  /** Why there are no images (shown by {@linkcode NodeVolumes.caps}). */
  noImagesWhy?: string;
}

/** Who keeps the volumes' caps: the kernel (images), or the content API's check only. */
export interface VolumeCaps {
  /** `kernel`: a sandbox's own writes stop at the cap; `checked`: only the content API's do. */
  enforcedBy: "kernel" | "checked";
  /** Why the kernel does not (with `checked`). */
  why?: string;
}

/** A write in flight through the content API (see {@linkcode NodeVolumes.beginWrite}). */
export interface VolumeWrite {
  /**
   * Counts `n` more bytes of the body.
   *
   * @throws {HttpError} 507 when they do not fit under the cap.
   */
  add(n: number): void;
  /** Ends the write: `committed` when its file is now in the volume. */
  end(committed: boolean): void;
}

/** The stored description of one volume. */
interface VolumeFile {
  id: string;
  sizeBytes: number;
  createdAt: string;
}

/** The largest number of entries a usage walk counts before it calls the volume full. */
const MAX_WALK_ENTRIES = 200_000;

/** The most content-API writes one volume takes at once (each holds a file open on the node). */
export const MAX_WRITES_IN_FLIGHT = 64;

/** How long a usage walk's count is trusted (moved by the content API's own writes meanwhile). */
export const USAGE_TTL_MS = 30_000;

/**
 * The volumes under one root.
 *
 * @example
 * ```ts ignore
 * const volumes = new NodeVolumes({ root, shared: false, defaultSizeBytes: 1e9, sandboxes });
 * await volumes.create("vol-00000000000000000000");
 * ```
 */
export class NodeVolumes {
  /** Where the volumes live. */
  readonly root: string;
  /** True on a shared root: every node serves every volume. */
  readonly shared: boolean;
  readonly #defaultSizeBytes: number;
  readonly #sandboxes: NodeVolumesOptions["sandboxes"];
  readonly #now: () => number;
  readonly #onWalk: ((id: string) => void) | undefined;
  readonly #images: VolumeImages | undefined;
  /** Who keeps the caps, for `/healthz` and the boot log. */
  readonly caps: VolumeCaps;
  /** The last walk's count per volume, moved by writes since; dropped past its TTL or on delete. */
  readonly #usage = new Map<string, { bytes: number; at: number; ttl: number }>();
  /** Walks in flight, so concurrent writes share one. */
  readonly #walking = new Map<string, Promise<number>>();
  /** Bytes held by writes in flight, per volume (an entry lives while a write does). */
  readonly #held = new Map<string, number>();
  /** Writes in flight, per volume (an entry lives while a write does). */
  readonly #writing = new Map<string, number>();

  /** Volumes under `options.root`; nothing is read or made until a method is called. */
  constructor(options: NodeVolumesOptions) {
    this.root = options.root;
    this.shared = options.shared;
    this.#defaultSizeBytes = options.defaultSizeBytes;
    this.#sandboxes = options.sandboxes;
    this.#now = options.now ?? Date.now;
    this.#onWalk = options.onWalk;
    this.#images = options.images;
    this.caps = options.images
      ? { enforcedBy: "kernel" }
      : { enforcedBy: "checked", why: options.noImagesWhy ?? "no volume images configured" };
  }

  /**
   * At boot, with images: mounts every volume's image at its directory (idempotent) and drops
   * half-made ones; then removes the bodies of writes a stopped node left behind.
   */
  async open(log?: Log): Promise<void> {
    if (this.#images) {
      const { mounted, dropped, failed } = await this.#images.mountAll();
      if (mounted.length > 0) log?.("info", "volume images mounted", { count: mounted.length });
      if (dropped.length > 0) {
        log?.("warn", "volume images of creates the node stopped in the middle of were removed", {
          volumes: dropped,
        });
      }
      for (const f of failed) {
        log?.("error", "a volume's image did not mount: the volume is not served", {
          volume: f.id,
          error: f.error,
          fix: "check the image with e2fsck -f, then restart the node",
        });
      }
    }
    await this.sweepUploads();
  }

  /** Where a body is written before it is renamed into the volume (out of a sandbox's sight). */
  uploadsDir(id: string): string {
    return join(this.root, id, "uploads");
  }

  /** The ids of the volumes present under the root now (read at every check-in). */
  ids(): string[] {
    const out: string[] = [];
    try {
      for (const e of Deno.readDirSync(this.root)) {
        if (e.isDirectory && VOLUME_ID.test(e.name) && exists(join(this.root, e.name, "data"))) {
          out.push(e.name);
        }
      }
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    }
    return out.sort();
  }

  /** Whether the volume is here. */
  has(id: string): boolean {
    return VOLUME_ID.test(id) && exists(join(this.root, id, "data"));
  }

  /** The host directory a sandbox mounts, or `undefined` when the volume is not here. */
  dataDir(id: string): string | undefined {
    return this.has(id) ? join(this.root, id, "data") : undefined;
  }

  /** The directory, or a 404 naming the volume. */
  requireDataDir(id: string): string {
    const dir = this.dataDir(id);
    if (dir === undefined) {
      throw new HttpError(404, `Volume '${id}' is not on this node (root ${this.root})`);
    }
    return dir;
  }

  /** The volume's cap in bytes. */
  sizeBytes(id: string): number {
    try {
      const file = JSON.parse(Deno.readTextFileSync(join(this.root, id, "volume.json")));
      return typeof file.sizeBytes === "number" ? file.sizeBytes : this.#defaultSizeBytes;
    } catch {
      return this.#defaultSizeBytes;
    }
  }

  /**
   * Makes the volume's directory (idempotent: a retried create finds it made). World-writable,
   * as a bind mount is seen by whatever user a sandbox's commands run as.
   */
  async create(id: string, sizeBytes?: number): Promise<{ id: string; sizeBytes: number }> {
    const dir = join(this.root, id);
    const size = sizeBytes ?? this.#defaultSizeBytes;
    const images = this.#images;
    // A plain directory made before the node kept caps stays one.
    const inImage = images !== undefined && !(exists(join(dir, "data")) && !images.hasImage(id));
    // An image this call makes goes again when the create fails (a mount refused for want of a
    // loop device): the gateway forgets a volume whose create failed, so nothing would ever
    // delete it, and every boot would mount it again.
    const fresh = inImage && !images.hasImage(id);
    try {
      if (inImage) {
        await images.make(id, size);
        await images.mount(id);
      }
      await Deno.mkdir(join(dir, "data"), { recursive: true });
      await Deno.chmod(join(dir, "data"), 0o777);
      await Deno.mkdir(this.uploadsDir(id), { recursive: true, mode: 0o700 });
      const file: VolumeFile = { id, sizeBytes: size, createdAt: new Date().toISOString() };
      // Written last: an image without it is a create that never finished (`mountAll`).
      await Deno.writeTextFile(join(dir, "volume.json"), JSON.stringify(file));
    } catch (error) {
      if (fresh) {
        await images.remove(id).catch(() => {});
        await Deno.remove(dir, { recursive: true }).catch(() => {});
      }
      throw error;
    }
    return { id, sizeBytes: size };
  }

  /** The node's sandboxes that mount the volume (any state: a paused one resumes with it). */
  users(id: string): { id: string; name: string; state: string }[] {
    const out = [];
    for (const s of this.#sandboxes()) {
      if (s.spec.volumes?.some((v) => v.name === id)) {
        out.push({ id: s.id, name: s.name, state: s.state });
      }
    }
    return out;
  }

  /**
   * A 409 naming the sandboxes that mount the volume, when any does.
   *
   * @throws {HttpError} 409 naming them and what to do.
   */
  refuseWhileMounted(id: string, what: string): void {
    const users = this.users(id);
    if (users.length === 0) return;
    throw new HttpError(
      409,
      `Cannot ${what} volume '${id}': it is mounted by sandbox ${
        users.map((u) => `'${u.id}' (${u.state})`).join(", ")
      }: kill them first`,
      { details: { sandboxes: users.map((u) => u.id) } },
    );
  }

  /** Deletes the volume and its files; false when it was not here. */
  async destroy(id: string): Promise<boolean> {
    if (!this.has(id)) {
      // An image whose mount failed at boot: not served, but deleting it frees its disk.
      if (!VOLUME_ID.test(id) || !this.#images?.hasImage(id)) return false;
      await this.#images.remove(id);
      await Deno.remove(join(this.root, id), { recursive: true }).catch(() => {});
      return true;
    }
    this.refuseWhileMounted(id, "delete");
    if (this.#images?.hasImage(id)) {
      // The files go with the image: unmounted, the directory is an empty mount point.
      await this.#images.remove(id);
      await Deno.remove(join(this.root, id), { recursive: true });
    } else await Deno.remove(join(this.root, id), { recursive: true });
    this.forgetUsage(id);
    return true;
  }

  /**
   * Removes the bodies of writes a stopped node left behind (at start, when none is in flight;
   * skipped on a shared root, where another node's writes may be). The directory itself stays,
   * made again at once with the inode its removal freed: a content-API delete moves what it
   * removes into it, and in a volume whose every inode or block a sandbox took, making it then
   * would fail, and nothing could be removed but from inside a sandbox.
   */
  async sweepUploads(): Promise<void> {
    if (this.shared) return;
    for (const id of this.ids()) {
      await Deno.remove(this.uploadsDir(id), { recursive: true }).catch(() => {});
      await Deno.mkdir(this.uploadsDir(id), { mode: 0o700 }).catch(() => {});
    }
  }

  /**
   * Imports a moved volume: `fill` writes its files into the `data` directory it is given (in
   * an image of `sizeBytes` when the kernel keeps caps, so the copy stops at the cap too); the
   * volume appears whole or not at all.
   */
  async importInto(
    id: string,
    sizeBytes: number,
    fill: (dataDir: string) => Promise<number>,
  ): Promise<number> {
    const staging = join(this.root, `.incoming-${id}`);
    const file: VolumeFile = { id, sizeBytes, createdAt: new Date().toISOString() };
    const images = this.#images;
    if (images === undefined) {
      await Deno.mkdir(join(staging, "uploads"), { recursive: true, mode: 0o700 });
      const bytes = await fill(join(staging, "data"));
      await Deno.writeTextFile(join(staging, "volume.json"), JSON.stringify(file));
      await Deno.rename(staging, join(this.root, id));
      return bytes;
    }
    await images.dropIncoming(id, staging);
    try {
      await images.make(id, sizeBytes, true);
      await images.mount(id, staging, true);
      await Deno.mkdir(join(staging, "uploads"), { recursive: true, mode: 0o700 });
      const bytes = await fill(join(staging, "data"));
      await Deno.writeTextFile(join(staging, "volume.json"), JSON.stringify(file));
      await images.unmount(staging);
      await images.adopt(id);
      await images.mount(id);
      await Deno.remove(staging).catch(() => {});
      return bytes;
    } catch (error) {
      await images.dropIncoming(id, staging).catch(() => {});
      throw error;
    }
  }

  /** Drops the cached count (after a delete through the content API, or the volume's). */
  forgetUsage(id: string): void {
    this.#usage.delete(id);
  }

  /** Bytes the volume holds: the cached count while fresh, else one walk shared by callers. */
  async cachedUsedBytes(id: string): Promise<number> {
    const cached = this.#usage.get(id);
    if (cached !== undefined && this.#now() - cached.at < cached.ttl) return cached.bytes;
    let walk = this.#walking.get(id);
    if (walk === undefined) {
      const at = this.#now();
      walk = this.usedBytes(id).then((bytes) => {
        const took = this.#now() - at;
        this.#usage.set(id, { bytes, at, ttl: Math.max(USAGE_TTL_MS, 10 * took) });
        return bytes;
      }).finally(() => this.#walking.delete(id));
      this.#walking.set(id, walk);
    }
    return await walk;
  }

  /**
   * Starts a write of a file that replaces `replacedBytes`: its bytes are held against the cap
   * as they arrive, beside every other write in flight.
   */
  async beginWrite(id: string, replacedBytes: number): Promise<VolumeWrite> {
    const cap = await this.capBytes(id);
    const writing = this.#writing.get(id) ?? 0;
    if (writing >= MAX_WRITES_IN_FLIGHT) {
      throw new HttpError(
        429,
        `Volume '${id}' has ${writing} writes in flight, the most it takes at once: retry once ` +
          "some finish",
        { headers: { "retry-after": "1" } },
      );
    }
    this.#writing.set(id, writing + 1);
    try {
      await this.cachedUsedBytes(id);
    } catch (error) {
      this.#endWriting(id);
      throw error;
    }
    let written = 0;
    let ended = false;
    const hold = (n: number) => {
      const next = (this.#held.get(id) ?? 0) + n;
      if (next <= 0) this.#held.delete(id);
      else this.#held.set(id, next);
    };
    return {
      add: (n) => {
        const used = this.#usage.get(id)?.bytes ?? 0;
        const held = this.#held.get(id) ?? 0;
        if (used + held + n - replacedBytes > cap) {
          throw new HttpError(
            507,
            `Volume '${id}' is full: its cap is ${cap} bytes; remove files or create a new volume`,
          );
        }
        written += n;
        hold(n);
      },
      end: (committed) => {
        if (ended) return;
        ended = true;
        this.#endWriting(id);
        hold(-written);
        const cached = this.#usage.get(id);
        if (committed && cached !== undefined) {
          cached.bytes = Math.max(0, cached.bytes + written - replacedBytes);
        }
      },
    };
  }

  #endWriting(id: string): void {
    const n = (this.#writing.get(id) ?? 1) - 1;
    if (n <= 0) this.#writing.delete(id);
    else this.#writing.set(id, n);
  }

  /**
   * The cap writes are checked against: the stored cap, or, in an image, the room its
   * filesystem offers for files when that is less (the image's own metadata takes some).
   */
  async capBytes(id: string): Promise<number> {
    const cap = this.sizeBytes(id);
    const dir = join(this.root, id);
    if (!this.#images?.isMounted(dir)) return cap;
    return Math.min(cap, (await filesystemUsage(dir)).totalBytes);
  }

  /**
   * Bytes the volume's files take: its filesystem's own count when it is an image (`statfs`),
   * else their apparent sizes, counted by a bounded walk.
   */
  async usedBytes(id: string): Promise<number> {
    const volumeDir = join(this.root, id);
    if (this.#images?.isMounted(volumeDir)) {
      this.requireDataDir(id);
      return (await filesystemUsage(volumeDir)).usedBytes;
    }
    this.#onWalk?.(id);
    let total = 0;
    let entries = 0;
    const walk = async (dir: string): Promise<void> => {
      for await (const e of Deno.readDir(dir)) {
        if (++entries > MAX_WALK_ENTRIES) {
          throw new HttpError(
            507,
            `Volume '${id}' holds more than ${MAX_WALK_ENTRIES} entries: remove some first`,
          );
        }
        const path = join(dir, e.name);
        if (e.isDirectory) await walk(path);
        else if (e.isFile) total += (await Deno.lstat(path)).size;
      }
    };
    await walk(this.requireDataDir(id));
    return total;
  }
}

/**
 * The volumes of a node's config: under `DORMICE_VOLUME_ROOT` (shared) or
 * `<DORMICE_DATA_DIR>/volumes`, capped at `DORMICE_VOLUME_SIZE_GB`.
 *
 * @example
 * ```ts ignore
 * const volumes = nodeVolumesFor(config, ledger);
 * ```
 */
export function nodeVolumesFor(
  config: { dataDir: string; volumeRoot?: string | null; volumeSizeBytes?: number },
  ledger: { all(): SandboxRecord[] },
  kernel?: { images?: VolumeImages; noImagesWhy?: string },
): NodeVolumes {
  const shared = typeof config.volumeRoot === "string";
  return new NodeVolumes({
    root: shared ? config.volumeRoot! : join(config.dataDir, "volumes"),
    shared,
    defaultSizeBytes: config.volumeSizeBytes ?? DEFAULT_VOLUME_SIZE_BYTES,
    sandboxes: () => ledger.all(),
    ...kernel,
  });
}

/**
 * The volumes of a node's config with their caps kept by the kernel when it can
 * (`volume_images.ts`): root, loop devices, e2fsprogs and `--allow-run=mount,umount,mkfs.ext4,losetup`,
 * and not on a shared root (one ext4 image mounted by two nodes at once would be corrupted).
 * Otherwise the content API's check, and the reason in {@linkcode NodeVolumes.caps}.
 *
 * @example
 * ```ts ignore
 * const volumes = await openNodeVolumes(config, ledger);
 * await volumes.open(log);
 * ```
 */
export async function openNodeVolumes(
  config: { dataDir: string; volumeRoot?: string | null; volumeSizeBytes?: number },
  ledger: { all(): SandboxRecord[] },
): Promise<NodeVolumes> {
  if (typeof config.volumeRoot === "string") {
    return nodeVolumesFor(config, ledger, {
      noImagesWhy: "DORMICE_VOLUME_ROOT is a shared root: an ext4 image mounted by two nodes " +
        "at once would be corrupted, so caps are checked by the content API only (give the " +
        "shared filesystem its own quotas)",
    });
  }
  const root = join(config.dataDir, "volumes");
  await Deno.mkdir(root, { recursive: true });
  const why = await probeVolumeImages(root);
  if (why !== null) return nodeVolumesFor(config, ledger, { noImagesWhy: why });
  const maxBytes = await largestFileBytes(join(root, ".images"));
  const refusal = volumeSizeRefusal(config.volumeSizeBytes ?? DEFAULT_VOLUME_SIZE_BYTES, maxBytes);
  if (refusal !== null) throw new VolumeSizeRefused(refusal);
  return nodeVolumesFor(config, ledger, { images: new VolumeImages(root, { maxBytes }) });
}

/** A `DORMICE_VOLUME_SIZE_GB` this node cannot keep: the node refuses to start with it. */
export class VolumeSizeRefused extends Error {
  override name = "VolumeSizeRefused";
}

/**
 * Why a default cap of `sizeBytes` cannot be kept where the largest image file is `maxBytes`
 * bytes (`null` when it can). Refused rather than clamped: every create would otherwise make a
 * smaller volume than the operator set, or fail with a 400 the client did not cause.
 */
export function volumeSizeRefusal(sizeBytes: number, maxBytes: number): string | null {
  if (sizeBytes <= maxBytes) return null;
  return `DORMICE_VOLUME_SIZE_GB=${sizeBytes / 1e9} asks for volumes of ${sizeBytes} bytes, but ` +
    `this node keeps each volume as one ext4 image file under DORMICE_DATA_DIR, and that ` +
    `filesystem keeps no file larger than ${maxBytes} bytes (ext4's limit is 16 TiB): set ` +
    `DORMICE_VOLUME_SIZE_GB to at most ${Math.floor(maxBytes / 1e9)}, or put DORMICE_DATA_DIR ` +
    "on a filesystem with larger files (XFS)";
}

/** The cap of a new volume when `DORMICE_VOLUME_SIZE_GB` is unset: 10 GB. */
export const DEFAULT_VOLUME_SIZE_BYTES = 10e9;

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}
