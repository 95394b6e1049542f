/**
 * A gateway mounted at `/fleet` inside a host Hono app that asks its own header of every request,
 * with a node checking in there and a sandbox acquired through `/fleet`: the whole fleet in
 * process, imported only through the package's entry points (`deno.json` links the package from
 * its path, as a project that depends on `jsr:@dormice/cluster` would import it).
 */
import assert from "node:assert/strict";
import { Hono } from "hono";
import { createGateway } from "@dormice/cluster";
import { createNodeApp, FakeExecutor, Ledger, type NodeApp } from "@dormice/cluster/node";

const token = "s".repeat(32);
const hostSecret = "host-secret-0123";

Deno.test("a gateway mounted at /fleet behind a host app's own header: a node checks in there and an acquire goes through", async () => {
  // The node's origin, answered by the node app below (the gateway reaches it through `fetch`).
  const nodeOrigin = "http://node-a.test:3676";
  // The gateway's way to the node, set once the node is built (it needs the host app first).
  const toNode: { node?: NodeApp } = {};
  await using gateway = createGateway({
    token,
    sweepIntervalMs: 60_000,
    // The node's own `fetch` handler, as the narrow `(request) => Response` the options take.
    fetch: (request) => toNode.node!.fetch(request),
  });
  const host = new Hono();
  const seen: string[] = [];
  host.use("*", async (c, next) => {
    seen.push(`${c.req.method} ${new URL(c.req.url).pathname}`);
    if (c.req.header("x-host-auth") !== hostSecret) {
      return c.json({ message: "the host wants x-host-auth" }, 403);
    }
    await next();
  });
  host.mount("/fleet", gateway.fetch);

  const node = createNodeApp({
    config: {
      apiToken: token,
      dataDir: ".",
      nodeId: "node-a",
      nodeEndpoint: nodeOrigin,
      gatewayEndpoint: "https://host.test/fleet",
      gatewayCheckInHeader: { name: "x-host-auth", value: hostSecret },
      checkInIntervalSeconds: 15,
      scanIntervalSeconds: 60,
    },
    executor: new FakeExecutor(),
    ledger: Ledger.inMemory({ nodeId: "node-a", endpoint: nodeOrigin }),
    // A Hono app's `request`: the node checks in through the host, behind its header.
    fetch: (request: Request) => host.request(request),
  });
  toNode.node = node;
  try {
    const outcome = await node.checkInNow();
    assert.deepEqual(outcome, { ok: true, status: 200 }, JSON.stringify(outcome));
    assert.deepEqual(seen, ["POST /fleet/checkIn"]);
    assert.ok(gateway.fleet.get("node-a"), "the node is a member");

    const res = await host.request("/fleet/acquireSandbox", {
      method: "POST",
      headers: {
        "x-host-auth": hostSecret,
        authorization: `Bearer ${token}`,
        "content-type": "application/json",
      },
      body: JSON.stringify({ name: "through-fleet" }),
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.equal(body.sandbox.name, "through-fleet");
    assert.equal(body.sandbox.nodeId, "node-a");

    // The host's own auth still stands in front of the gateway.
    const refused = await host.request("/fleet/healthz");
    assert.equal(refused.status, 403);
    await refused.body?.cancel();
  } finally {
    await node.close();
  }
});
