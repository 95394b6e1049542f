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

Deno.test("envd resumes a paused sandbox for traffic only when its lifecycle says autoResume", async () => {
  const { app, service, accessTokens, executor } = await setup();
  const clock = { now: Date.now };
  const make = async (name: string, autoResume: boolean) => {
    const { sandbox } = await service.acquire({
      name,
      deadline: { ms: 60_000, action: "pause" },
      e2b: { onTimeout: "pause", autoResume, timeoutSeconds: 120 },
    });
    await service.pause({ id: sandbox.id });
    const headers = {
      "E2b-Sandbox-Id": sandbox.id,
      "X-Access-Token": accessTokens.forSandbox(sandbox.id),
    };
    return { id: sandbox.id, headers };
  };
  const list = (headers: Record<string, string>) =>
    app.request("/e2b/envd/process.Process/List", {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: "{}",
    });

  // Without autoResume: not running, and traffic leaves it paused (connect resumes it).
  const stays = await make("stays", false);
  const health = await app.request("/e2b/envd/health", { headers: stays.headers });
  assert.equal(health.status, 502);
  await health.body?.cancel();
  const refused = await list(stays.headers);
  assert.equal(refused.status, 503);
  const body = await refused.json();
  assert.equal(body.code, "unavailable");
  assert.match(body.message, /is paused: resume it with Sandbox\.connect\(\)/);
  assert.equal(service.get({ id: stays.id })?.state, "frozen");

  // With autoResume: the request resumes it and gets its answer; the deadline is renewed.
  const wakes = await make("wakes", true);
  const before = clock.now();
  const answered = await list(wakes.headers);
  assert.equal(answered.status, 200);
  await answered.body?.cancel();
  const row = service.get({ id: wakes.id })!;
  assert.equal(row.state, "active");
  assert.ok(row.deadlineAt! >= before + 120_000, "renewed by the create's 120 s");
  assert.equal(row.deadlineAction, "pause");
  await service.pause({ id: wakes.id });
  const healthy = await app.request("/e2b/envd/health", { headers: wakes.headers });
  assert.equal(healthy.status, 204);
  assert.equal(service.get({ id: wakes.id })?.state, "active");

  // A native sandbox (no E2B lifecycle) still wakes on use, as the native verbs promise.
  const { sandbox: native } = await service.acquire({ name: "native" });
  await service.pause({ id: native.id });
  const woke = await list({
    "E2b-Sandbox-Id": native.id,
    "X-Access-Token": accessTokens.forSandbox(native.id),
  });
  assert.equal(woke.status, 200);
  await woke.body?.cancel();
  assert.equal(service.get({ id: native.id })?.state, "active");
  await executor.close();
});

Deno.test("envd RPCs are one-piece messages under 1 MiB; SendInput alone takes the body cap", async () => {
  const { unary, executor } = await setup();
  const big = "x".repeat(2 * 1024 * 1024);
  const stat = await unary("filesystem.Filesystem/Stat", { path: `/tmp/${big}` });
  assert.equal(stat.status, 400);
  const body = await stat.json();
  assert.equal(body.code, "invalid_argument");
  assert.match(body.message, /cap of 1 MiB \(DORMICE_JSON_MESSAGE_LIMIT_KB\)/);
  // SendInput carries a command's stdin: past 1 MiB it is read (and refused here for naming no
  // running process), not a 413.
  const input = await unary("process.Process/SendInput", {
    process: { pid: 424242 },
    input: { stdin: btoa(big) },
  });
  assert.doesNotMatch((await input.json()).message, /cap of/);
  await executor.close();
});
