import assert from "node:assert/strict";
import { asFetch } from "./fetch_handler.ts";

Deno.test("asFetch() hands a handler one Request with the method, headers, body and signal", async () => {
  const abort = new AbortController();
  let seen: Request | undefined;
  const send = asFetch((request) => {
    seen = request;
    return new Response("ok");
  });
  const res = await send("http://node.test/lookupSandbox", {
    method: "POST",
    headers: { authorization: "Bearer t" },
    body: '{"name":"x"}',
    signal: abort.signal,
  });
  assert.equal(await res.text(), "ok");
  assert.equal(seen!.url, "http://node.test/lookupSandbox");
  assert.equal(seen!.method, "POST");
  assert.equal(seen!.headers.get("authorization"), "Bearer t");
  assert.equal(await seen!.text(), '{"name":"x"}');
  abort.abort();
  assert.ok(seen!.signal.aborted);
  assert.equal(asFetch(globalThis.fetch), globalThis.fetch, "the global fetch is kept as it is");
});
