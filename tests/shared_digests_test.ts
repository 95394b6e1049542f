/**
 * Shared mode, black box: lookup digests on by default with three gateways on a real etcd and
 * three fake-executor nodes that check in with the third gateway only. A name created through
 * one gateway is found through another at once (its record in etcd names the node before the
 * node's digest shows it), and with one node frozen a miss answers `none` at once instead of
 * `unsure` after the lookup deadline, while the frozen node's own name stays unsure; a create made
 * on a node directly is found through every gateway at once, and two owners are a 409 at once.
 * Skipped,
 * saying why, when etcd is not installed.
 */
import assert from "node:assert/strict";
import { etcdMissing, startEtcd } from "./support/etcd.ts";
import { type GatewayProcess, postJson, startGateway } from "./_gateway.ts";
import { newToken, type NodeProcess, startNode } from "./_processes.ts";

const missing = etcdMissing();
const skip = missing === null ? "" : ` (skipped: ${missing})`;

async function waitUntil(what: string, check: () => Promise<boolean>, timeoutMs = 20_000) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Timed out after ${timeoutMs} ms waiting until ${what}`);
}

/** The node's state in `g`'s listNodes; a node down only for lack of news reads "unheard". */
async function stateOf(g: GatewayProcess, nodeId: string): Promise<string | undefined> {
  const { body } = await g.json("listNodes");
  const node = body.nodes.find((n: { id: string }) => n.id === nodeId);
  return node?.unheard ? "unheard" : node?.state;
}

Deno.test({
  name:
    `shared mode digests: a name made through one gateway is found through another at once, and a frozen node blocks only its own names${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    // A three-member cluster, as the shared-mode promises are held to.
    const etcd = await startEtcd(3);
    const token = newToken();
    const started: { stop(): Promise<unknown> }[] = [];
    let frozen: NodeProcess | undefined;
    try {
      const env = {
        DORMICE_GATEWAY_ETCD: etcd.endpoints,
        DORMICE_GATEWAY_ETCD_PREFIX: `/t-${crypto.randomUUID().slice(0, 8)}/`,
        // The host's real CPU use is noise from whatever else runs on the machine.
        DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      };
      const gateways = await Promise.all([0, 1, 2].map(() => startGateway({ token, env })));
      started.push(...gateways);
      const [g1, g2, g3] = gateways;
      // Every node checks in with g3 only: g1 and g2 hear of them, and of their digests, through
      // etcd. A 2 s interval: a new name is not in any digest for the lookups right after it.
      const nodes = await Promise.all([0, 1, 2].map((i) =>
        startNode({
          token,
          env: {
            DORMICE_GATEWAY_ENDPOINT: g3.url,
            DORMICE_NODE_ID: `node-${i}`,
            DORMICE_CHECK_IN_INTERVAL_SECONDS: "2",
          },
        })
      ));
      started.push(...nodes);
      for (const g of gateways) {
        await waitUntil(`${g.url} sees three nodes up`, async () => {
          for (let i = 0; i < 3; i++) if (await stateOf(g, `node-${i}`) !== "up") return false;
          return true;
        });
      }
      // A name on node-2, made there directly (the node pushes it to g3 before it builds), then
      // node-2's next regular check-ins carry it to every gateway.
      const held = await postJson(nodes[2].url, token, "acquireSandbox", { name: "held-2" });
      assert.equal(held.status, 200, JSON.stringify(held.body));
      await new Promise((r) => setTimeout(r, 5000));
      // Digests are on by default in shared mode: a miss asks nobody once digests are in.
      const nobody = await g1.json("lookupSandbox", { name: "nobody" });
      assert.equal(nobody.status, 200, JSON.stringify(nobody.body));
      assert.equal(nobody.body.found, false, JSON.stringify(nobody.body));

      nodes[2].process.child.kill("SIGSTOP");
      frozen = nodes[2];
      // Down, not just unheard: the placer sends nothing there any more.
      for (const g of gateways) {
        await waitUntil(
          `${g.url} sees node-2 down`,
          async () => await stateOf(g, "node-2") === "down",
        );
      }

      for (let i = 0; i < 8; i++) {
        const [maker, finder] = i % 2 === 0 ? [g1, g2] : [g2, g1];
        const name = `fresh-${i}`;
        // A miss for a name nobody holds answers at once: node-2's last digest rules it out.
        const miss = await finder.json("lookupSandbox", { name: `never-${i}` });
        assert.equal(
          miss.status,
          200,
          `never-${i} with node-2 frozen: ${JSON.stringify(miss.body)}`,
        );
        assert.equal(miss.body.found, false, JSON.stringify(miss.body));

        const made = await maker.json("acquireSandbox", { name });
        assert.equal(made.status, 200, `${name}: ${JSON.stringify(made.body)}`);
        assert.equal(made.body.created, true, JSON.stringify(made.body));
        const id = made.body.sandbox.id;
        // At once, through the other gateway, by name and by id: no node's digest shows it yet.
        const byName = await finder.json("lookupSandbox", { name });
        assert.equal(byName.body.found, true, `${name} by name: ${JSON.stringify(byName.body)}`);
        assert.equal(byName.body.sandbox.id, id);
        const byId = await finder.json("lookupSandbox", { id });
        assert.equal(byId.body.found, true, `${name} by id: ${JSON.stringify(byId.body)}`);
        // And a create of the same name through the third gateway wakes it, builds nothing.
        const again = await g3.json("acquireSandbox", { name });
        assert.equal(again.status, 200, JSON.stringify(again.body));
        assert.equal(again.body.created, false, JSON.stringify(again.body));
        assert.equal(again.body.sandbox.id, id);
      }

      // A create made on a node directly, behind every gateway's back: the node's pushed
      // check-in (to g3) records it in etcd before the build, so g1 and g2 find it at once.
      for (let i = 0; i < 4; i++) {
        const name = `direct-${i}`;
        const made = await postJson(nodes[i % 2].url, token, "acquireSandbox", { name });
        assert.equal(made.status, 200, JSON.stringify(made.body));
        const byName = await g1.json("lookupSandbox", { name });
        assert.equal(byName.body.found, true, `${name} by name: ${JSON.stringify(byName.body)}`);
        const byId = await g2.json("lookupSandbox", { id: made.body.sandbox.id });
        assert.equal(byId.body.found, true, `${name} by id: ${JSON.stringify(byId.body)}`);
      }

      // Two owners, each made directly on its node: both are recorded, so the next lookup
      // through another gateway asks both and answers the conflict (409 naming both) at once.
      for (const node of nodes.slice(0, 2)) {
        const made = await postJson(node.url, token, "acquireSandbox", { name: "twice" });
        assert.equal(made.status, 200, JSON.stringify(made.body));
      }
      const both = await g1.json("execCommand", { name: "twice", command: "echo x" });
      assert.equal(both.status, 409, JSON.stringify(both.body));
      assert.match(both.body.message, /node-0/);
      assert.match(both.body.message, /node-1/);

      // The frozen node's own name stays unsure everywhere: never built a second time.
      for (const g of gateways) {
        const r = await g.json("acquireSandbox", { name: "held-2" });
        assert.equal(r.status, 503, JSON.stringify(r.body));
        assert.match(r.body.message, /node-2/);
      }
      for (const node of nodes.slice(0, 2)) {
        const { body } = await postJson(node.url, token, "lookupSandbox", { name: "held-2" });
        assert.equal(body.found, false, "held-2 was built again elsewhere");
      }
    } catch (error) {
      // What the gateways logged (a record they could not read, a round's reasons) says why.
      for (const p of started) {
        const spawned = (p as { process?: { stdout(): string; stderr(): string } }).process;
        const out = `${spawned?.stdout() ?? ""}\n${spawned?.stderr() ?? ""}`;
        for (const line of out.split("\n")) {
          if (/recent creates|warn|error/.test(line)) console.error(line.slice(0, 400));
        }
      }
      throw error;
    } finally {
      frozen?.process.child.kill("SIGCONT");
      for (const p of started.reverse()) await p.stop().catch(() => {});
      await etcd.stop();
    }
  },
});
