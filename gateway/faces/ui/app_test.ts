import assert from "node:assert/strict";
import { createGateway } from "../../app.ts";
import { checkIn } from "../../_fixtures_test.ts";

const token = "t".repeat(32);

function login(gateway: ReturnType<typeof createGateway>, given: string, origin?: string) {
  return gateway.fetch(
    new Request("http://gw/ui/login", {
      method: "POST",
      headers: {
        "content-type": "application/x-www-form-urlencoded",
        host: "gw",
        ...(origin ? { origin } : {}),
      },
      body: new URLSearchParams({ token: given }).toString(),
    }),
  );
}

Deno.test("The fleet page's login sets a session cookie, never the token, and logout ends it", async () => {
  const gateway = createGateway({ token });
  gateway.fleet.checkIn(checkIn("node-a", "http://127.0.0.1:9"));

  const form = await gateway.fetch(new Request("http://gw/ui"));
  assert.equal(form.status, 200);
  const csp = form.headers.get("content-security-policy") ?? "";
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'nonce-[^']+'/);
  assert.match(await form.text(), /action="\/ui\/login"/);

  const wrong = await login(gateway, "x".repeat(32));
  assert.equal(wrong.status, 401);
  assert.equal(wrong.headers.get("set-cookie"), null);
  assert.match(await wrong.text(), /not the fleet token/);

  const foreign = await login(gateway, token, "https://evil.example");
  assert.equal(foreign.status, 403);
  assert.equal(foreign.headers.get("set-cookie"), null);
  await foreign.body?.cancel();

  const ok = await login(gateway, token, "http://gw");
  assert.equal(ok.status, 303);
  assert.equal(ok.headers.get("location"), "/ui");
  const cookie = ok.headers.get("set-cookie") ?? "";
  assert.match(cookie, /^dormice_session=[A-Za-z0-9_-]{43}; Path=\/ui; HttpOnly; SameSite=Strict;/);
  assert.ok(!cookie.includes(token));
  const session = cookie.split(";")[0];

  const page = await gateway.fetch(new Request("http://gw/ui", { headers: { cookie: session } }));
  const html = await page.text();
  assert.match(html, /data-node="node-a"/);
  const fragments = await gateway.fetch(
    new Request("http://gw/ui/fragments", { headers: { cookie: session } }),
  );
  assert.equal(fragments.status, 200);
  const json = await fragments.json();
  assert.deepEqual(Object.keys(json.sections).sort(), [
    "nodes",
    "placements",
    "sandboxes",
    "volumes",
  ]);

  // The bearer gate does not open the page, and the cookie opens nothing but the page.
  const byBearer = await gateway.fetch(
    new Request("http://gw/ui/fragments", { headers: { authorization: `Bearer ${token}` } }),
  );
  assert.equal(byBearer.status, 401);
  await byBearer.body?.cancel();
  const verb = await gateway.fetch(
    new Request("http://gw/listNodes", { method: "POST", headers: { cookie: session } }),
  );
  assert.equal(verb.status, 401);
  await verb.body?.cancel();

  const out = await gateway.fetch(
    new Request("http://gw/ui/logout", { method: "POST", headers: { cookie: session } }),
  );
  assert.equal(out.status, 303);
  assert.match(out.headers.get("set-cookie") ?? "", /^dormice_session=; .*Max-Age=0/);
  const after = await gateway.fetch(
    new Request("http://gw/ui/fragments", { headers: { cookie: session } }),
  );
  assert.equal(after.status, 401);
  await after.body?.cancel();
  gateway.close();
});

Deno.test("The login form refuses a body larger than a token with a 413", async () => {
  const gateway = createGateway({ token });
  const res = await login(gateway, "x".repeat(10_000));
  assert.equal(res.status, 413);
  assert.match((await res.json()).message, /cap/);
  gateway.close();
});

Deno.test("The fleet page pages and filters the sandboxes every node lists", async () => {
  const rows = Array.from({ length: 30 }, (_, i) => ({
    id: `sbx_${String(i).padStart(2, "0")}`,
    name: `agent-${i}`,
    team: i % 3 === 0 ? "acme" : "default",
    state: i % 2 === 0 ? "active" : "frozen",
    nodeId: "node-a",
    template: "base",
    createdAt: new Date(1_700_000_000_000 + i * 1000).toISOString(),
    lastActiveAt: new Date(1_700_000_000_000 + i * 1000).toISOString(),
  }));
  const nodeFetch = ((input: string | Request) =>
    Promise.resolve(
      (typeof input === "string" ? input : input.url).endsWith("/listSandboxes")
        ? Response.json({ sandboxes: rows })
        : new Response("no", { status: 404 }),
    )) as unknown as typeof fetch;
  const gateway = createGateway({ token, fetch: nodeFetch });
  gateway.fleet.checkIn(checkIn("node-a", "http://10.0.0.1:3676"));
  const session = (await login(gateway, token)).headers.get("set-cookie")!.split(";")[0];
  const shown = async (query: string) => {
    const res = await gateway.fetch(
      new Request(`http://gw/ui?${query}`, { headers: { cookie: session } }),
    );
    const html = await res.text();
    return {
      ids: [...html.matchAll(/data-sandbox="([^"]+)"/g)].map((m) => m[1]),
      pager: /(\d+) sandboxes?, page (\d+) of (\d+)/.exec(html)?.slice(1).join(" "),
    };
  };
  // Newest first, 25 a page.
  const first = await shown("");
  assert.equal(first.ids.length, 25);
  assert.equal(first.ids[0], "sbx_29");
  assert.equal(first.pager, "30 1 2");
  const second = await shown("page=2");
  assert.deepEqual(second.ids, ["sbx_04", "sbx_03", "sbx_02", "sbx_01", "sbx_00"]);
  // Filters combine; a page past the end shows the last one.
  const acmeActive = await shown("team=acme&state=active&page=9");
  assert.deepEqual(acmeActive.ids, ["sbx_24", "sbx_18", "sbx_12", "sbx_06", "sbx_00"]);
  assert.equal(acmeActive.pager, "5 1 1");
  // A state that does not exist is no filter, not an error page.
  assert.equal((await shown("state=bogus")).pager, "30 1 2");
  assert.equal((await shown("node=node-b")).ids.length, 0);
  gateway.close();
});

Deno.test("The fleet page and listNodes show the built templates each node holds, by team and name", async () => {
  const nodeFetch =
    (() => Promise.resolve(Response.json({ sandboxes: [] }))) as unknown as typeof fetch;
  const gateway = createGateway({ token, fetch: nodeFetch });
  gateway.fleet.checkIn({
    ...checkIn("node-a", "http://10.0.0.1:3676"),
    snapshots: ["snap-aaaaaaaaaaaaaaaaaaaa"],
    snapshotNames: ["acme/my-agent", "acme/<b>odd</b>"],
  });
  const listed = await gateway.fetch(
    new Request("http://gw/listNodes", {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: "{}",
    }),
  );
  assert.equal(listed.status, 200);
  const node = (await listed.json()).nodes.find((n: { id: string }) => n.id === "node-a");
  assert.deepEqual(node.snapshotNames, ["acme/my-agent", "acme/<b>odd</b>"]);
  const session = (await login(gateway, token)).headers.get("set-cookie")!.split(";")[0];
  const html = await (await gateway.fetch(
    new Request("http://gw/ui", { headers: { cookie: session } }),
  )).text();
  assert.match(html, /<th>Built templates<\/th>/);
  assert.match(html, /<span>acme\/my-agent<\/span>/);
  assert.match(html, /acme\/&lt;b&gt;odd&lt;\/b&gt;/);
});
