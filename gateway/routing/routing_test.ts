// GatewayRouting's rules at unit level: a real Fleet, Finder and Placer over stub nodes reached
// through an injected fetch (no sockets), and Finder timers that never fire (no real time).
import assert from "node:assert/strict";
import { probesOf } from "../finder/_probes.ts";
import { Fleet } from "../fleet/fleet.ts";
import { Finder, type FinderTimers } from "../finder/finder.ts";
import { placementAsk, Placer } from "../placer/placer.ts";
import { GatewayRouting } from "./routing.ts";
import { LocalSlots, type Slots } from "./slots.ts";
import type { CreateOptions } from "./create.ts";
import { FakeClock } from "../../shared/clock.ts";
import { HttpError } from "../../shared/http_error.ts";
import { LookupDigest } from "../../shared/lookup_digest.ts";
import { checkIn, fetchToNodes, reading } from "../_fixtures_test.ts";

const token = "routing-unit-test-token-0123456789abcdef";

interface StubSandbox {
  id: string;
  name: string;
  state: string;
}

type Answer = (request: Request, body: Record<string, unknown>) => Response | Promise<Response>;

/** A node reached through the injected fetch: `lookupSandbox` over a map, every other path from `answers`. */
class StubNode {
  sandboxes = new Map<string, StubSandbox>();
  /** `<METHOD> <path>` of every request, in order. */
  calls: string[] = [];
  /** Answers by path; a missing path is a 404. */
  answers = new Map<string, Answer>();
  /** When set, every request fails as if the node did not answer. */
  silent = false;
  constructor(readonly id: string, readonly endpoint: string) {}

  async handle(request: Request): Promise<Response> {
    const path = new URL(request.url).pathname;
    this.calls.push(`${request.method} ${path}`);
    if (this.silent) throw new TypeError("error sending request: Connection refused");
    const text = await request.text();
    const body = text === "" ? {} : JSON.parse(text);
    if (path === "/lookupSandbox") {
      const s = body.name !== undefined
        ? this.sandboxes.get(body.name)
        : [...this.sandboxes.values()].find((x) => x.id === body.id);
      return Response.json(s ? { found: true, sandbox: s } : { found: false });
    }
    const answer = this.answers.get(path);
    return answer ? answer(request, body) : Response.json({ message: "no route" }, { status: 404 });
  }

  /** `calls` without the lookups, i.e. what the gateway forwarded. */
  get forwarded(): string[] {
    return this.calls.filter((c) => c !== "POST /lookupSandbox");
  }
}

/** Deadlines that never fire: every test here gets its answers at once. */
const idleTimers: FinderTimers = { setTimeout: () => 0, clearTimeout: () => {} };

/**
 * One fleet of stub nodes and a gateway's routing over it; `another()` is a second gateway on the
 * same fleet with its own Finder and Placer that shares the name slots (shared mode's EtcdSlots).
 */
/** Lets settled promises run their callbacks (promise turns, no timer). */
async function flush(): Promise<void> {
  for (let i = 0; i < 20; i++) await Promise.resolve();
}

function setup(slots: Slots = new LocalSlots(), fleetOptions: { deadAfterMs?: number } = {}) {
  const nodes = new Map<string, StubNode>();
  const fakeFetch = fetchToNodes(nodes);
  const clock = new FakeClock();
  /** The clock of the routing's watch over requests waiting for a head (its own ticks). */
  const watchClock = new FakeClock(0);
  const fleet = new Fleet({ clock, ...fleetOptions });
  const gateway = () => {
    const finder = new Finder({
      fleet,
      token,
      fetch: fakeFetch,
      clock,
      timers: idleTimers,
    });
    const placer = new Placer({ fleet });
    const routing = new GatewayRouting({
      fleet,
      finder,
      placer,
      token,
      fetch: fakeFetch,
      slots,
      hangUpClock: watchClock,
    });
    return { finder, placer, routing };
  };
  const add = (id: string, memoryAvailableBytes = 8e9) => {
    const endpoint = `http://${id}.test:3676`;
    const node = new StubNode(id, endpoint);
    nodes.set(endpoint, node);
    fleet.checkIn(checkIn(id, endpoint, { reading: reading({ memoryAvailableBytes }) }));
    return node;
  };
  return {
    clock,
    watchClock,
    fleet,
    nodes,
    ...gateway(),
    another: gateway,
    add,
    close: () => fleet.close(),
  };
}

/** Slots that tell which keys are asked for, as they are asked (before any wait). */
class WatchedSlots extends LocalSlots {
  /** Every key a `run` asked for, in order. */
  readonly asked: string[] = [];
  #waiters: { key: string; resolve: () => void }[] = [];

  override run<T>(key: string, task: () => Promise<T> | T): Promise<T> {
    this.asked.push(key);
    const due = this.#waiters.filter((w) => w.key === key);
    this.#waiters = this.#waiters.filter((w) => w.key !== key);
    for (const w of due) w.resolve();
    return super.run(key, task);
  }

  /** Resolves when the next `run` for `key` asks for it. */
  nextAskFor(key: string): Promise<void> {
    return new Promise((resolve) => this.#waiters.push({ key, resolve }));
  }
}

/** A node's acquire: builds the sandbox (or wakes it) and answers like a node's native face. */
function acquireOn(node: StubNode, status = 200): Answer {
  let seq = 0;
  return (_request, body) => {
    if (status !== 200) return Response.json({ message: `refused ${status}` }, { status });
    const name = String(body.name ?? `unnamed-${++seq}`);
    const s = node.sandboxes.get(name) ?? { id: `${node.id}-${++seq}`, name, state: "active" };
    node.sandboxes.set(name, s);
    return Response.json({ status: "ready", sandbox: s });
  };
}

/** `acquireOn(node)` held at the node until `held` settles; `arrived` hears each request come. */
function heldAcquireOn(node: StubNode, held: Promise<void>, arrived: () => void): Answer {
  const build = acquireOn(node);
  return async (request, body) => {
    arrived();
    await held;
    return build(request, body);
  };
}

function createOptions(name: string | undefined, signal = new AbortController().signal) {
  return {
    name,
    path: "/acquireSandbox",
    body: JSON.stringify(name === undefined ? {} : { name }),
    signal,
    identify: (t: string) => JSON.parse(t).sandbox,
  } satisfies CreateOptions;
}

function httpError(status: number, pattern?: RegExp) {
  return (error: unknown) => {
    assert.ok(error instanceof HttpError, `expected an HttpError, got ${error}`);
    assert.equal(error.status, status);
    if (pattern) assert.match(error.message, pattern);
    return true;
  };
}

Deno.test("GatewayRouting.create() places a name no node has, counts it, and caches the 2xx answer", async () => {
  const { routing, placer, finder, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a));
  try {
    const answer = await routing.create(createOptions("x"));
    assert.equal(answer.status, 200);
    assert.equal(answer.node.id, "a");
    assert.deepEqual(a.calls, ["POST /lookupSandbox", "POST /acquireSandbox"]);
    assert.equal(placer.inFlight("a"), 1);
    assert.equal(finder.cached("name", "x")?.sandbox.id, "a-1");
    assert.equal(finder.cached("id", "a-1")?.sandbox.name, "x");
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() uncounts a placement the node refused with a 4xx", async () => {
  const { routing, placer, finder, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a, 400));
  try {
    const answer = await routing.create(createOptions("x"));
    // The node's own answer goes back to the client as it came.
    assert.equal(answer.status, 400);
    assert.equal(JSON.parse(answer.text).message, "refused 400");
    // Nothing was built, so nothing is counted against the node or cached.
    assert.equal(placer.inFlight("a"), 0);
    assert.equal(finder.cached("name", "x"), undefined);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() keeps a placement counted when the node answers a 5xx", async () => {
  const { routing, placer, finder, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a, 500));
  try {
    const answer = await routing.create(createOptions("x"));
    assert.equal(answer.status, 500);
    // A 5xx may have built the sandbox: it stays counted until the node's next reading.
    assert.equal(placer.inFlight("a"), 1);
    assert.equal(finder.cached("name", "x"), undefined);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() wakes a name found on a node there, without counting a placement", async () => {
  const { routing, placer, finder, add, close } = setup();
  const a = add("a", 9e9);
  const b = add("b", 1e9);
  b.sandboxes.set("x", { id: "b-7", name: "x", state: "frozen" });
  b.answers.set("/acquireSandbox", acquireOn(b));
  try {
    const answer = await routing.create(createOptions("x"));
    assert.equal(answer.status, 200);
    // b holds it, although the Placer would choose a (more memory).
    assert.equal(answer.node.id, "b");
    assert.deepEqual(a.forwarded, []);
    assert.equal(placer.inFlight("a") + placer.inFlight("b"), 0);
    assert.equal(finder.cached("name", "x")?.node.id, "b");
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() of a cached name confirms it by id and wakes it, counting no placement", async () => {
  const { routing, placer, fleet, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a));
  try {
    assert.equal((await routing.create(createOptions("x"))).status, 200);
    assert.equal(placer.inFlight("a"), 1);
    // The node's next reading counts the sandbox itself.
    fleet.checkIn(checkIn("a", a.endpoint, { reading: reading({ active: 1 }) }));
    assert.equal(placer.inFlight("a"), 0);
    const wake = await routing.create(createOptions("x"));
    assert.equal(wake.status, 200);
    assert.equal(JSON.parse(wake.text).sandbox.id, "a-1");
    assert.deepEqual(a.calls, [
      "POST /lookupSandbox",
      "POST /acquireSandbox",
      "POST /lookupSandbox",
      "POST /acquireSandbox",
    ]);
    assert.equal(placer.inFlight("a"), 0, "a wake of a sandbox found on its node is no placement");
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() runs nothing for a client that left while queued in the name's slot", async () => {
  const { routing, placer, add, close } = setup();
  const a = add("a");
  const held = Promise.withResolvers<void>(), first = Promise.withResolvers<void>();
  a.answers.set("/acquireSandbox", heldAcquireOn(a, held.promise, first.resolve));
  try {
    const holder = routing.create(createOptions("x"));
    await first.promise;
    const leaving = new AbortController();
    const queued = routing.create(createOptions("x", leaving.signal));
    assert.equal(routing.slots.isBusy("x"), true);
    leaving.abort();
    held.resolve();
    assert.equal((await holder).status, 200);
    await assert.rejects(queued, httpError(499));
    // One lookup and one create, both the holder's: the queued client cost the node nothing.
    assert.deepEqual(a.calls, ["POST /lookupSandbox", "POST /acquireSandbox"]);
    assert.equal(placer.inFlight("a"), 1);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() of an unnamed sandbox asks no node, places it and counts it under the name the node gave", async () => {
  const { routing, placer, finder, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a));
  try {
    const answer = await routing.create(createOptions(undefined));
    assert.equal(answer.status, 200);
    // A fresh name cannot exist anywhere: no lookup round.
    assert.deepEqual(a.calls, ["POST /acquireSandbox"]);
    const name = JSON.parse(answer.text).sandbox.name;
    assert.equal(name, "unnamed-1");
    assert.equal(finder.cached("name", name)?.node.id, "a");
    // Counted once, and under the node's name, so a destroy by that name gives it back.
    assert.equal(placer.inFlight("a"), 1);
    assert.equal(placer.release(name), true);
    assert.equal(placer.inFlight("a"), 0);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() of an unnamed sandbox refused with a 4xx leaves nothing counted", async () => {
  const { routing, placer, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a, 409));
  try {
    assert.equal((await routing.create(createOptions(undefined))).status, 409);
    assert.equal(placer.inFlight("a"), 0);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() for a client that already left is a 499 that asks no node", async () => {
  const { routing, placer, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a));
  const left = new AbortController();
  left.abort();
  try {
    for (const name of ["x", undefined]) {
      await assert.rejects(routing.create(createOptions(name, left.signal)), httpError(499));
    }
    assert.deepEqual(a.calls, []);
    assert.equal(placer.inFlight("a"), 0);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() with no node that fits is a 503 with Retry-After and every reason", async () => {
  const { routing, fleet, add, close } = setup();
  const a = add("a");
  fleet.checkIn(checkIn("a", a.endpoint, { reading: reading({ active: 400 }) }));
  try {
    await assert.rejects(routing.create(createOptions("x")), (error) => {
      httpError(503, /'a'.*DORMICE_GATEWAY_NODE_ACTIVE_LIMIT/)(error);
      const e = error as HttpError;
      assert.equal(e.headers["retry-after"], "15");
      assert.deepEqual((e.details.reasons as { reason: string }[]).map((r) => r.reason), [
        "active-limit",
      ]);
      return true;
    });
    assert.deepEqual(a.forwarded, []);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.resolve() turns a name on two nodes into a 409 and a silent node into a 503", async () => {
  const { routing, add, close } = setup();
  const a = add("a"), b = add("b");
  a.sandboxes.set("dup", { id: "a-1", name: "dup", state: "active" });
  b.sandboxes.set("dup", { id: "b-1", name: "dup", state: "active" });
  const signal = new AbortController().signal;
  try {
    await assert.rejects(routing.resolve("name", "dup", signal), (error) => {
      httpError(409, /'a'.*'b'/)(error);
      const nodes = (error as HttpError).details.nodes as { nodeId: string; sandboxId: string }[];
      assert.deepEqual(nodes.map((n) => `${n.nodeId}:${n.sandboxId}`), ["a:a-1", "b:b-1"]);
      return true;
    });
    b.silent = true;
    await assert.rejects(routing.resolve("name", "fresh", signal), (error) => {
      httpError(503, /'b'.*did not answer/)(error);
      assert.equal((error as HttpError).headers["retry-after"], "15");
      return true;
    });
    b.silent = false;
    await assert.rejects(
      routing.locate("name", "nowhere", signal),
      httpError(404, /No sandbox with name 'nowhere'.*acquireSandbox/),
    );
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.stream() re-checks a node's 404 and evicts the entry only when the sandbox is gone", async () => {
  const { routing, finder, add, close } = setup();
  const a = add("a");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  a.answers.set("/readFile", () => Response.json({ message: "No file /nope" }, { status: 404 }));
  const signal = new AbortController().signal;
  const read = async () => {
    const found = await routing.locate("name", "x", signal);
    const request = new Request("http://gw.test/readFile", { method: "POST", body: "{}" });
    const res = await routing.stream(request, { found, by: "name", key: "x", path: "/readFile" });
    assert.equal(res.status, 404);
    await res.body?.cancel();
  };
  try {
    // A missing file inside a live sandbox: the node still has it, the entry stays.
    await read();
    assert.deepEqual(a.calls, ["POST /lookupSandbox", "POST /readFile", "POST /lookupSandbox"]);
    assert.equal(finder.cached("name", "x")?.sandbox.id, "a-1");
    // Destroyed behind the gateway's back: the re-check evicts it.
    a.sandboxes.delete("x");
    await read();
    assert.equal(finder.cached("name", "x"), undefined);
    await assert.rejects(routing.locate("name", "x", signal), httpError(404));
  } finally {
    close();
  }
});

Deno.test("GatewayRouting answers at once with a 503 naming a node that stopped checking in", async () => {
  const { routing, finder, fleet, clock, add, close } = setup();
  const a = add("a");
  const b = add("b");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  a.answers.set("/execCommand", () => Response.json({ exitCode: 0 }));
  a.answers.set("/acquireSandbox", acquireOn(a));
  a.answers.set("/destroySandbox", () => Response.json({ destroyed: true }));
  b.answers.set("/acquireSandbox", acquireOn(b));
  const signal = new AbortController().signal;
  try {
    const found = await routing.locate("name", "x", signal);
    // a froze: b keeps checking in, a misses more than two of its 15 s intervals.
    clock.tick(31_000);
    fleet.checkIn(checkIn("b", b.endpoint));
    assert.equal(fleet.isDown("a"), true);
    const before = a.calls.length;
    const exec = new Request("http://gw.test/execCommand", { method: "POST", body: "{}" });
    const refusal = (error: unknown) => {
      httpError(
        503,
        /'a' at http:\/\/a\.test:3676 holds this sandbox but has not checked in for 31 s/,
      )(error);
      assert.match((error as HttpError).message, /removeNode/);
      assert.equal((error as HttpError).headers["retry-after"], "15");
      return true;
    };
    await assert.rejects(
      routing.stream(exec, { found, by: "name", key: "x", path: "/execCommand" }),
      refusal,
    );
    // The name may still live there: a create neither wakes nor builds it, a destroy waits too.
    await assert.rejects(routing.create(createOptions("x")), refusal);
    await assert.rejects(
      routing.destroy({ by: "name", key: "x", path: "/destroySandbox", body: "{}", signal }),
      refusal,
    );
    assert.equal(a.calls.length, before, "the silent node was not asked anything");
    assert.deepEqual(b.forwarded, [], "nothing was built elsewhere");
    assert.equal(finder.cached("name", "x")?.node.id, "a");
    // Back: served again.
    fleet.checkIn(checkIn("a", a.endpoint));
    const res = await routing.stream(exec, { found, by: "name", key: "x", path: "/execCommand" });
    assert.equal(res.status, 200);
    await res.body?.cancel();
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.stream() ends a wait for a head when the node stops checking in", async () => {
  const { routing, fleet, clock, watchClock, add, close } = setup();
  const a = add("a");
  const b = add("b");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  let asked!: () => void;
  const arrived = new Promise<void>((resolve) => asked = resolve);
  // The node took the request and froze: no head, ever.
  a.answers.set("/execCommand", (request) => {
    asked();
    return new Promise<Response>((_, reject) =>
      request.signal.addEventListener("abort", () => reject(request.signal.reason))
    );
  });
  try {
    const found = await routing.locate("name", "x", new AbortController().signal);
    const pending = routing.stream(
      new Request("http://gw.test/execCommand", { method: "POST", body: "{}" }),
      { found, by: "name", key: "x", path: "/execCommand" },
    );
    await arrived;
    clock.tick(31_000);
    fleet.checkIn(checkIn("b", b.endpoint));
    let settled = false;
    pending.finally(() => settled = true).catch(() => {});
    // The watch asks the Fleet every 10 ticks of 10 ms: not before the tenth, at the tenth.
    watchClock.tick(90);
    await flush();
    assert.equal(settled, false, "the watch asked before its tenth tick");
    watchClock.tick(10);
    await assert.rejects(
      pending,
      httpError(
        504,
        /'a' at http:\/\/a\.test:3676 stopped checking in .* while this request waited/,
      ),
    );
    assert.equal(routing.hangUps.size, 0);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.stream() sends the node's credentials by default and the client's own with headers {}", async () => {
  const { routing, add, close } = setup();
  const a = add("a");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  const seen: (string | null)[] = [];
  a.answers.set("/envd", (request) => {
    seen.push(request.headers.get("authorization"));
    return new Response("ok");
  });
  const found = await routing.locate("id", "a-1", new AbortController().signal);
  const request = () =>
    new Request("http://gw.test/x", {
      method: "POST",
      headers: { authorization: "Basic dXNlcg==" },
    });
  try {
    for (const headers of [undefined, {}]) {
      const res = await routing.stream(request(), {
        found,
        by: "id",
        key: "a-1",
        path: "/envd",
        headers,
      });
      assert.equal(await res.text(), "ok");
    }
    assert.deepEqual(seen, [`Bearer ${token}`, "Basic dXNlcg=="]);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.destroy() evicts and gives the placement back on a 2xx, re-checks a 404, and is null when no node has it", async () => {
  const { routing, placer, finder, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a));
  a.answers.set("/destroySandbox", (_r, body) => {
    const had = a.sandboxes.delete(String(body.name));
    return Response.json({ destroyed: had }, { status: had ? 200 : 404 });
  });
  const signal = new AbortController().signal;
  const destroy = (name: string) =>
    routing.destroy({
      by: "name",
      key: name,
      path: "/destroySandbox",
      body: JSON.stringify({ name }),
      signal,
    });
  try {
    await routing.create(createOptions("x"));
    assert.equal(placer.inFlight("a"), 1);
    const done = await destroy("x");
    assert.equal(done?.status, 200);
    assert.equal(finder.cached("name", "x"), undefined);
    assert.equal(placer.inFlight("a"), 0);

    // Cached, then gone behind the gateway's back: the node's 404 makes the Finder ask again.
    await routing.create(createOptions("y"));
    a.sandboxes.delete("y");
    a.calls = [];
    assert.equal((await destroy("y"))?.status, 404);
    assert.deepEqual(a.calls, [
      "POST /destroySandbox",
      "POST /lookupSandbox",
    ]);
    assert.equal(finder.cached("name", "y"), undefined);

    a.calls = [];
    assert.equal(await destroy("never"), null);
    assert.deepEqual(a.forwarded, []);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.destroy() by an id its cache lacks waits in the name's slot for an acquire's wake", async () => {
  const slots = new WatchedSlots();
  const { routing, another, add, close } = setup(slots);
  // The destroy comes through another gateway, whose cache has never seen the sandbox.
  const other = another().routing;
  const a = add("a");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "frozen" });
  const order: string[] = [];
  const waking = Promise.withResolvers<void>(), wakeMayFinish = Promise.withResolvers<void>();
  a.answers.set(
    "/acquireSandbox",
    heldAcquireOn(a, wakeMayFinish.promise, () => {
      order.push("wake");
      waking.resolve();
    }),
  );
  const destroyReached = Promise.withResolvers<void>();
  a.answers.set("/destroySandbox", (_request, body) => {
    order.push("destroy");
    destroyReached.resolve();
    const s = [...a.sandboxes.values()].find((x) => x.id === body.id);
    if (s) a.sandboxes.delete(s.name);
    return Response.json({ destroyed: s !== undefined }, { status: s ? 200 : 404 });
  });
  const signal = new AbortController().signal;
  try {
    // The acquire found x and its wake is on its way to the node, inside the name's slot.
    const acquiring = routing.create(createOptions("x"));
    await waking.promise;
    const queued = slots.nextAskFor("x");
    const destroying = other.destroy({
      by: "id",
      key: "a-1",
      path: "/destroySandbox",
      body: JSON.stringify({ id: "a-1" }),
      signal,
    });
    // Whichever comes first: the destroy queues behind the acquire in the name's slot, or it
    // reaches the node while the wake is still on its way (red when the id takes a slot of its
    // own: the wake would then rebuild, on that node, what the destroy just removed).
    const first = await Promise.race([
      queued.then(() => "queued in the name's slot"),
      destroyReached.promise.then(() => "reached the node during the wake"),
    ]);
    assert.equal(first, "queued in the name's slot");
    assert.deepEqual(order, ["wake"]);
    wakeMayFinish.resolve();
    assert.equal((await acquiring).status, 200);
    assert.equal((await destroying)?.status, 200);
    assert.deepEqual(order, ["wake", "destroy"]);
    assert.equal(a.sandboxes.size, 0, "the name was woken and then destroyed, not rebuilt");
    assert.deepEqual(slots.asked, ["x", "x"]);
  } finally {
    wakeMayFinish.resolve();
    close();
  }
});

Deno.test("GatewayRouting.create(): a cold create and a warm claim of one name race in its slot, and one sandbox is built", async () => {
  // w holds a warm sandbox and is busier; c holds none and is idle. Apart, the claim goes to w
  // and the cold create to c: two copies of the name, unless both run in the name's slot.
  const claim = { ...createOptions("x"), ask: placementAsk("minimal") };
  const cold = { ...createOptions("x"), ask: placementAsk("minimal", { network: true }) };
  const warmPool = { template: "minimal", spec: {}, warm: 2, target: 2 };
  const orders: [string, CreateOptions, CreateOptions][] = [
    ["cold first", cold, claim],
    ["claim first", claim, cold],
  ];
  for (const [label, first, second] of orders) {
    const slots = new WatchedSlots();
    const { routing, placer, fleet, add, close } = setup(slots);
    const w = add("w");
    const c = add("c");
    fleet.checkIn(checkIn("w", w.endpoint, { reading: reading({ active: 4 }), pools: [warmPool] }));
    const arrivals: string[] = [];
    let arrival = Promise.withResolvers<void>();
    const gate = Promise.withResolvers<void>();
    for (const node of [w, c]) {
      node.answers.set(
        "/acquireSandbox",
        heldAcquireOn(node, gate.promise, () => {
          arrivals.push(node.id);
          arrival.resolve();
        }),
      );
    }
    try {
      const one = routing.create(first);
      const queued = slots.nextAskFor("x");
      const two = routing.create(second);
      await arrival.promise;
      arrival = Promise.withResolvers<void>();
      // The second queues for the name's slot, or (red) reaches a node while the first's create
      // is still on its way.
      const next = await Promise.race([
        queued.then(() => "queued in the name's slot"),
        arrival.promise.then(() => `reached a node while the other was on its way: ${arrivals}`),
      ]);
      assert.equal(next, "queued in the name's slot", label);
      gate.resolve();
      const answers = await Promise.all([one, two]);
      const builder = first === claim ? "w" : "c";
      assert.deepEqual(answers.map((a) => a.node.id), [builder, builder], label);
      assert.deepEqual(
        [w, c].flatMap((n) => [...n.sandboxes.values()].map((s) => `${n.id}:${s.name}`)),
        [`${builder}:x`],
        `${label}: one sandbox`,
      );
      // One placement, and a claim counted only when the claim built it: the wake took none.
      assert.equal(placer.inFlight("w") + placer.inFlight("c"), 1, label);
      const left = placer.pick(claim.ask).explain.warm?.sampled[0].warm;
      assert.equal(left, first === claim ? 1 : 2, `${label}: w's warm left`);
    } finally {
      gate.resolve();
      close();
    }
  }
});

Deno.test("GatewayRouting.fanOut() parses each 2xx and names why each other node gave none", async () => {
  const { routing, add, close } = setup();
  const a = add("a"), b = add("b"), c = add("c");
  a.answers.set("/list", () => Response.json({ sandboxes: ["one"] }));
  b.answers.set("/list", () => Response.json({ message: "bad filter" }, { status: 400 }));
  c.silent = true;
  try {
    const answers = await routing.fanOut("/list", "{}", new AbortController().signal);
    assert.deepEqual(answers.map((x) => x.ok ? [x.node.id, x.json] : [x.node.id, x.cause]), [
      ["a", { sandboxes: ["one"] }],
      // The status and the node's sentence, which the E2B face passes on as the query's fault.
      ["b", 'HTTP 400: {"message":"bad filter"}'],
      ["c", "ECONNREFUSED: nothing listens at that address and port"],
    ]);
  } finally {
    close();
  }
});

/** A routing over `fleet` whose nodes `fakeFetch` answers, for the fan-out tests. */
function fanOutRouting(
  fleet: Fleet,
  fakeFetch: typeof fetch,
  options: Partial<ConstructorParameters<typeof GatewayRouting>[0]>,
): GatewayRouting {
  const finder = new Finder({ fleet, token, fetch: fakeFetch, timers: idleTimers });
  return new GatewayRouting({
    fleet,
    finder,
    placer: new Placer({ fleet }),
    token,
    fetch: fakeFetch,
    ...options,
  });
}

Deno.test("GatewayRouting.fanOut() asks at most fanOutConcurrency nodes at once, every node in the end", async () => {
  const nodes = new Map<string, StubNode>();
  const fleet = new Fleet({ clock: new FakeClock() });
  let inFlight = 0, peak = 0;
  for (let i = 0; i < 12; i++) {
    const node = new StubNode(`n${i}`, `http://n${i}.test:3676`);
    node.answers.set("/list", async () => {
      peak = Math.max(peak, ++inFlight);
      await new Promise((resolve) => setTimeout(resolve, 0));
      inFlight--;
      return Response.json({ sandboxes: [] });
    });
    nodes.set(node.endpoint, node);
    fleet.checkIn(checkIn(node.id, node.endpoint));
  }
  const routing = fanOutRouting(fleet, fetchToNodes(nodes), { fanOutConcurrency: 3 });
  try {
    const answers = await routing.fanOut("/list", "{}", new AbortController().signal);
    assert.equal(answers.filter((a) => a.ok).length, 12);
    assert.ok(peak <= 3, `${peak} nodes were asked at once`);
  } finally {
    fleet.close();
  }
});

Deno.test("GatewayRouting.fanOut() asks under one signal per worker, as wide as slow answers call for, up to fanOutConcurrencyMax", async () => {
  const fleet = new Fleet({ clock: new FakeClock() });
  for (let i = 0; i < 2000; i++) {
    fleet.checkIn(checkIn(`n${i}`, `http://10.2.${i >> 8}.${i & 255}:3676`));
  }
  // Each answer takes the routing's clock 10 ms on: with 4 in flight, an ask waits about 40 ms.
  const clock = new FakeClock(0);
  let inFlight = 0, peak = 0;
  const signals = new Set<AbortSignal>();
  const fakeFetch = (async (_input: RequestInfo | URL, init?: RequestInit) => {
    signals.add(init!.signal!);
    peak = Math.max(peak, ++inFlight);
    await Promise.resolve();
    clock.tick(10);
    inFlight--;
    return Response.json({ sandboxes: [] });
  }) as typeof fetch;
  const routing = fanOutRouting(fleet, fakeFetch, {
    clock,
    fanOutConcurrency: 4,
    fanOutConcurrencyMax: 200,
  });
  try {
    const first = await routing.fanOut("/list", "{}", new AbortController().signal);
    assert.equal(first.filter((a) => a.ok).length, 2000);
    // It begins at 4; its first 4 answers (40 ms each) call for 1,996 nodes × 40 ms in half of
    // the 4,960 ms left of its 5,000 ms bound: 33 at once.
    assert.equal(peak, 33, `${peak} nodes were asked at once in the first call`);
    // One signal per worker, not the call's bound shared by every ask in flight.
    assert.equal(signals.size, 33, `${signals.size} signals for 33 workers`);
    // The next call begins from those answers (about 330 ms each): at the ceiling.
    peak = 0;
    await routing.fanOut("/list", "{}", new AbortController().signal);
    assert.equal(peak, 200, `${peak} nodes were asked at once in the second call`);
  } finally {
    fleet.close();
  }
});

Deno.test("GatewayRouting.fanOut() does not wait on a node the fleet reads as down, and says so", async () => {
  const { routing, add, clock, fleet, close } = setup();
  const a = add("a"), b = add("b");
  a.answers.set("/list", () => Response.json({ sandboxes: ["one"] }));
  b.answers.set("/list", () => Response.json({ sandboxes: ["two"] }));
  try {
    clock.tick(31_000); // both silent past two 15 s intervals; a checks in again
    fleet.checkIn(checkIn("a", a.endpoint));
    const answers = await routing.fanOut("/list", "{}", new AbortController().signal);
    assert.deepEqual(answers.map((x) => x.ok ? [x.node.id, x.json] : [x.node.id, x.cause]), [
      ["a", { sandboxes: ["one"] }],
      ["b", "not asked: no check-in for 31 s, so the fleet reads it as down"],
    ]);
    assert.deepEqual(b.calls, [], "the down node was not asked");
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.fanOut() for a client that left mid-way is a 499", async () => {
  const { routing, add, close } = setup();
  const a = add("a");
  const left = new AbortController();
  a.answers.set("/list", () => {
    left.abort();
    throw new DOMException("The signal has been aborted", "AbortError");
  });
  try {
    await assert.rejects(routing.fanOut("/list", "{}", left.signal), httpError(499));
  } finally {
    close();
  }
});

Deno.test("GatewayRouting.create() tells the Finder of its create, so digests are not trusted before they show it", async () => {
  const { routing, finder, fleet, add, close } = setup();
  const a = add("a");
  a.answers.set("/acquireSandbox", acquireOn(a));
  const empty = LookupDigest.sized(0).toWire();
  const report = () => fleet.checkIn(checkIn("a", "http://a.test:3676", { lookupDigest: empty }));
  try {
    report();
    report();
    assert.equal(probesOf(finder).mustAsk(fleet.get("a")!, "name", "y"), undefined);
    await routing.create(createOptions("x"));
    // Red without routing's finder.placing(): the stale digest would rule the new name out.
    assert.equal(probesOf(finder).mustAsk(fleet.get("a")!, "name", "x"), "own-create");
    report();
    report();
    assert.equal(probesOf(finder).mustAsk(fleet.get("a")!, "name", "y"), undefined);
  } finally {
    close();
  }
});

Deno.test("GatewayRouting: a node declared dead frees its names, and back again a name built twice is a 409", async () => {
  const { routing, fleet, clock, add, nodes, another, close } = setup(new LocalSlots(), {
    deadAfterMs: 600_000,
  });
  const a = add("a");
  const b = add("b");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  a.answers.set("/acquireSandbox", acquireOn(a));
  b.answers.set("/acquireSandbox", acquireOn(b));
  const signal = new AbortController().signal;
  try {
    // a's machine is gone: its address refuses, b keeps checking in.
    nodes.delete(a.endpoint);
    clock.tick(31_000);
    fleet.checkIn(checkIn("b", b.endpoint));
    // Down, not dead: every name it may hold is refused, a new one included.
    await assert.rejects(routing.create(createOptions("y")), httpError(503, /'a'/));
    clock.tick(600_000);
    fleet.checkIn(checkIn("b", b.endpoint));
    assert.equal(fleet.list().find((n) => n.id === "a")?.state, "dead");
    // Dead: its names are free, built on b.
    for (const name of ["y", "x"]) {
      const res = await routing.create(createOptions(name));
      assert.equal(res.status, 200, name);
    }
    assert.equal(b.sandboxes.get("x")?.id.startsWith("b-"), true);
    // a comes back with its ledger: "x" is held twice, and every lookup says so.
    nodes.set(a.endpoint, a);
    fleet.checkIn(checkIn("a", a.endpoint));
    assert.equal(fleet.list().find((n) => n.id === "a")?.state, "up");
    // A gateway that did not build it (or this one once its cache entry goes) asks every node.
    const other = another();
    await assert.rejects(
      other.routing.resolve("name", "x", signal),
      httpError(409, /'a'.*'b'|'b'.*'a'/),
    );
    await assert.rejects(other.routing.create(createOptions("x")), httpError(409));
    // "y" was never on a: served from b alone.
    assert.equal((await other.routing.locate("name", "y", signal)).node.id, "b");
  } finally {
    close();
  }
});

Deno.test("GatewayRouting: while etcd is unreadable, a node it cannot hear of is served until its health check fails, then refused at once", async () => {
  const { routing, fleet, clock, add, close } = setup();
  const a = add("a");
  const b = add("b");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  a.answers.set("/execCommand", () => Response.json({ exitCode: 0 }));
  a.answers.set("/healthz", () => Response.json({ ok: true }));
  const signal = new AbortController().signal;
  const exec = () => new Request("http://gw.test/execCommand", { method: "POST", body: "{}" });
  try {
    const found = await routing.locate("name", "x", signal);
    // Shared mode: the last whole read of etcd began now, and none succeeds after it.
    fleet.replicaAsOf(clock.now());
    clock.tick(31_000);
    fleet.checkIn(checkIn("b", b.endpoint));
    assert.equal(fleet.isUnheard("a"), true);
    // It answers its health check: still served (it may be checking in with another gateway).
    const served = await routing.stream(exec(), {
      found,
      by: "name",
      key: "x",
      path: "/execCommand",
    });
    assert.equal(served.status, 200);
    await served.body?.cancel();
    for (let i = 0; i < 5; i++) await Promise.resolve();
    assert.ok(a.calls.includes("GET /healthz"), "it was asked itself");
    // It dies meanwhile: the next probe fails, and from then on its requests are a 503 at once.
    a.silent = true;
    clock.tick(5_001);
    const first = await routing.stream(exec(), {
      found,
      by: "name",
      key: "x",
      path: "/execCommand",
    })
      .catch((e) => e);
    // The request that started the probe met the refused connection itself (502).
    assert.ok(first instanceof HttpError && first.status === 502, String(first));
    for (let i = 0; i < 5; i++) await Promise.resolve();
    assert.ok(a.calls.filter((c) => c === "GET /healthz").length >= 2, "probed again");
    const before = a.calls.length;
    await assert.rejects(
      routing.stream(exec(), { found, by: "name", key: "x", path: "/execCommand" }),
      httpError(503, /'a' .*did not answer a health check .*cannot read etcd/),
    );
    assert.equal(a.calls.length, before, "nothing more reached it");
  } finally {
    close();
  }
});
