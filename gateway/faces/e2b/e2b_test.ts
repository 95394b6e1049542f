import assert from "node:assert/strict";
import { UNREACHABLE_COUNT_HEADER, UNREACHABLE_HEADER } from "./e2b.ts";
import { checkIn, reading } from "../../_fixtures_test.ts";
import { api, createNamed, key, setup } from "./_fixtures_test.ts";

Deno.test("E2B api: a missing or wrong X-API-KEY is a 401 in E2B's {code, message}", async () => {
  const { gateway } = setup();
  try {
    for (const headers of [{}, { "x-api-key": "wrong" }] as Record<string, string>[]) {
      const res = await api(gateway, "GET", "/v2/sandboxes", undefined, headers as typeof key);
      assert.equal(res.status, 401);
      const body = await res.json();
      assert.equal(body.code, 401);
      assert.match(body.message, /E2B_API_KEY/);
    }
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: twenty concurrent named creates build one sandbox and cache it", async () => {
  const { gateway, add } = setup();
  const a = add("a", 9e9);
  const b = add("b", 1e9);
  try {
    const answers = await Promise.all(
      Array.from(
        { length: 20 },
        () =>
          api(gateway, "POST", "/v2/sandboxes", { templateID: "base", metadata: { name: "n1" } }),
      ),
    );
    const ids = new Set<string>();
    for (const res of answers) {
      assert.equal(res.status, 201);
      ids.add((await res.json()).sandboxID);
    }
    assert.equal(ids.size, 1);
    assert.equal(a.sandboxes.size + b.sandboxes.size, 1);
    const [id] = ids;
    assert.equal(gateway.finder.cached("id", id)?.sandbox.name, "n1");
    assert.equal(gateway.finder.cached("name", "n1")?.sandbox.id, id);
    // The placement was counted once, where it went (memory breaks the tie: node a).
    assert.equal(gateway.placer.inFlight("a"), 1);
    assert.deepEqual(a.nameHeaders.filter((h) => h !== null), []);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a named create's cache hit is confirmed with its node by id; found is a wake", async () => {
  const { gateway, add } = setup();
  const a = add("a", 9e9);
  const b = add("b", 1e9);
  try {
    const first = await createNamed(gateway, "n1");
    assert.equal(first.status, 201);
    // A reading since: the placement is in the node's own count now, the gateway's is 0.
    gateway.fleet.checkIn(
      checkIn("a", a.endpoint, { reading: reading({ memoryAvailableBytes: 9e9 }) }),
    );
    for (const node of [a, b]) [node.calls, node.lookups] = [[], []];
    const again = await createNamed(gateway, "n1");
    assert.equal(again.status, 201);
    assert.equal(again.id, first.id);
    // Asked by id, only the node the cache names, then the wake on that node.
    assert.deepEqual(a.lookups, [{ id: first.id }]);
    assert.deepEqual(a.calls, ["POST /lookupSandbox", "POST /e2b/api/v2/sandboxes"]);
    assert.deepEqual(b.lookups, []);
    // A wake is not a placement.
    assert.equal(gateway.placer.inFlight("a"), 0);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a named create whose cached sandbox is gone evicts it and asks the fleet", async () => {
  const { gateway, add } = setup();
  const a = add("a", 9e9);
  const b = add("b", 1e9);
  try {
    const first = await createNamed(gateway, "n1");
    assert.equal(first.status, 201);
    // Killed behind the gateway's back.
    a.sandboxes.delete("n1");
    for (const node of [a, b]) node.lookups = [];
    const again = await createNamed(gateway, "n1");
    assert.equal(again.status, 201);
    assert.notEqual(again.id, first.id, "built anew");
    // By id on the cached node (absent), then by name across the whole fleet (none).
    assert.deepEqual(a.lookups, [{ id: first.id }, { name: "n1" }]);
    assert.deepEqual(b.lookups, [{ name: "n1" }]);
    assert.equal(gateway.finder.cached("id", first.id!), undefined, "the old id is evicted");
    assert.equal(gateway.finder.cached("name", "n1")?.sandbox.id, again.id);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a named create whose cached node is silent is a 503 naming it, built nowhere", async () => {
  const { gateway, add } = setup();
  const a = add("a", 9e9);
  const b = add("b", 1e9);
  try {
    const first = await createNamed(gateway, "n1");
    assert.equal(first.status, 201);
    a.silent = true;
    for (const node of [a, b]) [node.calls, node.lookups] = [[], []];
    const again = await createNamed(gateway, "n1");
    assert.equal(again.status, 503);
    assert.equal(again.body.code, 503);
    assert.match(again.body.message, /Cannot tell whether 'n1' exists: 'a'/);
    // The name may live on the silent node: neither asked of the fleet nor built on b.
    assert.deepEqual(b.lookups, []);
    assert.deepEqual(b.calls.filter((c) => c.startsWith("POST /e2b/api")), []);
    assert.equal(b.sandboxes.size, 0);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a bad metadata.name is a 400 naming the field, nothing placed", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const res = await api(gateway, "POST", "/sandboxes", {
      templateID: "base",
      metadata: { name: "x".repeat(129) },
    });
    assert.equal(res.status, 400);
    const body = await res.json();
    assert.equal(body.code, 400);
    assert.match(body.message, /metadata\.name/);
    const notJson = await gateway.fetch(
      new Request("http://gw.test/e2b/api/v2/sandboxes", {
        method: "POST",
        headers: key,
        body: "{",
      }),
    );
    assert.equal(notJson.status, 400);
    assert.equal((await notJson.json()).code, 400);
    assert.deepEqual(a.calls, []);
    assert.equal(gateway.placer.inFlight("a"), 0);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: an unnamed create is named by the gateway, placed without a lookup round", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const res = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base" });
    assert.equal(res.status, 201);
    const { sandboxID } = await res.json();
    assert.deepEqual(a.calls, ["POST /e2b/api/v2/sandboxes"]);
    assert.deepEqual(a.nameHeaders, ["e2b-gen-1"]);
    assert.equal(gateway.finder.cached("id", sandboxID)?.sandbox.name, "e2b-gen-1");
    assert.equal(gateway.placer.inFlight("a"), 1);

    // Kill: found by id, so the destroy runs in the name's slot and gives the placement back.
    const killed = await api(gateway, "DELETE", `/sandboxes/${sandboxID}`);
    assert.equal(killed.status, 204);
    assert.equal(await killed.text(), "");
    assert.equal(gateway.placer.inFlight("a"), 0);
    assert.equal(gateway.finder.cached("id", sandboxID), undefined);
    const again = await api(gateway, "DELETE", `/sandboxes/${sandboxID}`);
    assert.equal(again.status, 404);
    assert.equal((await again.json()).code, 404);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a node's 4xx to a create uncounts the placement", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  a.createStatus = 400;
  try {
    const res = await api(gateway, "POST", "/v2/sandboxes", { templateID: "nope" });
    assert.equal(res.status, 400);
    assert.deepEqual(await res.json(), { code: 400, message: "refused" });
    assert.equal(gateway.placer.inFlight("a"), 0);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a named create with no node able to take it is a 503 with Retry-After", async () => {
  const { gateway } = setup();
  try {
    const res = await api(gateway, "POST", "/v2/sandboxes", {
      templateID: "base",
      metadata: { name: "n" },
    });
    assert.equal(res.status, 503);
    assert.ok(res.headers.get("retry-after"));
    assert.equal((await res.json()).code, 503);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a sandbox on two nodes is a 409 in E2B's dialect", async () => {
  const { gateway, add } = setup();
  add("a").add("twin");
  add("b").add("twin");
  try {
    const res = await api(gateway, "POST", "/v2/sandboxes", {
      templateID: "base",
      metadata: { name: "twin" },
    });
    assert.equal(res.status, 409);
    const body = await res.json();
    assert.equal(body.code, 409);
    assert.match(body.message, /'a'.*'b'|'b'.*'a'/);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: routes with an id are found by id and forwarded; unknown is a 404", async () => {
  const { gateway, add } = setup();
  add("a");
  const b = add("b");
  const s = b.add("x", { team: "t" });
  try {
    const res = await api(gateway, "GET", `/sandboxes/${s.id}`);
    assert.equal(res.status, 200);
    assert.deepEqual((await res.json()).metadata, { team: "t" });
    assert.ok(b.calls.includes(`GET /e2b/api/sandboxes/${s.id}`));
    const missing = await api(gateway, "GET", "/sandboxes/nope");
    assert.equal(missing.status, 404);
    assert.equal((await missing.json()).code, 404);
    const unknownRoute = await api(gateway, "GET", "/templates/x/unknown");
    assert.equal(unknownRoute.status, 404);
    assert.equal((await unknownRoute.json()).code, 404);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: GET /v2/sandboxes merges every node's list and pages across them", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s)).toISOString();
  a.add("a1", {}, at(1));
  b.add("b2", {}, at(2));
  a.add("a3", {}, at(3));
  b.add("b4", {}, at(4));
  try {
    const all = await api(gateway, "GET", "/v2/sandboxes");
    assert.equal(all.headers.get("x-next-token"), null);
    assert.deepEqual((await all.json()).map((r: { sandboxID: string }) => r.sandboxID), [
      "b-2",
      "a-2",
      "b-1",
      "a-1",
    ]);
    const seen: string[] = [];
    let next: string | null = null;
    let pages = 0;
    do {
      const res = await api(
        gateway,
        "GET",
        `/v2/sandboxes?limit=3${next ? `&nextToken=${next}` : ""}`,
      );
      assert.equal(res.status, 200);
      seen.push(...(await res.json()).map((r: { sandboxID: string }) => r.sandboxID));
      next = res.headers.get("x-next-token");
      pages++;
    } while (next !== null && pages < 5);
    assert.deepEqual(seen, ["b-2", "a-2", "b-1", "a-1"]);
    assert.equal(pages, 2);
    const bad = await api(gateway, "GET", "/v2/sandboxes?nextToken=zzz");
    assert.equal(bad.status, 400);
    assert.equal((await bad.json()).code, 400);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: many silent nodes name the first 100 in x-dormice-unreachable, and count them all", async () => {
  const { gateway, add } = setup();
  add("a").add("a1");
  for (let i = 0; i < 150; i++) add(`s${String(i).padStart(3, "0")}`).silent = true;
  try {
    const res = await api(gateway, "GET", "/v2/sandboxes");
    assert.equal(res.status, 200);
    const named = res.headers.get(UNREACHABLE_HEADER)!.split(",");
    assert.equal(named.length, 100, "a header of 150 (or 10,000) ids is one no client accepts");
    assert.equal(named[0], "s000");
    assert.equal(res.headers.get(UNREACHABLE_COUNT_HEADER), "150");
    assert.equal((await res.json()).length, 1);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a silent node is named in x-dormice-unreachable; all silent is a 503", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  a.add("a1");
  b.silent = true;
  try {
    const res = await api(gateway, "GET", "/v2/sandboxes");
    assert.equal(res.status, 200);
    assert.equal(res.headers.get(UNREACHABLE_HEADER), "b");
    assert.equal((await res.json()).length, 1);
    a.silent = true;
    const none = await api(gateway, "GET", "/v2/sandboxes");
    assert.equal(none.status, 503);
    assert.equal((await none.json()).code, 503);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: routes not built yet are a 501 for an existing sandbox, E2B's 404 for a missing one", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const s = a.add("x");
  try {
    const routes = (_id: string): [string, string][] => [
      // A template's id, not a snapshot's: deleting templates is not built.
      ["DELETE", "/templates/tpl_1"],
    ];
    for (const [method, path] of routes(s.id)) {
      const res = await api(gateway, method, path, method === "GET" ? undefined : {});
      assert.equal(res.status, 501, `${method} ${path}`);
      const body = await res.json();
      assert.equal(body.code, 501);
      assert.match(body.message, /not built on this fleet/);
    }
    // Only lookups reached the node: the 501 is the gateway's own.
    assert.ok(a.calls.every((c) => c === "POST /lookupSandbox"), a.calls.join(", "));
    // A killed (or never made) sandbox is not found first, which the SDK raises as
    // SandboxNotFoundError; routes about no sandbox stay a 501.
    for (const [method, path] of routes("gone")) {
      const res = await api(gateway, method, path, method === "GET" ? undefined : {});
      const body = await res.json();
      const aboutSandbox = path.includes("/sandboxes/");
      assert.equal(res.status, aboutSandbox ? 404 : 501, `${method} ${path}`);
      assert.equal(body.code, res.status);
      if (aboutSandbox) assert.match(body.message, /^Sandbox 'gone' not found/);
    }
    const noKey = await api(gateway, "GET", "/snapshots", undefined, {} as typeof key);
    assert.equal(noKey.status, 401);
    await noKey.body?.cancel();
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: GET /sandboxes/metrics merges every node's answer; over 100 ids is a 400", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  const onA = a.add("x");
  const onB = b.add("y");
  try {
    const res = await api(
      gateway,
      "GET",
      `/sandboxes/metrics?sandbox_ids=${onA.id},${onB.id},nowhere`,
    );
    assert.equal(res.status, 200);
    assert.deepEqual((await res.json()).sandboxes, {
      [onA.id]: { cpuCount: 1, from: "a" },
      [onB.id]: { cpuCount: 1, from: "b" },
    });
    b.silent = true;
    const partial = await api(gateway, "GET", `/sandboxes/metrics?sandbox_ids=${onA.id}`);
    assert.equal(partial.headers.get(UNREACHABLE_HEADER), "b");
    assert.deepEqual(Object.keys((await partial.json()).sandboxes), [onA.id]);
    a.calls.length = 0;
    const many = Array.from({ length: 101 }, (_, i) => `sbx_${i}`).join(",");
    const tooMany = await api(gateway, "GET", `/sandboxes/metrics?sandbox_ids=${many}`);
    assert.equal(tooMany.status, 400);
    assert.match((await tooMany.json()).message, /at most 100/);
    assert.deepEqual(a.calls, [], "refused before any node is asked");
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a merged v2 list sums the nodes' x-total-running", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  a.add("a1");
  a.add("a2");
  b.add("b1");
  try {
    const res = await api(gateway, "GET", "/v2/sandboxes?limit=1");
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-total-running"), "3");
    assert.equal((await res.json()).length, 1);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: a create with address rules is placed only on a node that enforces them", async () => {
  const { gateway, add } = setup();
  const a = add("a", 9e9);
  const b = add("b", 1e9);
  const rules = { network: { denyOut: ["0.0.0.0/0"], allowOut: ["198.18.0.1"] } };
  try {
    // Neither says it enforces rules: a 503 naming the reason for each, nothing built.
    const none = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base", ...rules });
    assert.equal(none.status, 503);
    assert.match((await none.json()).message, /cannot enforce egress rules/);
    // A domain rule or a header transform alone asks for the same capability.
    for (
      const network of [
        { allowOut: ["api.example.com"] },
        { rules: { "api.example.com": [{ transform: { headers: { "X-K": "v" } } }] } },
      ]
    ) {
      const named = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base", network });
      assert.equal(named.status, 503, JSON.stringify(network));
      assert.match((await named.json()).message, /cannot enforce egress rules/);
    }
    assert.equal(a.sandboxes.size + b.sandboxes.size, 0);
    // b does (the less roomy one, which a plain create would not get).
    gateway.fleet.checkIn(
      checkIn("b", b.endpoint, {
        reading: reading({ memoryAvailableBytes: 1e9 }),
        egressRules: true,
      }),
    );
    const placed = await api(gateway, "POST", "/v2/sandboxes", { templateID: "base", ...rules });
    assert.equal(placed.status, 201);
    assert.equal(b.sandboxes.size, 1);
    assert.equal(a.sandboxes.size, 0);
    // A deny of every address alone is no egress: any node serves it, the roomier one here.
    const closed = await api(gateway, "POST", "/v2/sandboxes", {
      templateID: "base",
      network: { denyOut: ["0.0.0.0/0"] },
    });
    assert.equal(closed.status, 201);
    assert.equal(a.sandboxes.size, 1);
  } finally {
    gateway.close();
  }
});
