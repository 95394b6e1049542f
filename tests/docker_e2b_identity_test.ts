/**
 * What a sandbox knows of itself, through the official `e2b` SDK, unmodified, on Docker: as
 * E2B's envd does, every command sees `E2B_SANDBOX=true`, `E2B_SANDBOX_ID`, `E2B_TEMPLATE_ID`
 * and `E2B_TEAM_ID`, and `/run/e2b/.<NAME>` holds each. The values are the sandbox's own after a
 * cold create (a create's `envs` cannot replace them), a warm pool's claim, a fork and a create
 * from a snapshot (their own ids, not the origin's), a filesystem pause and resume, and a
 * take-over by another node when the first is down (same id). Off CI the test skips with a
 * printed reason when there is no engine or no `docker-registry`; with `CI=true` it fails.
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import type { NodeProcess } from "./_processes.ts";
import { startGateway } from "./_gateway.ts";
import { dockerGate, removeContainersOf, startDockerNode, until } from "./_docker.ts";
import { startRegistry } from "./_heal_fleet.ts";

const gate = await dockerGate("sandbox identity variables and files");
const hasRegistry = (await new Deno.Command("bash", { args: ["-c", "command -v docker-registry"] })
  .output()).success;
if (!hasRegistry && Deno.env.get("CI") !== "true") {
  console.log("sandbox identity test skipped: docker-registry is not installed");
}

const NAMES = ["E2B_SANDBOX", "E2B_SANDBOX_ID", "E2B_TEMPLATE_ID", "E2B_TEAM_ID"];

/** Each identity variable as a command sees it, and as its file holds it. */
async function identityOf(sbx: Sandbox): Promise<{ env: string[]; files: string[] }> {
  const env = await sbx.commands.run(NAMES.map((n) => `echo "$${n}"`).join("; "));
  const files = await sbx.commands.run(
    NAMES.map((n) => `cat /run/e2b/.${n}; echo`).join("; "),
  );
  return { env: env.stdout.split("\n").slice(0, 4), files: files.stdout.split("\n").slice(0, 4) };
}

async function assertIdentity(sbx: Sandbox, template: string, team: string): Promise<void> {
  const want = ["true", sbx.sandboxId, template, team];
  const got = await identityOf(sbx);
  assert.deepEqual(got.env, want, `env of ${sbx.sandboxId}`);
  assert.deepEqual(got.files, want, `files of ${sbx.sandboxId}`);
}

Deno.test({
  name: "e2b SDK on Docker: E2B_SANDBOX_ID and its /run/e2b files follow the sandbox",
  ignore: gate.skip || (!hasRegistry && Deno.env.get("CI") !== "true"),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const tag = crypto.randomUUID().slice(0, 6);
  const ids = [`idn-a-${tag}`, `idn-b-${tag}`];
  const team = `identity-${tag}`;
  const registry = await startRegistry();
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const nodes = new Map<string, NodeProcess>();
  const start = async (id: string) => {
    nodes.set(
      id,
      await startDockerNode({
        token: gw.token,
        gatewayUrl: gw.url,
        nodeId: id,
        env: {
          DORMICE_SNAPSHOT_REGISTRY: registry.address,
          DORMICE_SNAPSHOT_MIN_DISK_GB: "0",
          DORMICE_TEMPLATES: "base=dormice-minimal:latest,minimal=dormice-minimal:latest",
        },
      }),
    );
    await until(`${id} up at the gateway`, async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.some((n: { id: string; state: string; reading: unknown }) =>
        n.id === id && n.state === "up" && n.reading !== null
      );
    }, 60_000);
  };
  const minted = await gw.json("createApiKey", { team });
  assert.equal(minted.status, 200, JSON.stringify(minted.body));
  const sdk = {
    apiUrl: `${gw.url}/e2b/api`,
    sandboxUrl: `${gw.url}/e2b/envd`,
    apiKey: minted.body.key,
  };
  const made: Sandbox[] = [];
  try {
    await start(ids[0]);
    let source!: Sandbox;

    await t.step("a cold create: its id, template and team; its envs replace none", async () => {
      source = await Sandbox.create("minimal", {
        ...sdk,
        envs: { E2B_SANDBOX_ID: "mine", E2B_SANDBOX: "false" },
      });
      made.push(source);
      await assertIdentity(source, "minimal", team);
      // A command's own envs are its own, as envd's are; the file keeps the id.
      const own = await source.commands.run('echo "$E2B_SANDBOX_ID"', {
        envs: { E2B_SANDBOX_ID: "per-command" },
      });
      assert.equal(own.stdout.trim(), "per-command");
    });

    await t.step("a fork and a create from a snapshot: each its own id", async () => {
      const [fork] = await Sandbox.fork(source.sandboxId, { ...sdk, count: 1 });
      assert.ok(fork instanceof Sandbox, String(fork));
      made.push(fork);
      assert.notEqual(fork.sandboxId, source.sandboxId);
      await assertIdentity(fork, "minimal", team);
      const snap = await source.createSnapshot();
      const fromSnap = await Sandbox.create(snap.snapshotId, sdk);
      made.push(fromSnap);
      assert.notEqual(fromSnap.sandboxId, source.sandboxId);
      const info = await fromSnap.getInfo();
      await assertIdentity(fromSnap, info.templateId, team);
    });

    await t.step("a warm sandbox handed out: the id it is answered with", async () => {
      const set = await gw.json("setPools", { pools: [{ template: "minimal", warm: 1 }] });
      assert.equal(set.status, 200, JSON.stringify(set.body));
      const node = nodes.get(ids[0])!;
      const pools = async () => {
        const res = await fetch(`${node.url}/listPools`, {
          method: "POST",
          headers: { authorization: `Bearer ${node.token}`, "content-type": "application/json" },
          body: "{}",
        });
        return (await res.json()).pools[0] ?? { warm: 0, claimed: 0 };
      };
      await until("one warm sandbox", async () => (await pools()).warm === 1, 60_000);
      const claimedBefore = (await pools()).claimed;
      const warm = await Sandbox.create("minimal", sdk);
      made.push(warm);
      assert.equal((await pools()).claimed, claimedBefore + 1, "precondition: claimed warm");
      await assertIdentity(warm, "minimal", team);
      const cleared = await gw.json("setPools", { pools: [] });
      assert.equal(cleared.status, 200, JSON.stringify(cleared.body));
    });

    await t.step("paused to disk and resumed: the same id", async () => {
      assert.equal(await source.pause({ keepMemory: false }), true);
      const back = await Sandbox.connect(source.sandboxId, sdk);
      await assertIdentity(back, "minimal", team);
    });

    await t.step("taken over by another node while its own is down: the same id", async () => {
      assert.equal(await source.pause({ keepMemory: false }), true);
      await start(ids[1]);
      await nodes.get(ids[0])!.stop();
      nodes.delete(ids[0]);
      await until("the first node down at the gateway", async () => {
        const { body } = await gw.json("listNodes");
        return !body.nodes.some((n: { id: string; state: string }) =>
          n.id === ids[0] && n.state === "up"
        );
      }, 60_000);
      const moved = await Sandbox.connect(source.sandboxId, sdk);
      const where = await fetch(`${sdk.apiUrl}/sandboxes/${source.sandboxId}`, {
        headers: { "x-api-key": sdk.apiKey },
      });
      assert.equal((await where.json()).clientID, ids[1], "precondition: taken over");
      await assertIdentity(moved, "minimal", team);
    });
  } finally {
    await Promise.all(made.map((s) => s.kill().catch(() => {})));
    await Promise.all([...nodes.values()].map((n) => n.stop()));
    await gw.stop();
    await registry.stop();
    await removeContainersOf(ids);
  }
});
