import assert from "node:assert/strict";
import { Hono } from "hono";
import { AccessTokens } from "./access_tokens.ts";
import { decodeEnvelopes, encodeEnvelope } from "./connect_codec.ts";
import { createEnvd, handleSignedFiles, resolvePath } from "./envd.ts";
import { FakeExecutor } from "../executors/fake.ts";
import { Ledger } from "../ledger.ts";
import { SandboxService } from "../service.ts";
import { fileSignature } from "./access_tokens.ts";

async function setup(options: { maxUploadBytes?: number } = {}) {
  const executor = new FakeExecutor();
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const service = new SandboxService({ ledger, executor });
  const accessTokens = new AccessTokens("secret for the envd tests 0123456789abc");
  const app = new Hono();
  app.route("/e2b/envd", createEnvd(service, { accessTokens, ...options }));
  app.route("/", handleSignedFiles(service, { accessTokens }));
  const { sandbox } = await service.acquire({ name: "envd-1" });
  const headers = (extra: Record<string, string> = {}) => ({
    "E2b-Sandbox-Id": sandbox.id,
    "X-Access-Token": accessTokens.forSandbox(sandbox.id),
    ...extra,
  });
  const unary = (method: string, body: unknown, h = headers()) =>
    app.request(`/e2b/envd/${method}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...h },
      body: JSON.stringify(body),
    });
  const stream = (method: string, body: unknown, h = headers(), signal?: AbortSignal) =>
    app.request(`/e2b/envd/${method}`, {
      method: "POST",
      headers: { "content-type": "application/connect+json", ...h },
      body: encodeEnvelope(0, body),
      signal,
    });
  return { app, service, executor, accessTokens, sandbox, headers, unary, stream };
}

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

Deno.test("Filesystem RPCs speak protobuf JSON: int64 as strings, enum names", async () => {
  const { unary, service, sandbox, executor } = await setup();
  await service.writeFile({ id: sandbox.id }, "/tmp/d/a.txt", new TextEncoder().encode("hello"));
  const list = await (await unary("filesystem.Filesystem/ListDir", { path: "/tmp/d", depth: 1 }))
    .json();
  assert.equal(list.entries.length, 1);
  assert.equal(list.entries[0].type, "FILE_TYPE_FILE");
  assert.equal(list.entries[0].size, "5");
  assert.equal(list.entries[0].path, "/tmp/d/a.txt");
  const dir = await (await unary("filesystem.Filesystem/Stat", { path: "/tmp/d" })).json();
  assert.equal(dir.entry.type, "FILE_TYPE_DIRECTORY");
  const missing = await unary("filesystem.Filesystem/Stat", { path: "/tmp/none" });
  assert.equal(missing.status, 404);
  assert.equal((await missing.json()).code, "not_found");
  const bad = await unary("filesystem.Filesystem/Stat", { path: 7 });
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).message, /'path'/);
  await executor.close();
});

Deno.test("Process/Start streams start, data, end and the end-stream envelope", async () => {
  const { stream, executor } = await setup();
  const res = await stream("process.Process/Start", {
    process: { cmd: "/bin/bash", args: ["-l", "-c", "echo hi; echo err >&2; exit 2"] },
  });
  assert.equal(res.headers.get("content-type"), "application/connect+json");
  const envelopes = decodeEnvelopes(new Uint8Array(await res.arrayBuffer()));
  const messages = envelopes.map((e) => e.message as Record<string, Record<string, unknown>>);
  assert.ok("start" in messages[0].event);
  const out = messages.filter((m) => m.event?.data).map((m) => m.event.data);
  assert.deepEqual(out, [{ stdout: btoa("hi\n") }, { stderr: btoa("err\n") }]);
  assert.deepEqual(messages.at(-2)?.event.end, {
    exitCode: 2,
    exited: true,
    status: "exit status 2",
  });
  assert.deepEqual(envelopes.at(-1), { flags: 2, message: {} });
  await executor.close();
});

Deno.test("Process/Start refuses the wrong content type with 415", async () => {
  const { unary, executor } = await setup();
  const res = await unary("process.Process/Start", { process: { cmd: "echo" } });
  assert.equal(res.status, 415);
  await res.body?.cancel();
  await executor.close();
});

Deno.test("a client hanging up stops its stream; the command lives on until killed", async () => {
  const { stream, unary, headers, executor } = await setup();
  const client = new AbortController();
  const res = await stream(
    "process.Process/Start",
    { process: { cmd: "/bin/bash", args: ["-c", "sleep 30"] } },
    headers({ "Keepalive-Ping-Interval": "1" }),
    client.signal,
  );
  const reader = res.body!.getReader();
  const first = await reader.read();
  const [start] = decodeEnvelopes(first.value!);
  const pid = (start.message as { event: { start: { pid: number } } }).event.start.pid;
  client.abort();
  await reader.cancel();
  const listed = await (await unary("process.Process/List", {})).json();
  assert.deepEqual(listed.processes.map((p: { pid: number }) => p.pid), [pid]);
  const kill = await unary("process.Process/SendSignal", {
    process: { pid },
    signal: "SIGNAL_SIGKILL",
  });
  assert.equal(kill.status, 200);
  await kill.body?.cancel();
  const again = await unary("process.Process/SendSignal", {
    process: { pid: 999 },
    signal: "SIGNAL_SIGKILL",
  });
  assert.equal(again.status, 404);
  assert.equal((await again.json()).code, "not_found");
  await executor.close();
});

Deno.test("WatchDir reports uploads made through envd, then ends when the client leaves", async () => {
  const { app, stream, headers, executor } = await setup();
  const res = await stream("filesystem.Filesystem/WatchDir", { path: "/tmp" });
  const reader = res.body!.getReader();
  const started = decodeEnvelopes((await reader.read()).value!);
  assert.deepEqual(started[0].message, { start: {} });
  const form = new FormData();
  form.append("file", new Blob(["x"]), "/tmp/w.txt");
  const up = await app.request("/e2b/envd/files", {
    method: "POST",
    headers: headers(),
    body: form,
  });
  assert.deepEqual(await up.json(), [{ path: "/tmp/w.txt", name: "w.txt", type: "file" }]);
  const [event] = decodeEnvelopes((await reader.read()).value!);
  assert.deepEqual(event.message, { filesystem: { name: "w.txt", type: "EVENT_TYPE_WRITE" } });
  await reader.cancel();
  await executor.close();
});

Deno.test("POST /files refuses a 'path' with several parts, and octet-stream without path", async () => {
  const { app, headers, executor } = await setup();
  const form = new FormData();
  form.append("file", new Blob(["1"]), "/tmp/1");
  form.append("file", new Blob(["2"]), "/tmp/2");
  const res = await app.request("/e2b/envd/files?path=/tmp/x", {
    method: "POST",
    headers: headers(),
    body: form,
  });
  assert.equal(res.status, 400);
  assert.match((await res.json()).message, /'path'/);
  const raw = await app.request("/e2b/envd/files", {
    method: "POST",
    headers: headers({ "content-type": "application/octet-stream" }),
    body: "data",
  });
  assert.equal(raw.status, 400);
  assert.equal((await raw.json()).code, 400);
  await executor.close();
});

Deno.test("the root /files door serves a signed URL and refuses an expired one", async () => {
  const { app, service, sandbox, accessTokens, executor } = await setup();
  await service.writeFile({ id: sandbox.id }, "/tmp/s.txt", new TextEncoder().encode("s"));
  const token = accessTokens.forSandbox(sandbox.id);
  const sig = (exp?: number) =>
    fileSignature({
      path: "/tmp/s.txt",
      operation: "read",
      user: "",
      accessToken: token,
      expiration: exp,
    });
  const ok = await app.request(`/files?path=/tmp/s.txt&signature=${encodeURIComponent(sig())}`);
  assert.equal(await ok.text(), "s");
  const exp = Math.floor(Date.now() / 1000) - 10;
  const old = await app.request(
    `/files?path=/tmp/s.txt&signature=${encodeURIComponent(sig(exp))}&signature_expiration=${exp}`,
  );
  assert.equal(old.status, 401);
  assert.match((await old.json()).message, /expired/);
  const none = await app.request("/files?path=/tmp/s.txt");
  assert.equal(none.status, 401);
  await none.body?.cancel();
  await executor.close();
});

Deno.test("resolvePath() starts relative paths at the user's home", () => {
  assert.equal(resolvePath("a.txt", "user", "path"), "/home/user/a.txt");
  assert.equal(resolvePath("~/b/../c", "root", "path"), "/root/c");
  assert.equal(resolvePath("/tmp/x/", "user", "path"), "/tmp/x");
  assert.throws(() => resolvePath("", "user", "path"), /'path' is required/);
});

Deno.test("envd refuses a chunked upload over the limit with a 413, and stores nothing", async () => {
  const { app, headers, executor, sandbox } = await setup({ maxUploadBytes: 1024 });
  // A stream body carries no Content-Length, as the SDK sends it.
  const chunked = (bytes: number) =>
    new ReadableStream<Uint8Array>({
      start(c) {
        for (let sent = 0; sent < bytes; sent += 256) c.enqueue(new Uint8Array(256));
        c.close();
      },
    });
  const raw = await app.request("/e2b/envd/files?path=/tmp/big.bin", {
    method: "POST",
    headers: headers({ "content-type": "application/octet-stream" }),
    body: chunked(4096),
  });
  assert.equal(raw.status, 413);
  assert.match((await raw.json()).message, /limit of 1024 bytes/);
  const form = new FormData();
  form.append("file", new Blob([new Uint8Array(4096)]), "/tmp/big2.bin");
  const encoded = new Response(form);
  const multipart = await app.request("/e2b/envd/files", {
    method: "POST",
    headers: headers({ "content-type": encoded.headers.get("content-type")! }),
    body: encoded.body,
  });
  assert.equal(multipart.status, 413);
  await multipart.body?.cancel();
  await assert.rejects(executor.readFile(sandbox.id, "/tmp/big.bin"));
  await assert.rejects(executor.readFile(sandbox.id, "/tmp/big2.bin"));
  const small = await app.request("/e2b/envd/files?path=/tmp/small.bin", {
    method: "POST",
    headers: headers({ "content-type": "application/octet-stream" }),
    body: chunked(512),
  });
  assert.equal(small.status, 200);
  await small.body?.cancel();
  await executor.close();
});
