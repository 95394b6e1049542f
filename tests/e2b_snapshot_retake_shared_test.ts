/**
 * A snapshot name taken again on another node, in shared mode, black box: two gateways sharing
 * a real etcd on loopback, two fake-executor nodes checking in with them on a long interval (so
 * no regular check-in tells the gateways anything during the test). Name N is taken on node A
 * and A's holding of it is known to both gateways; N is taken again on node B through the first
 * gateway (E2B: the same snapshot id, a newer build); a create from that id through the second
 * gateway, sent the moment the take is answered, must start from B's build. Skipped, saying
 * why, when etcd is not installed.
 */
import assert from "node:assert/strict";
import { etcdMissing, startEtcd } from "./support/etcd.ts";
import { type GatewayProcess, sharedModeEnv, startGateway } from "./_gateway.ts";
import { newToken, type NodeProcess, startNode } from "./_processes.ts";
import { until } from "./_docker.ts";

const missing = etcdMissing();
const skip = missing === null ? "" : ` (skipped: ${missing})`;

const TEAM = "retake";

/** The nodes `gw` sees up with a reading, with the snapshot names each advertises. */
async function nodesAt(gw: GatewayProcess): Promise<Map<string, string[]>> {
  const { body } = await gw.json("listNodes");
  const up = body.nodes.filter((n: { state: string; reading: unknown }) =>
    n.state === "up" && n.reading !== null
  );
  return new Map(
    up.map((n: { id: string; snapshotNames?: string[] }) => [n.id, n.snapshotNames ?? []]),
  );
}

Deno.test({
  name:
    `shared mode: a snapshot name taken again on another node is created from at its newest through any gateway at once${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const etcd = await startEtcd(1);
  const token = newToken();
  const env = sharedModeEnv(etcd);
  const gateways: GatewayProcess[] = [];
  const nodes = new Map<string, NodeProcess>();
  try {
    gateways.push(...await Promise.all([0, 1].map(() => startGateway({ token, env }))));
    const [g1, g2] = gateways;
    for (const id of ["node-a", "node-b"]) {
      nodes.set(
        id,
        await startNode({
          token,
          env: {
            DORMICE_GATEWAY_ENDPOINT: gateways.map((g) => g.url).join(","),
            DORMICE_NODE_ID: id,
            // Only the check-ins a node pushes out of turn reach the gateways during the test.
            DORMICE_CHECK_IN_INTERVAL_SECONDS: "300",
          },
        }),
      );
    }
    for (const gw of gateways) {
      await until(`${gw.url} sees both nodes up`, async () => (await nodesAt(gw)).size === 2);
    }
    const minted = await g1.json("createApiKey", { team: TEAM });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const apiKey = minted.body.key as string;
    const e2b = (gw: GatewayProcess, method: string, path: string, body?: unknown) =>
      fetch(`${gw.url}/e2b/api${path}`, {
        method,
        headers: { "x-api-key": apiKey, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    await until("the second gateway knows the key", async () => {
      const res = await e2b(g2, "GET", "/snapshots");
      await res.body?.cancel();
      return res.status === 200;
    });
    // A sandbox on each node, made on the node itself: each such create pushes the node's
    // check-in (with the snapshots it holds then) to a gateway, which is how the test makes
    // node A's holding of N known without waiting for an interval.
    const direct = async (nodeId: string, name: string): Promise<string> => {
      const res = await fetch(`${nodes.get(nodeId)!.url}/e2b/api/v2/sandboxes`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${token}`,
          "x-api-key": token,
          "x-dormice-team": TEAM,
          "content-type": "application/json",
        },
        body: JSON.stringify({ templateID: "base", metadata: { name } }),
      });
      const text = await res.text();
      assert.equal(res.status, 201, text);
      return JSON.parse(text).sandboxID;
    };
    const onA = await direct("node-a", "src-a");
    const onB = await direct("node-b", "src-b");
    const name = `ready-${crypto.randomUUID().slice(0, 6)}`;
    const first = await e2b(g1, "POST", `/sandboxes/${onA}/snapshots`, { name });
    const firstText = await first.text();
    assert.equal(first.status, 201, firstText);
    const snapshotId = JSON.parse(firstText).snapshotID as string;
    await direct("node-a", "nudge-a");
    for (const gw of gateways) {
      await until(`${gw.url} sees node-a advertise ${name}`, async () => {
        const seen = await nodesAt(gw);
        return seen.get("node-a")!.includes(`${TEAM}/${name}`) &&
          !seen.get("node-b")!.includes(`${TEAM}/${name}`);
      });
    }

    // Taken again on node B through the first gateway: the same id, a newer build.
    const again = await e2b(g1, "POST", `/sandboxes/${onB}/snapshots`, { name });
    const againText = await again.text();
    assert.equal(again.status, 201, againText);
    assert.equal(JSON.parse(againText).snapshotID, snapshotId, "a name taken again keeps its id");
    // At once, through the other gateway: B's build, not A's older one.
    const created = await e2b(g2, "POST", "/v2/sandboxes", { templateID: snapshotId });
    const createdText = await created.text();
    assert.equal(created.status, 201, createdText);
    const sandboxId = JSON.parse(createdText).sandboxID as string;
    const info = await e2b(g2, "GET", `/sandboxes/${sandboxId}`);
    const infoText = await info.text();
    assert.equal(info.status, 200, infoText);
    assert.equal(
      JSON.parse(infoText).clientID,
      "node-b",
      "the create from the id taken again must start from node-b's newer build",
    );

    // Another team's create from that id goes the same way (etcd names node-b) and finds
    // nothing of its own: E2B's 404, as for an id no node holds.
    const other = await g1.json("createApiKey", { team: "other" });
    assert.equal(other.status, 200, JSON.stringify(other.body));
    const asOther = (templateID: string) =>
      fetch(`${g2.url}/e2b/api/v2/sandboxes`, {
        method: "POST",
        headers: { "x-api-key": other.body.key, "content-type": "application/json" },
        body: JSON.stringify({ templateID }),
      });
    await until("the second gateway knows the other key", async () => {
      const res = await fetch(`${g2.url}/e2b/api/snapshots`, {
        headers: { "x-api-key": other.body.key },
      });
      await res.body?.cancel();
      return res.status === 200;
    });
    for (const id of [snapshotId, `snap-${"0".repeat(20)}`]) {
      const res = await asOther(id);
      const text = await res.text();
      assert.equal(res.status, 404, `another team's create from '${id}': ${text}`);
      assert.doesNotMatch(text, new RegExp(TEAM), "nothing of the owning team shows");
    }
  } finally {
    await Promise.all([...nodes.values(), ...gateways].map((p) => p.stop()));
    await etcd.stop();
  }
});
