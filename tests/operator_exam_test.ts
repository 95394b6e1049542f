/**
 * The operator's view through real processes: a gateway and two nodes on loopback.
 *
 * - `/metrics` on the gateway and on each node parses as Prometheus text, its counters move with
 *   the traffic this test sends, and no label carries the fleet token, a key, a sandbox's name
 *   or id;
 * - a webhook receiver on loopback gets every event of a create, pause, resume, timeout-kill
 *   sequence, each signed; while it is down the events wait, and once it is back it gets them.
 */
import assert from "node:assert/strict";
import { newToken } from "./_processes.ts";
import { postJson } from "./_gateway.ts";
import { e2b, fleet, scrape, until } from "./_operator_fleet.ts";
import { startWebhookReceiver } from "./_webhook_receiver.ts";

Deno.test({
  name: "GET /metrics on the gateway and every node: Prometheus text that moves with traffic",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const f = await fleet();
  try {
    const { gateway, token, nodes } = f;
    const minted = await gateway.json("createApiKey", { team: "acme", label: "metrics-test" });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const key: string = minted.body.key;
    const name = "metrics-secret-name-7f3a";

    const before = (await scrape(gateway.url, token)).exposition;
    const acquired = await postJson(gateway.url, key, "acquireSandbox", { name });
    assert.equal(acquired.status, 200, JSON.stringify(acquired.body));
    const sandboxId: string = acquired.body.sandbox.id;
    for (let i = 0; i < 3; i++) {
      const r = await postJson(gateway.url, key, "execCommand", { name, command: "echo hi" });
      assert.equal(r.status, 200, JSON.stringify(r.body));
    }
    // A name no node has: one lookup round, answered none.
    const missing = await postJson(gateway.url, key, "execCommand", {
      name: "never-made",
      command: "true",
    });
    assert.equal(missing.status, 404);
    // The check-ins bring the team's count and the new census.
    await until("the check-ins count the sandbox", async () => {
      const { exposition } = await scrape(gateway.url, token);
      return exposition.value("dormice_gateway_team_running_sandboxes", { team: "acme" }) === 1;
    });

    const { text, exposition: after } = await scrape(gateway.url, token);
    const moved = (name: string, labels?: Record<string, string>) =>
      after.value(name, labels) - before.value(name, labels);
    assert.equal(after.value("dormice_gateway_nodes", { state: "up" }), 2);
    assert.equal(after.value("dormice_gateway_nodes", { state: "down" }), 0);
    assert.equal(moved("dormice_gateway_placements_total", { outcome: "placed" }), 1);
    assert.ok(
      moved("dormice_gateway_forwards_total", { face: "native", status: "200" }) >= 4,
      "the create and three execs were forwarded",
    );
    assert.ok(moved("dormice_gateway_forward_duration_seconds_count", { face: "native" }) >= 4);
    assert.ok(moved("dormice_gateway_finder_cache_requests_total", { result: "hit" }) >= 3);
    assert.ok(moved("dormice_gateway_lookup_rounds_total", { outcome: "none" }) >= 1);
    assert.ok(moved("dormice_gateway_lookup_node_asks_total") >= 2);
    assert.ok(after.value("dormice_gateway_finder_cache_entries", { index: "id" }) >= 1);
    assert.equal(after.value("dormice_gateway_config_digest_mismatches"), 0);
    assert.equal(after.value("dormice_gateway_busy_slots"), 0);
    assert.equal(
      after.value("dormice_gateway_sandboxes", { state: "active" }),
      1,
      "one active sandbox over both nodes",
    );
    // Conventions: every counter is a _total, every family has help.
    for (const [family, type] of after.types) {
      assert.ok(family.startsWith("dormice_"), family);
      if (type === "counter") assert.ok(family.endsWith("_total"), family);
      assert.ok(after.help.get(family), `${family} has HELP`);
    }
    // No secret and no unbounded value in a label or anywhere in the text.
    for (const secret of [token, key, name, sandboxId]) {
      assert.ok(!text.includes(secret), `the exposition mentions '${secret.slice(0, 8)}…'`);
    }

    // The operator's only: a key is refused, nothing at all is a 401.
    const byKey = await fetch(`${gateway.url}/metrics`, {
      headers: { authorization: `Bearer ${key}` },
    });
    assert.equal(byKey.status, 403, await byKey.text());
    const bare = await fetch(`${gateway.url}/metrics`);
    assert.equal(bare.status, 401, await bare.text());

    // Each node: its census, its executor calls, its check-ins.
    let creates = 0;
    for (const node of nodes) {
      const { text: nodeText, exposition: n } = await scrape(node.url, token);
      creates += n.value("dormice_node_executor_operations_total", {
        operation: "create",
        outcome: "ok",
      });
      assert.ok(n.value("dormice_node_check_ins_total", { outcome: "ok" }) >= 1, node.url);
      assert.ok(n.types.get("dormice_node_executor_operation_duration_seconds") === "histogram");
      for (const secret of [token, key, name, sandboxId]) assert.ok(!nodeText.includes(secret));
      const refused = await fetch(`${node.url}/metrics`);
      assert.equal(refused.status, 401, await refused.text());
    }
    assert.equal(creates, 1, "one create over both nodes");
    const holder = nodes.find((n) => acquired.body.sandbox.endpoint === n.url)!;
    const held = (await scrape(holder.url, token)).exposition;
    assert.equal(held.value("dormice_node_sandboxes", { state: "active" }), 1);
    assert.ok(
      held.value("dormice_node_executor_operations_total", { operation: "exec", outcome: "ok" }) >=
        3,
    );
  } finally {
    await f.stop();
  }
});

Deno.test({
  name: "Lifecycle webhooks: signed events for create, pause, resume and a timeout kill; " +
    "retried to a receiver that was down",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const secret = newToken();
  const receiver = startWebhookReceiver(secret);
  const f = await fleet({ DORMICE_WEBHOOK_URL: receiver.url, DORMICE_WEBHOOK_SECRET: secret });
  try {
    const { gateway } = f;
    const created = await e2b(gateway, "POST", "/sandboxes", {
      templateID: "base",
      timeout: 300,
      metadata: { name: "hooked-1" },
    });
    assert.equal(created.status, 201, await created.clone().text());
    const { sandboxID: id } = await created.json();
    const paused = await e2b(gateway, "POST", `/sandboxes/${id}/pause`);
    assert.equal(paused.status, 204, await paused.text());
    // Resumed with a one-second life: the node's scanner kills it, no client watching.
    const resumed = await e2b(gateway, "POST", `/sandboxes/${id}/resume`, { timeout: 1 });
    assert.equal(resumed.status, 201, await resumed.text());

    const of = (sandboxId: string) =>
      receiver.deliveries.filter((d) => d.event.sandbox.id === sandboxId);
    await until(
      "the timeout kill reaches the receiver",
      () => of(id).some((d) => d.event.type === "timed_out"),
    );
    const events = of(id);
    assert.deepEqual(events.map((d) => d.event.type), [
      "created",
      "paused",
      "resumed",
      "timed_out",
    ]);
    for (const d of events) {
      assert.ok(d.signed, `${d.event.type} carries a valid signature`);
      assert.equal(d.eventIdHeader, d.event.id);
      assert.equal(d.event.sandbox.name, "hooked-1");
      assert.equal(d.event.sandbox.team, "default");
      assert.match(d.event.nodeId, /^node-[ab]$/);
      assert.ok(Date.parse(d.event.at) > 0, d.event.at);
      assert.ok(d.event.reason && d.event.detail, JSON.stringify(d.event));
    }
    assert.equal(new Set(events.map((d) => d.event.nodeId)).size, 1);
    assert.deepEqual(events.map((d) => d.event.reason), [
      "placed",
      "requested",
      "requested",
      "timeout",
    ]);
    assert.equal(events[3].event.source, "node");

    // The receiver goes down; its events wait for it.
    await receiver.down();
    const second = await e2b(gateway, "POST", "/sandboxes", {
      templateID: "base",
      metadata: { name: "hooked-2" },
    });
    const secondBody = await second.json();
    assert.equal(second.status, 201, JSON.stringify(secondBody));
    const id2: string = secondBody.sandboxID;
    const killed = await e2b(gateway, "DELETE", `/sandboxes/${id2}`);
    assert.equal(killed.status, 204, await killed.text());
    await until(
      "a failed delivery is counted",
      async () =>
        (await scrape(gateway.url, gateway.token)).exposition.value(
          "dormice_gateway_webhook_deliveries_total",
          { outcome: "failed" },
        ) >= 2,
    );
    assert.equal(of(id2).length, 0);

    receiver.up();
    await until("the retried events arrive", () => of(id2).length === 2);
    assert.deepEqual(of(id2).map((d) => [d.event.type, d.signed]), [
      ["created", true],
      ["killed", true],
    ]);

    // A receiver that hangs slows nothing: with its delivery of a create held unanswered, the
    // kill is answered while the gateway still waits on that delivery (a kill that waited for
    // it would find it given up after the 5 s delivery timeout).
    receiver.hold();
    const third = await e2b(gateway, "POST", "/sandboxes", {
      templateID: "base",
      metadata: { name: "hooked-3" },
    });
    const thirdBody = await third.json();
    assert.equal(third.status, 201, JSON.stringify(thirdBody));
    const id3: string = thirdBody.sandboxID;
    await until(
      "the receiver holds the create's delivery",
      () => receiver.held.some((h) => h.delivery.event.sandbox.id === id3),
    );
    const parked = receiver.held.find((h) => h.delivery.event.sandbox.id === id3)!;
    const killed3 = await e2b(gateway, "DELETE", `/sandboxes/${id3}`);
    assert.equal(killed3.status, 204, await killed3.text());
    assert.equal(parked.signal.aborted, false, "the kill waited for the held delivery to give up");
    receiver.release();
    await until(
      "the held events are delivered",
      () => of(id3).filter((d) => d.event.type === "killed").length > 0,
    );
    assert.deepEqual(of(id3).map((d) => d.event.type), ["created", "killed"]);

    const m = (await scrape(gateway.url, gateway.token)).exposition;
    assert.equal(m.value("dormice_gateway_webhook_events_dropped_total"), 0);
    assert.equal(m.value("dormice_gateway_webhook_queue_events"), 0);
  } finally {
    await f.stop();
    await receiver.stop();
  }
});
