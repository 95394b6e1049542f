/**
 * What keeping a volume's cap in the kernel costs (`node/volume_images.ts`): a volume as a plain
 * directory under the data dir against one as a sparse ext4 image loop-mounted there, measured
 * in process on the node's own code. Create time (`NodeVolumes.create`, 10 GB cap: mkfs.ext4 and
 * the mount against a mkdir), sequential write throughput (dd of 256 MiB, fsync'd at the end),
 * 2,000 small files written by one shell (no sync: `sync -f` of a plain directory flushes the
 * whole shared data disk), and the usage count the content API asks (a walk of
 * the 2,000 files against statfs). A sandbox writes through a bind mount of the same directory,
 * so the host-side figures are the sandbox's. Skipped with the reason when this host cannot
 * loop-mount (not root, no loop devices, no mkfs.ext4).
 *
 * @module
 */
import { join } from "node:path";
import { NodeVolumes } from "../../node/volumes.ts";
import { probeVolumeImages, VolumeImages } from "../../node/volume_images.ts";
import { row, type Section } from "../lib/stats.ts";

/** Options of the volume-image benchmark. */
export interface VolumeImagesOptions {
  /** Runs (each measures both kinds once). */
  runs: number;
}

const title = "Volumes: a loop-mounted ext4 image against a plain directory";
const WRITE_MIB = 256;
const SMALL_FILES = 2_000;

async function sh(command: string): Promise<void> {
  const out = await new Deno.Command("sh", { args: ["-c", command], stdin: "null" }).output();
  if (!out.success) {
    throw new Error(`${command.slice(0, 80)} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
}

async function timed(f: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await f();
  return performance.now() - t0;
}

/** Measures both kinds of volume; skipped when this host cannot loop-mount. */
export async function runVolumeImages({ runs }: VolumeImagesOptions): Promise<Section> {
  const reference = "the same step on a plain directory of the same data disk, in the same run";
  const dir = await Deno.makeTempDir({ prefix: "dormice-bench-volumes-" });
  const images = new VolumeImages(join(dir, "image"));
  try {
    await Deno.mkdir(join(dir, "image"));
    const why = await probeVolumeImages(join(dir, "image"));
    if (why !== null) return { title, reference, rows: [], notes: [], skipped: why };
    const kinds = {
      plain: new NodeVolumes({
        root: join(dir, "plain"),
        shared: false,
        defaultSizeBytes: 10e9,
        sandboxes: () => [],
      }),
      image: new NodeVolumes({
        root: join(dir, "image"),
        shared: false,
        defaultSizeBytes: 10e9,
        sandboxes: () => [],
        images,
      }),
    };
    const m = {
      plain: {
        create: [] as number[],
        write: [] as number[],
        small: [] as number[],
        count: [] as number[],
      },
      image: {
        create: [] as number[],
        write: [] as number[],
        small: [] as number[],
        count: [] as number[],
      },
    };
    for (let r = 0; r < runs; r++) {
      for (const kind of ["plain", "image"] as const) {
        const volumes = kinds[kind];
        const id = `vol-bench${String(r).padStart(15, "0")}`;
        m[kind].create.push(await timed(() => volumes.create(id)));
        const data = volumes.requireDataDir(id);
        const ms = await timed(() =>
          sh(`dd if=/dev/zero of=${data}/big bs=1M count=${WRITE_MIB} conv=fsync status=none`)
        );
        m[kind].write.push(WRITE_MIB / (ms / 1000));
        await Deno.remove(join(data, "big"));
        m[kind].small.push(
          await timed(() =>
            sh(
              `cd ${data} && i=0; while [ $i -lt ${SMALL_FILES} ]; do echo x > f$i; ` +
                `i=$((i+1)); done`,
            )
          ),
        );
        m[kind].count.push(await timed(() => volumes.usedBytes(id)));
        await volumes.destroy(id);
      }
    }
    return {
      title,
      reference,
      rows: [
        row(
          "create a volume (10 GB cap), plain directory (reference)",
          "ms",
          m.plain.create,
          m.plain.create,
        ),
        row(
          "create a volume (10 GB cap), ext4 image: mkfs.ext4 + mount",
          "ms",
          m.image.create,
          m.plain.create,
        ),
        row(
          `write ${WRITE_MIB} MiB (dd, fsync), plain directory (reference)`,
          "MiB/s",
          m.plain.write,
          m.plain.write,
        ),
        row(
          `write ${WRITE_MIB} MiB (dd, fsync), ext4 image`,
          "MiB/s",
          m.image.write,
          m.plain.write,
        ),
        row(
          `${SMALL_FILES} small files (sh), plain directory (reference)`,
          "ms",
          m.plain.small,
          m.plain.small,
        ),
        row(
          `${SMALL_FILES} small files (sh), ext4 image`,
          "ms",
          m.image.small,
          m.plain.small,
        ),
        row(
          `usage of ${SMALL_FILES} files: a walk, plain directory (reference)`,
          "ms",
          m.plain.count,
          m.plain.count,
        ),
        row(
          `usage of ${SMALL_FILES} files: statfs, ext4 image`,
          "ms",
          m.image.count,
          m.plain.count,
        ),
      ],
      notes: [
        "Both kinds on the same data disk (the node's data dir's filesystem); the image is a sparse file as large as the cap, mounted loop,nosuid,nodev.",
        "A sandbox writes through a bind mount of the same directory, so these host-side figures are what its writes see.",
      ],
    };
  } finally {
    const left = await Array.fromAsync(Deno.readDir(join(dir, "image"))).catch(() => []);
    for (const e of left) {
      if (e.name.startsWith("vol-")) {
        await images.unmount(join(dir, "image", e.name)).catch(() => {});
      }
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
