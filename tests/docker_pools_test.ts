/**
 * The exam of warm pools and capabilities on Docker: real gateway and node
 * processes, real containers, counted on the engine.
 *
 * Needs an engine and the images: with `CI=true` it never skips; off CI it skips with a
 * printed reason.
 */
import assert from "node:assert/strict";
import {
  containersOf,
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { newToken } from "./_processes.ts";

const gate = await dockerGate("docker pools suite");

/** Polls `check` every 100 ms until it returns true, for at most `ms`. */
async function until(what: string, check: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Timed out after ${ms} ms waiting for ${what}`);
}

// deno-lint-ignore no-explicit-any
async function nodeCall(node: DockerNodeProcess, verb: string, body: unknown): Promise<any> {
  const res = await fetch(`${node.url}/${verb}`, {
    method: "POST",
    headers: { authorization: `Bearer ${node.token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  return await res.json();
}

const minimalPool = (warm: number) => [{ template: "minimal", warm }];

Deno.test({
  name: "docker: warm pools through the gateway: claims, restarts, bursts, crashes, templates",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const token = newToken();
  const idA = `dkpool-a-${crypto.randomUUID().slice(0, 6)}`;
  const idB = `dkpool-b-${crypto.randomUUID().slice(0, 6)}`;
  const dataA = await Deno.makeTempDir({ prefix: "dormice-pools-a-" });
  let gw: GatewayProcess | undefined;
  let a: DockerNodeProcess | undefined;
  let b: DockerNodeProcess | undefined;
  const startA = async () =>
    a = await startDockerNode({ nodeId: idA, token, gatewayUrl: gw!.url, dataDir: dataA });
  // Up at the endpoint it has now: a restarted node listens on a fresh port.
  const nodeUp = (id: string) => async () => {
    const { body } = await gw!.json("listNodes");
    const url = id === idA ? a?.url : b?.url;
    // deno-lint-ignore no-explicit-any
    return body.nodes.some((n: any) => n.id === id && n.state === "up" && n.endpoint === url);
  };
  const warmOn = async (node: DockerNodeProcess) =>
    (await nodeCall(node, "listPools", {})).pools[0]?.warm ?? 0;
  try {
    // The machine is shared and busy: placement here is about templates and warm, not cpu.
    gw = await startGateway({ token, env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    await startA();
    await until("node A up", nodeUp(idA));

    await t.step("setPools through the gateway answers one result per node", async () => {
      const r = await gw!.json("setPools", { pools: minimalPool(2) });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.deepEqual(
        r.body.results.map((x: { nodeId: string; ok: boolean }) => [x.nodeId, x.ok]),
        [
          [idA, true],
        ],
      );
      await until("A's pool full", async () => await warmOn(a!) === 2);
      const pools = JSON.parse(await Deno.readTextFile(`${dataA}/pools.json`)).pools;
      assert.deepEqual(pools, [{ template: "minimal", spec: {}, warm: 2 }]);
    });

    await t.step(
      "the pools survive a node restart (pools.json), adopting warm containers",
      async () => {
        const before = (await containersOf(idA)).sort();
        await a!.stop();
        await startA();
        await until("A up again", nodeUp(idA));
        assert.equal(await warmOn(a!), 2, "adopted at boot, not rebuilt");
        assert.deepEqual((await containersOf(idA)).sort(), before);
      },
    );

    await t.step(
      "a claim through the gateway returns a running sandbox whose first command works",
      async () => {
        await until("A's reading shows the warm pool", async () => {
          const { body } = await gw!.json("listNodes");
          // deno-lint-ignore no-explicit-any
          return body.nodes.find((n: any) => n.id === idA)?.pools?.[0]?.warm === 2;
        });
        const created = await gw!.json("acquireSandbox", {
          name: "claimed",
          template: "minimal",
          spec: { env: { GREETING: "from-the-claim" } },
        });
        assert.equal(created.status, 200, JSON.stringify(created.body));
        assert.equal(created.body.created, true);
        assert.equal(created.body.sandbox.state, "active");
        const run = await gw!.json("execCommand", { name: "claimed", command: "echo $GREETING" });
        assert.equal(run.status, 200, JSON.stringify(run.body));
        assert.equal(run.body.stdout, "from-the-claim\n");
        const pools = (await nodeCall(a!, "listPools", {})).pools;
        assert.equal(pools[0].claimed, 1);
      },
    );

    await t.step(
      "a burst larger than the pool falls back to cold creates, none failing",
      async () => {
        const names = Array.from({ length: 5 }, (_, i) => `burst-${i}`);
        const answers = await Promise.all(
          names.map((name) => gw!.json("acquireSandbox", { name, template: "minimal" })),
        );
        assert.deepEqual(answers.map((x) => x.status), names.map(() => 200));
        for (const name of names) {
          const run = await gw!.json("execCommand", { name, command: "echo ok" });
          assert.equal(run.body.stdout, "ok\n", name);
        }
        for (const name of [...names, "claimed"]) {
          assert.equal((await gw!.json("destroySandbox", { name })).status, 200);
        }
      },
    );

    await t.step(
      "a node killed during refill leaves no orphan container after it restarts",
      async () => {
        await until("A's pool full", async () => await warmOn(a!) === 2);
        // Raise the target and kill the node while the refill is building.
        await nodeCall(a!, "setPools", { pools: minimalPool(4) });
        await until(
          "a refill in flight",
          async () => (await nodeCall(a!, "listPools", {})).pools[0].refilling > 0,
          10_000,
        );
        a!.process.child.kill("SIGKILL");
        await a!.process.exited;
        await startA();
        await until("A's pool full after the crash", async () => await warmOn(a!) === 4);
        await until("nothing else left", async () => (await containersOf(idA)).length === 4);
        const listed = (await nodeCall(a!, "listSandboxes", {})).sandboxes;
        assert.equal(listed.length, 0, "warm sandboxes are nobody's");
        assert.equal((await containersOf(idA)).length, 4, "four warm containers, no orphan");
      },
    );

    await t.step("a template only node B holds lands on B; one nobody holds is a 400", async () => {
      b = await startDockerNode({
        nodeId: idB,
        token,
        gatewayUrl: gw!.url,
        env: {
          DORMICE_TEMPLATES:
            "base=dormice-base:latest,minimal=dormice-minimal:latest,tiny=dormice-minimal:latest",
        },
      });
      await until("B up with its templates", async () => {
        const { body } = await gw!.json("listNodes");
        // deno-lint-ignore no-explicit-any
        return body.nodes.find((n: any) => n.id === idB)?.templates?.includes("tiny") ?? false;
      });
      await until(
        "A and B both up where they listen",
        async () => await nodeUp(idA)() && await nodeUp(idB)(),
      );
      const r = await gw!.json("acquireSandbox", { name: "on-b", template: "tiny" });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.sandbox.nodeId, idB);
      const none = await gw!.json("acquireSandbox", { name: "nowhere", template: "cuda" });
      assert.equal(none.status, 400);
      assert.match(none.body.message, /No node of the fleet has template 'cuda': the fleet offers/);
      assert.equal((await gw!.json("destroySandbox", { name: "on-b" })).status, 200);
    });

    await t.step("a divergent config digest is reported in listNodes and the log", async () => {
      // B's template map differs from A's: with two nodes there is no majority, so the
      // earliest node's digest is the reference and B is the one set apart.
      const { body } = await gw!.json("listNodes");
      // deno-lint-ignore no-explicit-any
      const byId = new Map(body.nodes.map((n: any) => [n.id, n]));
      // deno-lint-ignore no-explicit-any
      assert.equal((byId.get(idA) as any).configDigestMismatch, false);
      // deno-lint-ignore no-explicit-any
      assert.equal((byId.get(idB) as any).configDigestMismatch, true);
      assert.match(gw!.process.stderr(), /fleet-invariant settings differ/);
    });
  } finally {
    await b?.stop().catch(() => {});
    await a?.stop().catch(() => {});
    await gw?.stop().catch(() => {});
    await removeContainersOf([idA, idB]);
    await Deno.remove(dataA, { recursive: true }).catch(() => {});
  }
});
