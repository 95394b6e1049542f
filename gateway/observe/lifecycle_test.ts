import assert from "node:assert/strict";
import { buildGateway } from "../app.ts";
import type { LifecycleEvent } from "./webhooks.ts";
import { checkIn } from "../_fixtures_test.ts";
import { FakeClock } from "../../shared/clock.ts";

const token = "t".repeat(32);

/** A gateway whose webhook deliveries land in `events`. */
function gatewayWithHook() {
  const clock = new FakeClock();
  const events: LifecycleEvent[] = [];
  const gateway = buildGateway({
    token,
    clock,
    webhook: {
      url: "http://127.0.0.1:1/hook",
      secret: "s".repeat(32),
      fetch: async (request: Request) => {
        events.push(await request.json());
        return new Response(null, { status: 204 });
      },
    },
  });
  return { gateway, clock, events };
}

Deno.test("A node that goes down sends node_lost for each sandbox the cache places there", async () => {
  const { gateway, clock, events } = gatewayWithHook();
  gateway.fleet.checkIn(checkIn("node-a", "http://10.0.0.1:3676"));
  gateway.fleet.checkIn(checkIn("node-b", "http://10.0.0.2:3676"));
  const a = gateway.fleet.get("node-a")!;
  gateway.finder.remember(a, { id: "sbx_1", name: "agent-1", state: "active", team: "acme" });
  gateway.finder.remember(gateway.fleet.get("node-b")!, {
    id: "sbx_2",
    name: "agent-2",
    state: "active",
  });
  clock.tick(20_000);
  gateway.fleet.checkIn(checkIn("node-b", "http://10.0.0.2:3676"));
  clock.tick(11_000); // node-a silent 31 s > two 15 s intervals; node-b heard 11 s ago
  assert.deepEqual(gateway.sweep(), ["node-a"]);
  assert.ok(await gateway.webhooks!.idle(2000));
  assert.equal(events.length, 1);
  const [lost] = events;
  assert.equal(lost.type, "node_lost");
  assert.equal(lost.reason, "node_down");
  assert.deepEqual(lost.sandbox, { id: "sbx_1", name: "agent-1", team: "acme" });
  assert.equal(lost.nodeId, "node-a");
  assert.match(lost.detail, /has not checked in for 31 s/);
  gateway.close();
});

Deno.test("Node-reported events reach the webhook once, and a killed sandbox leaves the cache", async () => {
  const { gateway, events } = gatewayWithHook();
  const body = {
    ...checkIn("node-a", "http://10.0.0.1:3676"),
    events: [{
      id: "ev-1",
      type: "timed_out" as const,
      at: 1_700_000_000_000,
      reason: "timeout",
      detail: "Killed by the node's deadline scanner",
      sandbox: { id: "sbx_1", name: "agent-1", team: "default" },
    }],
  };
  gateway.fleet.checkIn(body);
  gateway.finder.remember(gateway.fleet.get("node-a")!, {
    id: "sbx_1",
    name: "agent-1",
    state: "active",
  });
  const post = () =>
    gateway.fetch(
      new Request("http://gw/checkIn", {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
  // The same check-in twice: the node did not hear the first answer and sent it again.
  assert.equal((await post()).status, 200);
  assert.equal((await post()).status, 200);
  assert.ok(await gateway.webhooks!.idle(2000));
  assert.deepEqual(events.map((e) => [e.id, e.type, e.source, e.at]), [
    ["ev-1", "timed_out", "node", "2023-11-14T22:13:20.000Z"],
  ]);
  assert.equal(gateway.finder.cached("id", "sbx_1"), undefined, "the killed sandbox is evicted");
  gateway.close();
});

Deno.test("Without a webhook the gateway builds no events and still accepts events in check-ins", async () => {
  const gateway = buildGateway({ token });
  assert.equal(gateway.lifecycle.enabled, false);
  assert.equal(gateway.webhooks, undefined);
  const res = await gateway.fetch(
    new Request("http://gw/checkIn", {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({
        ...checkIn("node-a", "http://10.0.0.1:3676"),
        events: [{
          id: "ev-1",
          type: "paused",
          at: 1,
          reason: "timeout",
          detail: "x",
          sandbox: { id: "s", name: "n", team: "default" },
        }],
      }),
    }),
  );
  assert.equal(res.status, 200, await res.text());
  gateway.close();
});
