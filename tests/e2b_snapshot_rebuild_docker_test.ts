/**
 * A snapshot name taken again on Docker, across two engines that share nothing (a second
 * `dockerd`), through the official `e2b` SDK: the name's first build is taken on one node, the
 * second (same id, E2B's new build of one template) on the other; with the second node full, a
 * create lands on the first, which holds the older build under its own tag, and must start from
 * the newest (it heals it first). Off CI it skips with a printed reason when it cannot run.
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { startGateway } from "./_gateway.ts";
import { removeContainersOf, startDockerNode } from "./_docker.ts";
import {
  freshCheckIn,
  nodeOf,
  removeSnapshotImages,
  secondEngineReadiness,
  startSecondEngine,
} from "./_heal_fleet.ts";
import type { NodeProcess } from "./_processes.ts";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";

const why = await secondEngineReadiness("docker snapshot rebuild");
if (why !== null && Deno.env.get("CI") !== "true") {
  console.log(`docker snapshot rebuild skipped: ${why}`);
}

Deno.test({
  name: "e2b SDK on Docker: a name taken again on another engine is started from at its newest",
  ignore: why !== null && Deno.env.get("CI") !== "true",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (why !== null) throw new Error(`CI=true, so this must run: ${why}`);
  const engine = await startSecondEngine();
  const gw = await startGateway({
    env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100", DORMICE_GATEWAY_NODE_ACTIVE_LIMIT: "1" },
  });
  const suffix = crypto.randomUUID().slice(0, 6);
  const ids = [`rba-${suffix}`, `rbb-${suffix}`];
  const socketOf = (id: string) => id === ids[0] ? DEFAULT_DOCKER_SOCKET : engine.socket;
  const nodes: NodeProcess[] = [];
  const made: Sandbox[] = [];
  try {
    for (const id of ids) {
      nodes.push(
        await startDockerNode({
          token: gw.token,
          gatewayUrl: gw.url,
          nodeId: id,
          socket: socketOf(id),
          env: {
            DORMICE_SNAPSHOT_MIN_DISK_GB: "0",
            DORMICE_TEMPLATES: "base=dormice-minimal:latest,minimal=dormice-minimal:latest",
            ...(id === ids[1] ? { DORMICE_SANDBOX_HOST_FIREWALL: "off" } : {}),
          },
        }),
      );
      await freshCheckIn(gw, id, `${id} up`, (n) => n.reading !== null);
    }
    const minted = await gw.json("createApiKey", { team: "rebuild" });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const opts = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey: minted.body.key,
    };
    const name = `rb-${suffix}`;
    // One sandbox on each node (the limit is 1 a node).
    const first = await Sandbox.create("minimal", opts);
    made.push(first);
    const firstNode = await nodeOf(opts, first.sandboxId);
    await freshCheckIn(
      gw,
      firstNode,
      "the first node full",
      (n) => (n.reading?.sandboxes.active ?? 0) >= 1,
    );
    const second = await Sandbox.create("minimal", opts);
    made.push(second);
    const secondNode = await nodeOf(opts, second.sandboxId);
    assert.notEqual(secondNode, firstNode);
    await first.files.write("/home/user/state.txt", "v1");
    const v1 = await first.createSnapshot({ name });
    await second.files.write("/home/user/state.txt", "v2");
    const v2 = await second.createSnapshot({ name });
    assert.equal(v2.snapshotId, v1.snapshotId, "one name, one id");
    // The second node full, the first empty: the create lands on the first, which holds v1.
    await first.kill();
    await freshCheckIn(
      gw,
      firstNode,
      "the first node empty",
      (n) => n.reading?.sandboxes.active === 0,
    );
    await freshCheckIn(
      gw,
      secondNode,
      "the second node full",
      (n) => (n.reading?.sandboxes.active ?? 0) >= 1,
    );
    for (const from of [name, v1.snapshotId]) {
      const copy = await Sandbox.create(from, opts);
      try {
        assert.equal(await nodeOf(opts, copy.sandboxId), firstNode, from);
        assert.equal(await copy.files.read("/home/user/state.txt"), "v2", from);
      } finally {
        await copy.kill().catch(() => {});
      }
      await freshCheckIn(
        gw,
        firstNode,
        "the first node empty again",
        (n) => n.reading?.sandboxes.active === 0,
      );
    }
  } finally {
    for (const s of made) await s.kill().catch(() => {});
    await Promise.all(nodes.map((n) => n.stop()));
    await gw.stop();
    await removeContainersOf(ids).catch(() => {});
    await removeSnapshotImages(DEFAULT_DOCKER_SOCKET, ids);
    await engine.stop();
  }
});
