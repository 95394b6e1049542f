import assert from "node:assert/strict";
import { testNodeApp } from "./_app_fixtures_test.ts";

const token = "node-app-test-token-0123456789abcdef";
const endpoint = "http://127.0.0.1:3676";

Deno.test("createNodeApp(): GET /metrics asks for the fleet token and answers it with Prometheus text", async () => {
  const node = testNodeApp({ token, endpoint });
  try {
    for (const headers of [{}, { authorization: "Bearer wrong-token" }] as HeadersInit[]) {
      const res = await node.fetch(new Request("http://node.test/metrics", { headers }));
      assert.equal(res.status, 401);
      assert.equal(res.headers.get("www-authenticate"), "Bearer");
      const { message } = await res.json();
      assert.match(message, /GET \/metrics takes the fleet token/);
      assert.match(message, /Authorization: Bearer <DORMICE_API_TOKEN>/);
    }
    const ok = await node.fetch(
      new Request("http://node.test/metrics", { headers: { authorization: `Bearer ${token}` } }),
    );
    assert.equal(ok.status, 200);
    assert.match(await ok.text(), /^# HELP dormice_node_/m);
  } finally {
    await node.close();
  }
});
