/**
 * The filesystem pause outlives the whole fleet, through the official `e2b` SDK, unmodified: a
 * gateway in front of two Docker nodes, a sandbox paused to disk on each, every node killed
 * (SIGKILL, no shutdown) — meanwhile `Sandbox.connect()` fails and starts nothing — then every
 * node started again on its data dir and port, and `Sandbox.connect()` resumes each sandbox
 * under its id with its files. Off CI the test skips with a printed reason when there is no
 * engine; with `CI=true` it fails.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { Sandbox } from "e2b";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import type { NodeProcess } from "./_processes.ts";
import { startGateway } from "./_gateway.ts";
import { dockerGate, removeContainersOf, startDockerNode, until } from "./_docker.ts";

const gate = await dockerGate("docker filesystem pause across a fleet restart");

Deno.test({
  name: "e2b SDK: sandboxes paused to disk resume after every node is killed and restarted",
  ignore: gate.skip,
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (gate.failure) throw new Error(gate.failure);
  const tag = crypto.randomUUID().slice(0, 6);
  const ids = [`fpf-a-${tag}`, `fpf-b-${tag}`];
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  const dataDirs = await Promise.all(
    ids.map(() => Deno.makeTempDir({ prefix: "dormice-fs-pause-fleet-" })),
  );
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const start = (i: number, port?: number) =>
    startDockerNode({
      token: gw.token,
      gatewayUrl: gw.url,
      nodeId: ids[i],
      dataDir: dataDirs[i],
      port,
    });
  const nodes: (NodeProcess | undefined)[] = [];
  const nodesUp = () =>
    until("every node up with a reading at the gateway", async () => {
      const { body } = await gw.json("listNodes");
      return ids.every((id) =>
        body.nodes.some((n: { id: string; state: string; reading: unknown }) =>
          n.id === id && n.state === "up" && n.reading !== null
        )
      );
    }, 60_000);
  const nodeOf = async (sandboxId: string) =>
    (await docker.listContainers({ filters: { label: [`dormice.sandbox=${sandboxId}`] } }))[0]
      ?.Labels["dormice.node"];
  const minted = await gw.json("createApiKey", { team: "fs-pause-fleet" });
  assert.equal(minted.status, 200, JSON.stringify(minted.body));
  const sdk = {
    apiUrl: `${gw.url}/e2b/api`,
    sandboxUrl: `${gw.url}/e2b/envd`,
    apiKey: minted.body.key,
  };
  const made: Sandbox[] = [];
  try {
    for (let i = 0; i < ids.length; i++) nodes[i] = await start(i);
    await nodesUp();
    // One sandbox on each node (the placer picks; extra creates until both nodes hold one).
    const onNode = new Map<string, Sandbox>();
    for (let tries = 0; tries < 8 && onNode.size < ids.length; tries++) {
      const sbx = await Sandbox.create(sdk);
      made.push(sbx);
      const node = await nodeOf(sbx.sandboxId);
      if (node !== undefined && !onNode.has(node)) onNode.set(node, sbx);
    }
    assert.deepEqual([...onNode.keys()].sort(), [...ids].sort(), "a sandbox on every node");
    for (const [node, sbx] of onNode) {
      await sbx.files.write("/home/user/kept.txt", `kept on ${node}`);
      assert.equal(await sbx.pause({ keepMemory: false }), true);
      const left = await docker.listContainers({
        all: true,
        filters: { label: [`dormice.sandbox=${sbx.sandboxId}`] },
      });
      assert.equal(left.length, 0, "a sandbox paused to disk holds no container");
    }

    // Every node killed: no shutdown runs.
    for (const node of nodes) {
      node!.process.child.kill("SIGKILL");
      await node!.process.exited;
    }
    const [first] = onNode.values();
    await assert.rejects(
      Sandbox.connect(first.sandboxId, sdk),
      "with every node down a connect fails rather than start anything",
    );

    for (let i = 0; i < ids.length; i++) nodes[i] = await start(i, nodes[i]!.port);
    await nodesUp();
    for (const [node, sbx] of onNode) {
      const back = await Sandbox.connect(sbx.sandboxId, sdk);
      assert.equal(back.sandboxId, sbx.sandboxId);
      assert.equal(await back.files.read("/home/user/kept.txt"), `kept on ${node}`);
      assert.equal((await back.commands.run("cat /home/user/kept.txt")).stdout, `kept on ${node}`);
      assert.equal(await nodeOf(sbx.sandboxId), node, "resumed on the node that kept it");
    }
  } finally {
    for (const sbx of made) await Sandbox.kill(sbx.sandboxId, sdk).catch(() => {});
    for (const node of nodes) await node?.stop();
    await gw.stop();
    await removeContainersOf(ids);
    for (const id of ids) {
      const images = await docker.listImages({ filters: { label: [`dormice.node=${id}`] } });
      for (const image of images) {
        await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
      }
    }
    for (const dir of dataDirs) await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
