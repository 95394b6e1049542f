/**
 * A volume mounts on a Docker node whose `DORMICE_DATA_DIR` is relative, as `deno task fleet`
 * gives its nodes (`.dormice/fleet/node-a`): the official `e2b` SDK, unmodified, creates a volume,
 * mounts it in a sandbox, writes through the mount, and a second sandbox reads the file.
 *
 * Needs an engine and the images (`.ci/docker.sh`): with `CI=true` it never skips; off CI it
 * skips with a printed reason.
 */
import assert from "node:assert/strict";
import { Sandbox, Volume } from "e2b";
import { startGateway } from "./_gateway.ts";
import { freePort } from "./_processes.ts";
import { dockerGate, removeContainersOf, startDockerNode, unmountBelow, until } from "./_docker.ts";

const gate = await dockerGate("docker volume under a relative data dir");

Deno.test({
  name: "a Docker node with a relative DORMICE_DATA_DIR mounts a managed volume",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  const suffix = crypto.randomUUID().slice(0, 6);
  const nodeId = `dkvolrel-${suffix}`;
  // Relative to the repository, where the test helpers start the node.
  const dataDir = `.dormice/test-${nodeId}`;
  assert.ok(!dataDir.startsWith("/"));
  await Deno.mkdir(dataDir, { recursive: true });
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  let node: Awaited<ReturnType<typeof startDockerNode>> | undefined;
  try {
    node = await startDockerNode({
      token: gw.token,
      gatewayUrl: gw.url,
      nodeId,
      dataDir,
      port: freePort(),
      env: { DORMICE_VOLUME_SIZE_GB: "1" },
    });
    await until("the docker node up", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.some((n: { id: string; state: string }) =>
        n.id === nodeId && n.state === "up"
      );
    });
    const apiKey = (await gw.json("createApiKey", { team: "acme" })).body.key as string;
    const sdk = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey,
    };
    const volume = await Volume.create("relative", sdk);
    const writer = await Sandbox.create("minimal", {
      ...sdk,
      volumeMounts: { "/mnt/data": volume },
    });
    try {
      await writer.files.write("/mnt/data/hello.txt", "written by the writer");
    } finally {
      await writer.kill();
    }
    const reader = await Sandbox.create("minimal", {
      ...sdk,
      volumeMounts: { "/mnt/data": volume },
    });
    try {
      assert.equal(await reader.files.read("/mnt/data/hello.txt"), "written by the writer");
    } finally {
      await reader.kill();
    }
  } finally {
    await node?.stop();
    await gw.stop();
    await removeContainersOf([nodeId]);
    // The volume is a loop-mounted image under the data dir: unmounted before it is removed,
    // or the mount (and its loop device) outlives the test.
    await unmountBelow(dataDir);
    await Deno.remove(dataDir, { recursive: true }).catch(() => {});
    const left = await new Deno.Command("findmnt", { args: ["-rn", "-o", "TARGET"] }).output();
    assert.ok(
      !new TextDecoder().decode(left.stdout).includes(`/${dataDir}/`),
      "a volume mount outlived the test",
    );
  }
});
