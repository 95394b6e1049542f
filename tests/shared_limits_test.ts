/**
 * Shared mode, black box: a key's limits hold across every gateway of the fleet. Three gateways
 * on a three-member etcd, two nodes on the fake executor; clients spread their creates
 * round-robin over the gateways, in the native and the E2B dialect. Skipped, saying why, when
 * etcd is not installed; never under CI.
 */
import assert from "node:assert/strict";
import { etcdMissing, startEtcd } from "./support/etcd.ts";
import { type GatewayProcess, postJson, startGateway } from "./_gateway.ts";
import { newToken, type NodeProcess, startNode } from "./_processes.ts";

const missing = etcdMissing();
const skip = missing === null ? "" : ` (skipped: ${missing})`;

async function waitUntil(what: string, check: () => Promise<boolean>, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Timed out after ${timeoutMs} ms waiting until ${what}`);
}

// deno-lint-ignore no-explicit-any
type Answer = { status: number; headers: Headers; body: any };

/** A create through the E2B face, with an API key. */
async function e2bCreate(gw: GatewayProcess, key: string): Promise<Answer> {
  const res = await fetch(`${gw.url}/e2b/api/sandboxes`, {
    method: "POST",
    headers: { "x-api-key": key, "content-type": "application/json" },
    body: JSON.stringify({ templateID: "minimal" }),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null };
}

/** The sandboxes of `team` on every node, asked directly. */
async function teamSandboxes(nodes: NodeProcess[], token: string, team: string) {
  const ids: string[] = [];
  for (const node of nodes) {
    const { body } = await postJson(node.url, token, "listSandboxes", {});
    for (const s of body.sandboxes) if (s.team === team) ids.push(s.id as string);
  }
  return ids;
}

Deno.test({
  name:
    `shared mode: a key's maxSandboxes and createsPerMinute hold across three gateways, not per gateway${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const etcd = await startEtcd(3);
  const token = newToken();
  const env = {
    DORMICE_GATEWAY_ETCD: etcd.endpoints,
    DORMICE_GATEWAY_ETCD_PREFIX: `/t-${crypto.randomUUID().slice(0, 8)}/`,
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
  };
  const started: { stop(): Promise<unknown> }[] = [];
  try {
    const gateways = await Promise.all([0, 1, 2].map(() => startGateway({ token, env })));
    started.push(...gateways);
    // A long check-in interval: no reading lands during a burst, so only what the gateways
    // share while the creates are in flight can hold the count.
    const nodes = await Promise.all([0, 1].map((i) =>
      startNode({
        token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: gateways.map((g) => g.url).join(","),
          DORMICE_NODE_ID: `node-${i}`,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "30",
        },
      })
    ));
    started.push(...nodes);
    for (const gw of gateways) {
      await waitUntil(`${gw.url} sees both nodes up with a reading`, async () => {
        const { body } = await gw.json("listNodes");
        // deno-lint-ignore no-explicit-any
        return body.nodes.filter((n: any) => n.state === "up" && n.reading !== null).length === 2;
      });
    }
    /** Mints a key on the first gateway and waits until every gateway accepts it. */
    const mint = async (body: Record<string, unknown>): Promise<string> => {
      const minted = await gateways[0].json("createApiKey", body);
      assert.equal(minted.status, 200, JSON.stringify(minted.body));
      for (const gw of gateways) {
        await waitUntil(`${gw.url} knows the new key`, async () => {
          const r = await postJson(gw.url, minted.body.key, "listSandboxes", {});
          return r.status === 200;
        });
      }
      return minted.body.key;
    };

    await t.step(
      "twelve concurrent creates over three gateways with maxSandboxes 3 build 3",
      async () => {
        const key = await mint({ team: "burst", maxSandboxes: 3 });
        // Round-robin over the gateways, every other one through the E2B face.
        const answers: { face: "native" | "e2b"; answer: Answer }[] = await Promise.all(
          Array.from({ length: 12 }, async (_, i) => {
            const gw = gateways[i % 3];
            if (i % 2 === 0) {
              return { face: "e2b" as const, answer: await e2bCreate(gw, key) };
            }
            const answer = await postJson(gw.url, key, "acquireSandbox", { name: `b-${i}` });
            return { face: "native" as const, answer };
          }),
        );
        const built = answers.filter((a) => a.answer.status === 200 || a.answer.status === 201);
        const refused = answers.filter((a) => a.answer.status === 429);
        assert.equal(
          built.length,
          3,
          `built ${built.length}: ${JSON.stringify(answers.map((a) => a.answer.status))}`,
        );
        assert.equal(refused.length, 9, JSON.stringify(answers.map((a) => a.answer.body)));
        for (const { face, answer } of refused) {
          // No Retry-After: only a kill frees a place.
          assert.equal(answer.headers.get("retry-after"), null);
          assert.match(
            answer.body.message,
            /^You have reached the maximum number of concurrent E2B/,
          );
          assert.match(answer.body.message, /maxSandboxes 3\): kill one first/);
          if (face === "e2b") assert.equal(answer.body.code, 429, JSON.stringify(answer.body));
        }
        assert.ok(
          refused.some((a) => a.face === "e2b") && refused.some((a) => a.face === "native"),
        );
        assert.equal((await teamSandboxes(nodes, token, "burst")).length, 3);
      },
    );

    await t.step("createsPerMinute 2 is one rate for the fleet: 2 of 6 creates pass", async () => {
      const key = await mint({ team: "rated", createsPerMinute: 2 });
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) {
        const r = await postJson(gateways[i % 3].url, key, "acquireSandbox", { name: `r-${i}` });
        statuses.push(r.status);
        if (r.status === 429) {
          assert.match(r.body.message, /createsPerMinute 2\): retry in \d+ s/);
          assert.ok(Number(r.headers.get("retry-after")) > 0);
        }
      }
      assert.deepEqual(statuses, [200, 200, 429, 429, 429, 429]);
      assert.equal((await teamSandboxes(nodes, token, "rated")).length, 2);
    });
  } finally {
    await Promise.all(started.map((p) => p.stop()));
    await etcd.stop();
  }
});
