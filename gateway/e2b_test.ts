import assert from "node:assert/strict";
import { createGateway, type Gateway } from "./app.ts";
import { mountE2b, SANDBOX_NAME_HEADER, UNREACHABLE_HEADER } from "./e2b.ts";
import { checkIn, reading } from "./_fixtures_test.ts";
import { AccessTokens, fileSignature } from "../shared/access_tokens.ts";

const token = "gateway-e2b-unit-test-token-0123456789abcdef";
const key = { "x-api-key": token, "content-type": "application/json" };
/** The envd access tokens every node of this fleet mints (derived from the fleet token). */
const envdTokens = AccessTokens.fromFleetToken(token);

interface StubSandbox {
  id: string;
  name: string;
  metadata: Record<string, string>;
  startedAt: string;
}

/** An in-process node: lookupSandbox and a small E2B control plane and envd over a map. */
class StubNode {
  sandboxes = new Map<string, StubSandbox>();
  /** Paths the node was asked, with the method. */
  calls: string[] = [];
  /** Each lookup's body, in order. */
  lookups: Record<string, string>[] = [];
  /** Each create's name header. */
  nameHeaders: (string | null)[] = [];
  /** When set, every request fails as if the node did not answer. */
  silent = false;
  /** Status to answer creates with instead of creating. */
  createStatus: number | undefined;
  /** The last envd request's headers and body. */
  envdSeen: { headers: Headers; body: string; path: string } | undefined;
  /** The signal of the last held stream. */
  held: AbortSignal | undefined;
  #seq = 0;
  constructor(readonly id: string, readonly endpoint: string) {}

  byId(id: string): StubSandbox | undefined {
    return [...this.sandboxes.values()].find((s) => s.id === id);
  }

  add(name: string, metadata: Record<string, string> = {}, startedAt = new Date().toISOString()) {
    const s = { id: `${this.id}-${++this.#seq}`, name, metadata: { ...metadata }, startedAt };
    this.sandboxes.set(name, s);
    return s;
  }

  async handle(request: Request): Promise<Response> {
    const url = new URL(request.url);
    const path = url.pathname;
    this.calls.push(`${request.method} ${path}`);
    if (this.silent) throw new TypeError("error sending request: Connection refused");
    if (path === "/e2b/envd/process.Process/Start") {
      // A stream that never ends: only the client hanging up (through the gateway) stops it.
      this.held = request.signal;
      return new Response(
        new ReadableStream({
          start: (controller) => controller.enqueue(new TextEncoder().encode("first")),
        }),
        { headers: { "content-type": "application/connect+json" } },
      );
    }
    if (path.startsWith("/e2b/envd/")) {
      this.envdSeen = {
        headers: request.headers,
        body: await request.text(),
        path: path + url.search,
      };
      return new Response("from " + this.id, { headers: { "content-type": "text/plain" } });
    }
    assert.equal(request.headers.get("authorization"), `Bearer ${token}`);
    if (path === "/lookupSandbox") {
      const body = await request.json();
      this.lookups.push(body);
      const s = body.name !== undefined ? this.sandboxes.get(body.name) : this.byId(body.id);
      return Response.json(
        s
          ? { found: true, sandbox: { id: s.id, name: s.name, state: "active" } }
          : { found: false },
      );
    }
    if (path === "/e2b/api/v2/sandboxes" && request.method === "POST") {
      const body = await request.json();
      this.nameHeaders.push(request.headers.get(SANDBOX_NAME_HEADER));
      if (this.createStatus !== undefined) {
        return Response.json({ code: this.createStatus, message: "refused" }, {
          status: this.createStatus,
        });
      }
      // A yield, so concurrent creates would interleave here if the gateway let them through.
      await new Promise((r) => setTimeout(r, 0));
      const name = body.metadata?.name ?? request.headers.get(SANDBOX_NAME_HEADER) ?? "random";
      const s = this.sandboxes.get(name) ?? this.add(name, body.metadata);
      return Response.json({ sandboxID: s.id, templateID: "base", envdVersion: "0.6.13" }, {
        status: 201,
      });
    }
    if (path === "/e2b/api/v2/sandboxes" && request.method === "GET") {
      // Newest first, after the cursor, `limit` rows: the node's own paging.
      const limit = Number(url.searchParams.get("limit") ?? 100);
      const token = url.searchParams.get("nextToken");
      const cursor = token ? JSON.parse(atob(token.replace(/-/g, "+").replace(/_/g, "/"))) : null;
      const rows = [...this.sandboxes.values()]
        .map((s) => ({ sandboxID: s.id, startedAt: s.startedAt, metadata: s.metadata }))
        .sort((x, y) => Date.parse(y.startedAt) - Date.parse(x.startedAt))
        .filter((r) => !cursor || Date.parse(r.startedAt) < Date.parse(cursor[0]));
      return Response.json(rows.slice(0, limit), {
        headers: { "x-total-running": String(rows.length) },
      });
    }
    if (path === "/e2b/api/sandboxes/metrics") {
      const asked = (url.searchParams.get("sandbox_ids") ?? "").split(",");
      const sandboxes = Object.fromEntries(
        asked.filter((id) => this.byId(id)).map((id) => [id, { cpuCount: 1, from: this.id }]),
      );
      return Response.json({ sandboxes });
    }
    const m = /^\/e2b\/api\/sandboxes\/([^/]+)$/.exec(path);
    if (m) {
      const s = this.byId(m[1]);
      if (!s) return Response.json({ code: 404, message: "not here" }, { status: 404 });
      if (request.method === "DELETE") {
        this.sandboxes.delete(s.name);
        return new Response(null, { status: 204 });
      }
      return Response.json({ sandboxID: s.id, metadata: s.metadata, state: "running" });
    }
    return Response.json({ code: 404, message: "no route" }, { status: 404 });
  }
}

function setup() {
  const nodes = new Map<string, StubNode>();
  const fakeFetch = (input: RequestInfo | URL, init?: RequestInit) => {
    const request = new Request(input, init);
    const node = nodes.get(new URL(request.url).origin);
    if (!node) return Promise.reject(new TypeError("error sending request: Connection refused"));
    return node.handle(request);
  };
  let names = 0;
  const gateway = createGateway({
    token,
    fetch: fakeFetch as typeof fetch,
    lookupTimeoutMs: 500,
    mount: (app, parts) => mountE2b(app, parts, { randomName: () => `e2b-gen-${++names}` }),
  });
  const add = (id: string, memoryAvailableBytes = 8e9) => {
    const endpoint = `http://${id}.test:3676`;
    const node = new StubNode(id, endpoint);
    nodes.set(endpoint, node);
    gateway.fleet.checkIn(checkIn(id, endpoint, { reading: reading({ memoryAvailableBytes }) }));
    return node;
  };
  return { gateway, add };
}

function api(gateway: Gateway, method: string, path: string, body?: unknown, headers = key) {
  return gateway.fetch(
    new Request(`http://gw.test/e2b/api${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    }),
  );
}

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

/** A named create through the gateway; its status and sandbox id. */
async function createNamed(gateway: Gateway, name: string) {
  const res = await api(gateway, "POST", "/v2/sandboxes", {
    templateID: "base",
    metadata: { name },
  });
  const body = await res.json();
  return { status: res.status, body, id: body.sandboxID as string | undefined };
}

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
    const unknownRoute = await api(gateway, "GET", "/templates");
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

Deno.test("E2B faces: an invalid sandbox id is a 400 in the face's dialect that asks no node", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  try {
    for (const id of ["x".repeat(129), "bad/id", "bad id!"]) {
      const answers: [string, Response, "e2b" | "connect"][] = [
        ["GET api", await api(gateway, "GET", `/sandboxes/${encodeURIComponent(id)}`), "e2b"],
        ["DELETE api", await api(gateway, "DELETE", `/sandboxes/${encodeURIComponent(id)}`), "e2b"],
        [
          "connect api",
          await api(gateway, "POST", `/v2/sandboxes/${encodeURIComponent(id)}/connect`, {}),
          "e2b",
        ],
        [
          "envd rpc",
          await envd(gateway, "/process.Process/List", { "e2b-sandbox-id": id }, "{}"),
          "connect",
        ],
        ["envd files", await envd(gateway, "/files?path=/a", { "e2b-sandbox-id": id }), "e2b"],
        [
          "root files",
          await gateway.fetch(
            new Request("http://gw.test/files?path=/a&signature=v1_x", {
              headers: { "e2b-sandbox-id": id },
            }),
          ),
          "e2b",
        ],
      ];
      for (const [where, res, dialect] of answers) {
        assert.equal(res.status, 400, `${where} ${id}`);
        const body = await res.json();
        assert.equal(body.code, dialect === "connect" ? "invalid_argument" : 400, where);
        assert.match(body.message, /is not a sandbox id: a sandbox id (uses only|has at most 128)/);
        // No node was asked, so none is named (the old answer listed every node's endpoint).
        assert.doesNotMatch(JSON.stringify(body), /\.test:3676/, where);
      }
    }
    assert.deepEqual([...a.calls, ...b.calls], []);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: requests without the sandbox's token or signature are 401s that reach no node", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const b = add("b");
  const s = a.add("x");
  const other = envdTokens.forSandbox(`${s.id}-other`);
  const expired = fileSignature({
    path: "/a",
    operation: "read",
    user: "",
    accessToken: envdTokens.forSandbox(s.id),
    expiration: 1,
  });
  try {
    // A flood of random ids with no token, a wrong token, or a bad or expired signature.
    const floods: [string, Record<string, string>, RegExp, "connect" | "rest"][] = [];
    for (let i = 0; i < 50; i++) {
      const id = `rnd-${crypto.randomUUID()}`;
      floods.push([
        "/process.Process/List",
        { "e2b-sandbox-id": id },
        /needs the X-Access/,
        "connect",
      ]);
      floods.push([
        "/health",
        { "e2b-sandbox-id": id, "x-access-token": other },
        /does not belong/,
        "rest",
      ]);
    }
    floods.push([
      "/process.Process/List",
      { "e2b-sandbox-id": s.id, "x-access-token": other },
      /does not belong/,
      "connect",
    ]);
    floods.push([
      "/files?path=/a&signature=v1_forged",
      { "e2b-sandbox-id": s.id },
      /needs the X-Access/,
      "rest",
    ]);
    floods.push([
      `/files?path=/a&signature=${encodeURIComponent(expired)}&signature_expiration=1`,
      { "e2b-sandbox-id": s.id },
      /needs/,
      "rest",
    ]);
    // A signature only stands in for the token on REST doors, as on the node.
    floods.push([
      `/process.Process/List?signature=${encodeURIComponent(expired)}`,
      { "e2b-sandbox-id": s.id },
      /needs/,
      "connect",
    ]);
    for (const [path, headers, message, dialect] of floods) {
      const res = await envd(gateway, path, headers, "{}");
      assert.equal(res.status, 401, path);
      const body = await res.json();
      assert.equal(body.code, dialect === "connect" ? "unauthenticated" : 401, path);
      assert.match(body.message, message);
    }
    const door = await gateway.fetch(
      new Request("http://gw.test/files?path=/a&signature=v1_forged", {
        headers: { "e2b-sandbox-id": s.id },
      }),
    );
    assert.equal(door.status, 401);
    assert.equal((await door.json()).code, 401);
    // Not one lookup, not one forward: the nodes never heard of any of it.
    assert.deepEqual([...a.calls, ...b.calls], []);
  } finally {
    gateway.close();
  }
});

function envd(gateway: Gateway, path: string, headers: Record<string, string>, body?: BodyInit) {
  return gateway.fetch(
    new Request(`http://gw.test/e2b/envd${path}`, { method: "POST", headers, body }),
  );
}

Deno.test("E2B envd: forwarded by E2b-Sandbox-Id with the client's headers untouched", async () => {
  const { gateway, add } = setup();
  add("a");
  const b = add("b");
  const s = b.add("x");
  try {
    const res = await envd(gateway, "/files?path=/tmp/a", {
      "e2b-sandbox-id": s.id,
      "x-access-token": envdTokens.forSandbox(s.id),
      "authorization": "Basic cm9vdDo=",
      "content-type": "application/octet-stream",
    }, new Uint8Array([1, 2, 3]));
    assert.equal(res.status, 200);
    assert.equal(await res.text(), "from b");
    assert.equal(b.envdSeen?.path, "/e2b/envd/files?path=/tmp/a");
    assert.equal(b.envdSeen?.headers.get("x-access-token"), envdTokens.forSandbox(s.id));
    assert.equal(b.envdSeen?.headers.get("authorization"), "Basic cm9vdDo=");
    assert.equal(b.envdSeen?.headers.get("content-type"), "application/octet-stream");
    assert.equal(b.envdSeen?.body, "\u0001\u0002\u0003");
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: routing errors in the Connect dialect on RPC paths, {code:int} on REST", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const rpc = "/process.Process/List";
    const noHeader = await envd(gateway, rpc, { "content-type": "application/json" }, "{}");
    assert.equal(noHeader.status, 400);
    assert.equal((await noHeader.json()).code, "invalid_argument");

    const nope = { "e2b-sandbox-id": "nope", "x-access-token": envdTokens.forSandbox("nope") };
    const gone = await envd(gateway, rpc, nope, "{}");
    assert.equal(gone.status, 502);
    assert.equal((await gone.json()).code, "unavailable");
    const goneRest = await envd(gateway, "/files?path=/x", nope);
    assert.equal(goneRest.status, 502);
    assert.equal((await goneRest.json()).code, 502);

    a.silent = true;
    const silent = await envd(gateway, rpc, nope, "{}");
    assert.equal(silent.status, 503);
    assert.ok(silent.headers.get("retry-after"));
    assert.equal((await silent.json()).code, "unavailable");
    const silentRest = await envd(gateway, "/health", nope);
    assert.equal(silentRest.status, 503);
    assert.equal((await silentRest.json()).code, 503);
  } finally {
    gateway.close();
  }
});

Deno.test("the root /files door is a 501 unless the request names its sandbox", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const s = a.add("x");
  try {
    const res = await gateway.fetch(new Request("http://gw.test/files?path=/a&signature=v1_x"));
    assert.equal(res.status, 501);
    const body = await res.json();
    assert.equal(body.code, 501);
    assert.match(body.message, /node's own address/);
    const signature = fileSignature({
      path: "/a",
      operation: "read",
      user: "",
      accessToken: envdTokens.forSandbox(s.id),
    });
    const signed = `/files?path=/a&signature=${encodeURIComponent(signature)}`;
    const named = await gateway.fetch(
      new Request(`http://gw.test${signed}`, { headers: { "e2b-sandbox-id": s.id } }),
    );
    assert.equal(named.status, 200);
    await named.body?.cancel();
    assert.equal(a.envdSeen?.path, `/e2b/envd${signed}`);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B envd: a stream flows as it comes and the client's hang-up aborts the node's request", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  const s = a.add("x");
  try {
    const client = new AbortController();
    const res = await gateway.fetch(
      new Request("http://gw.test/e2b/envd/process.Process/Start", {
        method: "POST",
        headers: {
          "e2b-sandbox-id": s.id,
          "x-access-token": envdTokens.forSandbox(s.id),
          "content-type": "application/connect+json",
        },
        body: "{}",
        signal: client.signal,
      }),
    );
    assert.equal(res.status, 200);
    const reader = res.body!.getReader();
    assert.equal(new TextDecoder().decode((await reader.read()).value), "first");
    assert.equal(a.held?.aborted, false);
    client.abort();
    await reader.cancel().catch(() => {});
    assert.equal(a.held?.aborted, true);
  } finally {
    gateway.close();
  }
});

Deno.test("E2B api: routes not built yet are a 501 with a sentence, asking no node", async () => {
  const { gateway, add } = setup();
  const a = add("a");
  try {
    const routes: [string, string][] = [
      ["POST", "/sandboxes/sbx_any/snapshots"],
      ["GET", "/snapshots"],
      ["POST", "/sandboxes/sbx_any/fork"],
      ["PUT", "/sandboxes/sbx_any/network"],
      ["DELETE", "/templates/tpl_1"],
    ];
    for (const [method, path] of routes) {
      const res = await api(gateway, method, path, method === "GET" ? undefined : {});
      assert.equal(res.status, 501, `${method} ${path}`);
      const body = await res.json();
      assert.equal(body.code, 501);
      assert.match(body.message, /not built on this fleet yet: |so there are none/);
    }
    assert.deepEqual(a.calls, [], "a sandbox that does not exist must not turn 501 into 404");
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
