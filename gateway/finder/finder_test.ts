import assert from "node:assert/strict";
import { Hono } from "hono";
import { Fleet } from "../fleet/fleet.ts";
import { Finder } from "./finder.ts";
import { FakeClock } from "../../shared/clock.ts";
import { checkIn } from "../_fixtures_test.ts";
import { type Behaviour, EP, fakeFetch, manualTimers, s1, setup, TOKEN } from "./_fixtures_test.ts";

Deno.test("Finder.find() is one when exactly one node has the name, and caches it", async () => {
  const { finder, fake, fleet, t } = setup({ a: "absent", b: { found: s1 }, c: "absent" });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "one");
  if (r.kind !== "one") return;
  assert.equal(r.node.id, "b");
  assert.deepEqual(r.sandbox, { ...s1, state: "active", team: "default" });
  // Every node asked once, in parallel, with the fleet token and the name.
  assert.deepEqual(fake.calls.map((c) => c.url).sort(), [
    `${EP.a}/lookupSandbox`,
    `${EP.b}/lookupSandbox`,
    `${EP.c}/lookupSandbox`,
  ]);
  assert.ok(fake.calls.every((c) => c.authorization === `Bearer ${TOKEN}`));
  assert.ok(fake.calls.every((c) => c.body.name === "alpha" && c.signal !== undefined));
  assert.equal(t.pending.size, 0, "the round's deadline timer is cleared");
  // Cached under both keys: no further round.
  assert.equal(finder.cached("name", "alpha"), r);
  assert.equal(finder.cached("id", "sb-1"), r);
  assert.equal(await finder.find("id", "sb-1"), r);
  assert.equal(fake.calls.length, 3);
  fleet.close();
});

Deno.test("Finder.find() is none when every node answers no, and caches nothing", async () => {
  const { finder, fake, fleet } = setup({ a: "absent", b: "absent" });
  assert.deepEqual(await finder.find("name", "alpha"), { kind: "none" });
  assert.deepEqual(await finder.find("name", "alpha"), { kind: "none" });
  assert.equal(fake.calls.length, 4);
  assert.deepEqual(finder.cacheSize, { name: 0, id: 0 });
  fleet.close();
});

Deno.test("Finder.find() on an empty fleet is none without asking anyone", async () => {
  const fleet = new Fleet();
  const fake = fakeFetch(new Map());
  const finder = new Finder({ fleet, token: TOKEN, fetch: fake.fn });
  assert.deepEqual(await finder.find("name", "alpha"), { kind: "none" });
  assert.equal(fake.calls.length, 0);
  fleet.close();
});

Deno.test("Finder.find() is a conflict naming both nodes when two have the name", async () => {
  const { finder, fleet } = setup({
    a: { found: s1 },
    b: { found: { id: "sb-2", name: "alpha" } },
    c: "absent",
  });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "conflict");
  if (r.kind !== "conflict") return;
  assert.deepEqual(r.nodes.map((n) => n.node.id).sort(), ["a", "b"]);
  assert.ok(r.message.includes("'a'") && r.message.includes(EP.a), r.message);
  assert.ok(r.message.includes("'b'") && r.message.includes(EP.b), r.message);
  assert.match(r.message, /destroySandbox on that node directly/);
  assert.equal(finder.cached("name", "alpha"), undefined, "a conflict is not cached");
  fleet.close();
});

Deno.test("Finder conflict from two ids at one endpoint says to remove the one that stopped", async () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock });
  fleet.checkIn(checkIn("old", EP.a, { intervalSeconds: 1 }));
  clock.tick(5_000);
  fleet.checkIn(checkIn("new", EP.a, { intervalSeconds: 1 }));
  const fake = fakeFetch(new Map([[EP.a, { found: s1 }]]));
  const finder = new Finder({ fleet, token: TOKEN, fetch: fake.fn, timers: manualTimers().timers });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "conflict");
  if (r.kind !== "conflict") return;
  assert.match(r.message, /share the endpoint http:\/\/10\.0\.0\.1:3676/);
  assert.match(r.message, /Remove the id that no longer checks in \('old'\) with removeNode/);
  // The second remedy: the stopped-looking id may run elsewhere with an endpoint naming this machine.
  assert.match(r.message, /DORMICE_NODE_ENDPOINT names the wrong machine: correct it/);
  assert.match(r.message, /GET http:\/\/10\.0\.0\.1:3676\/healthz names the id/);
  fleet.close();
});

Deno.test("Finder conflict from two live ids at one endpoint says to correct an endpoint, not to wait", async () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock });
  fleet.checkIn(checkIn("one", EP.a, { intervalSeconds: 1 }));
  fleet.checkIn(checkIn("two", EP.a, { intervalSeconds: 1 }));
  const fake = fakeFetch(new Map([[EP.a, { found: s1 }]]));
  const finder = new Finder({ fleet, token: TOKEN, fetch: fake.fn, timers: manualTimers().timers });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "conflict");
  if (r.kind !== "conflict") return;
  // Neither id will ever show down while both check in: no sentence may say to wait for that.
  assert.doesNotMatch(r.message, /shows it down|once .* down/);
  assert.match(r.message, /Every one of them still checks in/);
  assert.match(r.message, /correct the DORMICE_NODE_ENDPOINT of the others/);
  assert.match(r.message, /GET http:\/\/10\.0\.0\.1:3676\/healthz/);
  fleet.close();
});

Deno.test("Finder.find() is unsure naming a silent node when nobody else has it", async () => {
  const { finder, fleet } = setup({ a: "absent", b: "refused", c: { status: 500 } });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "unsure");
  if (r.kind !== "unsure") return;
  assert.deepEqual(r.silent.map((s) => s.node.id), ["b", "c"]);
  assert.match(r.silent[0].cause, /Connection refused/);
  assert.match(r.silent[1].cause, /HTTP 500: node says no/);
  assert.match(r.message, /Cannot tell whether 'alpha' exists: 'b' \(http:\/\/10\.0\.0\.2:3676/);
  assert.match(r.message, /removeNode/);
  assert.equal(r.retryAfterSeconds, 15);
  fleet.close();
});

Deno.test("Finder reads a node's 400 to a lookup as absent, not silence, and logs it once", async () => {
  const { finder, fleet, lines, fake } = setup({ a: { status: 400 }, b: "absent" });
  for (const name of ["alpha", "beta"]) {
    const r = await finder.find("name", name);
    // Silence would be a 503 "retry shortly" that no retry ever fixes.
    assert.equal(r.kind, "none");
  }
  assert.equal(fake.calls.length, 4);
  const warned = lines.filter((l) => /refused a lookup key/.test(l.msg));
  assert.equal(warned.length, 1);
  assert.equal(warned[0].fields.nodeId, "a");
  assert.match(String(warned[0].fields.cause), /node says no/);
  fleet.close();
});

Deno.test("Finder reads a found sandbox in a state it does not know as found", async () => {
  const { finder, fleet } = setup({ a: { found: { ...s1, state: "hibernating" } }, b: "absent" });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "one");
  if (r.kind === "one") assert.equal(r.sandbox.state, "hibernating");
  fleet.close();
});

Deno.test("Finder.find() is one even when another node is silent", async () => {
  const { finder, fleet } = setup({ a: { found: s1 }, b: "refused" });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "one");
  fleet.close();
});

Deno.test("Finder asks a down node too: a name living only there is unsure, never none", async () => {
  const { finder, fleet, clock, fake } = setup({ a: "absent", b: "refused" });
  clock.tick(31_000);
  fleet.checkIn(checkIn("a", EP.a)); // a is up, b is down
  assert.equal(fleet.isDown("b"), true);
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "unsure");
  assert.ok(fake.calls.some((c) => c.url.startsWith(EP.b)), "the down node was asked");
  // A down node that does answer is heard like any other.
  const { finder: f2, fleet: fleet2, clock: clock2 } = setup({ a: "absent", b: { found: s1 } });
  clock2.tick(31_000);
  const r2 = await f2.find("name", "alpha");
  assert.equal(r2.kind, "one");
  fleet.close();
  fleet2.close();
});

Deno.test("Finder round: a node that never answers is silent at the deadline (manual timer)", async () => {
  const { finder, fleet, t } = setup({ a: "absent", b: "hang" });
  const pending = finder.find("name", "alpha");
  await new Promise((r) => setTimeout(r, 0));
  // One deadline for the whole round, and one more for the asks still in flight at it.
  assert.deepEqual([...t.pending.values()].map((p) => p.ms), [2000, 4000]);
  t.fireAll();
  const r = await pending;
  assert.equal(r.kind, "unsure");
  if (r.kind === "unsure") assert.match(r.silent[0].cause, /No answer within 2000 ms/);
  fleet.close();
});

Deno.test("Finder round with a real 50 ms deadline answers then, and aborts a node that never answers one deadline later", async () => {
  const fleet = new Fleet();
  fleet.checkIn(checkIn("a", EP.a));
  fleet.checkIn(checkIn("b", EP.b));
  const fake = fakeFetch(new Map<string, Behaviour>([[EP.a, "hang"], [EP.b, "absent"]]));
  const finder = new Finder({ fleet, token: TOKEN, fetch: fake.fn, timeoutMs: 50 });
  const r = await finder.find("name", "alpha");
  assert.equal(r.kind, "unsure");
  if (r.kind === "unsure") assert.match(r.silent[0].cause, /No answer within 50 ms/);
  const aSignal = fake.calls.find((c) => c.url.startsWith(EP.a))!.signal!;
  // Its connection is not cut at the round's deadline: a late answer keeps it usable.
  assert.equal(aSignal.aborted, false);
  await new Promise((resolve) => aSignal.addEventListener("abort", resolve, { once: true }));
  assert.equal((aSignal.reason as DOMException).name, "TimeoutError");
  assert.match((aSignal.reason as DOMException).message, /No answer within 100 ms/);
  fleet.close();
});

Deno.test("Finder shares one round between concurrent misses for one key", async () => {
  const { finder, fleet, fake, t } = setup({ a: "hang", b: { found: s1 } });
  const all = Array.from({ length: 20 }, () => finder.find("name", "alpha"));
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(fake.calls.length, 2, "one round of two nodes");
  t.fireAll();
  const results = await Promise.all(all);
  assert.ok(results.every((r) => r === results[0] && r.kind === "one"));
  // Another key gets its own round.
  t.fireAll();
  const other = finder.find("name", "beta");
  await new Promise((r) => setTimeout(r, 0));
  t.fireAll();
  await other;
  assert.equal(fake.calls.length, 4);
  fleet.close();
});

Deno.test("Finder: a caller that leaves rejects at once; the round stops when all have left", async () => {
  const { finder, fleet, fake, t } = setup({ a: "hang" });
  const one = new AbortController();
  const two = new AbortController();
  const p1 = finder.find("name", "alpha", { signal: one.signal });
  const p2 = finder.find("name", "alpha", { signal: two.signal });
  await new Promise((r) => setTimeout(r, 0));
  const nodeSignal = fake.calls[0].signal!;
  one.abort(new Error("client 1 hung up"));
  await assert.rejects(p1, /client 1 hung up/);
  assert.equal(nodeSignal.aborted, false, "the other caller still waits");
  two.abort(new Error("client 2 hung up"));
  await assert.rejects(p2, /client 2 hung up/);
  assert.equal(nodeSignal.aborted, true, "nobody waits: the node's work is stopped");
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(t.pending.size, 0, "the aborted round cleared its deadline");
  // A new caller starts a fresh round rather than joining the aborted one.
  const p3 = finder.find("name", "alpha");
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(fake.calls.length, 2);
  t.fireAll();
  assert.equal((await p3).kind, "unsure");
  fleet.close();
});

Deno.test("Finder.lookup() with an already-aborted signal asks nobody", async () => {
  const { finder, fleet, fake } = setup({ a: "absent" });
  await assert.rejects(
    finder.lookup("name", "x", { signal: AbortSignal.abort(new Error("gone")) }),
    /gone/,
  );
  assert.equal(fake.calls.length, 0);
  fleet.close();
});

Deno.test("Finder logs a silent node once per change of cause, not every round", async () => {
  const { finder, fleet, lines } = setup({ a: "refused" });
  await finder.find("name", "x");
  await finder.find("name", "y");
  assert.equal(lines.filter((l) => l.msg === "node did not answer a lookup").length, 1);
  assert.ok(
    lines.every((l) => !JSON.stringify(l).includes(TOKEN)),
    "the token never reaches a log",
  );
  fleet.close();
});

Deno.test("Finder logs a node answering again, and never logs a caller's hang-up as silence", async () => {
  const { finder, fleet, lines, behaviours } = setup({ a: "hang" });
  const caller = new AbortController();
  const p = finder.find("name", "x", { signal: caller.signal });
  await new Promise((r) => setTimeout(r, 0));
  caller.abort(new Error("hung up"));
  await assert.rejects(p, /hung up/);
  await new Promise((r) => setTimeout(r, 0));
  assert.equal(lines.filter((l) => l.msg === "node did not answer a lookup").length, 0);
  behaviours.set(EP.a, "refused");
  await finder.find("name", "x");
  behaviours.set(EP.a, "absent");
  await finder.find("name", "x");
  assert.deepEqual(lines.map((l) => l.msg).filter((m) => /node/.test(m)), [
    "node did not answer a lookup",
    "node answers lookups again",
  ]);
  fleet.close();
});

Deno.test("Finder.find() keeps at most maxLookupsPerNode lookups in flight to one node", async () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock });
  fleet.checkIn(checkIn("a", EP.a));
  let inFlight = 0, most = 0;
  const release: Array<() => void> = [];
  const fn = (async () => {
    inFlight++;
    most = Math.max(most, inFlight);
    await new Promise<void>((r) => release.push(r));
    inFlight--;
    return Response.json({ found: false });
  }) as typeof fetch;
  const t = manualTimers();
  const finder = new Finder({
    fleet,
    token: TOKEN,
    fetch: fn,
    timers: t.timers,
    maxLookupsPerNode: 3,
  });
  // Ten distinct names: ten rounds, each asking node a once.
  const rounds = Array.from({ length: 10 }, (_, i) => finder.find("name", `n${i}`));
  while (release.length < 3) await Promise.resolve();
  for (let i = 0; i < 50; i++) await Promise.resolve();
  assert.equal(most, 3);
  while (release.length > 0 || inFlight > 0) {
    release.shift()?.();
    await new Promise((r) => setTimeout(r, 0));
  }
  const results = await Promise.all(rounds);
  assert.deepEqual(results.map((r) => r.kind), Array(10).fill("none"));
  assert.equal(most, 3);
  fleet.close();
});

Deno.test("Finder.find() counts the wait for a per-node slot against the round's deadline", async () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock });
  fleet.checkIn(checkIn("a", EP.a));
  const fn = (request: Request) =>
    new Promise<Response>((_, reject) =>
      request.signal.addEventListener("abort", () => reject(request.signal.reason))
    );
  const t = manualTimers();
  const finder = new Finder({
    fleet,
    token: TOKEN,
    fetch: fn,
    timers: t.timers,
    maxLookupsPerNode: 1,
  });
  const first = finder.find("name", "x");
  const queued = finder.find("name", "y");
  await Promise.resolve();
  t.fireAll(); // both rounds' deadlines pass: the queued one must not wait for a free slot
  const [a, b] = await Promise.all([first, queued]);
  assert.equal(a.kind, "unsure");
  assert.equal(b.kind, "unsure");
  fleet.close();
});

Deno.test("Finder does not ask a dead node: a name it may hold is none, not unsure, and its cache entries go", async () => {
  const { finder, fleet, clock, fake, behaviours } = setup(
    { a: { found: s1 }, b: "absent" },
    undefined,
    {
      deadAfterMs: 600_000,
    },
  );
  // Cached on a while it answers.
  assert.equal((await finder.find("name", "alpha")).kind, "one");
  behaviours.set(EP.a, "refused");
  clock.tick(31_000);
  fleet.checkIn(checkIn("b", EP.b));
  // Down but not dead: the name may live only there, so it is never none.
  finder.evict("name", "alpha");
  assert.equal((await finder.find("name", "alpha")).kind, "unsure");
  assert.equal((await finder.find("name", "alpha")).kind, "unsure");
  finder.remember(fleet.get("a")!, { ...s1, state: "active" });
  clock.tick(600_000);
  fleet.checkIn(checkIn("b", EP.b));
  assert.equal(fleet.isDead("a"), true);
  const calls = fake.calls.length;
  assert.equal(finder.cached("name", "alpha"), undefined, "its sandboxes went with it");
  assert.deepEqual(await finder.find("name", "alpha"), { kind: "none" });
  assert.ok(fake.calls.slice(calls).every((c) => c.url.startsWith(EP.b)), "a was not asked");
  fleet.close();
});

Deno.test("Finder: a dead node back with a name rebuilt elsewhere meanwhile is a 409 conflict naming both", async () => {
  const { finder, fleet, clock, behaviours } = setup({ a: "refused", b: "absent" }, undefined, {
    deadAfterMs: 600_000,
  });
  clock.tick(600_031);
  fleet.checkIn(checkIn("b", EP.b));
  assert.deepEqual(await finder.find("name", "alpha"), { kind: "none" });
  // Built on b meanwhile; a comes back with its own copy in its ledger.
  behaviours.set(EP.b, { found: { id: "sb-2", name: "alpha" } });
  behaviours.set(EP.a, { found: s1 });
  fleet.checkIn(checkIn("a", EP.a));
  const r = await finder.lookup("name", "alpha");
  assert.equal(r.kind, "conflict");
  if (r.kind === "conflict") {
    assert.deepEqual(r.nodes.map((n) => n.node.id).sort(), ["a", "b"]);
    assert.match(r.message, /'a'/);
    assert.match(r.message, /'b'/);
  }
  fleet.close();
});

Deno.test("a Finder takes a Hono app's request as its fetch and finds what the app holds", async () => {
  const node = new Hono();
  node.post("/lookupSandbox", async (c) => {
    const { name } = await c.req.json();
    return c.json(
      name === "held"
        ? { found: true, sandbox: { id: "sbx_1", name, state: "active" } }
        : { found: false },
    );
  });
  const fleet = new Fleet();
  fleet.checkIn(checkIn("a", "http://10.0.0.5:3676"));
  // A Hono app's `request` answers `Response | Promise<Response>`: the narrow option takes it.
  const finder = new Finder({ fleet, token: "t".repeat(32), fetch: (r) => node.request(r) });
  try {
    const found = await finder.find("name", "held");
    assert.equal(found.kind, "one", JSON.stringify(found));
    const none = await finder.find("name", "other");
    assert.equal(none.kind, "none", JSON.stringify(none));
  } finally {
    fleet.close();
  }
});
