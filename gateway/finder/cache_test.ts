import assert from "node:assert/strict";
import { checkIn } from "../_fixtures_test.ts";
import { EP, s1, setup } from "./_fixtures_test.ts";

Deno.test("Finder.confirm() on a hit asks that node by id: found is a wake", async () => {
  const { finder, fleet, fake } = setup({ a: { found: s1 }, b: "absent" });
  const first = await finder.find("name", "alpha");
  const before = fake.calls.length;
  const r = await finder.confirm("name", "alpha");
  assert.equal(r, first);
  assert.equal(fake.calls.length, before + 1);
  assert.deepEqual(fake.calls.at(-1)!.body, { id: "sb-1" });
  assert.ok(fake.calls.at(-1)!.url.startsWith(EP.a));
  fleet.close();
});

Deno.test("Finder.confirm() on a hit whose node lost it evicts and asks the fleet", async () => {
  const { finder, fleet, fake, behaviours } = setup({ a: { found: s1 }, b: "absent" });
  await finder.find("name", "alpha");
  // Destroyed on a behind the gateway's back, rebuilt on b.
  behaviours.set(EP.a, "absent");
  behaviours.set(EP.b, { found: { id: "sb-9", name: "alpha" } });
  const r = await finder.confirm("name", "alpha");
  assert.equal(r.kind, "one");
  if (r.kind === "one") assert.equal(r.node.id, "b");
  assert.equal(finder.cached("id", "sb-1"), undefined, "the old id is evicted too");
  assert.equal(finder.cached("id", "sb-9"), r);
  assert.equal(fake.calls.length, 2 + 1 + 2);
  fleet.close();
});

Deno.test("Finder.confirm() on a hit whose node is silent is unsure naming it", async () => {
  const { finder, fleet, behaviours, t } = setup({ a: { found: s1 }, b: "absent" });
  await finder.find("name", "alpha");
  behaviours.set(EP.a, "hang");
  const pending = finder.confirm("name", "alpha");
  await new Promise((r) => setTimeout(r, 0));
  t.fireAll();
  const r = await pending;
  assert.equal(r.kind, "unsure");
  if (r.kind === "unsure") assert.deepEqual(r.silent.map((s) => s.node.id), ["a"]);
  assert.ok(finder.cached("name", "alpha"), "silence evicts nothing");
  fleet.close();
});

Deno.test("Finder.confirm() on a miss is a plain lookup round", async () => {
  const { finder, fleet } = setup({ a: "absent", b: "absent" });
  assert.deepEqual(await finder.confirm("name", "alpha"), { kind: "none" });
  fleet.close();
});

Deno.test("Finder.recheck() after a node's 404 evicts a sandbox the node no longer has", async () => {
  const { finder, fleet, behaviours, fake } = setup({ a: { found: s1 } });
  await finder.find("name", "alpha");
  // Still there (the 404 was about something else, e.g. a missing file): kept.
  assert.equal(await finder.recheck("name", "alpha"), "kept");
  assert.ok(finder.cached("name", "alpha"));
  behaviours.set(EP.a, "absent");
  assert.equal(await finder.recheck("name", "alpha"), "evicted");
  assert.equal(finder.cached("name", "alpha"), undefined);
  assert.equal(finder.cached("id", "sb-1"), undefined);
  assert.deepEqual(fake.calls.at(-1)!.body, { id: "sb-1" });
  assert.equal(await finder.recheck("name", "alpha"), "uncached");
  fleet.close();
});

Deno.test("Finder.forgetNode() drops a removed node's cache entries and failure record", async () => {
  const { finder, fleet, clock, behaviours } = setup({ a: { found: s1 }, b: "refused" });
  await finder.find("name", "alpha");
  await finder.find("id", "sb-1");
  behaviours.set(EP.a, "refused");
  await finder.find("name", "ghost");
  assert.equal(finder.failingNodes, 2);
  assert.deepEqual(finder.cacheSize, { name: 1, id: 1 });
  clock.tick(31_000);
  fleet.removeNode("a");
  finder.forgetNode("a");
  assert.deepEqual(finder.cacheSize, { name: 0, id: 0 });
  assert.equal(finder.failingNodes, 1);
  fleet.close();
});

Deno.test("Finder rounds drop failure records of nodes the directory no longer holds", async () => {
  const { finder, fleet, clock } = setup({ a: "absent", b: "refused", c: "refused" });
  await finder.find("name", "ghost");
  assert.equal(finder.failingNodes, 2);
  clock.tick(31_000);
  fleet.checkIn(checkIn("a", EP.a));
  // Removed without forgetNode (an embedder's Fleet with no onRemove hook).
  fleet.removeNode("b");
  fleet.removeNode("c");
  await finder.find("name", "ghost-2");
  assert.equal(finder.failingNodes, 0);
  fleet.close();
});

Deno.test("Finder.evict() forgets a sandbox under both keys", async () => {
  const { finder, fleet } = setup({ a: { found: s1 } });
  await finder.find("id", "sb-1");
  assert.ok(finder.cached("name", "alpha"));
  finder.evict("id", "sb-1");
  assert.equal(finder.cached("name", "alpha"), undefined);
  assert.deepEqual(finder.cacheSize, { name: 0, id: 0 });
  fleet.close();
});

Deno.test("Finder.cached() drops an entry whose node was removed", async () => {
  const { finder, fleet, clock } = setup({ a: { found: s1 } });
  await finder.find("name", "alpha");
  clock.tick(31_000);
  fleet.removeNode("a");
  assert.equal(finder.cached("name", "alpha"), undefined);
  assert.deepEqual(finder.cacheSize, { name: 0, id: 0 });
  fleet.close();
});

Deno.test("Finder.cached() follows a node's endpoint move without a new round", async () => {
  const { finder, fleet, clock } = setup({ a: { found: s1 } });
  await finder.find("name", "alpha");
  clock.tick(16_000);
  fleet.checkIn(checkIn("a", "http://10.9.9.9:3676"));
  assert.equal(finder.cached("name", "alpha")?.node.endpoint, "http://10.9.9.9:3676");
  fleet.close();
});

Deno.test("Finder cache is bounded and keeps the most recently used", () => {
  const { finder, fleet } = setup({ a: "absent" }, 3);
  const node = fleet.get("a")!;
  for (let i = 0; i < 5; i++) {
    finder.remember(node, { id: `id-${i}`, name: `n-${i}`, state: "active" });
  }
  assert.deepEqual(finder.cacheSize, { name: 3, id: 3 });
  assert.equal(finder.cached("name", "n-1"), undefined);
  assert.ok(finder.cached("name", "n-2"));
  finder.remember(node, { id: "id-5", name: "n-5", state: "active" });
  assert.ok(finder.cached("name", "n-2"), "the hit made n-2 young");
  assert.equal(finder.cached("name", "n-3"), undefined);
  fleet.close();
});

Deno.test("Finder.confirm() rejects with the caller's reason when the caller leaves", async () => {
  const { finder, fleet, behaviours, t } = setup({ a: { found: s1 } });
  await finder.find("name", "alpha");
  behaviours.set(EP.a, "hang");
  const caller = new AbortController();
  const p = finder.confirm("name", "alpha", { signal: caller.signal });
  await new Promise((r) => setTimeout(r, 0));
  caller.abort(new Error("client gone"));
  await assert.rejects(p, /client gone/);
  assert.equal(t.pending.size, 0);
  fleet.close();
});

Deno.test("Finder.confirm() starts a fresh round rather than joining one begun earlier", async () => {
  const { finder, fleet, fake, t, behaviours } = setup({ a: "hang" });
  const early = finder.find("name", "alpha"); // e.g. an exec that began before the create
  await new Promise((r) => setTimeout(r, 0));
  behaviours.set(EP.a, { found: s1 }); // the create landed meanwhile
  const r = await finder.confirm("name", "alpha");
  assert.equal(r.kind, "one");
  assert.equal(fake.calls.length, 2);
  t.fireAll();
  assert.equal((await early).kind, "unsure");
  fleet.close();
});

Deno.test("Finder.remember() of a name rebuilt under a new id drops the old id", () => {
  const { finder, fleet } = setup({ a: "absent", b: "absent" });
  finder.remember(fleet.get("a")!, { id: "old", name: "alpha", state: "active" });
  finder.remember(fleet.get("b")!, { id: "new", name: "alpha", state: "active" });
  assert.equal(finder.cached("id", "old"), undefined);
  assert.equal(finder.cached("name", "alpha")?.node.id, "b");
  fleet.close();
});
