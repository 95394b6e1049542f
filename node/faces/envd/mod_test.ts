import assert from "node:assert/strict";
import { setup } from "./_fixtures_test.ts";

Deno.test("envd answers a missing sandbox header in each dialect", async () => {
  const { app, executor } = await setup();
  const rpc = await app.request("/e2b/envd/filesystem.Filesystem/Stat", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ path: "/tmp" }),
  });
  assert.equal(rpc.status, 400);
  assert.equal((await rpc.json()).code, "invalid_argument");
  const rest = await app.request("/e2b/envd/files?path=/tmp/a");
  assert.equal(rest.status, 400);
  assert.equal((await rest.json()).code, 400);
  await executor.close();
});

Deno.test("envd requires the sandbox's X-Access-Token", async () => {
  const { unary, app, sandbox, executor } = await setup();
  const wrong = await unary("filesystem.Filesystem/Stat", { path: "/tmp" }, {
    "E2b-Sandbox-Id": sandbox.id,
    "X-Access-Token": "not-it",
  });
  assert.equal(wrong.status, 401);
  assert.equal((await wrong.json()).code, "unauthenticated");
  const rest = await app.request("/e2b/envd/files?path=/tmp/a", {
    headers: { "E2b-Sandbox-Id": sandbox.id },
  });
  assert.equal(rest.status, 401);
  assert.equal((await rest.json()).code, 401);
  await executor.close();
});

Deno.test("envd /health is 204 for a running sandbox and 502 for an unknown one", async () => {
  const { app, headers, executor } = await setup();
  const ok = await app.request("/e2b/envd/health", { headers: headers() });
  assert.equal(ok.status, 204);
  const gone = await app.request("/e2b/envd/health", { headers: { "E2b-Sandbox-Id": "sbx_no" } });
  assert.equal(gone.status, 502);
  await gone.body?.cancel();
  const rpc = await app.request("/e2b/envd/filesystem.Filesystem/Stat", {
    method: "POST",
    headers: { "content-type": "application/json", "E2b-Sandbox-Id": "sbx_no" },
    body: "{}",
  });
  assert.equal(rpc.status, 503);
  assert.equal((await rpc.json()).code, "unavailable");
  await executor.close();
});

Deno.test("Process/Start refuses the wrong content type with 415", async () => {
  const { unary, executor } = await setup();
  const res = await unary("process.Process/Start", { process: { cmd: "echo" } });
  assert.equal(res.status, 415);
  await res.body?.cancel();
  await executor.close();
});
