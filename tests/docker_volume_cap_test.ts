/**
 * A managed volume's cap kept by the kernel on Docker: a node running as root makes each volume
 * an ext4 image loop-mounted at its directory, so a sandbox writing past the cap into its
 * mounted volume gets ENOSPC, `df` in the sandbox shows the cap, and the node's disk holds no
 * more than the image. The volume's files survive a node restart on a host that lost its mounts
 * (the node mounts the images again at boot), and deleting the volume frees the image.
 *
 * Needs an engine, the images (`.ci/docker.sh`), root and loop devices: with `CI=true` it never
 * skips for a missing engine; off CI, or without root or loop devices, it skips with a printed
 * reason.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  unmountBelow,
} from "./_docker.ts";
import { freePort } from "./_processes.ts";

const gate = await dockerGate("docker volume-cap suite");

/** Why this host cannot loop-mount images, or `null`. */
function noLoopDevices(): string | null {
  if (Deno.uid() !== 0) return "the tests do not run as root (a loop mount needs it)";
  // Asked of a shell: Deno wants --allow-all to stat a device.
  const test = new Deno.Command("test", { args: ["-c", "/dev/loop-control"] }).outputSync();
  if (!test.success) {
    return "the host has no /dev/loop-control (no loop devices)";
  }
  return null;
}
const noLoop = gate.skip ? null : noLoopDevices();
if (noLoop !== null) console.log(`docker volume-cap suite skipped: ${noLoop}`);

const CAP = 64 * 1024 * 1024;

Deno.test({
  name:
    "docker volume cap: ENOSPC past the cap inside a sandbox, survives a restart, freed on delete",
  ignore: gate.skip || noLoop !== null,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const nodeId = `dkcap-${crypto.randomUUID().slice(0, 8)}`;
  const dataDir = await Deno.makeTempDir({ prefix: "dormice-dkcap-" });
  const port = freePort();
  const start = () => startDockerNode({ nodeId, dataDir, port });
  let node: DockerNodeProcess | undefined;
  const call = async (verb: string, body: unknown) => {
    const res = await fetch(`${node!.url}/${verb}`, {
      method: "POST",
      headers: { authorization: `Bearer ${node!.token}` },
      body: JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() };
  };
  const id = `vol-${crypto.randomUUID().replaceAll("-", "").slice(0, 20)}`;
  const volumeDir = join(dataDir, "volumes", id);
  const image = join(dataDir, "volumes", ".images", `${id}.ext4`);
  const mounted = async () =>
    (await new Deno.Command("mountpoint", { args: ["-q", volumeDir] }).output()).success;
  try {
    node = await start();
    await t.step("the node says the kernel keeps the caps", async () => {
      const health = await (await fetch(`${node!.url}/healthz`)).json();
      assert.deepEqual(health.volumeCaps, { enforcedBy: "kernel" }, JSON.stringify(health));
    });

    await t.step("a sandbox writing past the cap gets ENOSPC; df shows the cap", async () => {
      const made = await call("createVolume", { id, sizeBytes: CAP });
      assert.equal(made.status, 201, JSON.stringify(made.body));
      const acquired = await call("acquireSandbox", {
        name: "writer",
        template: "minimal",
        spec: { volumes: [{ name: id, mountPath: "/data" }] },
      });
      assert.equal(acquired.status, 200, JSON.stringify(acquired.body));
      const df = await call("execCommand", { name: "writer", command: "df -k /data | tail -1" });
      const sizeKb = Number(df.body.stdout.trim().split(/\s+/)[1]);
      assert.ok(sizeKb > 0.75 * CAP / 1024 && sizeKb <= CAP / 1024, df.body.stdout);
      const dd = await call("execCommand", {
        name: "writer",
        command: "echo kept > /data/kept.txt && dd if=/dev/zero of=/data/big bs=1M count=100",
      });
      assert.notEqual(
        dd.body.exitCode,
        0,
        `the write past the cap went through: ${dd.body.stderr}`,
      );
      assert.match(dd.body.stderr, /No space left on device/);
      assert.ok(await mounted(), "the volume's image is mounted at its directory");
      // The node's disk holds at most the image: its allocated blocks stay under the cap.
      const info = await Deno.stat(image);
      assert.equal(info.size, CAP);
      assert.ok(info.blocks! * 512 <= CAP, `the image takes ${info.blocks! * 512} bytes`);
      // The content API counts the filesystem's own usage and refuses past the room left.
      const put = await fetch(`${node!.url}/volumecontent/${id}/file?path=/more.bin`, {
        method: "PUT",
        headers: { authorization: `Bearer ${node!.token}` },
        body: new Uint8Array(8 * 1024 * 1024),
      });
      assert.equal(put.status, 507, await put.text());
      await call("execCommand", { name: "writer", command: "rm /data/big" });
      assert.equal((await call("destroySandbox", { name: "writer" })).status, 200);
    });

    await t.step(
      "after a restart on a host that lost its mounts, the files are there",
      async () => {
        await node!.stop();
        const umount = await new Deno.Command("umount", { args: [volumeDir] }).output();
        assert.ok(umount.success, new TextDecoder().decode(umount.stderr));
        assert.ok(!(await mounted()));
        node = await start();
        assert.ok(await mounted(), "the node mounted the image again at boot");
        const res = await fetch(`${node.url}/volumecontent/${id}/file?path=/kept.txt`, {
          headers: { authorization: `Bearer ${node.token}` },
        });
        assert.equal(await res.text(), "kept\n");
        // A second boot with the mount still there keeps it as it is.
        await node.stop();
        node = await start();
        assert.ok(await mounted());
      },
    );

    await t.step("deleting the volume unmounts it and frees the image", async () => {
      const gone = await call("destroyVolume", { id });
      assert.deepEqual(gone.body, { destroyed: true });
      assert.ok(!(await mounted()));
      await assert.rejects(Deno.stat(image), Deno.errors.NotFound);
      await assert.rejects(Deno.stat(volumeDir), Deno.errors.NotFound);
    });
  } finally {
    await node?.stop();
    await removeContainersOf([nodeId]);
    await unmountBelow(dataDir);
    await Deno.remove(dataDir, { recursive: true }).catch(() => {});
  }
});
