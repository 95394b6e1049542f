import assert from "node:assert/strict";
import { Hono } from "hono";
import { createGateway, Fleet } from "../mod.ts";
import { FakeClock } from "../shared/clock.ts";
import { checkIn, recordingLog } from "./_fixtures_test.ts";

const token = "t".repeat(32);

Deno.test("createGateway({ token }) as the README embeds it serves the E2B control plane", async () => {
  await using gateway = createGateway({ token });
  const res = await gateway.fetch(
    new Request("http://gw.test/e2b/api/sandboxes", {
      method: "POST",
      headers: { "x-api-key": token, "content-type": "application/json" },
      body: JSON.stringify({ templateID: "base" }),
    }),
  );
  const body = await res.json();
  // No node has checked in: the E2B face answers in its own dialect, not the native 404.
  assert.notEqual(res.status, 404, JSON.stringify(body));
  assert.equal(body.code, res.status, JSON.stringify(body));
  assert.match(body.message, /node/);
});

Deno.test("createGateway({ faces }) leaves out the faces set to false", async () => {
  await using gateway = createGateway({ token, faces: { e2b: false, operator: false } });
  const auth = { authorization: `Bearer ${token}`, "x-api-key": token };
  for (const path of ["/e2b/api/sandboxes", "/metrics", "/ui"]) {
    const res = await gateway.fetch(new Request(`http://gw.test${path}`, { headers: auth }));
    assert.equal(res.status, 404, path);
    assert.match((await res.json()).message, /the gateway answers/, path);
  }
  const health = await gateway.fetch(new Request("http://gw.test/healthz"));
  assert.equal(health.status, 200);
  await health.body?.cancel();
});

Deno.test("createGateway() sweeps for down nodes on its own timer until close()", async () => {
  const clock = new FakeClock();
  const { log, lines } = recordingLog();
  const gateway = createGateway({ token, clock, timers: clock, log, sweepIntervalMs: 1000 });
  gateway.fleet.checkIn(checkIn("n1"));
  assert.equal(clock.pendingTimers, 1);
  // Two 15 s intervals without a check-in: down, announced by the gateway's own sweep.
  clock.tick(31_000);
  assert.ok(lines.some((l) => l.msg.startsWith("node is down") && l.fields.nodeId === "n1"));
  assert.equal(clock.pendingTimers, 1, "one sweep timer, rescheduled");
  const closed = gateway.close();
  assert.equal(gateway.close(), closed, "close() twice is the same promise");
  await closed;
  assert.equal(clock.pendingTimers, 0);
});

Deno.test("createGateway(): await using closes the real sweep timer (the sanitizers check)", async () => {
  await using gateway = createGateway({ token, sweepIntervalMs: 5 });
  const res = await gateway.fetch(new Request("http://gw.test/healthz"));
  assert.equal(res.status, 200);
  await res.body?.cancel();
});

Deno.test("an HttpError the Fleet throws inside a host Hono app is answered with its status, not a 500", async () => {
  const fleet = new Fleet();
  try {
    const host = new Hono();
    host.delete("/nodes/:id", (c) => {
      fleet.removeNode(c.req.param("id"));
      return c.body(null, 204);
    });
    const res = await host.request("/nodes/nope", { method: "DELETE" });
    assert.equal(res.status, 404);
    assert.match((await res.json()).message, /No node 'nope' in the fleet/);
  } finally {
    fleet.close();
  }
});

Deno.test("a gateway mounted in a host Hono app answers there as it does alone", async () => {
  await using gateway = createGateway({ token });
  const host = new Hono();
  host.mount("/fleet", gateway.fetch);
  const res = await host.request("/fleet/e2b/api/sandboxes", {
    method: "POST",
    headers: { "x-api-key": "wrong" },
    body: "{}",
  });
  assert.equal(res.status, 401);
  assert.equal((await res.json()).code, 401);
});

Deno.test("createGateway() refuses bad options in the embedder's words, every one at once", () => {
  assert.throws(
    () => createGateway({ token: "short" }),
    (error: Error) => {
      assert.ok(error instanceof TypeError);
      assert.match(
        error.message,
        /^Cannot create the gateway: token is 5 characters long: pass at least 32/,
      );
      return true;
    },
  );
  assert.throws(
    () => createGateway({ token, cpuLimitPct: 250, activeLimit: -1, lookupTimeoutMs: Number.NaN }),
    (error: Error) => {
      assert.match(error.message, /cpuLimitPct is 250: pass a percentage above 0 and at most 100/);
      assert.match(error.message, /activeLimit is -1: pass a positive whole number/);
      assert.match(error.message, /lookupTimeoutMs is NaN: pass a whole number of milliseconds/);
      // Named as the embedder passed them: no daemon variable it never set.
      assert.doesNotMatch(error.message, /DORMICE_/);
      return true;
    },
  );
  assert.throws(
    () => createGateway({ token, lookupDigests: "sole-writer", etcd: { endpoints: ["http://e"] } }),
    /lookupDigests "sole-writer" cannot go with etcd/,
  );
  // At the edges the daemon allows, nothing is refused.
  const fine = createGateway({ token, cpuLimitPct: 100, minDiskGB: 0, nodeDeadAfterMs: 0 });
  void fine.close();
});
