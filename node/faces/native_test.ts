import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { FakeClock } from "../../shared/clock.ts";
import { hostReadingSchema, lookupAnswerSchema } from "../../shared/schemas.ts";
import type { NodeApp } from "../app.ts";
import { testNodeApp } from "../_app_fixtures_test.ts";
import { FakeExecutor } from "../executors/fake.ts";
import type { HostSampler } from "../host_reading.ts";

const token = "n".repeat(32);
const endpoint = "http://127.0.0.1:3676";

const sampler: HostSampler = {
  cpuCount: () => 2,
  cpuTimes: () => null,
  memory: () => ({
    memoryTotalBytes: 4,
    memoryAvailableBytes: 2,
    swapTotalBytes: 0,
    swapFreeBytes: 0,
  }),
  dataDisk: () => null,
};

function node(): { app: NodeApp; executor: FakeExecutor } {
  const clock = new FakeClock(1_700_000_000_000);
  const executor = new FakeExecutor({ clock });
  const app = testNodeApp({ token, endpoint, executor, clock, sampler, build: "test-build" });
  return { app, executor };
}

async function call(
  app: NodeApp,
  verb: string,
  body: unknown,
  init: { token?: string | null; method?: string; raw?: string } = {},
): Promise<{ status: number; body: Record<string, unknown> }> {
  const headers: Record<string, string> = { "content-type": "application/json" };
  const t = init.token === undefined ? token : init.token;
  if (t !== null) headers.authorization = `Bearer ${t}`;
  const res = await app.fetch(
    new Request(`http://node/${verb}`, {
      method: init.method ?? "POST",
      headers,
      body: (init.method ?? "POST") === "GET" ? undefined : init.raw ?? JSON.stringify(body),
    }),
  );
  return { status: res.status, body: await res.json() };
}

Deno.test("native face: every verb round-trips", async () => {
  const { app } = node();
  const acquired = await call(app, "acquireSandbox", { name: "a", metadata: { team: "x" } });
  assert.equal(acquired.status, 200);
  const sandbox = acquired.body.sandbox as Record<string, unknown>;
  assert.deepEqual(acquired.body, {
    status: "ready",
    created: true,
    sandbox: {
      id: sandbox.id,
      name: "a",
      team: "default",
      state: "active",
      nodeId: "node-1",
      endpoint,
      template: "base",
      metadata: { team: "x" },
      spec: {},
      createdAt: "2023-11-14T22:13:20.000Z",
      lastActiveAt: "2023-11-14T22:13:20.000Z",
    },
  });
  assert.equal((await call(app, "acquireSandbox", { name: "a" })).body.created, false);
  assert.deepEqual(
    (await call(app, "execCommand", { name: "a", command: "echo hi; echo e >&2; exit 2" })).body,
    {
      exitCode: 2,
      stdout: "hi\n",
      stderr: "e\n",
      stdoutTruncated: false,
      stderrTruncated: false,
    },
  );
  assert.equal(
    (await call(app, "execCommand", { name: "a", command: ["echo", "argv"] })).body.stdout,
    "argv\n",
  );
  // JSON strings cannot carry a lone 0xE2: it is answered as U+FFFD; the file keeps the byte.
  const notUtf8 = await call(app, "execCommand", {
    name: "a",
    command: "printf 'a\\xe2b'; printf '\\377' >&2; printf '\\xe2' > /tmp/raw",
  });
  assert.equal(notUtf8.body.stdout, "a\ufffdb");
  assert.equal(notUtf8.body.stderr, "\ufffd");
  assert.equal(
    (await call(app, "readFile", { name: "a", path: "/tmp/raw" })).body.contentBase64,
    "4g==",
  );
  assert.deepEqual(
    (await call(app, "writeFile", { name: "a", path: "/tmp/b", contentBase64: "AP8=" })).body,
    {
      path: "/tmp/b",
      size: 2,
    },
  );
  assert.deepEqual(
    (await call(app, "writeFile", { name: "a", path: "t.txt", content: "héllo" })).body,
    {
      path: "/home/user/t.txt",
      size: 6,
    },
  );
  assert.deepEqual((await call(app, "readFile", { name: "a", path: "/tmp/b" })).body, {
    path: "/tmp/b",
    size: 2,
    contentBase64: "AP8=",
  });
  const updated = await call(app, "updateMetadata", {
    name: "a",
    metadata: { y: "1" },
    merge: true,
  });
  assert.deepEqual((updated.body.sandbox as { metadata: unknown }).metadata, { team: "x", y: "1" });
  const listed = await call(app, "listSandboxes", { metadata: { y: "1" } });
  assert.deepEqual((listed.body.sandboxes as { name: string }[]).map((s) => s.name), ["a"]);
  const metrics = await call(app, "getSandboxMetrics", { name: "a" });
  assert.equal(metrics.status, 200);
  assert.equal((metrics.body.metrics as { cpuCount: number }).cpuCount, 1);
  const host = await call(app, "getHostMetrics", {});
  assert.equal(host.body.nodeId, "node-1");
  assert.equal(host.body.build, "test-build");
  hostReadingSchema.parse(host.body.reading);
  const found = await call(app, "lookupSandbox", { name: "a" });
  assert.deepEqual(lookupAnswerSchema.parse(found.body), {
    found: true,
    sandbox: { id: sandbox.id, name: "a", state: "active", team: "default" },
  });
  assert.deepEqual((await call(app, "lookupSandbox", { id: sandbox.id })).body, found.body);
  assert.deepEqual((await call(app, "destroySandbox", { name: "a" })).body, { destroyed: true });
  assert.deepEqual((await call(app, "destroySandbox", { name: "a" })).body, { destroyed: false });
  assert.deepEqual((await call(app, "lookupSandbox", { name: "a" })).body, { found: false });
  const health = await app.fetch(new Request("http://node/healthz"));
  assert.deepEqual(await health.json(), {
    ok: true,
    nodeId: "node-1",
    build: "test-build",
    // A node app given no volume images: the content API checks the caps, and says so.
    volumeCaps: { enforcedBy: "checked", why: "no volume images configured" },
  });
  await app.close();
});

Deno.test("native face: bad input is a 4xx {message} naming the problem", async () => {
  const { app } = node();
  await call(app, "acquireSandbox", { name: "a" });
  const cases: [string, string, unknown, Parameters<typeof call>[3], number, RegExp][] = [
    ["no token", "listSandboxes", {}, { token: null }, 401, /Missing bearer token/],
    ["wrong token", "listSandboxes", {}, { token: "x".repeat(32) }, 401, /does not match/],
    ["malformed JSON", "acquireSandbox", null, { raw: "{nope" }, 400, /not valid JSON/],
    ["array body", "acquireSandbox", [1], {}, 400, /must be a JSON object/],
    ["129-char name", "acquireSandbox", { name: "a".repeat(129) }, {}, 400, /'name'.*at most 128/],
    ["missing name", "execCommand", { command: "true" }, {}, 400, /'name' is required/],
    ["wrong type", "execCommand", { name: "a", command: 5 }, {}, 400, /'command'/],
    [
      "bad base64",
      "writeFile",
      { name: "a", path: "/x", contentBase64: "!!" },
      {},
      400,
      /'contentBase64'/,
    ],
    [
      "both contents",
      "writeFile",
      { name: "a", path: "/x", content: "", contentBase64: "" },
      {},
      400,
      /exactly one/,
    ],
    ["lookup neither", "lookupSandbox", {}, {}, 400, /exactly one of 'name' or 'id'/],
    ["unknown verb", "makeCoffee", {}, {}, 404, /Unknown verb 'makeCoffee'.*acquireSandbox/],
    ["unknown sandbox", "readFile", { name: "zz", path: "/x" }, {}, 404, /No sandbox named 'zz'/],
    ["missing file", "readFile", { name: "a", path: "/nope" }, {}, 404, /\/nope does not exist/],
    ["read a dir", "readFile", { name: "a", path: "/tmp" }, {}, 400, /is a directory/],
    ["wrong method", "execCommand", {}, { method: "GET" }, 405, /GET is not allowed.*use POST/],
  ];
  for (const [label, verb, body, init, status, pattern] of cases) {
    const r = await call(app, verb, body, init);
    assert.equal(r.status, status, `${label}: ${JSON.stringify(r.body)}`);
    assert.deepEqual(Object.keys(r.body), ["message"], label);
    assert.match(String(r.body.message), pattern, label);
  }
  const post = await app.fetch(new Request("http://node/healthz", { method: "POST" }));
  assert.equal(post.status, 405);
  assert.equal(post.headers.get("allow"), "GET");
  await post.body?.cancel();
  await app.close();
});

Deno.test("native face: acquireSandbox takes spec.egressRules, a bad entry a 400 naming its path", async () => {
  const { app, executor } = node();
  const ruled = await call(app, "acquireSandbox", {
    name: "ruled",
    spec: { egressRules: { allowOut: ["198.18.0.1"], denyOut: ["0.0.0.0/0"] } },
  });
  assert.equal(ruled.status, 200, JSON.stringify(ruled.body));
  const sandbox = ruled.body.sandbox as { id: string; spec: Record<string, unknown> };
  const rules = { allowOut: ["198.18.0.1/32"], denyOut: ["0.0.0.0/0"] };
  assert.deepEqual(sandbox.spec.egressRules, rules);
  assert.deepEqual(executor.egressRulesOf(sandbox.id), rules);
  const bad = await call(app, "acquireSandbox", {
    name: "bad",
    spec: { egressRules: { allowOut: ["localhost"] } },
  });
  assert.equal(bad.status, 400);
  assert.match(
    String(bad.body.message),
    /'spec\.egressRules\.allowOut\.0': 'localhost' is a single-label name/,
  );
  // Domains and transforms, as the stored form keeps them.
  const named = await call(app, "acquireSandbox", {
    name: "named",
    spec: {
      egressRules: {
        allowOut: ["API.example.com"],
        denyOut: ["0.0.0.0/0"],
        transforms: { "api.example.com": [{ headers: { "X-K": "v" } }] },
      },
    },
  });
  assert.equal(named.status, 200, JSON.stringify(named.body));
  const id = (named.body.sandbox as { id: string }).id;
  // The record shows header names, never values.
  assert.deepEqual(
    (named.body.sandbox as { spec: { egressRules: unknown } }).spec.egressRules,
    {
      allowOut: [],
      denyOut: ["0.0.0.0/0"],
      allowDomains: ["api.example.com"],
      transforms: { "api.example.com": [{ headers: { "X-K": "***" } }] },
    },
  );
  assert.deepEqual(executor.egressRulesOf(id), {
    allowOut: [],
    denyOut: ["0.0.0.0/0"],
    allowDomains: ["api.example.com"],
    transforms: { "api.example.com": [{ headers: { "X-K": "v" } }] },
  });
  await app.close();
});

Deno.test("native face: an unexpected error is a logged 500 {message}", async () => {
  const { app, executor } = node();
  await call(app, "acquireSandbox", { name: "a" });
  executor.hooks.fail("stats", new Error("kaboom"));
  const r = await call(app, "getSandboxMetrics", { name: "a" });
  assert.equal(r.status, 500);
  assert.match(String(r.body.message), /failed unexpectedly \(kaboom\)/);
  await app.close();
});

Deno.test("native face: a body declared over the JSON cap is a 413 {message}, not read", async () => {
  const { app } = node();
  const declared = (verb: string, bytes: number, body: string) =>
    app.fetch(
      new Request(`http://node/${verb}`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
          "content-length": String(bytes),
        },
        body,
      }),
    );
  // Every verb but writeFile is a one-piece message: 1 MiB.
  const message = await declared("acquireSandbox", 2 * 1024 * 1024, '{"name":"a"}');
  assert.equal(message.status, 413);
  const body = await message.json();
  assert.deepEqual(Object.keys(body), ["message"]);
  assert.match(body.message, /cap of 1 MiB \(DORMICE_JSON_MESSAGE_LIMIT_KB\): .*writeFile/);
  const file = await declared("writeFile", 64 * 1024 * 1024, '{"name":"a"}');
  assert.equal(file.status, 413);
  assert.match((await file.json()).message, /cap of 32 MiB \(DORMICE_JSON_BODY_LIMIT_MB\)/);
  await app.close();
});

Deno.test("native face: writeFile takes a 2 MiB file, but not 2 MiB of JSON structure", async () => {
  const { app, executor } = node();
  await call(app, "acquireSandbox", { name: "a" });
  const content = "x".repeat(2 * 1024 * 1024);
  const ok = await call(app, "writeFile", { name: "a", path: "/tmp/two", content });
  assert.equal(ok.status, 200, JSON.stringify(ok.body));
  // 2 MiB of small arrays take a parse of their own: one big string does not.
  const nested = await call(app, "writeFile", {
    name: "a",
    path: "/tmp/nested",
    content: "x",
    extra: Array.from({ length: 200_000 }, () => [1]),
  });
  assert.equal(nested.status, 400);
  assert.match(nested.body.message as string, /writeFile must be one JSON object of a few fields/);
  // A message verb over 1 MiB is a 413 even when its body is one string.
  const big = await call(app, "execCommand", { name: "a", command: content });
  assert.equal(big.status, 413);
  await executor.close();
});

Deno.test("native face: a 404 for a sandbox not on this node is marked absent, a missing file's is not", async () => {
  const { app } = node();
  await call(app, "acquireSandbox", { name: "a" });
  const ask = (body: unknown) =>
    app.fetch(
      new Request("http://node/readFile", {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${token}` },
        body: JSON.stringify(body),
      }),
    );
  const absent = await ask({ name: "zz", path: "/x" });
  assert.equal(absent.status, 404);
  assert.equal(absent.headers.get("x-dormice-absent"), "1");
  await absent.body?.cancel();
  const missingFile = await ask({ name: "a", path: "/nope" });
  assert.equal(missingFile.status, 404);
  assert.equal(missingFile.headers.get("x-dormice-absent"), null);
  await missingFile.body?.cancel();
  await app.close();
});

Deno.test("native face: writeFile takes 8 MiB of contentBase64 and names a bad character's place", async () => {
  const { app, executor } = node();
  await call(app, "acquireSandbox", { name: "a" });
  // A regex of base64 quanta threw "Maximum call stack size exceeded" on this: a 500.
  const bytes = new Uint8Array(6 * 1024 * 1024).map((_, i) => i % 251);
  const text = Buffer.from(bytes).toString("base64");
  const ok = await call(app, "writeFile", { name: "a", path: "/tmp/big", contentBase64: text });
  assert.equal(ok.status, 200, JSON.stringify(ok.body));
  assert.equal(ok.body.size, bytes.length);
  const read = await call(app, "readFile", { name: "a", path: "/tmp/big" });
  assert.equal(read.body.contentBase64, text);
  const bad = text.slice(0, 4_000_000) + "QU D" + text.slice(4_000_004);
  const refused = await call(app, "writeFile", { name: "a", path: "/tmp/bad", contentBase64: bad });
  assert.equal(refused.status, 400);
  assert.match(
    refused.body.message as string,
    /'contentBase64'.*characters 3670016 to 4194303 are not standard base64/,
  );
  await executor.close();
});

Deno.test("native face: acquireSandbox refuses metadata past 64 keys and env past 1,000 vars", async () => {
  const { app, executor } = node();
  const many = (n: number) =>
    Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, "v"]));
  const meta = await call(app, "acquireSandbox", { name: "a", metadata: many(65) });
  assert.equal(meta.status, 400);
  assert.deepEqual(Object.keys(meta.body), ["message"]);
  assert.match(meta.body.message as string, /'metadata'.*at most 64 keys of 16 KiB/);
  const env = await call(app, "acquireSandbox", { name: "a", spec: { env: many(1001) } });
  assert.equal(env.status, 400);
  assert.match(env.body.message as string, /'spec.env'.*at most 1000 variables of 256 KiB/);
  const exec = await call(app, "execCommand", { name: "a", command: "true", env: many(1001) });
  assert.equal(exec.status, 400);
  assert.match(exec.body.message as string, /'env'.*at most 1000 variables/);
  await executor.close();
});

Deno.test("native face: readFile streams its answer, the base64 made a slice at a time", async () => {
  const { app, executor } = node();
  await call(app, "acquireSandbox", { name: "a" });
  const bytes = new Uint8Array(2 * 1024 * 1024 + 5).map((_, i) => i % 253);
  const text = Buffer.from(bytes).toString("base64");
  assert.equal(
    (await call(app, "writeFile", { name: "a", path: "/tmp/r", contentBase64: text })).status,
    200,
  );
  const res = await app.fetch(
    new Request("http://node/readFile", {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "a", path: "/tmp/r" }),
    }),
  );
  assert.equal(res.status, 200);
  assert.equal(res.headers.get("content-type"), "application/json");
  let chunks = 0;
  const parts: Uint8Array<ArrayBuffer>[] = [];
  for await (const chunk of res.body!) chunks++, parts.push(new Uint8Array(chunk));
  const answer = JSON.parse(
    new TextDecoder().decode(new Uint8Array(await new Blob(parts).arrayBuffer())),
  );
  assert.deepEqual(answer, { path: "/tmp/r", size: bytes.length, contentBase64: text });
  // A head, six slices of 384 KiB, the tail.
  assert.ok(chunks >= 7, `${chunks} chunks`);
  await executor.close();
});

Deno.test("native face: updateMetadata refuses a merge that would pass 64 keys", async () => {
  const { app, executor } = node();
  await call(app, "acquireSandbox", { name: "a" });
  const keys = (from: number, n: number) =>
    Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${from + i}`, "v"]));
  const first = await call(app, "updateMetadata", {
    name: "a",
    metadata: keys(0, 40),
    merge: true,
  });
  assert.equal(first.status, 200);
  const second = await call(app, "updateMetadata", {
    name: "a",
    metadata: keys(40, 40),
    merge: true,
  });
  assert.equal(second.status, 400);
  assert.match(second.body.message as string, /merged metadata of 'a' holds 80 keys.*at most 64/);
  await executor.close();
});
