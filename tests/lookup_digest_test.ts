/**
 * Lookup digests, black box: a gateway in front of real nodes, spoken to only with `fetch`.
 * One frozen node (SIGSTOP) among several makes `unsure` only the names its last digest may
 * hold; every other new name is placed at once. A sandbox created on a node directly, behind
 * the gateway's back, is found through the gateway at once (docs/lookup-digest.md).
 */
import assert from "node:assert/strict";
import { newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, postJson, startGateway } from "./_gateway.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` every 100 ms until it returns true or `ms` passes. */
async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

async function stateOf(g: GatewayProcess, nodeId: string): Promise<string | undefined> {
  const { body } = await g.json("listNodes");
  return body.nodes.find((n: { id: string }) => n.id === nodeId)?.state;
}

Deno.test({
  name: "lookup digests: a frozen node blocks only the names its last digest may hold",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const token = newToken();
  const started: { stop(): Promise<unknown> }[] = [];
  let frozen: NodeProcess | undefined;
  try {
    const g = await startGateway({
      token,
      // The host's real CPU use is noise from whatever else runs on the machine, not an input.
      env: {
        DORMICE_GATEWAY_LOOKUP_DIGESTS: "on",
        DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      },
    });
    started.push(g);
    const nodeEnv = (id: string) => ({
      DORMICE_GATEWAY_ENDPOINT: g.url,
      DORMICE_NODE_ID: id,
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    });
    // F first and alone, so the gateway places "held-f" there; then A and B join.
    const f = await startNode({ token, env: nodeEnv("node-f") });
    started.push(f);
    await until("node-f up", async () => await stateOf(g, "node-f") === "up");
    const held = await g.json("acquireSandbox", { name: "held-f" });
    assert.equal(held.status, 200, JSON.stringify(held.body));
    assert.equal(held.body.sandbox.nodeId, "node-f");
    const [a, b] = await Promise.all([
      startNode({ token, env: nodeEnv("node-a") }),
      startNode({ token, env: nodeEnv("node-b") }),
    ]);
    started.push(a, b);
    await until(
      "node-a and node-b up",
      async () => await stateOf(g, "node-a") === "up" && await stateOf(g, "node-b") === "up",
    );
    // Three more check-ins of F (1 s apart): its digest now holds "held-f" (two after the
    // create's answer are enough, docs/lookup-digest.md rule 5).
    await sleep(3500);

    f.process.child.kill("SIGSTOP");
    frozen = f;
    await until("node-f down", async () => await stateOf(g, "node-f") === "down");

    // New names F's last digest rules out: placed on A or B, not held by F's silence.
    for (const name of ["new-1", "new-2", "new-3"]) {
      const r = await g.json("acquireSandbox", { name }, { signal: AbortSignal.timeout(20_000) });
      assert.equal(r.status, 200, `${name}: ${JSON.stringify(r.body)}`);
      assert.ok(["node-a", "node-b"].includes(r.body.sandbox.nodeId), JSON.stringify(r.body));
    }
    // The name F may hold stays unsure: never built a second time elsewhere.
    const again = await g.json("acquireSandbox", { name: "held-f" }, {
      signal: AbortSignal.timeout(20_000),
    });
    assert.equal(again.status, 503, JSON.stringify(again.body));
    assert.match(again.body.message, /node-f/);
    for (const node of [a, b]) {
      const r = await fetch(`${node.url}/lookupSandbox`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ name: "held-f" }),
      });
      assert.equal((await r.json()).found, false, "held-f was built again elsewhere");
    }
  } finally {
    frozen?.process.child.kill("SIGCONT");
    for (const p of started.reverse()) await p.stop().catch(() => {});
  }
});

Deno.test({
  name: "lookup digests: a sandbox created on a node directly is found through the gateway at once",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const token = newToken();
  const started: { stop(): Promise<unknown> }[] = [];
  try {
    // The host's real CPU use is noise from whatever else runs on the machine, not an input.
    const g = await startGateway({
      token,
      env: { DORMICE_GATEWAY_LOOKUP_DIGESTS: "on", DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" },
    });
    started.push(g);
    // A 3 s interval: a regular check-in is unlikely to carry the new name before the lookups
    // below, which come right after the create's answer.
    const nodeEnv = (id: string) => ({
      DORMICE_GATEWAY_ENDPOINT: g.url,
      DORMICE_NODE_ID: id,
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "3",
    });
    const [a, b] = await Promise.all([
      startNode({ token, env: nodeEnv("node-a") }),
      startNode({ token, env: nodeEnv("node-b") }),
    ]);
    started.push(a, b);
    await until(
      "node-a and node-b up",
      async () => await stateOf(g, "node-a") === "up" && await stateOf(g, "node-b") === "up",
    );
    // Two check-ins each, so the gateway trusts their digests: a miss asks nobody.
    await sleep(6500);
    const none = await g.json("lookupSandbox", { name: "nobody" });
    assert.equal(none.body.found, false, JSON.stringify(none.body));

    for (const [i, face] of ["native", "e2b"].entries()) {
      const name = `direct-${i}`;
      let id: string;
      if (face === "native") {
        const made = await postJson(a.url, token, "acquireSandbox", { name });
        assert.equal(made.status, 200, JSON.stringify(made.body));
        id = made.body.sandbox.id;
      } else {
        const made = await fetch(`${a.url}/e2b/api/sandboxes`, {
          method: "POST",
          headers: { "x-api-key": token, "content-type": "application/json" },
          body: JSON.stringify({ templateID: "base", metadata: { name } }),
        });
        const body = await made.json();
        assert.equal(made.status, 201, JSON.stringify(body));
        id = body.sandboxID;
      }
      const byId = await g.json("lookupSandbox", { id });
      assert.equal(byId.body.found, true, `${face} by id: ${JSON.stringify(byId.body)}`);
      assert.equal(byId.body.nodeId ?? byId.body.sandbox?.nodeId ?? "node-a", "node-a");
      if (face === "native") {
        const byName = await g.json("execCommand", { name, command: "echo found" });
        assert.equal(byName.status, 200, `${face} by name: ${JSON.stringify(byName.body)}`);
      } else {
        // A fork called on the node directly: its copies are creates behind the gateway's back.
        const forked = await fetch(`${a.url}/e2b/api/sandboxes/${id}/fork`, {
          method: "POST",
          headers: { "x-api-key": token, "content-type": "application/json" },
          body: JSON.stringify({ count: 1 }),
        });
        const copies = await forked.json();
        assert.equal(forked.status, 201, JSON.stringify(copies));
        const copy = copies[0].sandbox.sandboxID;
        const found = await g.json("lookupSandbox", { id: copy });
        assert.equal(found.body.found, true, `fork copy by id: ${JSON.stringify(found.body)}`);
      }
    }

    // The truths with digests trusted: two owners are a 409 (both digests hold the name) ...
    for (const node of [a, b]) {
      const made = await postJson(node.url, token, "acquireSandbox", { name: "twice" });
      assert.equal(made.status, 200, JSON.stringify(made.body));
    }
    const both = await g.json("execCommand", { name: "twice", command: "echo x" });
    assert.equal(both.status, 409, JSON.stringify(both.body));
    assert.match(both.body.message, /node-a/);
    assert.match(both.body.message, /node-b/);
    // ... and twenty concurrent acquires of one new name build it once.
    const burst = await Promise.all(
      Array.from({ length: 20 }, () => g.json("acquireSandbox", { name: "burst" })),
    );
    for (const r of burst) assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(new Set(burst.map((r) => r.body.sandbox.id)).size, 1);
    assert.equal(burst.filter((r) => r.body.created).length, 1);
  } finally {
    for (const p of started.reverse()) await p.stop().catch(() => {});
  }
});

Deno.test({
  name:
    "lookup digests: a node refuses a direct create its gateway cannot hear of, building nothing",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const token = newToken();
  const g = await startGateway({ token });
  let gatewayStopped = false;
  const node = await startNode({
    token,
    env: {
      DORMICE_GATEWAY_ENDPOINT: g.url,
      DORMICE_NODE_ID: "node-a",
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    },
  });
  try {
    await until("node-a up", async () => await stateOf(g, "node-a") === "up");
    // While the gateway answers, a direct create is made known to it and built.
    const first = await postJson(node.url, token, "acquireSandbox", { name: "heard" });
    assert.equal(first.status, 200, JSON.stringify(first.body));
    await g.stop();
    gatewayStopped = true;
    const refused = await postJson(node.url, token, "acquireSandbox", { name: "unheard" });
    assert.equal(refused.status, 503, JSON.stringify(refused.body));
    assert.match(refused.body.message, /gateway .*must hear of a create/);
    assert.ok(Number(refused.headers.get("retry-after")) >= 1);
    const looked = await postJson(node.url, token, "lookupSandbox", { name: "unheard" });
    assert.equal(looked.body.found, false, "nothing may be built");
    // A wake of a name it holds builds nothing and needs no gateway.
    const wake = await postJson(node.url, token, "acquireSandbox", { name: "heard" });
    assert.equal(wake.status, 200, JSON.stringify(wake.body));
  } finally {
    await node.stop().catch(() => {});
    if (!gatewayStopped) await g.stop().catch(() => {});
  }
});
