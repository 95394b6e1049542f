import assert from "node:assert/strict";
import { checkIn } from "./_fixtures_test.ts";
import { FakeClock } from "../shared/clock.ts";
import { call, selfEndpoint, setup } from "./_app_fixtures_test.ts";

Deno.test("listNodes shows each node's state, age, reading and in-flight; removeNode refuses a live node", async () => {
  const { gateway, add } = setup();
  add("a");
  try {
    await (await call(gateway, "acquireSandbox", { name: "counted" })).body?.cancel();
    const { nodes } = await (await call(gateway, "listNodes", {})).json();
    assert.equal(nodes.length, 1);
    assert.equal(nodes[0].id, "a");
    assert.equal(nodes[0].state, "up");
    assert.equal(nodes[0].inFlight, 1);
    assert.equal(typeof nodes[0].lastCheckInAgeMs, "number");
    assert.equal(nodes[0].reading.cpuCount, 4);
    const live = await call(gateway, "removeNode", { nodeId: "a" });
    assert.equal(live.status, 409);
    assert.match((await live.json()).message, /still checks in/);
    const missing = await call(gateway, "removeNode", {});
    assert.equal(missing.status, 400);
    assert.match((await missing.json()).message, /'nodeId'/);
  } finally {
    gateway.close();
  }
});

Deno.test("removeNode leaves nothing of the node in the Finder's cache, its failure log or the Placer", async () => {
  const clock = new FakeClock();
  const { gateway, add } = setup({ clock });
  const a = add("a");
  const b = add("b");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  try {
    const exec = await call(gateway, "execCommand", { name: "x", command: "true" });
    assert.equal(exec.status, 200);
    await exec.body?.cancel();
    const made = await call(gateway, "acquireSandbox", { name: "new" });
    assert.equal(made.status, 200);
    await made.body?.cancel();
    b.silent = true;
    a.silent = true;
    const unsure = await call(gateway, "execCommand", { name: "ghost", command: "true" });
    assert.equal(unsure.status, 503);
    await unsure.body?.cancel();
    assert.equal(gateway.finder.failingNodes, 2);
    assert.ok(gateway.placer.tracked.nodes > 0);
    assert.ok(gateway.finder.cacheSize.name > 0);
    clock.tick(31_000);
    for (const nodeId of ["a", "b"]) {
      const removed = await call(gateway, "removeNode", { nodeId });
      assert.equal(removed.status, 200);
      await removed.body?.cancel();
    }
    assert.deepEqual(gateway.finder.cacheSize, { name: 0, id: 0 });
    assert.equal(gateway.finder.failingNodes, 0);
    assert.deepEqual(gateway.placer.tracked, { nodes: 0, names: 0 });
  } finally {
    gateway.close();
  }
});

Deno.test("every request the gateway sends a node carries its hop marker", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    for (
      const [verb, body] of [
        ["acquireSandbox", { name: "x" }],
        ["execCommand", { name: "x", command: "true" }],
        ["listSandboxes", {}],
        ["destroySandbox", { name: "x" }],
      ] as const
    ) {
      const res = await call(gateway, verb, body);
      assert.equal(res.status, 200, verb);
      await res.body?.cancel();
    }
    assert.deepEqual(a.calls, [
      "lookupSandbox",
      "acquireSandbox",
      "execCommand",
      "listSandboxes",
      "destroySandbox",
    ]);
    assert.deepEqual(a.hops, a.calls.map(() => "gw-unit"));
  } finally {
    gateway.close();
  }
});

Deno.test("a node endpoint that leads back to the gateway is refused at the door, not called for ever", async () => {
  const { gateway, add, selfCalls } = setup();
  add("a");
  try {
    const joined = await call(gateway, "checkIn", checkIn("rogue", selfEndpoint));
    assert.equal(joined.status, 200);
    await joined.body?.cancel();
    const listed = await call(gateway, "listSandboxes", {});
    assert.equal(listed.status, 200);
    const { unreachable } = await listed.json();
    assert.equal(unreachable.length, 1);
    assert.equal(unreachable[0].nodeId, "rogue");
    assert.match(unreachable[0].cause, /HTTP 508: .*came back to the gateway that sent it/);
    // One call to itself, refused: not a fan-out calling itself until the process dies.
    assert.equal(selfCalls(), 1);
    const missed = await call(gateway, "execCommand", { name: "ghost", command: "true" });
    assert.equal(missed.status, 503);
    assert.match((await missed.json()).message, /'rogue'.*leads back to this gateway/);
    assert.equal(selfCalls(), 2);
  } finally {
    gateway.close();
  }
});

Deno.test("checkIn refuses an endpoint that is the gateway's own listening address", async () => {
  const { gateway } = setup({ listenAddress: { hostname: "127.0.0.1", port: 3677 } });
  try {
    for (const endpoint of ["http://127.0.0.1:3677", "http://localhost:3677"]) {
      const res = await call(gateway, "checkIn", checkIn("rogue", endpoint));
      assert.equal(res.status, 400, endpoint);
      assert.match((await res.json()).message, /this gateway's own address.*DORMICE_NODE_ENDPOINT/);
    }
    assert.equal(gateway.fleet.size, 0);
    const other = await call(gateway, "checkIn", checkIn("a", "http://127.0.0.1:3676"));
    assert.equal(other.status, 200);
    await other.body?.cancel();
  } finally {
    gateway.close();
  }
});

Deno.test("setPools on a fleet no node has checked in with is a 409, not an empty success", async () => {
  const { gateway, add } = setup();
  const pools = [{ template: "base", warm: 2 }];
  try {
    const empty = await call(gateway, "setPools", { pools });
    assert.equal(empty.status, 409);
    const { message } = await empty.json();
    assert.match(message, /^No node has checked in with this gateway, so setPools reached no node/);
    assert.match(message, /DORMICE_GATEWAY_ENDPOINT/);
    // Naming nodes still answers one result each, the unknown ones failed.
    const named = await call(gateway, "setPools", { pools, nodeIds: ["a"] });
    assert.equal(named.status, 200);
    assert.deepEqual((await named.json()).results, [
      {
        nodeId: "a",
        ok: false,
        error: "No node 'a' in the fleet: listNodes shows the registered ids",
      },
    ]);
    const a = add("a");
    const sent = await call(gateway, "setPools", { pools });
    assert.equal(sent.status, 200);
    assert.deepEqual((await sent.json()).results, [
      { nodeId: "a", ok: true, pools: [{ template: "base", spec: {}, warm: 2 }] },
    ]);
    assert.deepEqual(a.calls, ["setPools"]);
  } finally {
    gateway.close();
  }
});

Deno.test("createGateway() declares a long-silent node dead after 10 minutes by default: listNodes says so and its names are free", async () => {
  const clock = new FakeClock();
  const { gateway, add, nodes } = setup({ clock });
  const a = add("a");
  add("b");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  try {
    nodes.delete(a.endpoint); // its machine is gone
    clock.tick(31_000);
    gateway.fleet.checkIn(checkIn("b", "http://b.test:3676"));
    const held = await call(gateway, "acquireSandbox", { name: "x" });
    assert.equal(held.status, 503, "down: the name may live only there");
    assert.match((await held.json()).message, /DORMICE_GATEWAY_NODE_DEAD_AFTER_S/);
    clock.tick(600_000);
    gateway.fleet.checkIn(checkIn("b", "http://b.test:3676"));
    gateway.sweep();
    const { nodes: listed } = await (await call(gateway, "listNodes", {})).json();
    assert.deepEqual(listed.map((n: { id: string; state: string }) => [n.id, n.state]), [
      ["a", "dead"],
      ["b", "up"],
    ]);
    const made = await call(gateway, "acquireSandbox", { name: "x" });
    assert.equal(made.status, 200, "dead: its names are free");
    await made.body?.cancel();
  } finally {
    gateway.close();
  }
});

Deno.test("createGateway({ nodeDeadAfterMs: 0 }) never declares a node dead", async () => {
  const clock = new FakeClock();
  const { gateway, add, nodes } = setup({ clock, nodeDeadAfterMs: 0 });
  const a = add("a");
  add("b");
  try {
    nodes.delete(a.endpoint);
    clock.tick(86_400_000);
    gateway.fleet.checkIn(checkIn("b", "http://b.test:3676"));
    const { nodes: listed } = await (await call(gateway, "listNodes", {})).json();
    assert.equal(listed[0].state, "down");
    const held = await call(gateway, "acquireSandbox", { name: "x" });
    assert.equal(held.status, 503);
    await held.body?.cancel();
  } finally {
    gateway.close();
  }
});
