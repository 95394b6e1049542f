/**
 * A node that cannot keep volume caps in the kernel says so, not silently: without
 * `--allow-run=mount,umount,mkfs.ext4,losetup`, and on a shared root even with them, its boot
 * log warns and `GET /healthz` answers `volumeCaps: {enforcedBy: "checked", why}`. (Where it can,
 * `tests/docker_volume_cap_test.ts` proves the kernel's ENOSPC.)
 */
import assert from "node:assert/strict";
import { nodePermissions, startNode } from "./_processes.ts";
import { largestFileBytes } from "../node/volume_images.ts";
import { MAX_VOLUME_BYTES } from "../shared/volumes.ts";

Deno.test("volume caps: a node without the mount permissions checks caps in the content API, and says why", async () => {
  const node = await startNode();
  try {
    const health = await (await fetch(`${node.url}/healthz`)).json();
    assert.equal(health.volumeCaps.enforcedBy, "checked", JSON.stringify(health));
    assert.match(health.volumeCaps.why, /may not run mount, umount, mkfs\.ext4, losetup/);
    assert.match(node.process.stderr(), /volume caps are checked by the content API only/);
  } finally {
    await node.stop();
  }
});

Deno.test("volume caps: on a shared root the caps are checked, even with the mount permissions", async () => {
  const root = await Deno.makeTempDir({ prefix: "dormice-shared-root-" });
  const node = await startNode({
    env: { DORMICE_VOLUME_ROOT: root },
    permissions: (dataDir) => [
      ...nodePermissions(dataDir).filter((p) => !/^--allow-(run|read|write)=/.test(p)),
      `--allow-read=${dataDir},${root}`,
      `--allow-write=${dataDir},${root}`,
      "--allow-run=sh,mount,umount,mkfs.ext4,losetup",
    ],
  });
  try {
    const health = await (await fetch(`${node.url}/healthz`)).json();
    assert.equal(health.volumeCaps.enforcedBy, "checked", JSON.stringify(health));
    assert.match(health.volumeCaps.why, /DORMICE_VOLUME_ROOT is a shared root/);
    // Nothing was mounted or made for images on the shared root.
    assert.deepEqual([...Deno.readDirSync(root)].map((e) => e.name), []);
  } finally {
    await node.stop();
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test({
  name:
    "volume caps: a node whose DORMICE_VOLUME_SIZE_GB is above its largest image file refuses to start, naming it",
  // Kernel-kept caps need root (and loop devices); the limit is the filesystem's under /tmp.
  ignore: Deno.uid() !== 0,
}, async () => {
  const dataDir = await Deno.makeTempDir({ prefix: "dormice-node-" });
  try {
    const max = await largestFileBytes(dataDir);
    if (max === MAX_VOLUME_BYTES) return; // XFS or tmpfs: no such limit below the node's own
    const node = await startNode({
      dataDir,
      waitForHealth: false,
      env: { DORMICE_VOLUME_SIZE_GB: String(Math.ceil(max / 1e9) + 1) },
      permissions: (dir) => [
        ...nodePermissions(dir).filter((p) => !/^--allow-run=/.test(p)),
        "--allow-run=sh,mount,umount,mkfs.ext4,losetup",
      ],
    });
    // Bounded: a node that starts after all is stopped, and the test fails below.
    const started = setTimeout(() => void node.process.stop(), 20_000);
    const status = await node.process.exited.finally(() => clearTimeout(started));
    assert.equal(status.code, 2, node.process.stderr());
    assert.match(node.process.stderr(), /DORMICE_VOLUME_SIZE_GB=\d+ asks for volumes of/);
    assert.match(
      node.process.stderr(),
      new RegExp(`set DORMICE_VOLUME_SIZE_GB to at most ${Math.floor(max / 1e9)}`),
    );
    // Its probe's image and size probe are gone.
    assert.deepEqual([...Deno.readDirSync(`${dataDir}/volumes/.images`)], []);
  } finally {
    await Deno.remove(dataDir, { recursive: true });
  }
});
