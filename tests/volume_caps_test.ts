/**
 * A node that cannot keep volume caps in the kernel says so, not silently: without
 * `--allow-run=mount,umount,mkfs.ext4,losetup`, and on a shared root even with them, its boot
 * log warns and `GET /healthz` answers `volumeCaps: {enforcedBy: "checked", why}`. (Where it can,
 * `tests/docker_volume_cap_test.ts` proves the kernel's ENOSPC.)
 */
import assert from "node:assert/strict";
import { nodePermissions, startNode } from "./_processes.ts";

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
