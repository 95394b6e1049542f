import assert from "node:assert/strict";
import { join } from "node:path";
import {
  type CommandRunner,
  filesystemUsage,
  largestFileBytes,
  MIN_IMAGE_BYTES,
  probeVolumeImages,
  VolumeImages,
} from "./volume_images.ts";
import { NodeVolumes, volumeSizeRefusal } from "./volumes.ts";
import { HttpError } from "../shared/http_error.ts";
import { MAX_VOLUME_BYTES } from "../shared/volumes.ts";

const id = "vol-0123456789abcdef0123";

/** A fake host: mkfs writes a marker, mount and umount move a set of mount points. */
function fakeHost(options: { busy?: boolean; failMount?: string; mountSays?: string } = {}) {
  const calls: string[] = [];
  const mounts = new Set<string>();
  let busy = options.busy ?? false;
  const run: CommandRunner = async (command, args) => {
    calls.push(`${command} ${args.join(" ")}`);
    if (command === "mkfs.ext4") {
      // A marker at the start, the size kept (as mkfs keeps a file's).
      using file = await Deno.open(args[args.length - 1], { write: true });
      await file.write(new TextEncoder().encode("ext4"));
    } else if (command === "mount") {
      const [image, at] = args.slice(-2);
      if (options.failMount && image.includes(options.failMount)) {
        return { code: 32, stderr: options.mountSays ?? "mount: wrong fs type" };
      }
      mounts.add(at);
    } else if (command === "losetup" && args[0] === "-j") {
      return { code: 0, stderr: "", stdout: "/dev/loop7" };
    } else if (command === "umount") {
      if (busy && args[0] !== "-l") {
        busy = false;
        return { code: 32, stderr: "umount: target is busy." };
      }
      mounts.delete(args[args.length - 1]);
    }
    return { code: 0, stderr: "" };
  };
  return { calls, mounts, run, isMountPoint: (dir: string) => mounts.has(dir) };
}

/** The node's volumes under `root` (not shared, 1 GB caps, no sandboxes) on `images`. */
function volumesOn(root: string, images: VolumeImages): NodeVolumes {
  return new NodeVolumes({
    root,
    shared: false,
    defaultSizeBytes: 1e9,
    sandboxes: () => [],
    images,
  });
}

Deno.test("volume images: an image is made sparse under a .tmp name, once, and a small cap is a 400", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost();
    const images = new VolumeImages(root, host);
    await images.make(id, 1e9);
    const info = await Deno.stat(images.imagePath(id));
    assert.equal(info.size, 1e9);
    assert.ok(info.blocks! * 512 < 1e6, "the image is sparse");
    assert.deepEqual(host.calls, [
      `mkfs.ext4 -q -F -m 0 -E nodiscard ${images.imagePath(id)}.tmp`,
    ]);
    // A retried create keeps the image it made (and its files).
    await images.make(id, 2e9);
    assert.equal(host.calls.length, 1);
    await assert.rejects(
      images.make("vol-aaaaaaaaaaaaaaaaaaaa", MIN_IMAGE_BYTES - 1),
      (e: Error & { status?: number }) =>
        e.status === 400 && /at least 16777216 bytes/.test(e.message),
    );
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volume images: mounts are nosuid,nodev and idempotent; a busy unmount is detached", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost({ busy: true });
    const images = new VolumeImages(root, host);
    await images.make(id, 1e9);
    await images.mount(id);
    await images.mount(id);
    const at = join(root, id);
    assert.deepEqual(host.calls.filter((c) => /^(mount|losetup)/.test(c)), [
      `mount -t ext4 -o loop,nosuid,nodev ${images.imagePath(id)} ${at}`,
      `losetup -j ${images.imagePath(id)} -n -O NAME`,
      "losetup --direct-io=on /dev/loop7",
    ]);
    await images.remove(id);
    assert.deepEqual(host.calls.filter((c) => c.startsWith("umount")), [
      `umount ${at}`,
      `umount -l ${at}`,
    ]);
    assert.equal(images.isMounted(at), false);
    assert.equal(images.hasImage(id), false);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volume images: a boot drops half-made images and stale moves, mounts the rest, names failures", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost({ failMount: "vol-bbbbbbbbbbbbbbbbbbbb" });
    const images = new VolumeImages(root, host);
    await images.make(id, 1e9);
    await images.make("vol-bbbbbbbbbbbbbbbbbbbb", 1e9);
    await images.make("vol-cccccccccccccccccccc", 1e9, true);
    await images.mount(
      "vol-cccccccccccccccccccc",
      join(root, ".incoming-vol-cccccccccccccccccccc"),
      true,
    );
    await Deno.writeTextFile(join(images.dir, "vol-dddddddddddddddddddd.ext4.tmp"), "");
    // A probe stopped mounted (the node killed during its boot's probe).
    await images.make(".probe-0badf00d", 1e9);
    await images.mount(".probe-0badf00d", join(images.dir, ".probe-0badf00d"));
    // A finished create's image holds its volume.json (here the fake mount point holds it).
    await Deno.mkdir(join(root, id));
    await Deno.writeTextFile(join(root, id, "volume.json"), "{}");
    const { mounted, dropped, failed } = await images.mountAll();
    assert.deepEqual(mounted, [id]);
    assert.deepEqual(dropped, []);
    assert.deepEqual(failed.map((f) => f.id), ["vol-bbbbbbbbbbbbbbbbbbbb"]);
    assert.match(failed[0].error, /wrong fs type/);
    assert.deepEqual([...Deno.readDirSync(images.dir)].map((e) => e.name).sort(), [
      `${id}.ext4`,
      "vol-bbbbbbbbbbbbbbbbbbbb.ext4",
    ]);
    assert.deepEqual([...host.mounts], [join(root, id)], "the probe's mount is gone too");
    // A second boot with the mount still there leaves it be.
    const before = host.calls.length;
    await images.mountAll();
    assert.equal(host.calls.filter((c, i) => i >= before && c.startsWith("mount")).length, 1);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("node volumes with images: a create refused for want of a loop device is a 503 naming it and leaves nothing", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost({
      failMount: id,
      mountSays:
        `mount: ${root}/${id}: failed to setup loop device for ${root}/.images/${id}.ext4.`,
    });
    const images = new VolumeImages(root, host);
    const volumes = volumesOn(root, images);
    await assert.rejects(
      volumes.create(id),
      (e: Error & { status?: number; headers?: Record<string, string> }) =>
        e.status === 503 && /No loop device is free/.test(e.message) &&
        /max_loop/.test(e.message) && e.headers?.["retry-after"] !== undefined,
    );
    // The half-made volume is gone: no image for a boot to mount, no directory.
    assert.equal(images.hasImage(id), false);
    assert.deepEqual([...Deno.readDirSync(root)].map((e) => e.name), [".images"]);
    assert.equal(volumes.has(id), false);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volume images: a boot drops the image of a create the node stopped in the middle of", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost();
    const images = new VolumeImages(root, host);
    const volumes = volumesOn(root, images);
    await volumes.create(id);
    // Stopped after the mount, before volume.json: the gateway never heard of it.
    const half = "vol-hhhhhhhhhhhhhhhhhhhh";
    await images.make(half, 1e9);
    await images.mount(half);
    await Deno.mkdir(join(root, half, "data"));
    const { mounted, dropped, failed } = await images.mountAll();
    assert.deepEqual({ mounted, dropped, failed }, { mounted: [id], dropped: [half], failed: [] });
    assert.equal(images.hasImage(half), false);
    assert.deepEqual([...host.mounts], [join(root, id)]);
    assert.throws(() => Deno.statSync(join(root, half)), Deno.errors.NotFound);
    assert.deepEqual(volumes.ids(), [id]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("node volumes with images: create makes and mounts, import adopts whole, delete frees the image", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost();
    const images = new VolumeImages(root, host);
    const volumes = volumesOn(root, images);
    assert.deepEqual(volumes.caps, { enforcedBy: "kernel" });
    await volumes.create(id);
    assert.ok(images.hasImage(id) && images.isMounted(join(root, id)));
    assert.ok(volumes.has(id));
    // Mounted: the count is the filesystem's own (statfs), no walk; the cap at most its size.
    assert.equal(typeof await volumes.usedBytes(id), "number");
    assert.ok(await volumes.capBytes(id) <= 1e9);
    assert.equal(await volumes.destroy(id), true);
    assert.equal(images.hasImage(id), false);
    assert.equal(host.mounts.size, 0);
    assert.throws(() => Deno.statSync(join(root, id)), Deno.errors.NotFound);

    // An image that did not mount (a failed boot) is not served, but a delete frees it.
    const broken = "vol-ffffffffffffffffffff";
    await images.make(broken, 1e9);
    assert.equal(volumes.has(broken), false);
    assert.equal(await volumes.destroy(broken), true);
    assert.equal(images.hasImage(broken), false);

    const moved = "vol-eeeeeeeeeeeeeeeeeeee";
    await assert.rejects(
      volumes.importInto(moved, 1e9, () => Promise.reject(new Error("the stream broke"))),
      /the stream broke/,
    );
    assert.equal(images.hasImage(moved), false);
    assert.equal(host.mounts.size, 0);
    const bytes = await volumes.importInto(moved, 1e9, async (data) => {
      await Deno.mkdir(data);
      await Deno.writeTextFile(join(data, "a"), "abc");
      return 3;
    });
    assert.equal(bytes, 3);
    assert.ok(images.hasImage(moved));
    assert.deepEqual([...host.mounts], [join(root, moved)]);
    assert.equal(volumes.sizeBytes(moved), 1e9);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("node volumes without images say the content API checks the caps, and why", () => {
  const volumes = new NodeVolumes({
    root: "/nonexistent",
    shared: true,
    defaultSizeBytes: 1e9,
    sandboxes: () => [],
    noImagesWhy: "a shared root",
  });
  assert.deepEqual(volumes.caps, { enforcedBy: "checked", why: "a shared root" });
});

Deno.test("volume images: the probe names a failing step", async () => {
  const root = await Deno.makeTempDir();
  try {
    const why = await probeVolumeImages(
      root,
      (command) =>
        Promise.resolve(
          command === "mount"
            ? { code: 32, stderr: "mount: only root can do that" }
            : { code: 0, stderr: "" },
        ),
    );
    assert.match(why!, /only root can do that/);
    // Nothing of the probe is left.
    assert.deepEqual([...Deno.readDirSync(join(root, ".images"))], []);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volume images: a probe that finds no free loop device says the node keeps caps", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost({
      failMount: ".probe-",
      mountSays: "mount: /x: failed to setup loop device for /y.",
    });
    assert.equal(await probeVolumeImages(root, host.run), null);
    assert.ok(host.calls.some((c) => c.startsWith("mount ")), "the probe tried a mount");
    assert.deepEqual([...Deno.readDirSync(join(root, ".images"))], []);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

const notRoot = Deno.uid() !== 0 ||
  !new Deno.Command("test", { args: ["-c", "/dev/loop-control"] }).outputSync().success;
if (notRoot) console.log("volume images on this host skipped: not root, or no loop devices");

Deno.test({
  name: "volume images on this host: a write past the cap is ENOSPC and statfs counts it",
  ignore: notRoot,
}, async () => {
  const root = await Deno.makeTempDir();
  const images = new VolumeImages(root);
  try {
    assert.equal(await probeVolumeImages(root), null);
    await images.make(id, MIN_IMAGE_BYTES);
    await images.mount(id);
    const at = join(root, id);
    const usage = await filesystemUsage(at);
    assert.ok(usage.totalBytes <= MIN_IMAGE_BYTES && usage.totalBytes > MIN_IMAGE_BYTES / 2);
    const file = await Deno.open(join(at, "big"), { write: true, create: true });
    try {
      await assert.rejects(async () => {
        for (let i = 0; i < 32; i++) await file.write(new Uint8Array(1024 * 1024));
      }, /os error 28/);
    } finally {
      file.close();
    }
    assert.ok((await filesystemUsage(at)).usedBytes > usage.totalBytes / 2);
    assert.ok((await Deno.stat(images.imagePath(id))).blocks! * 512 <= MIN_IMAGE_BYTES);
  } finally {
    await images.remove(id).catch(() => {});
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("largestFileBytes(): the largest sparse file the filesystem keeps, and one block more does not fit", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const max = await largestFileBytes(join(dir, ".images"));
    assert.ok(max >= MIN_IMAGE_BYTES && max <= MAX_VOLUME_BYTES, String(max));
    assert.equal(max % 4096, 0);
    using file = await Deno.open(join(dir, "f"), { write: true, create: true });
    await file.truncate(max);
    if (max < MAX_VOLUME_BYTES) {
      await assert.rejects(file.truncate(max + 4096), /File too large/);
    }
    // Nothing is left behind, and nothing was written.
    assert.deepEqual([...Deno.readDirSync(join(dir, ".images"))], []);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("volume images: a cap above the largest image file is a 400 naming the limit (507 for a move), and leaves nothing", async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost();
    const images = new VolumeImages(root, { ...host, maxBytes: 2 ** 44 - 4096 });
    const err = await images.make(id, 2e13).catch((e) => e);
    assert.ok(err instanceof HttpError, String(err));
    assert.equal(err.status, 400);
    assert.match(err.message, /at most 17592186040320 bytes \(16\.00 TiB\) on this node/);
    assert.match(err.message, /20000000000000 bytes was asked: ask for a smaller cap/);
    const moved = await images.make(id, 2e13, true).catch((e) => e);
    assert.equal(moved.status, 507);
    assert.match(moved.message, /move the volume to a node whose data dir/);
    assert.deepEqual(host.calls, []);
    assert.equal(images.hasImage(id), false);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test({
  name: "volume images: a cap the filesystem refuses (EFBIG) is a 400 naming the limit, not a 500",
  // Where /tmp keeps files of MAX_VOLUME_BYTES (XFS, tmpfs), no cap is refused by the kernel.
  ignore: await (async () => {
    const dir = await Deno.makeTempDir();
    try {
      return (await largestFileBytes(dir)) === MAX_VOLUME_BYTES;
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  })(),
}, async () => {
  const root = await Deno.makeTempDir();
  try {
    const host = fakeHost();
    // The limit not measured: the node learns it from the kernel's refusal.
    const images = new VolumeImages(root, host);
    const err = await images.make(id, MAX_VOLUME_BYTES).catch((e) => e);
    assert.ok(err instanceof HttpError, String(err));
    assert.equal(err.status, 400);
    assert.match(err.message, /that filesystem keeps no larger file/);
    assert.deepEqual([...Deno.readDirSync(images.dir)], [], "no .tmp image is left");
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volumeSizeRefusal(): a default cap above the largest image names the setting and its most", () => {
  assert.equal(volumeSizeRefusal(10e9, 2 ** 44 - 4096), null);
  const said = volumeSizeRefusal(20000e9, 2 ** 44 - 4096)!;
  assert.match(said, /^DORMICE_VOLUME_SIZE_GB=20000 asks for volumes of 20000000000000 bytes/);
  assert.match(said, /no file larger than 17592186040320 bytes/);
  assert.match(said, /set DORMICE_VOLUME_SIZE_GB to at most 17592/);
});
