/**
 * A managed volume's cap kept by the kernel: each volume is a sparse ext4 image file,
 * `<root>/.images/<id>.ext4`, as large as the cap, loop-mounted (`nosuid,nodev`) at the volume's
 * directory `<root>/<id>`. The volume's `data` (what a sandbox mounts), its `uploads` (the
 * content API's bodies in flight) and its `volume.json` all live inside the image, so a
 * sandbox writing past the cap gets `ENOSPC` from the kernel, the node's disk holds at most the
 * image, and a content-API rename from `uploads` into `data` stays within one filesystem.
 *
 * Why an image rather than a project quota: a quota needs the data dir's filesystem made or
 * remounted with `prjquota` (ext4's `project` feature, or XFS), which a node cannot assume;
 * a loop device needs only root and `/dev/loop-control`. Measured 2026-12-07 on a 2-core host
 * with an ext4 data disk: see `bench/RESULTS.md` ("volume images").
 *
 * Every step is idempotent, so a boot ({@linkcode VolumeImages.mountAll}) or a retried create
 * finds half-done work and finishes it: an image is made under a `.tmp` name and renamed once
 * `mkfs.ext4` succeeded, a move's incoming image under `.incoming` until its stream arrived
 * whole; a boot removes both kinds and mounts every `.ext4`.
 *
 * Needs root, `--allow-run=mount,umount,mkfs.ext4,losetup` and e2fsprogs; {@linkcode probeVolumeImages}
 * answers why not, and the node then keeps the content API's own check (`volumes.ts`).
 *
 * @module
 */
import { join } from "node:path";
import { statfs } from "node:fs/promises";
import { HttpError } from "../shared/http_error.ts";
import { MAX_VOLUME_BYTES, VOLUME_ID } from "../shared/volumes.ts";

/** The commands this module runs (each needs `--allow-run`). */
export const IMAGE_COMMANDS = ["mount", "umount", "mkfs.ext4", "losetup"] as const;

/** The smallest cap a kernel-kept volume takes (ext4 with a journal needs room of its own). */
export const MIN_IMAGE_BYTES = 16 * 1024 * 1024;

/**
 * What `mount` (util-linux) says when it could not attach the image to a loop device: all taken
 * (`/dev/loop*` up to the module's `max_loop`, or a `/dev` without the ones the kernel added).
 */
const LOOP_SETUP_FAILED = /failed to setup loop device|could not find any free loop device/i;

/** How long one command may take. */
const COMMAND_TIMEOUT_MS = 60_000;

/** What a command answered. */
export interface CommandResult {
  /** Its exit code (0 succeeded). */
  code: number;
  /** What it wrote to stderr: the reason a failure is named with. */
  stderr: string;
  /** What it printed (only `losetup -j` is read). */
  stdout?: string;
}

/** Runs one command (tests inject a fake). */
export type CommandRunner = (command: string, args: string[]) => Promise<CommandResult>;

/** Runs `command` with no input, its stderr kept (bounded by a timeout). */
export const runCommand: CommandRunner = async (command, args) => {
  const out = await new Deno.Command(command, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal: AbortSignal.timeout(COMMAND_TIMEOUT_MS),
  }).output();
  const text = (b: Uint8Array) => new TextDecoder().decode(b).trim().slice(0, 2000);
  return { code: out.code, stderr: text(out.stderr), stdout: text(out.stdout) };
};

/** What a mounted filesystem holds, from `statfs`. */
export interface FilesystemUsage {
  /** Bytes the filesystem offers for files (its size less its own metadata). */
  totalBytes: number;
  /** Bytes its files and directories take. */
  usedBytes: number;
}

/** Options of {@linkcode VolumeImages}. */
export interface VolumeImagesOptions {
  /** Runs mount, umount and mkfs.ext4 (tests inject one). */
  run?: CommandRunner;
  /** Whether a directory is a mount point (tests inject one). */
  isMountPoint?: (dir: string) => boolean;
  /**
   * The largest image the filesystem under the root keeps ({@linkcode largestFileBytes});
   * {@linkcode MAX_VOLUME_BYTES} when not given.
   */
  maxBytes?: number;
}

/**
 * The images of the volumes under one root.
 *
 * @example
 * ```ts ignore
 * const images = new VolumeImages("/var/lib/dormice-node/volumes");
 * await images.make("vol-00000000000000000000", 1e9);
 * await images.mount("vol-00000000000000000000");
 * ```
 */
export class VolumeImages {
  /** The volumes' root. */
  readonly root: string;
  /** Where the images are kept. */
  readonly dir: string;
  readonly #run: CommandRunner;
  readonly #isMountPoint: (dir: string) => boolean;
  /** The largest cap an image here may have (see {@linkcode VolumeImagesOptions.maxBytes}). */
  readonly maxBytes: number;

  /** Images under `<root>/.images`; nothing is read or made until a method is called. */
  constructor(root: string, options: VolumeImagesOptions = {}) {
    this.root = root;
    this.dir = join(root, ".images");
    this.#run = options.run ?? runCommand;
    this.#isMountPoint = options.isMountPoint ?? isMountPoint;
    this.maxBytes = options.maxBytes ?? MAX_VOLUME_BYTES;
  }

  /** The image file of volume `id` (`.incoming`: a move's, until its stream arrived whole). */
  imagePath(id: string, incoming = false): string {
    return join(this.dir, `${id}.ext4${incoming ? ".incoming" : ""}`);
  }

  /** Whether volume `id` has an image. */
  hasImage(id: string): boolean {
    return exists(this.imagePath(id));
  }

  /** Whether `dir` has a filesystem mounted on it. */
  isMounted(dir: string): boolean {
    return this.#isMountPoint(dir);
  }

  /**
   * Makes the sparse image of `sizeBytes` (idempotent: an image already made is kept as it is).
   *
   * @throws {HttpError} 400 under {@linkcode MIN_IMAGE_BYTES} or above {@linkcode maxBytes} (507
   *   for a move's incoming image: the operator's move asks more than this node keeps).
   */
  async make(id: string, sizeBytes: number, incoming = false): Promise<void> {
    const path = this.imagePath(id, incoming);
    if (exists(path)) return;
    if (sizeBytes < MIN_IMAGE_BYTES) {
      throw new HttpError(
        400,
        `A volume's cap is at least ${MIN_IMAGE_BYTES} bytes on this node (its volumes are ext4 ` +
          `images, which need room of their own); ${sizeBytes} was asked: ask for a larger one`,
      );
    }
    if (sizeBytes > this.maxBytes) throw this.tooLarge(sizeBytes, incoming);
    await Deno.mkdir(this.dir, { recursive: true, mode: 0o700 });
    const tmp = `${path}.tmp`;
    const file = await Deno.open(tmp, { write: true, create: true, truncate: true, mode: 0o600 });
    try {
      await file.truncate(sizeBytes);
    } catch (error) {
      await Deno.remove(tmp).catch(() => {});
      if (isFileTooLarge(error)) throw this.tooLarge(sizeBytes, incoming);
      throw error;
    } finally {
      file.close();
    }
    // -m 0: no blocks kept for root (a sandbox's files may use the whole image); nodiscard:
    // the fresh sparse file holds nothing to discard. Inode tables are zeroed lazily, inside
    // the image, after the mount.
    await this.#must("mkfs.ext4", ["-q", "-F", "-m", "0", "-E", "nodiscard", tmp], "make");
    await Deno.rename(tmp, path);
  }

  /** The refusal of a cap larger than the filesystem under the root keeps in one file. */
  tooLarge(sizeBytes: number, incoming: boolean): HttpError {
    const max = Math.min(this.maxBytes, MAX_VOLUME_BYTES);
    return new HttpError(
      incoming ? 507 : 400,
      `A volume's cap is at most ${max} bytes (${gib(max)}) on this node: each volume is one ` +
        `image file under ${this.dir}, and that filesystem keeps no larger file (ext4's limit ` +
        `is 16 TiB); ${sizeBytes} bytes was asked: ${
          incoming
            ? "move the volume to a node whose data dir is on a filesystem with larger files (XFS)"
            : "ask for a smaller cap"
        }`,
    );
  }

  /**
   * Mounts the image of `id` at `at` (default `<root>/<id>`); idempotent. The loop device then
   * reads and writes the image with direct I/O: buffered, every block sits in the page cache
   * twice and a 256 MiB fsync'd write ran at a third of a plain directory's speed (measured
   * 2026-12-07, `bench/RESULTS.md`). A device that refuses direct I/O (an image on a
   * filesystem without `O_DIRECT`) stays buffered.
   */
  async mount(id: string, at: string = join(this.root, id), incoming = false): Promise<void> {
    await Deno.mkdir(at, { recursive: true });
    if (this.isMounted(at)) return;
    const image = this.imagePath(id, incoming);
    // `mount -o loop` sets the device to free itself once unmounted (autoclear).
    const args = ["-t", "ext4", "-o", "loop,nosuid,nodev", image, at];
    const mounted = await this.#run("mount", args);
    if (mounted.code !== 0 && LOOP_SETUP_FAILED.test(mounted.stderr)) {
      throw new HttpError(
        503,
        `No loop device is free on this node to mount volume '${id}' (each volume holds one ` +
          `while mounted; mount said: ${mounted.stderr}): delete volumes this node no longer ` +
          "needs, raise the loop module's max_loop, or make the volume on another node",
        { headers: { "retry-after": "30" } },
      );
    }
    if (mounted.code !== 0) {
      throw new Error(
        `Could not mount a volume image: mount ${args.join(" ")} exited ${mounted.code}: ` +
          mounted.stderr,
      );
    }
    const devices = await this.#run("losetup", ["-j", image, "-n", "-O", "NAME"]);
    for (const device of (devices.stdout ?? "").split("\n").filter((d) => d.startsWith("/dev/"))) {
      await this.#run("losetup", ["--direct-io=on", device]);
    }
  }

  /**
   * Unmounts `at` when something is mounted there. A mount still held (a container being
   * removed) is detached lazily: the kernel frees its loop device once the last holder goes.
   */
  async unmount(at: string): Promise<void> {
    if (!this.isMounted(at)) return;
    const first = await this.#run("umount", [at]);
    if (first.code === 0) return;
    if (!/busy/i.test(first.stderr)) {
      throw new Error(`umount ${at} failed (exit ${first.code}): ${first.stderr}`);
    }
    await this.#must("umount", ["-l", at], "unmount");
  }

  /** Unmounts volume `id` and removes its image (idempotent). */
  async remove(id: string): Promise<void> {
    await this.unmount(join(this.root, id));
    await Deno.remove(this.imagePath(id)).catch(ignoreNotFound);
  }

  /** Renames a move's incoming image to the volume's own (once it is unmounted). */
  async adopt(id: string): Promise<void> {
    await Deno.rename(this.imagePath(id, true), this.imagePath(id));
  }

  /** Removes a move's incoming image and its staging mount (after a failed or stale import). */
  async dropIncoming(id: string, at: string): Promise<void> {
    await this.unmount(at);
    await Deno.remove(at, { recursive: true }).catch(ignoreNotFound);
    await Deno.remove(this.imagePath(id, true)).catch(ignoreNotFound);
  }

  /**
   * At boot: drops half-made images, stale moves' staging and a stopped probe's image and
   * mount, then mounts every volume's image
   * at its directory (a mount still there from before is kept). An image that mounts without a
   * `volume.json` is a create the node stopped in the middle of (never answered, so the gateway
   * forgot it): it is dropped, or it would hold a loop device and its disk forever. Answers the
   * ids mounted, those dropped, and those whose mount failed, with why.
   */
  async mountAll(): Promise<
    { mounted: string[]; dropped: string[]; failed: { id: string; error: string }[] }
  > {
    const mounted: string[] = [];
    const dropped: string[] = [];
    const failed: { id: string; error: string }[] = [];
    for (const e of readDir(this.root)) {
      const m = /^\.incoming-(vol-[a-z0-9]+)$/.exec(e.name);
      if (e.isDirectory && m) await this.dropIncoming(m[1], join(this.root, e.name));
    }
    for (const e of readDir(this.dir)) {
      if (e.name.startsWith(".probe-")) {
        // A probe the node stopped in the middle of: its mount would hold a loop device.
        if (e.isDirectory) await this.unmount(join(this.dir, e.name));
        await Deno.remove(join(this.dir, e.name), { recursive: true }).catch(ignoreNotFound);
        continue;
      }
      if (e.name.endsWith(".tmp") || e.name.endsWith(".incoming")) {
        await Deno.remove(join(this.dir, e.name)).catch(ignoreNotFound);
        continue;
      }
      const id = e.name.replace(/\.ext4$/, "");
      if (!e.isFile || id === e.name || !VOLUME_ID.test(id)) continue;
      try {
        await this.mount(id);
        if (exists(join(this.root, id, "volume.json"))) {
          mounted.push(id);
          continue;
        }
        await this.remove(id);
        await Deno.remove(join(this.root, id), { recursive: true }).catch(ignoreNotFound);
        dropped.push(id);
      } catch (error) {
        failed.push({ id, error: (error as Error).message });
      }
    }
    return { mounted: mounted.sort(), dropped: dropped.sort(), failed };
  }

  async #must(command: string, args: string[], what: string): Promise<void> {
    const r = await this.#run(command, args);
    if (r.code !== 0) {
      throw new Error(
        `Could not ${what} a volume image: ${command} ${args.join(" ")} exited ${r.code}: ` +
          r.stderr,
      );
    }
  }
}

/** What the filesystem mounted at `dir` holds (`statfs`: constant time, no walk). */
export async function filesystemUsage(dir: string): Promise<FilesystemUsage> {
  const s = await statfs(dir);
  return { totalBytes: s.blocks * s.bsize, usedBytes: (s.blocks - s.bfree) * s.bsize };
}

/**
 * Whether this node can keep caps in the kernel under `root`: `null` when it can, or the
 * reason it cannot (for the boot log and `/healthz`). Proven by making, mounting and
 * unmounting a small image, so a host without root, loop devices or e2fsprogs says which.
 */
export async function probeVolumeImages(
  root: string,
  run: CommandRunner = runCommand,
): Promise<string | null> {
  const missing = IMAGE_COMMANDS.filter((c) =>
    Deno.permissions.querySync({ name: "run", command: c }).state !== "granted"
  );
  if (missing.length > 0) {
    return `the node may not run ${missing.join(", ")} (--allow-run=${IMAGE_COMMANDS.join(",")})`;
  }
  const images = new VolumeImages(root, { run });
  const id = `.probe-${crypto.randomUUID().slice(0, 8)}`;
  const at = join(images.dir, id);
  try {
    await images.make(id, MIN_IMAGE_BYTES);
    await images.mount(id, at);
    if (!images.isMounted(at)) return "the probe image mounted but its directory is no mount";
    return null;
  } catch (error) {
    // No loop device free now (the volumes' own mounts may hold them all, after a restart):
    // the node can keep caps, and a create says what it lacks (503). Falling back to checks
    // would leave the images of a host that lost its mounts unmounted and their volumes
    // unserved, and make new volumes plain directories.
    if (error instanceof HttpError && error.status === 503) return null;
    const message = (error as Error).message;
    if (error instanceof Deno.errors.NotFound) return `a command is missing: ${message}`;
    return message;
  } finally {
    await images.unmount(at).catch(() => {});
    await Deno.remove(at).catch(() => {});
    await Deno.remove(images.imagePath(id)).catch(() => {});
    await Deno.remove(`${images.imagePath(id)}.tmp`).catch(() => {});
  }
}

/**
 * The largest sparse file the filesystem holding `dir` keeps, up to {@linkcode MAX_VOLUME_BYTES}:
 * found by truncating one empty file (no block is written) to sizes halving the gap, at most 50
 * truncates, at 4 KiB. ext4 answers 16 TiB less 4 KiB; XFS and tmpfs the bound.
 */
export async function largestFileBytes(dir: string): Promise<number> {
  await Deno.mkdir(dir, { recursive: true, mode: 0o700 });
  const path = join(dir, `.probe-size-${crypto.randomUUID().slice(0, 8)}`);
  const file = await Deno.open(path, { write: true, create: true, truncate: true, mode: 0o600 });
  const fits = async (n: number) => {
    try {
      await file.truncate(n);
      return true;
    } catch (error) {
      if (isFileTooLarge(error)) return false;
      throw error;
    }
  };
  try {
    if (await fits(MAX_VOLUME_BYTES)) return MAX_VOLUME_BYTES;
    const block = 4096;
    let lo = 0; // in blocks: fits
    let hi = MAX_VOLUME_BYTES / block; // does not
    while (hi - lo > 1) {
      const mid = Math.floor((lo + hi) / 2);
      if (await fits(mid * block)) lo = mid;
      else hi = mid;
    }
    return lo * block;
  } finally {
    file.close();
    await Deno.remove(path).catch(() => {});
  }
}

/** `EFBIG`: a file larger than its filesystem keeps. */
function isFileTooLarge(error: unknown): boolean {
  return error instanceof Error && /File too large|os error 27\b/.test(error.message);
}

function gib(bytes: number): string {
  return bytes >= 2 ** 40
    ? `${(bytes / 2 ** 40).toFixed(2)} TiB`
    : `${(bytes / 2 ** 30).toFixed(2)} GiB`;
}

/** Whether `dir` is a mount point: its device differs from its parent's. */
export function isMountPoint(dir: string): boolean {
  try {
    return Deno.statSync(dir).dev !== Deno.statSync(join(dir, "..")).dev;
  } catch {
    return false;
  }
}

function readDir(dir: string): Deno.DirEntry[] {
  try {
    return [...Deno.readDirSync(dir)];
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return [];
    throw error;
  }
}

function exists(path: string): boolean {
  try {
    Deno.statSync(path);
    return true;
  } catch {
    return false;
  }
}

function ignoreNotFound(error: unknown): void {
  if (!(error instanceof Deno.errors.NotFound)) throw error;
}
