import assert from "node:assert/strict";
import { describeRoutes } from "./route_summary.ts";
import { createGateway } from "../app.ts";

const token = "route-summary-test-token-0123456789abcdef";

Deno.test("describeRoutes() names verbs, pages, two-method paths and mounted prefixes, nothing else", () => {
  const cases: [string, { method: string; path: string }[], string][] = [
    ["one verb", [{ method: "POST", path: "/a" }], "POST /<verb> for a"],
    ["a 405 catch-all adds nothing", [
      { method: "POST", path: "/a" },
      { method: "ALL", path: "/a" },
    ], "POST /<verb> for a"],
    ["middleware at /* adds nothing", [
      { method: "ALL", path: "/*" },
      { method: "GET", path: "/healthz" },
    ], "GET /healthz"],
    ["a page's sub-paths stay under it", [
      { method: "GET", path: "/ui" },
      { method: "POST", path: "/ui/login" },
      { method: "ALL", path: "/ui/*" },
      { method: "GET", path: "/metrics" },
    ], "GET /ui and /metrics"],
    ["GET and POST on one path is neither a verb nor a page", [
      { method: "GET", path: "/files" },
      { method: "POST", path: "/files" },
      { method: "POST", path: "/b" },
      { method: "ALL", path: "/e2b/api/*" },
      { method: "ALL", path: "/e2b/envd/*" },
    ], "POST /<verb> for b; GET and POST /files; and everything under /e2b/api/ and /e2b/envd/"],
    ["nothing", [], ""],
  ];
  for (const [what, routes, expected] of cases) {
    assert.equal(describeRoutes(routes), expected, what);
  }
});

async function unknownVerb(gateway: ReturnType<typeof createGateway>): Promise<string> {
  const res = await gateway.fetch(
    new Request("http://gw.test/frobnicate", {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: "{}",
    }),
  );
  assert.equal(res.status, 404);
  return (await res.json()).message;
}

Deno.test("createGateway(): the unknown-verb 404 lists every route it answers, and each one answers", async () => {
  const gateway = createGateway({ token });
  try {
    const message = await unknownVerb(gateway);
    const [, verbList] = /POST \/<verb> for ([^;]+);/.exec(message) ?? [];
    const verbs = verbList.split(", ");
    for (const verb of ["acquireSandbox", "execCommand", "listNodes", "setPools", "revokeApiKey"]) {
      assert.ok(verbs.includes(verb), `${verb} in ${message}`);
    }
    assert.match(message, /; GET \/healthz, \/metrics and \/ui; GET and POST \/files;/);
    assert.match(message, /and everything under \/e2b\/api\/ and \/e2b\/envd\/$/);
    // True as well as complete: none of them is this 404.
    const auth = { authorization: `Bearer ${token}` };
    for (const verb of verbs) {
      const res = await gateway.fetch(
        new Request(`http://gw.test/${verb}`, { method: "POST", headers: auth, body: "{}" }),
      );
      await res.body?.cancel();
      assert.notEqual(res.status, 404, verb);
    }
    for (const path of ["/healthz", "/metrics", "/ui", "/files", "/e2b/api/sandboxes"]) {
      const res = await gateway.fetch(new Request(`http://gw.test${path}`, { headers: auth }));
      const text = await res.text();
      assert.doesNotMatch(text, /the gateway answers/, `${path}: ${res.status} ${text}`);
    }
  } finally {
    gateway.close();
  }
});

Deno.test("createGateway(): with the E2B faces left out, the 404 does not offer them", async () => {
  const gateway = createGateway({ token, faces: { e2b: false } });
  try {
    const message = await unknownVerb(gateway);
    assert.doesNotMatch(message, /e2b|\/files/);
    assert.match(message, /GET \/healthz, \/metrics and \/ui$/);
  } finally {
    gateway.close();
  }
});
