/**
 * The filesystem pause through the official `e2b` SDK, unmodified, pointed at a real gateway in
 * front of a real node: `pause({ keepMemory: false })` leaves no container running and
 * `Sandbox.connect()` resumes the sandbox under its id with its files; a
 * `lifecycle.onTimeout: { action: "pause", keepMemory: false }` deadline does the same pause;
 * kill drops what was kept. On Docker the paused sandbox also survives a restart of its node.
 * Run on the fake executor, and again on Docker: off CI the Docker run skips with a printed
 * reason when there is no engine; with `CI=true` it fails.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { Sandbox } from "e2b";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import { type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { dockerGate, removeContainersOf, startDockerNode, until } from "./_docker.ts";

/** The engine's containers of sandbox `id`, and its archive images (tagged, or any). */
interface EngineView {
  containers(id: string): Promise<number>;
  archives(id: string): Promise<number>;
  images(id: string): Promise<number>;
}

interface Fleet {
  gw: GatewayProcess;
  node: NodeProcess;
  /** Stops the node and starts it again on the same data dir and port. */
  restart?(): Promise<void>;
  engine?: EngineView;
  stop(): Promise<void>;
}

async function nodeUp(gw: GatewayProcess, id: string): Promise<void> {
  await until(`node ${id} up with a reading at the gateway`, async () => {
    const { body } = await gw.json("listNodes");
    return body.nodes.some((n: { id: string; state: string; reading: unknown }) =>
      n.id === id && n.state === "up" && n.reading !== null
    );
  }, 30_000);
}

async function exam(t: Deno.TestContext, fleet: Fleet): Promise<void> {
  const { gw } = fleet;
  const minted = await gw.json("createApiKey", { team: "fs-pause" });
  assert.equal(minted.status, 200, JSON.stringify(minted.body));
  const sdk = {
    apiUrl: `${gw.url}/e2b/api`,
    sandboxUrl: `${gw.url}/e2b/envd`,
    apiKey: minted.body.key,
  };
  const made: string[] = [];
  try {
    await t.step(
      "pause({ keepMemory: false }) frees the sandbox; connect() resumes it with its files",
      async () => {
        const sbx = await Sandbox.create(sdk);
        made.push(sbx.sandboxId);
        await sbx.files.write("/home/user/kept.txt", "on disk");
        assert.equal(await sbx.pause({ keepMemory: false }), true);
        assert.equal((await sbx.getInfo()).state, "paused");
        const paused = await Sandbox.list({ ...sdk, query: { state: ["paused"] } }).nextItems();
        assert.ok(paused.some((s) => s.sandboxId === sbx.sandboxId), "listed as paused");
        if (fleet.engine) {
          assert.equal(await fleet.engine.containers(sbx.sandboxId), 0, "no container left");
          assert.equal(await fleet.engine.archives(sbx.sandboxId), 1, "its files kept");
        }
        // Already paused: the SDK's false.
        assert.equal(await sbx.pause({ keepMemory: false }), false);
        const back = await Sandbox.connect(sbx.sandboxId, sdk);
        assert.equal(back.sandboxId, sbx.sandboxId);
        assert.equal((await back.getInfo()).state, "running");
        assert.equal(await back.files.read("/home/user/kept.txt"), "on disk");
        assert.equal((await back.commands.run("cat /home/user/kept.txt")).stdout, "on disk");
        if (fleet.engine) {
          assert.equal(await fleet.engine.containers(sbx.sandboxId), 1);
          assert.equal(await fleet.engine.archives(sbx.sandboxId), 0, "the archive is dropped");
        }
        // Killed: the image its container ran from goes with it.
        assert.equal(await back.kill(), true);
        if (fleet.engine) assert.equal(await fleet.engine.images(sbx.sandboxId), 0);
      },
    );

    await t.step(
      "lifecycle.onTimeout { pause, keepMemory: false } pauses to disk at the deadline",
      async () => {
        const sbx = await Sandbox.create({
          ...sdk,
          timeoutMs: 2_000,
          lifecycle: { onTimeout: { action: "pause", keepMemory: false } },
        });
        made.push(sbx.sandboxId);
        await sbx.files.write("/home/user/deadline.txt", "kept at the deadline");
        await until(
          "the deadline to pause the sandbox",
          async () => (await Sandbox.getInfo(sbx.sandboxId, sdk)).state === "paused",
          30_000,
        );
        if (fleet.engine) {
          await until(
            "its container to go",
            async () => await fleet.engine!.containers(sbx.sandboxId) === 0,
          );
        }
        const back = await Sandbox.connect(sbx.sandboxId, { ...sdk, timeoutMs: 60_000 });
        assert.equal(await back.files.read("/home/user/deadline.txt"), "kept at the deadline");
      },
    );

    if (fleet.restart) {
      await t.step("a sandbox paused to disk survives its node's restart", async () => {
        const sbx = await Sandbox.create(sdk);
        made.push(sbx.sandboxId);
        await sbx.files.write("/home/user/restart.txt", "after restart");
        assert.equal(await sbx.pause({ keepMemory: false }), true);
        await fleet.restart!();
        const back = await Sandbox.connect(sbx.sandboxId, sdk);
        assert.equal(await back.files.read("/home/user/restart.txt"), "after restart");
      });
    }

    await t.step("kill() of a sandbox paused to disk drops what was kept", async () => {
      const sbx = await Sandbox.create(sdk);
      await sbx.files.write("/home/user/gone.txt", "gone");
      assert.equal(await sbx.pause({ keepMemory: false }), true);
      assert.equal(await sbx.kill(), true);
      assert.equal(await Sandbox.kill(sbx.sandboxId, sdk), false);
      if (fleet.engine) {
        assert.equal(await fleet.engine.containers(sbx.sandboxId), 0);
        assert.equal(await fleet.engine.images(sbx.sandboxId), 0);
      }
    });
  } finally {
    for (const id of made) await Sandbox.kill(id, sdk).catch(() => {});
  }
}

Deno.test({
  name: "e2b SDK filesystem pause through a gateway in front of a fake node",
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  let node: NodeProcess | undefined;
  try {
    node = await startNode({
      token: gw.token,
      env: {
        DORMICE_GATEWAY_ENDPOINT: gw.url,
        DORMICE_NODE_ID: "fs-pause-fake",
        DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
      },
    });
    await nodeUp(gw, "fs-pause-fake");
    await exam(t, { gw, node, stop: async () => {} });
  } finally {
    await node?.stop();
    await gw.stop();
  }
});

const gate = await dockerGate("docker filesystem pause suite");

Deno.test({
  name: "e2b SDK filesystem pause through a gateway in front of a Docker node",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const nodeId = `fsp-${crypto.randomUUID().slice(0, 6)}`;
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  const dataDir = await Deno.makeTempDir({ prefix: "dormice-fs-pause-" });
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const start = (port?: number) =>
    startDockerNode({ token: gw.token, gatewayUrl: gw.url, nodeId, dataDir, port });
  let node: NodeProcess | undefined;
  try {
    node = await start();
    await nodeUp(gw, nodeId);
    const engine: EngineView = {
      containers: async (id) =>
        (await docker.listContainers({ filters: { label: [`dormice.sandbox=${id}`] } })).length,
      archives: async (id) =>
        (await docker.listImages({ filters: { label: [`dormice.snapshot.archive=${id}`] } }))
          .filter((i: { RepoTags?: string[] }) =>
            (i.RepoTags ?? []).some((tag: string) => tag !== "<none>:<none>")
          ).length,
      images: async (id) =>
        (await docker.listImages({
          all: true,
          filters: { label: [`dormice.snapshot.archive=${id}`] },
        })).length,
    };
    await exam(t, {
      gw,
      node,
      engine,
      restart: async () => {
        const port = node!.port;
        await node!.stop();
        node = await start(port);
        await nodeUp(gw, nodeId);
      },
      stop: async () => {},
    });
  } finally {
    await node?.stop();
    await gw.stop();
    await removeContainersOf([nodeId]);
    const images = await docker.listImages({ filters: { label: [`dormice.node=${nodeId}`] } });
    for (const image of images) {
      await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
    }
    await Deno.remove(dataDir, { recursive: true }).catch(() => {});
  }
});
