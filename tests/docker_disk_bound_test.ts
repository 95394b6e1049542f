/**
 * One sandbox must not fill the engine's disk: with DORMICE_SANDBOX_DISK_MB a real node
 * process either bounds every sandbox's writable layer (a write past the bound fails inside
 * the sandbox with the file system's own error) or, on an engine whose storage driver cannot
 * keep the bound, refuses to start with a sentence naming the driver and the variable. Which
 * of the two applies is asked of the engine directly, so the test checks the node's answer
 * against the engine's, on any engine.
 *
 * Needs an engine and the base image: with `CI=true` it never skips; off CI it skips with a
 * printed reason.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import {
  dockerGate,
  dockerNodePermissions,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";
import { freePort, newToken, nodeMain, spawnDeno } from "./_processes.ts";

const gate = await dockerGate("docker disk-bound suite");

/** Whether this engine accepts a writable-layer bound: the engine's answer, not the node's. */
async function engineBoundsDisks(): Promise<{ bounds: boolean; said: string; driver: string }> {
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  const info = await docker.info();
  try {
    const probe = await docker.createContainer({
      Image: "dormice-minimal:latest",
      HostConfig: { NetworkMode: "none", StorageOpt: { size: "64M" } },
    });
    await probe.remove({ force: true });
    return { bounds: true, said: "", driver: info.Driver };
  } catch (error) {
    return {
      bounds: false,
      said: (error as { json?: { message?: string } }).json?.message ?? String(error),
      driver: info.Driver,
    };
  }
}

Deno.test({
  name: "docker: DORMICE_SANDBOX_DISK_MB bounds a sandbox's disk, or the node refuses to start",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  const engine = await engineBoundsDisks();
  const nodeId = `dkdisk-${crypto.randomUUID().slice(0, 8)}`;
  if (!engine.bounds) {
    // This engine cannot keep the bound: the node says so at boot and serves nothing.
    const dataDir = await Deno.makeTempDir({ prefix: "dormice-disk-" });
    try {
      const node = spawnDeno(nodeMain, {
        env: {
          DORMICE_API_TOKEN: newToken(),
          DORMICE_PORT: String(freePort()),
          DORMICE_DATA_DIR: dataDir,
          DORMICE_EXECUTOR: "docker",
          DORMICE_NODE_ID: nodeId,
          DORMICE_SANDBOX_DISK_MB: "64",
        },
        permissions: dockerNodePermissions(dataDir),
      });
      // A node that ignored the bound would serve for ever: give it the time of a boot.
      let timer: ReturnType<typeof setTimeout> | undefined;
      const status = await Promise.race([
        node.exited,
        new Promise<null>((resolve) => timer = setTimeout(() => resolve(null), 30_000)),
      ]).finally(() => clearTimeout(timer));
      if (status === null) await node.stop(1_000);
      assert.equal(status?.code, 2, `the node did not refuse to start:\n${node.stderr()}`);
      assert.match(
        node.stderr(),
        new RegExp(
          `A disk bound of 64 MiB per sandbox \\(DORMICE_SANDBOX_DISK_MB\\) needs a storage ` +
            `driver .*this engine's \\(${engine.driver}[^)]*\\) refuses it: .*` +
            `${engine.said.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}.*Unset DORMICE_SANDBOX_DISK_MB`,
        ),
      );
    } finally {
      await Deno.remove(dataDir, { recursive: true });
      await removeContainersOf([nodeId]);
    }
    return;
  }
  // This engine keeps the bound: a write past it fails inside the sandbox, the node lives on.
  const node = await startDockerNode({ nodeId, env: { DORMICE_SANDBOX_DISK_MB: "64" } });
  try {
    const call = async (verb: string, body: unknown) =>
      await (await fetch(`${node.url}/${verb}`, {
        method: "POST",
        headers: { authorization: `Bearer ${node.token}` },
        body: JSON.stringify(body),
      })).json();
    await call("acquireSandbox", { name: "hog", template: "minimal" });
    const r = await call("execCommand", {
      name: "hog",
      command: "dd if=/dev/zero of=/tmp/hog bs=1M count=128",
    });
    assert.notEqual(r.exitCode, 0, JSON.stringify(r));
    assert.match(r.stderr, /No space left on device|Disk quota exceeded/);
    const after = await call("execCommand", { name: "hog", command: "rm /tmp/hog; echo ok" });
    assert.equal(after.stdout, "ok\n");
  } finally {
    await node.stop();
    await removeContainersOf([nodeId]);
  }
});
