// The Finder's choice of whom to ask on a miss when nodes send lookup digests
// (docs/lookup-digest.md): one row per rule, each asserting who was asked and the outcome.
import { plainArgs } from "../../shared/_fetch_fixtures_test.ts";
import assert from "node:assert/strict";
import { probesOf } from "./_probes.ts";
import { Fleet } from "../fleet/fleet.ts";
import { Finder, type RecentLookup } from "./finder.ts";
import { FakeClock } from "../../shared/clock.ts";
import { idDigestKey, LookupDigest, nameDigestKey } from "../../shared/lookup_digest.ts";
import { checkIn } from "../_fixtures_test.ts";

const TOKEN = "t".repeat(32);

function digestOf(...keys: string[]) {
  const d = LookupDigest.sized(keys.length);
  for (const k of keys) d.add(k);
  return d.toWire();
}

/**
 * A fleet of three nodes a, b, c; `hang` endpoints never answer, the rest say absent. With
 * `recent`, the Finder runs in shared mode over those records of recent creates.
 */
function setup(mode: "off" | "sole-writer" | "on" = "sole-writer", recent?: RecentLookup) {
  const clock = new FakeClock(1_000_000);
  const fleet = new Fleet({ clock });
  const asked: string[] = [];
  const hang = new Set<string>();
  const found = new Map<string, { id: string; name: string }>();
  const fetchFn = (async (input: RequestInfo | URL, init?: RequestInit) => {
    ({ url: input, init } = await plainArgs(input, init));
    const origin = new URL(String(input)).origin;
    asked.push(origin);
    if (hang.has(origin)) {
      return await new Promise<Response>((_, reject) => {
        init?.signal?.addEventListener("abort", () => reject(init.signal!.reason), { once: true });
      });
    }
    const f = found.get(origin);
    if (f) return Response.json({ found: true, sandbox: { ...f, state: "active" } });
    return Response.json({ found: false });
  }) as typeof fetch;
  const finder = new Finder({
    fleet,
    token: TOKEN,
    fetch: fetchFn,
    lookupDigests: mode,
    timeoutMs: 50,
    recent,
  });
  const endpoint = (id: string) => `http://${id}.test:3676`;
  /** `times` check-ins of `id` carrying `digest` (or none). */
  const report = (id: string, digest?: ReturnType<typeof digestOf>, times = 2) => {
    for (let i = 0; i < times; i++) {
      fleet.checkIn(checkIn(id, endpoint(id), digest ? { lookupDigest: digest } : {}));
    }
  };
  const askedIds = () => asked.map((o) => new URL(o).hostname.split(".")[0]).sort();
  return { clock, fleet, finder, asked, askedIds, hang, found, endpoint, report };
}

Deno.test("a fresh digest that cannot hold the name is skipped; one that may is asked", async () => {
  const t = setup();
  t.report("a", digestOf(nameDigestKey(undefined, "other")));
  t.report("b", digestOf(nameDigestKey(undefined, "agent-1")));
  t.report("c", digestOf());
  t.found.set(t.endpoint("b"), { id: "sbx_b", name: "agent-1" });
  const r = await t.finder.lookup("name", "agent-1");
  assert.equal(r.kind, "one");
  assert.deepEqual(t.askedIds(), ["b"]);
  assert.equal(probesOf(t.finder).lastRoundAsked(), 1);
  t.fleet.close();
});

Deno.test("every digest saying no makes a miss that asks nobody: none", async () => {
  const t = setup();
  for (const id of ["a", "b", "c"]) t.report(id, digestOf());
  assert.equal((await t.finder.lookup("name", "agent-1")).kind, "none");
  assert.deepEqual(t.askedIds(), []);
  t.fleet.close();
});

Deno.test("a digest is read by id too", async () => {
  const t = setup();
  t.report("a", digestOf(idDigestKey("sbx_1")));
  t.report("b", digestOf());
  await t.finder.lookup("id", "sbx_1");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

Deno.test("a node with no digest (an older node) is always asked", async () => {
  const t = setup();
  t.report("a");
  t.report("b", digestOf());
  await t.finder.lookup("name", "agent-1");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

Deno.test("a node's first check-in to this process is not trusted: it may predate a create", async () => {
  const t = setup();
  t.report("a", digestOf(), 1);
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "agent-1"), "first-check-in");
  await t.finder.lookup("name", "agent-1");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

Deno.test("a down node blocks only the names its last digest may hold", async () => {
  const t = setup();
  t.report("a", digestOf(nameDigestKey(undefined, "kept")));
  t.report("b", digestOf());
  // a goes quiet past two of its 15 s intervals (frozen); b checks in again.
  t.clock.tick(31_000);
  t.report("b", digestOf(), 1);
  t.hang.add(t.endpoint("a"));
  assert.ok(t.fleet.isDown("a"), "precondition: a is down");
  // A new name its last digest rules out: a is not asked and its silence blocks nothing.
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "agent-1"), undefined);
  assert.equal((await t.finder.lookup("name", "agent-1")).kind, "none");
  assert.deepEqual(t.askedIds(), []);
  // A name that digest may hold: a is asked, and its silence is unsure as before.
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "kept"), "may-hold");
  assert.equal((await t.finder.lookup("name", "kept")).kind, "unsure");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

Deno.test("a down node with this gateway's create unanswered stays asked for every name", async () => {
  const t = setup();
  t.report("a", digestOf());
  t.report("b", digestOf());
  t.finder.placing("a")(false);
  t.clock.tick(31_000);
  t.report("b", digestOf(), 1);
  t.hang.add(t.endpoint("a"));
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "agent-1"), "own-create");
  assert.equal((await t.finder.lookup("name", "agent-1")).kind, "unsure");
  t.fleet.close();
});

Deno.test("a silent node whose fresh digest may hold the name makes the miss unsure", async () => {
  const t = setup();
  t.report("a", digestOf(nameDigestKey(undefined, "agent-1")));
  t.report("b", digestOf());
  t.hang.add(t.endpoint("a"));
  const r = await t.finder.lookup("name", "agent-1");
  assert.equal(r.kind, "unsure");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

Deno.test("this gateway's own create is asked for until two check-ins after it ended", () => {
  const t = setup();
  t.report("a", digestOf());
  const a = () => t.fleet.get("a")!;
  const ended = t.finder.placing("a");
  assert.equal(probesOf(t.finder).mustAsk(a(), "name", "agent-1"), "own-create", "in flight");
  // A check-in while it is in flight proves nothing about it.
  t.report("a", digestOf(), 3);
  assert.equal(probesOf(t.finder).mustAsk(a(), "name", "agent-1"), "own-create");
  ended(true);
  // The next check-in may have been built before the create committed.
  t.report("a", digestOf(), 1);
  assert.equal(probesOf(t.finder).mustAsk(a(), "name", "agent-1"), "own-create");
  t.report("a", digestOf(), 1);
  assert.equal(probesOf(t.finder).mustAsk(a(), "name", "agent-1"), undefined);
  t.fleet.close();
});

Deno.test("a create the node never answered keeps that node asked", () => {
  const t = setup();
  t.report("a", digestOf());
  t.finder.placing("a")(false);
  t.report("a", digestOf(), 5);
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "agent-1"), "own-create");
  // Until the node leaves: a node that joins again under the id starts clean.
  t.clock.tick(31_000);
  t.fleet.removeNode("a");
  t.finder.forgetNode("a");
  t.report("a", digestOf());
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "agent-1"), undefined);
  t.fleet.close();
});

Deno.test("with digests off every node is asked whatever its digest says", async () => {
  const t = setup("off");
  for (const id of ["a", "b", "c"]) t.report(id, digestOf());
  await t.finder.lookup("name", "agent-1");
  assert.deepEqual(t.askedIds(), ["a", "b", "c"]);
  t.fleet.close();
});

Deno.test("a digest that will not decode is dropped: the node is asked", async () => {
  const t = setup();
  // Fleet.checkIn refuses such a body from code (checkInSchema); one replicated from another
  // gateway's record is taken as it is, so the Fleet still drops what will not decode.
  const bad = checkIn("a", t.endpoint("a"), {
    lookupDigest: { bits: "@@@@", hashes: 7, count: 0 },
  });
  t.fleet.checkIn(bad, { replicated: true });
  t.fleet.checkIn(bad, { replicated: true });
  assert.equal(t.fleet.get("a")!.lookupDigest, null);
  await t.finder.lookup("name", "agent-1");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

Deno.test("mode on trusts only digests of nodes that push creates made behind its back", async () => {
  const t = setup("on");
  t.report("a", digestOf());
  t.report("b", { ...digestOf(), directPushed: true });
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("a")!, "name", "agent-1"), "no-digest");
  assert.equal(probesOf(t.finder).mustAsk(t.fleet.get("b")!, "name", "agent-1"), undefined);
  await t.finder.lookup("name", "agent-1");
  assert.deepEqual(t.askedIds(), ["a"]);
  t.fleet.close();
});

/** Shared mode's records: `records` maps a key to its node; `failing` makes every read throw. */
function recentOf(records: Map<string, string>, trustMs = 60_000) {
  const state = { failing: false, reads: 0 };
  const recent: RecentLookup = {
    trustMs,
    nodesFor: (_by, key) => {
      state.reads++;
      if (state.failing) return Promise.reject(new Error("etcd is away"));
      return Promise.resolve(records.has(key) ? [records.get(key)!] : []);
    },
  };
  return { recent, state };
}

const pushed = (...keys: string[]) => ({ ...digestOf(...keys), directPushed: true });

Deno.test("shared mode: the node a key's record names is asked whatever its digest says", async () => {
  const records = new Map([["default/agent-1", "b"]]);
  const t = setup("on", recentOf(records).recent);
  for (const id of ["a", "b", "c"]) t.report(id, pushed());
  t.found.set(t.endpoint("b"), { id: "sbx_b", name: "agent-1" });
  const r = await t.finder.lookup("name", "default/agent-1");
  assert.equal(r.kind, "one");
  assert.deepEqual(t.askedIds(), ["b"]);
  t.fleet.close();
});

Deno.test("shared mode: records that cannot be read make the miss ask every node", async () => {
  const { recent, state } = recentOf(new Map());
  const t = setup("on", recent);
  for (const id of ["a", "b", "c"]) t.report(id, pushed());
  state.failing = true;
  await t.finder.lookup("name", "default/agent-1");
  assert.deepEqual(t.askedIds(), ["a", "b", "c"]);
  state.failing = false;
  t.asked.length = 0;
  await t.finder.lookup("name", "default/agent-2");
  assert.deepEqual(t.askedIds(), []);
  assert.equal(state.reads, 2);
  t.fleet.close();
});

Deno.test("shared mode: records stand in for check-in counts; a digest older than the trust window is asked", () => {
  const t = setup("on", recentOf(new Map(), 60_000).recent);
  // One check-in, and a create of this gateway's in flight: single-gateway rules would ask.
  t.report("a", pushed(), 1);
  t.finder.placing("a");
  const a = t.fleet.get("a")!;
  assert.equal(probesOf(t.finder).mustAsk(a, "name", "default/x"), undefined);
  t.clock.tick(60_000);
  assert.equal(probesOf(t.finder).mustAsk(a, "name", "default/x"), undefined);
  t.clock.tick(1);
  assert.equal(probesOf(t.finder).mustAsk(a, "name", "default/x"), "stale-digest");
  t.fleet.close();
});

Deno.test("shared mode: a record not read within half the deadline makes the round ask the skipped nodes", async () => {
  const recent: RecentLookup = { trustMs: 60_000, nodesFor: () => new Promise(() => {}) };
  const t = setup("on", recent);
  for (const id of ["a", "b"]) t.report(id, pushed());
  t.report("c", pushed(nameDigestKey(undefined, "agent-1")));
  t.hang.add(t.endpoint("c"));
  const r = await t.finder.lookup("name", "agent-1");
  // c (its digest may hold the name) was asked at once; a and b once the read gave up, within
  // the same deadline, and they answered.
  assert.deepEqual(t.askedIds(), ["a", "b", "c"]);
  assert.equal(r.kind, "unsure");
  const silent = r.kind === "unsure" ? r.silent : [];
  assert.deepEqual(silent.map((s) => s.node.id), ["c"]);
  assert.equal(probesOf(t.finder).lastRoundAsked(), 3);
  t.fleet.close();
});
