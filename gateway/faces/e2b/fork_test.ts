/**
 * A fork through the gateway is held to the caller's key: each copy is admitted as a create
 * (`maxSandboxes`, `createsPerMinute`), the node is asked for the admitted ones only, and the
 * rest are answered as E2B's per-copy 429.
 */
import assert from "node:assert/strict";
import { FakeClock } from "../../../shared/clock.ts";
import { api, setup } from "./_fixtures_test.ts";

type Entry = { sandbox?: { sandboxID: string }; error?: { code: number; message: string } };

function asKey(key: string) {
  return { "x-api-key": key, "content-type": "application/json" };
}

Deno.test("E2B api: a fork's copies count against the key's maxSandboxes; the part past it is 429", async () => {
  const { gateway, add } = setup();
  const node = add("a");
  try {
    const { key } = gateway.keys.create({ team: "acme", maxSandboxes: 3 });
    const made = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base" }, asKey(key));
    assert.equal(made.status, 201);
    const { sandboxID } = await made.json();
    const fork = (count: number) =>
      api(gateway, "POST", `/sandboxes/${sandboxID}/fork`, { count }, asKey(key));
    const first = await fork(5);
    assert.equal(first.status, 201);
    const entries: Entry[] = await first.json();
    assert.equal(entries.length, 5, "one entry per copy asked");
    assert.deepEqual(node.forkBodies.map((b) => b.count), [2], "the node builds the admitted 2");
    assert.equal(entries.filter((e) => e.sandbox).length, 2);
    const refused = entries.slice(2);
    assert.ok(refused.every((e) => e.error?.code === 429), JSON.stringify(refused));
    assert.match(refused[0].error!.message, /maxSandboxes 3/);
    // The team is full now: a fork is one 429, and the node is not asked.
    const full = await fork(1);
    assert.equal(full.status, 429);
    assert.match((await full.json()).message, /maximum number of concurrent E2B sandboxes \(3\)/);
    assert.equal(node.forkBodies.length, 1);
    // And so is a create: the forked copies were counted.
    const create = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base" }, asKey(key));
    assert.equal(create.status, 429);
    await create.body?.cancel();
    // The fleet token has no limits: its fork is passed on whole.
    const operator = await api(gateway, "POST", `/sandboxes/${sandboxID}/fork`, { count: 4 });
    assert.equal(operator.status, 201);
    assert.equal((await operator.json()).length, 4);
    assert.deepEqual(node.forkBodies.map((b) => b.count), [2, 4]);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a fork's copies spend the key's createsPerMinute", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const { gateway, add } = setup({ clock });
  const node = add("a");
  try {
    const { key } = gateway.keys.create({ team: "acme", createsPerMinute: 3 });
    const made = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base" }, asKey(key));
    assert.equal(made.status, 201);
    const { sandboxID } = await made.json();
    const fork = (count: number) =>
      api(gateway, "POST", `/sandboxes/${sandboxID}/fork`, { count }, asKey(key));
    const first = await fork(3);
    assert.equal(first.status, 201);
    const entries: Entry[] = await first.json();
    assert.deepEqual(entries.map((e) => e.sandbox ? "built" : e.error?.code), [
      "built",
      "built",
      429,
    ]);
    assert.match(entries[2].error!.message, /createsPerMinute 3/);
    const none = await fork(1);
    assert.equal(none.status, 429);
    assert.ok(none.headers.get("retry-after"), "a rate's 429 says when to retry");
    await none.body?.cancel();
    clock.tick(20_000);
    const later = await fork(1);
    assert.equal(later.status, 201);
    await later.body?.cancel();
    // A count the node refuses (its 400 names why) is passed on as asked, nothing admitted.
    const bad = await fork(0);
    await bad.body?.cancel();
    assert.deepEqual(node.forkBodies.map((b) => b.count), [2, 1, 0]);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a fork's copy that failed on the node gives its place back", async () => {
  const { gateway, add } = setup();
  const node = add("a");
  try {
    const { key } = gateway.keys.create({ team: "acme", maxSandboxes: 3 });
    const made = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base" }, asKey(key));
    const { sandboxID } = await made.json();
    const fork = (count: number) =>
      api(gateway, "POST", `/sandboxes/${sandboxID}/fork`, { count }, asKey(key));
    node.forkFailures = 1;
    const first: Entry[] = await (await fork(2)).json();
    assert.deepEqual(first.map((e) => e.sandbox ? "built" : e.error?.code), [500, "built"]);
    node.forkFailures = 0;
    // 1 source + 1 copy: room for one more, which the failed copy did not keep.
    const second: Entry[] = await (await fork(2)).json();
    assert.deepEqual(second.map((e) => e.sandbox ? "built" : e.error?.code), ["built", 429]);
    assert.deepEqual(node.forkBodies.map((b) => b.count), [2, 1]);
  } finally {
    gateway.close();
  }
});
