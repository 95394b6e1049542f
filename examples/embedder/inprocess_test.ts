/**
 * A whole fleet in one process: a gateway (`createGateway`) and two nodes (`createNodeApp` on the
 * fake executor, in-memory ledgers), each reaching the others through their `fetch` handlers, so
 * no socket is opened. Driven first with `fetch`-style Requests handed to `gateway.fetch`, then
 * with the official `e2b` SDK, which needs a URL: a `Deno.serve` on 127.0.0.1:0 serving the same
 * `gateway.fetch`. Imported only through the package's entry points.
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { createGateway, type Gateway } from "@dormice/cluster";
import { createNodeApp, Ledger, type NodeApp } from "@dormice/cluster/node";

const token = "i".repeat(32);
const gatewayOrigin = "http://gateway.internal";

/** A gateway and nodes `ids`, each node at `http://<id>.internal:3676`, checked in once. */
async function inProcessFleet(ids: string[]): Promise<
  { gateway: Gateway; nodes: Map<string, NodeApp>; close(): Promise<void> }
> {
  // The gateway reaches a node by its endpoint's host: `<id>.internal:3676`.
  const nodes = new Map<string, NodeApp>();
  const gateway = createGateway({
    token,
    fetch: (request) => {
      const node = nodes.get(new URL(request.url).hostname.replace(/\.internal$/, ""));
      return node ? node.fetch(request) : new Response("no such node", { status: 502 });
    },
  });
  for (const id of ids) {
    const endpoint = `http://${id}.internal:3676`;
    nodes.set(
      id,
      createNodeApp({
        config: {
          apiToken: token,
          dataDir: ".",
          nodeId: id,
          nodeEndpoint: endpoint,
          gatewayEndpoint: gatewayOrigin,
          checkInIntervalSeconds: 15,
          scanIntervalSeconds: 60,
        },
        ledger: Ledger.inMemory({ nodeId: id, endpoint }),
        // The node's check-ins go straight to the gateway's handler.
        fetch: gateway.fetch,
      }),
    );
  }
  for (const node of nodes.values()) {
    assert.deepEqual(await node.checkInNow(), { ok: true, status: 200 });
  }
  return {
    gateway,
    nodes,
    async close() {
      for (const node of nodes.values()) await node.close();
      await gateway.close();
    },
  };
}

/** A native verb through `gateway.fetch`: its status and JSON body. */
async function call(gateway: Gateway, verb: string, body: unknown = {}) {
  const res = await gateway.fetch(
    new Request(`${gatewayOrigin}/${verb}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    }),
  );
  return { status: res.status, body: await res.json() };
}

Deno.test("an in-process fleet, no sockets: nodes check in, sandboxes are placed and driven through gateway.fetch", async () => {
  const fleet = await inProcessFleet(["n1", "n2"]);
  try {
    const listed = await call(fleet.gateway, "listNodes");
    assert.equal(listed.status, 200, JSON.stringify(listed.body));
    assert.deepEqual(
      listed.body.nodes.map((n: { id: string; state: string }) => `${n.id} ${n.state}`).sort(),
      ["n1 up", "n2 up"],
    );

    const made = await call(fleet.gateway, "acquireSandbox", { name: "job-1" });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    assert.equal(made.body.created, true);
    const home = made.body.sandbox.nodeId;
    assert.ok(fleet.nodes.has(home), `placed on ${home}`);

    const ran = await call(fleet.gateway, "execCommand", { name: "job-1", command: "echo hi" });
    assert.equal(ran.status, 200, JSON.stringify(ran.body));
    assert.equal(ran.body.stdout, "hi\n");
    assert.equal(ran.body.exitCode, 0);

    // The same name again finds the same sandbox, wherever it lives.
    const again = await call(fleet.gateway, "acquireSandbox", { name: "job-1" });
    assert.equal(again.body.created, false);
    assert.equal(again.body.sandbox.id, made.body.sandbox.id);

    // The node holds it: asked directly, through its own handler.
    const direct = await fleet.nodes.get(home)!.fetch(
      new Request(`http://${home}.internal:3676/lookupSandbox`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify({ name: "job-1" }),
      }),
    );
    assert.equal((await direct.json()).found, true);

    const gone = await call(fleet.gateway, "destroySandbox", { name: "job-1" });
    assert.equal(gone.status, 200, JSON.stringify(gone.body));
    assert.equal(gone.body.destroyed, true);
  } finally {
    await fleet.close();
  }
});

Deno.test("an in-process fleet served on a loopback port answers the official e2b SDK", async () => {
  const fleet = await inProcessFleet(["n1", "n2"]);
  // The SDK speaks to URLs: the same gateway.fetch behind a real listener.
  const server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    fleet.gateway.fetch,
  );
  try {
    const url = `http://127.0.0.1:${server.addr.port}`;
    const sdk = { apiUrl: `${url}/e2b/api`, sandboxUrl: `${url}/e2b/envd`, apiKey: token };
    const sandbox = await Sandbox.create({ ...sdk, metadata: { job: "report" } });
    try {
      const run = await sandbox.commands.run("echo hello from the fleet");
      assert.equal(run.exitCode, 0);
      assert.equal(run.stdout, "hello from the fleet\n");
      await sandbox.files.write("/tmp/note.txt", "written through the gateway\n");
      assert.equal(await sandbox.files.read("/tmp/note.txt"), "written through the gateway\n");
      const info = await sandbox.getInfo();
      assert.deepEqual(info.metadata, { job: "report" });

      // The native face sees the sandbox the SDK made, on one of the two nodes.
      const listed = await call(fleet.gateway, "listSandboxes");
      const mine = listed.body.sandboxes.find((s: { id: string }) => s.id === sandbox.sandboxId);
      assert.ok(mine, JSON.stringify(listed.body));
      assert.ok(fleet.nodes.has(mine.nodeId), `placed on ${mine.nodeId}`);
    } finally {
      assert.equal(await sandbox.kill(), true);
    }
    assert.equal(await Sandbox.kill(sandbox.sandboxId, sdk), false, "killed once, then gone");
  } finally {
    await server.shutdown();
    await fleet.close();
  }
});
