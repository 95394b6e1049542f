/**
 * Shared mode, black box: real gateways and nodes as processes, coordinated through a real etcd
 * on loopback (DESIGN §9). Skipped, saying why, when etcd is not installed; never under CI.
 */
import assert from "node:assert/strict";
import { etcdMissing, startEtcd } from "./support/etcd.ts";
import { type GatewayProcess, post, postJson, startGateway } from "./_gateway.ts";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";

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

/** Until `gw` sees `count` nodes up, each with a reading. */
function nodesUp(gw: GatewayProcess, count: number): Promise<void> {
  return waitUntil(`${gw.url} sees ${count} nodes up`, async () => {
    const { body } = await gw.json("listNodes");
    // deno-lint-ignore no-explicit-any
    const up = body.nodes.filter((n: any) => n.state === "up" && n.reading !== null);
    return up.length === count;
  });
}

/** The sandboxes named `name` on every node, asked directly. */
async function copies(nodes: NodeProcess[], token: string, name: string): Promise<string[]> {
  const ids: string[] = [];
  for (const node of nodes) {
    const { body } = await postJson(node.url, token, "listSandboxes", {});
    for (const s of body.sandboxes) if (s.name === name) ids.push(s.id as string);
  }
  return ids;
}

interface Fleet {
  token: string;
  gateways: GatewayProcess[];
  nodes: NodeProcess[];
  stop(): Promise<void>;
}

async function sharedFleet(options: {
  etcd: string;
  nodes: number;
  intervalSeconds: number;
  leaseSeconds?: number;
  /** Per node: the endpoint it reports (a proxy in front of it), given its own URL. */
  nodeEndpoint?: (i: number, port: number) => string;
  /** Extra variables for both gateways. */
  gatewayEnv?: Record<string, string>;
}): Promise<Fleet> {
  const token = newToken();
  const prefix = `/t-${crypto.randomUUID().slice(0, 8)}/`;
  const env = {
    DORMICE_GATEWAY_ETCD: options.etcd,
    DORMICE_GATEWAY_ETCD_PREFIX: prefix,
    DORMICE_GATEWAY_ETCD_LEASE_SECONDS: String(options.leaseSeconds ?? 10),
    // The nodes share the test machine's cores with three etcd members and whatever else runs:
    // their CPU reading is the machine's, and must not decide what these tests are about.
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
    ...options.gatewayEnv,
  };
  const gateways = await Promise.all([0, 1].map(() => startGateway({ token, env })));
  const nodes = await Promise.all(Array.from({ length: options.nodes }, (_, i) => {
    const port = freePort();
    return startNode({
      token,
      port,
      env: {
        DORMICE_GATEWAY_ENDPOINT: gateways.map((g) => g.url).join(","),
        DORMICE_NODE_ID: `node-${i}`,
        DORMICE_CHECK_IN_INTERVAL_SECONDS: String(options.intervalSeconds),
        ...(options.nodeEndpoint ? { DORMICE_NODE_ENDPOINT: options.nodeEndpoint(i, port) } : {}),
      },
    });
  }));
  // Every node checked in with the first gateway only; the second knows them through etcd.
  await Promise.all(gateways.map((g) => nodesUp(g, options.nodes)));
  return {
    token,
    gateways,
    nodes,
    async stop() {
      await Promise.all([...gateways, ...nodes].map((p) => p.stop()));
    },
  };
}

Deno.test({
  name:
    `shared mode: twenty simultaneous acquires of one name over two gateways build one sandbox${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const etcd = await startEtcd(1);
    // Each create reaches its node 200 ms late, so a gateway's create is not yet on the node
    // when the other asks the fleet: only the shared slot keeps the second from building.
    const proxyPorts = [freePort(), freePort()];
    const proxies = proxyPorts.map((p) => holdingProxy(p, 200, true));
    // A long interval: no new reading lands during the race, so each gateway's own in-flight
    // count decides its placement.
    const fleet = await sharedFleet({
      etcd: etcd.endpoints,
      nodes: 2,
      intervalSeconds: 60,
      nodeEndpoint: (i, port) => {
        proxies[i].setTarget(`http://127.0.0.1:${port}`);
        return `http://127.0.0.1:${proxyPorts[i]}`;
      },
    });
    const [g1, g2] = fleet.gateways;
    try {
      // One placement through the first gateway makes the two gateways' views differ (its
      // in-flight count is its own), so without a shared slot they would place the race's name
      // on different nodes.
      const pre = await g1.json("acquireSandbox", { name: "pre" });
      assert.equal(pre.status, 200, JSON.stringify(pre.body));
      const answers = await Promise.all(
        Array.from(
          { length: 20 },
          (_, i) => (i % 2 === 0 ? g1 : g2).json("acquireSandbox", { name: "race" }),
        ),
      );
      for (const a of answers) assert.equal(a.status, 200, JSON.stringify(a.body));
      const ids = new Set(answers.map((a) => a.body.sandbox.id));
      assert.equal(ids.size, 1, `the answers name ${ids.size} sandboxes`);
      assert.equal(answers.filter((a) => a.body.created).length, 1);
      assert.deepEqual(await copies(fleet.nodes, fleet.token, "race"), [...ids]);
    } finally {
      await fleet.stop();
      for (const p of proxies) await p.stop();
      await etcd.stop();
    }
  },
});

/**
 * A pass-through proxy in front of a node that holds the first `acquireSandbox` it sees for
 * `holdMs`, then forwards it whatever became of its sender (the node builds the sandbox after
 * the gateway that asked for it died).
 */
function holdingProxy(port: number, holdMs: number, every = false) {
  let target = "";
  let held = false;
  let holding!: () => void;
  const arrived = new Promise<void>((r) => holding = r);
  const server = Deno.serve({ hostname: "127.0.0.1", port, onListen: () => {} }, async (req) => {
    const url = new URL(req.url);
    const body = req.method === "GET" ? undefined : await req.arrayBuffer();
    if (url.pathname === "/acquireSandbox" && (every || !held)) {
      held = true;
      holding();
      await new Promise((r) => setTimeout(r, holdMs));
    }
    const headers = new Headers(req.headers);
    headers.delete("host");
    const res = await fetch(target + url.pathname + url.search, {
      method: req.method,
      headers,
      body,
    });
    return new Response(await res.arrayBuffer(), { status: res.status, headers: res.headers });
  });
  return {
    setTarget: (t: string) => target = t,
    arrived,
    stop: () => server.shutdown(),
  };
}

Deno.test({
  name:
    `shared mode: a gateway SIGKILLed mid-create leaves its sandbox to the other, no second copy, no node down${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const etcd = await startEtcd(1);
    const leaseSeconds = 3;
    const proxyPorts = [freePort(), freePort()];
    const proxies = proxyPorts.map((p) => holdingProxy(p, 1500));
    const fleet = await sharedFleet({
      etcd: etcd.endpoints,
      nodes: 2,
      intervalSeconds: 1,
      leaseSeconds,
      nodeEndpoint: (i, port) => {
        proxies[i].setTarget(`http://127.0.0.1:${port}`);
        return `http://127.0.0.1:${proxyPorts[i]}`;
      },
    });
    const [g1, g2] = fleet.gateways;
    try {
      const first = g1.json("acquireSandbox", { name: "held" }).catch(() => null);
      await Promise.race(proxies.map((p) => p.arrived));
      // g1 holds the name's slot and its create is on the way to a node.
      g1.process.child.kill("SIGKILL");
      await g1.process.exited;
      await first;
      // g2 waits on the dead gateway's slot until its lease lapses, then takes it: a 200 (a g2
      // that gave up on the slot would answer 503, one that never noticed the lapse not at all).
      const second = await g2.json("acquireSandbox", { name: "held" });
      assert.equal(second.status, 200, JSON.stringify(second.body));
      // The sandbox the dead gateway's node built, woken, not a second one.
      assert.equal(second.body.created, false, JSON.stringify(second.body));
      assert.deepEqual(await copies(fleet.nodes, fleet.token, "held"), [second.body.sandbox.id]);

      // The nodes move their check-ins to g2; none is reported down meanwhile (4 intervals).
      const until = Date.now() + 4000;
      while (Date.now() < until) {
        const { body } = await g2.json("listNodes");
        // deno-lint-ignore no-explicit-any
        const states = body.nodes.map((n: any) => `${n.id}:${n.state}`);
        assert.deepEqual(states.sort(), ["node-0:up", "node-1:up"]);
        await new Promise((r) => setTimeout(r, 250));
      }
      for (const node of fleet.nodes) {
        assert.match(node.process.stderr(), /check-in moves to the next gateway/);
      }
      const exec = await g2.json("execCommand", { name: "held", command: "echo still here" });
      assert.equal(exec.status, 200, JSON.stringify(exec.body));
      assert.equal(exec.body.stdout, "still here\n");
    } finally {
      await fleet.stop();
      for (const p of proxies) await p.stop();
      await etcd.stop();
    }
  },
});

Deno.test({
  name:
    `shared mode: a three-member etcd survives a member's death; with none, creates are 503 naming etcd and execs still answer${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const etcd = await startEtcd(3);
    // 1 s intervals and an outage of more than three: the gateway the nodes do not check in
    // with (g2) hears of them only through etcd, and must not take that silence for theirs.
    const intervalSeconds = 1;
    const fleet = await sharedFleet({ etcd: etcd.endpoints, nodes: 2, intervalSeconds });
    const [g1, g2] = fleet.gateways;
    try {
      const a = await g1.json("acquireSandbox", { name: "a" });
      assert.equal(a.status, 200, JSON.stringify(a.body));
      // Killing the first member (the one each gateway asks first) interrupts nothing.
      await etcd.kill(0);
      for (let i = 0; i < 6; i++) {
        const r = await (i % 2 ? g2 : g1).json("acquireSandbox", { name: `during-${i}` });
        assert.equal(r.status, 200, JSON.stringify(r.body));
      }
      // Every member stopped: creates and destroys wait for etcd, execs do not.
      await etcd.kill(1);
      await etcd.kill(2);
      await new Promise((r) => setTimeout(r, 3.5 * intervalSeconds * 1000));
      for (const gw of fleet.gateways) {
        const create = await gw.json("acquireSandbox", { name: "new" });
        assert.equal(create.status, 503, JSON.stringify(create.body));
        assert.match(create.body.message, /etcd is unreachable/);
        assert.ok(Number(create.headers.get("retry-after")) > 0);
        const destroy = await gw.json("destroySandbox", { name: "a" });
        assert.equal(destroy.status, 503, JSON.stringify(destroy.body));
        const exec = await gw.json("execCommand", { name: "a", command: "echo up" });
        assert.equal(exec.status, 200, JSON.stringify(exec.body));
        assert.equal(exec.body.stdout, "up\n");
      }
      // Check-ins are still accepted by the gateway the nodes check in with: no node goes down
      // there while etcd is away (the other gateway cannot hear of them until etcd returns).
      const { body } = await g1.json("listNodes");
      // deno-lint-ignore no-explicit-any
      assert.deepEqual(body.nodes.map((n: any) => n.state), ["up", "up"]);
      assert.match(g1.process.stderr(), /etcd is unreachable/);
      // Everything resumes when etcd returns.
      await etcd.restartAll();
      let last = "";
      await waitUntil("a create succeeds again", async () => {
        const r = await g2.json("acquireSandbox", { name: "new" });
        last = `${r.status} ${JSON.stringify(r.body)}`;
        return r.status === 200;
      }, 20_000).catch((error) => {
        throw new Error(`${error.message}; the last answer: ${last}`);
      });
      const gone = await post(g1.url, fleet.token, "destroySandbox", { name: "a" });
      assert.equal(gone.status, 200);
      await gone.body?.cancel();
    } finally {
      await fleet.stop();
      await etcd.stop();
    }
  },
});

Deno.test({
  name:
    `shared mode: with etcd stopped, a node that dies is shown down and unheard, and its requests end on a health check, not the head timeout${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const etcd = await startEtcd(3);
    const intervalSeconds = 1;
    // A head timeout far past what a client here waits (30 s): only the health check ends it.
    const fleet = await sharedFleet({
      etcd: etcd.endpoints,
      nodes: 1,
      intervalSeconds,
      gatewayEnv: { DORMICE_GATEWAY_HEAD_TIMEOUT_MS: "300000" },
    });
    const [g1, g2] = fleet.gateways;
    const node = fleet.nodes[0];
    let frozen = false;
    try {
      const a = await g1.json("acquireSandbox", { name: "a" });
      assert.equal(a.status, 200, JSON.stringify(a.body));
      // g2 knows where "a" lives (a cache hit: its requests go straight to the node).
      const warm = await g2.json("execCommand", { name: "a", command: "echo up" });
      assert.equal(warm.status, 200, JSON.stringify(warm.body));
      // g2 hears of the node through etcd only; stop etcd, then freeze the node (its socket
      // still accepts connections, nothing answers: the head timeout's case).
      // The whole three-member cluster goes: no member left to read from.
      for (let m = 0; m < etcd.members.length; m++) await etcd.kill(m);
      node.process.child.kill("SIGSTOP");
      frozen = true;
      let seen = "";
      await waitUntil("g2 shows the node down and unheard", async () => {
        const { body } = await g2.json("listNodes");
        seen = JSON.stringify(
          body.nodes.map((n: { state: string; unheard: boolean }) => [n.state, n.unheard]),
        );
        return seen === '[["down",true]]';
      }).catch((error) => {
        throw new Error(`${error.message}; listNodes said ${seen}`);
      });
      // The first request waits for the check it started, then ends naming it.
      const first = await g2.json("execCommand", { name: "a", command: "echo up" }, {
        signal: AbortSignal.timeout(30_000),
      });
      assert.ok([503, 504].includes(first.status), JSON.stringify(first.body));
      assert.match(first.body.message, /'node-0' .*did not answer a health check/);
      assert.match(first.body.message, /cannot read etcd/);
      // The next is refused at once, with a Retry-After.
      const next = await g2.json("execCommand", { name: "a", command: "echo up" }, {
        signal: AbortSignal.timeout(30_000),
      });
      assert.equal(next.status, 503, JSON.stringify(next.body));
      assert.match(next.body.message, /did not answer a health check/);
      assert.ok(Number(next.headers.get("retry-after")) > 0);
      // Back: the check passes again and its sandboxes answer, etcd still stopped.
      node.process.child.kill("SIGCONT");
      frozen = false;
      let last = "";
      await waitUntil("g2 serves the node again", async () => {
        const r = await g2.json("execCommand", { name: "a", command: "echo up" });
        last = `${r.status} ${JSON.stringify(r.body)}`;
        return r.status === 200 && r.body.stdout === "up\n";
      }).catch((error) => {
        throw new Error(`${error.message}; the last answer: ${last}`);
      });
    } finally {
      if (frozen) node.process.child.kill("SIGCONT");
      await fleet.stop();
      await etcd.stop();
    }
  },
});
