import assert from "node:assert/strict";
import { Hono } from "hono";
import { createGateway, Fleet } from "../mod.ts";
import { FakeClock } from "../shared/clock.ts";
import { buildGateway } from "./app.ts";
import { checkIn, reading, recordingLog } from "./_fixtures_test.ts";
import { auth, call, setup, type StubSandbox, token } from "./_app_fixtures_test.ts";

Deno.test("createGateway() answers /healthz openly and 401 on every other route without the token", async () => {
  const { gateway } = setup();
  try {
    const health = await gateway.fetch(new Request("http://gw.test/healthz"));
    assert.equal(health.status, 200);
    await health.body?.cancel();
    for (const verb of ["checkIn", "listNodes", "removeNode", "acquireSandbox", "nope"]) {
      for (
        const headers of [{}, { authorization: "Bearer wrong-token" }] as Record<string, string>[]
      ) {
        const res = await gateway.fetch(
          new Request(`http://gw.test/${verb}`, { method: "POST", headers, body: "{}" }),
        );
        assert.equal(res.status, 401, verb);
        assert.match((await res.json()).message, /token/);
      }
    }
  } finally {
    gateway.close();
  }
});

Deno.test("createGateway(): a fleet-only route's 401 asks for the fleet token, never an API key", async () => {
  const { gateway } = setup();
  try {
    const routes: [string, RequestInit][] = [
      ["GET /metrics", { method: "GET" }],
      ...["listNodes", "checkIn", "removeNode", "setPools", "createApiKey", "listApiKeys"].map(
        (verb): [string, RequestInit] => [verb, { method: "POST", body: "{}" }],
      ),
    ];
    for (const [route, init] of routes) {
      const path = route === "GET /metrics" ? "/metrics" : `/${route}`;
      for (const headers of [{}, { authorization: "Bearer wrong-token" }] as HeadersInit[]) {
        const res = await gateway.fetch(new Request(`http://gw.test${path}`, { ...init, headers }));
        assert.equal(res.status, 401, route);
        assert.equal(res.headers.get("www-authenticate"), "Bearer");
        const { message } = await res.json();
        assert.match(message, /DORMICE_API_TOKEN/, route);
        assert.ok(message.includes(`${route} takes the fleet token`), message);
        assert.doesNotMatch(message, /API key>|createApiKey\)/, message);
      }
    }
    // A key on them is still a 403; the client verbs still ask for a key.
    const created = await call(gateway, "createApiKey", { team: "acme" });
    const { key } = await created.json();
    const byKey = await gateway.fetch(
      new Request("http://gw.test/metrics", { headers: { authorization: `Bearer ${key}` } }),
    );
    assert.equal(byKey.status, 403);
    assert.match((await byKey.json()).message, /fleet token \(DORMICE_API_TOKEN\) only/);
    const client = await gateway.fetch(
      new Request("http://gw.test/acquireSandbox", { method: "POST", body: "{}" }),
    );
    assert.equal(client.status, 401);
    assert.match((await client.json()).message, /Bearer <API key>/);
  } finally {
    gateway.close();
  }
});

Deno.test("createGateway() refuses a check-in whose endpoint has a path, and a twin id", async () => {
  const { gateway } = setup();
  try {
    const bad = await call(gateway, "checkIn", checkIn("a", "http://10.0.0.1:3676/api"));
    assert.equal(bad.status, 400);
    assert.match((await bad.json()).message, /'endpoint'.*path/);
    const ok = await call(gateway, "checkIn", checkIn("a", "http://10.0.0.1:3676"));
    assert.equal(ok.status, 200);
    await ok.body?.cancel();
    const twin = await call(gateway, "checkIn", checkIn("a", "http://10.0.0.2:3676"));
    assert.equal(twin.status, 409);
    const { message } = await twin.json();
    assert.match(message, /10\.0\.0\.1:3676/);
    assert.match(message, /10\.0\.0\.2:3676/);
  } finally {
    gateway.close();
  }
});

Deno.test("checkIn refuses an interval outside 1–300 s with a sentence naming the variable", async () => {
  const { gateway } = setup();
  try {
    for (const intervalSeconds of [3600, 301, 0.5, 0]) {
      const res = await call(gateway, "checkIn", checkIn("a", undefined, { intervalSeconds }));
      assert.equal(res.status, 400, String(intervalSeconds));
      assert.match((await res.json()).message, /'intervalSeconds'.*check-in interval/);
    }
    const ok = await call(gateway, "checkIn", checkIn("a", undefined, { intervalSeconds: 300 }));
    assert.equal(ok.status, 200);
    await ok.body?.cancel();
    const res = await call(gateway, "checkIn", checkIn("a", undefined, { intervalSeconds: 3600 }));
    assert.match((await res.json()).message, /DORMICE_CHECK_IN_INTERVAL_SECONDS.*1–300/);
    assert.equal(gateway.fleet.get("a")?.intervalSeconds, 300);
  } finally {
    gateway.close();
  }
});

Deno.test("acquireSandbox places a new name, then wakes it with created:false", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const first = await (await call(gateway, "acquireSandbox", { name: "x" })).json();
    assert.equal(first.created, true);
    const again = await (await call(gateway, "acquireSandbox", { name: "x" })).json();
    assert.equal(again.created, false);
    assert.equal(again.sandbox.id, first.sandbox.id);
    // The second acquire confirmed the cache hit with its node by id before forwarding.
    assert.deepEqual(a.calls, [
      "lookupSandbox",
      "acquireSandbox",
      "lookupSandbox",
      "acquireSandbox",
    ]);
  } finally {
    gateway.close();
  }
});

Deno.test("twenty simultaneous acquires of one name build one sandbox", async () => {
  const { gateway, add } = setup();
  const a = add("a"), b = add("b");
  try {
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => call(gateway, "acquireSandbox", { name: "same" })),
    );
    const bodies = await Promise.all(answers.map((r) => r.json()));
    assert.equal(bodies.filter((b) => b.created).length, 1);
    assert.equal(new Set(bodies.map((b) => b.sandbox.id)).size, 1);
    assert.equal(a.sandboxes.size + b.sandboxes.size, 1);
  } finally {
    gateway.close();
  }
});

Deno.test("a 129-character name is a 400 before any lookup", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    for (const verb of ["acquireSandbox", "execCommand", "destroySandbox", "lookupSandbox"]) {
      const res = await call(gateway, verb, { name: "n".repeat(129), command: "true" });
      assert.equal(res.status, 400, verb);
      assert.match((await res.json()).message, /'name'.*128/);
    }
    assert.deepEqual(a.calls, []);
  } finally {
    gateway.close();
  }
});

Deno.test("a name on two nodes is a 409 naming both; a silent node makes a new name a 503", async () => {
  const { gateway, add } = setup();
  const a = add("a"), b = add("b");
  try {
    a.sandboxes.set("dup", { id: "a-1", name: "dup", state: "active" });
    b.sandboxes.set("dup", { id: "b-1", name: "dup", state: "active" });
    const conflict = await call(gateway, "execCommand", { name: "dup", command: "true" });
    assert.equal(conflict.status, 409);
    const { message } = await conflict.json();
    assert.match(message, /'a'/);
    assert.match(message, /'b'/);
    b.silent = true;
    const unsure = await call(gateway, "acquireSandbox", { name: "fresh" });
    assert.equal(unsure.status, 503);
    assert.ok(Number(unsure.headers.get("retry-after")) >= 1);
    assert.match((await unsure.json()).message, /'b'/);
    assert.equal(a.sandboxes.has("fresh"), false);
  } finally {
    gateway.close();
  }
});

Deno.test("in-flight: a destroy gives the slot back, a 4xx uncounts, a 5xx stays counted", async () => {
  const { gateway, add } = setup({ activeLimit: 1 });
  const a = add("a");
  try {
    const inFlight = () => gateway.placer.inFlight("a");
    assert.equal((await call(gateway, "acquireSandbox", { name: "p" })).status, 200);
    assert.equal(inFlight(), 1);
    const full = await call(gateway, "acquireSandbox", { name: "q" });
    assert.equal(full.status, 503);
    assert.match((await full.json()).message, /'a'.*DORMICE_GATEWAY_NODE_ACTIVE_LIMIT/);
    const destroyed = await (await call(gateway, "destroySandbox", { name: "p" })).json();
    assert.equal(destroyed.destroyed, true);
    assert.equal(inFlight(), 0);
    a.acquireStatus = 400;
    assert.equal((await call(gateway, "acquireSandbox", { name: "r" })).status, 400);
    assert.equal(inFlight(), 0);
    a.acquireStatus = 500;
    assert.equal((await call(gateway, "acquireSandbox", { name: "s" })).status, 500);
    assert.equal(inFlight(), 1);
  } finally {
    gateway.close();
  }
});

Deno.test("a node's 404 for a cached sandbox evicts it, so the next request finds it elsewhere", async () => {
  const { gateway, add } = setup();
  const a = add("a"), b = add("b");
  try {
    b.sandboxes.set("moved", { id: "b-1", name: "moved", state: "active" });
    assert.equal((await call(gateway, "execCommand", { name: "moved", command: "x" })).status, 200);
    b.sandboxes.delete("moved");
    const gone = await call(gateway, "execCommand", { name: "moved", command: "x" });
    assert.equal(gone.status, 404);
    await gone.body?.cancel();
    a.sandboxes.set("moved", { id: "a-1", name: "moved", state: "active" });
    const res = await call(gateway, "execCommand", { name: "moved", command: "x" });
    assert.equal((await res.json()).stdout, "a\n");
  } finally {
    gateway.close();
  }
});

Deno.test("listSandboxes merges every node and names the one that did not answer", async () => {
  const { gateway, add } = setup();
  const a = add("a"), b = add("b");
  try {
    a.sandboxes.set("one", { id: "a-1", name: "one", state: "active" });
    b.sandboxes.set("two", { id: "b-1", name: "two", state: "active" });
    const all = await (await call(gateway, "listSandboxes", {})).json();
    assert.deepEqual(all.sandboxes.map((s: StubSandbox) => s.name).sort(), ["one", "two"]);
    b.silent = true;
    const part = await call(gateway, "listSandboxes", {});
    assert.equal(part.headers.get("x-dormice-unreachable"), "b");
    assert.equal(part.headers.get("x-dormice-unreachable-count"), "1");
    const body = await part.json();
    assert.deepEqual(body.unreachable.map((u: { nodeId: string }) => u.nodeId), ["b"]);
    assert.equal(body.sandboxes.length, 1);
  } finally {
    gateway.close();
  }
});

Deno.test("getHostMetrics is a 501 naming the nodes; an unknown verb a 404; GET on a verb a 405", async () => {
  const { gateway, add } = setup();
  add("a");
  try {
    const host = await call(gateway, "getHostMetrics", {});
    assert.equal(host.status, 501);
    assert.match((await host.json()).message, /http:\/\/a\.test:3676\/getHostMetrics/);
    const unknown = await call(gateway, "frobnicate", {});
    assert.equal(unknown.status, 404);
    assert.match((await unknown.json()).message, /Unknown verb 'frobnicate'/);
    const get = await gateway.fetch(
      new Request("http://gw.test/execCommand", { headers: auth }),
    );
    assert.equal(get.status, 405);
    await get.body?.cancel();
  } finally {
    gateway.close();
  }
});

Deno.test("a client that already hung up costs no lookup and builds nothing", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const controller = new AbortController();
    controller.abort();
    const res = await call(gateway, "acquireSandbox", { name: "late" }, {
      signal: controller.signal,
    });
    assert.equal(res.status, 499);
    await res.body?.cancel();
    const exec = await call(gateway, "execCommand", { name: "late", command: "x" }, {
      signal: controller.signal,
    });
    assert.equal(exec.status, 499);
    await exec.body?.cancel();
    assert.deepEqual(a.calls, []);
  } finally {
    gateway.close();
  }
});

Deno.test("execCommand's head bound is the head timeout, or its own timeoutSeconds plus a margin", async () => {
  const { gateway, add } = setup({ headTimeoutMs: 50 });
  const a = add("a");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  a.execMs = 200;
  try {
    const cut = await call(gateway, "execCommand", { name: "x", command: "sleep 0.2" });
    assert.equal(cut.status, 504);
    assert.match((await cut.json()).message, /'a' at .* sent no answer within 50 ms/);
    // A command that says how long it may run is waited for that long (plus 30 s).
    const waited = await call(gateway, "execCommand", {
      name: "x",
      command: "sleep 0.2",
      timeoutSeconds: 1,
    });
    assert.equal(waited.status, 200);
    assert.equal((await waited.json()).exitCode, 0);
  } finally {
    gateway.close();
  }
});

Deno.test("the cached fast path forwards nothing for a client that already hung up", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  try {
    const warm = await call(gateway, "execCommand", { name: "x", command: "true" });
    assert.equal(warm.status, 200);
    await warm.body?.cancel();
    assert.ok(gateway.finder.cached("name", "x"), "x is a cache hit: no lookup, no await");
    const calls = a.calls.length;
    const gone = new AbortController();
    gone.abort();
    for (const verb of ["execCommand", "readFile", "lookupSandbox"]) {
      const res = await call(gateway, verb, { name: "x", command: "sleep 1", path: "/a" }, {
        signal: gone.signal,
      });
      assert.equal(res.status, 499, verb);
      await res.body?.cancel();
    }
    assert.equal(a.calls.length, calls, "the node heard nothing more");
  } finally {
    gateway.close();
  }
});

Deno.test("buildGateway() mounts more faces under /e2b/ that answer their own auth", async () => {
  const gateway = buildGateway({
    token,
    faces: { e2b: false },
    mount: (app, parts) => {
      app.get("/e2b/api/health", (c) => c.json({ nodes: parts.fleet.size }));
    },
  });
  try {
    const res = await gateway.fetch(new Request("http://gw.test/e2b/api/health"));
    assert.equal(res.status, 200);
    assert.deepEqual(await res.json(), { nodes: 0 });
  } finally {
    gateway.close();
  }
});

Deno.test("the routed verbs answer alike before Hono (gateway.fetch) and through it (gateway.app)", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  a.sandboxes.set("x", { id: "a-1", name: "x", state: "active" });
  const cases: [string, unknown, Record<string, string>][] = [
    ["execCommand", { name: "x", command: "true" }, auth],
    ["execCommand?trace=1", { name: "x", command: "true" }, auth],
    ["execCommand", { name: "x", command: "true" }, {}],
    ["execCommand", { name: "x", command: "true" }, { authorization: "Bearer wrong-token" }],
    ["execCommand", { name: 5 }, auth],
    ["execCommand", { name: "ghost", command: "true" }, auth],
    ["lookupSandbox", { name: "ghost" }, auth],
    ["lookupSandbox", { name: "x" }, auth],
    ["getSandboxMetrics", "not json", auth],
    ["readFile", { name: "x", path: "/a" }, auth],
  ];
  try {
    for (const [path, body, headers] of cases) {
      const request = () =>
        new Request(`http://gw.test/${path}`, {
          method: "POST",
          headers,
          body: typeof body === "string" ? body : JSON.stringify(body),
        });
      const fast = await gateway.fetch(request());
      const routed = await gateway.app.fetch(request());
      assert.equal(fast.status, routed.status, path);
      assert.equal(fast.headers.get("www-authenticate"), routed.headers.get("www-authenticate"));
      assert.equal(fast.headers.get("content-type"), routed.headers.get("content-type"), path);
      assert.equal(await fast.text(), await routed.text(), path);
    }
  } finally {
    gateway.close();
  }
});

Deno.test("createGateway(): a team's count keeps a create and a destroy a node's stale reading lacks", async () => {
  // A check-in whose counts were read before a create, heard after its answer: the gateway
  // still counts the create, by the node's change numbers; and the same for a destroy.
  const { gateway, add } = setup();
  try {
    const node = add("n1");
    node.ledgerSeq = 100;
    const made = await call(gateway, "createApiKey", { team: "acme", maxSandboxes: 1 });
    const { key } = await made.json();
    const asKey = (verb: string, body: unknown) =>
      gateway.fetch(
        new Request(`http://gw.test/${verb}`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify(body),
        }),
      );
    const staleCheckIn = (acme: number, ledgerSeq: number) =>
      gateway.fleet.checkIn(
        checkIn("n1", node.endpoint, {
          reading: reading({ memoryAvailableBytes: 8e9, teams: { acme }, ledgerSeq }),
        }),
      );
    const first = await asKey("acquireSandbox", { name: "a1" });
    assert.equal(first.status, 200);
    await first.body?.cancel();
    staleCheckIn(0, 100);
    const second = await asKey("acquireSandbox", { name: "a2" });
    assert.equal(second.status, 429, "the stale reading's 0 plus the create it lacks is the limit");
    await second.body?.cancel();
    const gone = await asKey("destroySandbox", { name: "a1" });
    assert.equal(gone.status, 200);
    await gone.body?.cancel();
    staleCheckIn(1, 101);
    const third = await asKey("acquireSandbox", { name: "a2" });
    assert.equal(third.status, 200, "the stale reading's 1 less the destroy it lacks is room");
    await third.body?.cancel();
  } finally {
    gateway.close();
  }
});

// Embedding: createGateway as a host service uses it, through the package's root.

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
