/**
 * The node's managed volumes (E2B's `Volume`): one directory each, `<root>/<id>/data`, with its
 * cap in `<root>/<id>/volume.json`. The root is `<DORMICE_DATA_DIR>/volumes`, or
 * `DORMICE_VOLUME_ROOT` when every node mounts one shared directory. A sandbox mounts the `data`
 * directory (a bind mount under Docker); the content API (`volume_content.ts`) reads and writes
 * it from the node; a move copies it to another node as a stream of entries (`volume_copy.ts`).
 *
 * The cap is checked, not enforced: writes through the content API and a move's copy stop at
 * it, but a sandbox writing into its bind mount is bounded only by the disk that holds the root,
 * because a plain directory has no quota of its own (an XFS project quota or a loop-mounted
 * image would need root and a filesystem chosen for it).
 *
 * @module
 */
import { join } from "node:path";
import { HttpError } from "../shared/http_error.ts";
import { VOLUME_ID } from "../shared/volumes.ts";
import type { SandboxRecord } from "./service_contract.ts";

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
}

/** The stored description of one volume. */
interface VolumeFile {
  id: string;
  sizeBytes: number;
  createdAt: string;
}

/** The largest number of entries a usage walk counts before it calls the volume full. */
const MAX_WALK_ENTRIES = 200_000;

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

  /** Volumes under `options.root`; nothing is read or made until a method is called. */
  constructor(options: NodeVolumesOptions) {
    this.root = options.root;
    this.shared = options.shared;
    this.#defaultSizeBytes = options.defaultSizeBytes;
    this.#sandboxes = options.sandboxes;
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
    await Deno.mkdir(join(dir, "data"), { recursive: true });
    await Deno.chmod(join(dir, "data"), 0o777);
    const file: VolumeFile = { id, sizeBytes: size, createdAt: new Date().toISOString() };
    await Deno.writeTextFile(join(dir, "volume.json"), JSON.stringify(file));
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
    if (!this.has(id)) return false;
    this.refuseWhileMounted(id, "delete");
    await Deno.remove(join(this.root, id), { recursive: true });
    return true;
  }

  /** Bytes the volume's files take (apparent sizes), counted by a bounded walk. */
  async usedBytes(id: string): Promise<number> {
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
): NodeVolumes {
  const shared = typeof config.volumeRoot === "string";
  return new NodeVolumes({
    root: shared ? config.volumeRoot! : join(config.dataDir, "volumes"),
    shared,
    defaultSizeBytes: config.volumeSizeBytes ?? DEFAULT_VOLUME_SIZE_BYTES,
    sandboxes: () => ledger.all(),
  });
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
