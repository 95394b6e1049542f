import assert from "node:assert/strict";
import { fileSignature } from "../../../shared/access_tokens.ts";
import { setup } from "./_fixtures_test.ts";
import { UploadStaging } from "./staging.ts";
import { UploadSlots } from "./upload_slots.ts";

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
  // E2B envd's body word for word (the SDK's tests compare all of it), the remedy in a header.
  assert.deepEqual(await old.json(), { code: 401, message: "signature is already expired" });
  assert.match(old.headers.get("x-dormice-hint") ?? "", /^Ask the SDK for a fresh URL/);
  // Through envd by header, as the gateway sends a domain's signed URL: the same words.
  const byHeader = await app.request(
    `/e2b/envd/files?path=/tmp/s.txt&signature=${
      encodeURIComponent(sig(exp))
    }&signature_expiration=${exp}`,
    { headers: { "e2b-sandbox-id": sandbox.id } },
  );
  assert.equal(byHeader.status, 401);
  assert.deepEqual(await byHeader.json(), { code: 401, message: "signature is already expired" });
  assert.match(byHeader.headers.get("x-dormice-hint") ?? "", /fresh URL/);
  // A URL altered after signing is told it matches nothing, whatever its expiration says.
  const forged = await app.request(
    `/files?path=/tmp/s.txt&signature=v1_forged&signature_expiration=${exp}`,
  );
  assert.equal(forged.status, 401);
  assert.match((await forged.json()).message, /^The signature matches no sandbox/);
  const none = await app.request("/files?path=/tmp/s.txt");
  assert.equal(none.status, 401);
  await none.body?.cancel();
  await executor.close();
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
  assert.match((await raw.json()).message, /cap of 1 KiB per request.*DORMICE_UPLOAD_LIMIT_MB/);
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

/** A temp dir for staged uploads, and a check that nothing was left in it. */
async function stagingDir() {
  const dir = await Deno.makeTempDir({ prefix: "dormice-staging-test-" });
  return {
    staging: new UploadStaging({ dir, memoryBytes: 64 * 1024 }),
    async leftovers() {
      const names: string[] = [];
      for await (const entry of Deno.readDir(dir)) names.push(entry.name);
      return names;
    },
    remove: () => Deno.remove(dir, { recursive: true }),
  };
}

/** A body we feed by hand: `push` a chunk, `end` it; `wanted()` resolves once it is read dry. */
function handFed() {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let asked: () => void = () => {};
  let wanting = new Promise<void>((resolve) => asked = resolve);
  const stream = new ReadableStream<Uint8Array>({
    start: (c) => void (controller = c),
    pull: () => {
      asked();
      wanting = new Promise<void>((resolve) => asked = resolve);
    },
  }, { highWaterMark: 0 });
  return {
    stream,
    push: (bytes: Uint8Array) => controller.enqueue(bytes),
    end: () => controller.close(),
    wanted: () => wanting,
  };
}

Deno.test("POST /files streams large multipart files through the staging dir, byte for byte", async () => {
  const dir = await stagingDir();
  const { app, headers, executor, sandbox } = await setup({ staging: dir.staging });
  const a = Uint8Array.from({ length: 3 * 1024 * 1024 + 3 }, (_, i) => (i * 31) & 0xff);
  const b = new TextEncoder().encode("small");
  const form = new FormData();
  form.append("file", new Blob([a]), "/tmp/up/a.bin");
  form.append("note", "ignored");
  form.append("file", new Blob([b]), "b.txt");
  const encoded = new Response(form);
  const res = await app.request("/e2b/envd/files", {
    method: "POST",
    headers: headers({ "content-type": encoded.headers.get("content-type")! }),
    // A stream, so no Content-Length: the SDK's own form.
    body: encoded.body,
  });
  assert.equal(res.status, 200);
  assert.deepEqual(await res.json(), [
    { path: "/tmp/up/a.bin", name: "a.bin", type: "file" },
    { path: "/home/user/b.txt", name: "b.txt", type: "file" },
  ]);
  assert.deepEqual(await executor.readFile(sandbox.id, "/tmp/up/a.bin"), a);
  assert.deepEqual(await executor.readFile(sandbox.id, "/home/user/b.txt"), b);
  assert.deepEqual(await dir.leftovers(), [], "a staged file outlived its upload");
  await executor.close();
  await dir.remove();
});

Deno.test("POST /files refuses a gzip inflating past the ratio cap with a 413 naming it", async () => {
  const dir = await stagingDir();
  const post = (app: Awaited<ReturnType<typeof setup>>["app"], h: HeadersInit, path: string) =>
    app.request(`/e2b/envd/files?path=${path}`, {
      method: "POST",
      headers: h,
      // 16 MiB of zeros are 16 KiB of gzip: far under the 1 GiB upload cap, 1,000 times over.
      body: new Blob([new Uint8Array(16 * 1024 * 1024)]).stream()
        .pipeThrough(new CompressionStream("gzip")),
    });
  const gzipHeaders = { "content-type": "application/octet-stream", "content-encoding": "gzip" };
  const capped = await setup({ staging: dir.staging });
  const bomb = await post(capped.app, capped.headers(gzipHeaders), "/tmp/bomb.bin");
  assert.equal(bomb.status, 413);
  const body = await bomb.json();
  assert.equal(body.code, 413);
  assert.match(body.message, /inflates more than 100 times its size/);
  assert.match(body.message, /DORMICE_UPLOAD_GZIP_MAX_RATIO/);
  await assert.rejects(capped.executor.readFile(capped.sandbox.id, "/tmp/bomb.bin"));
  assert.deepEqual(await dir.leftovers(), []);
  await capped.executor.close();
  // At deflate's own most the ratio is no cap: the same body is written whole.
  const open = await setup({ staging: dir.staging, maxGzipRatio: 1032 });
  const ok = await post(open.app, open.headers(gzipHeaders), "/tmp/zeros.bin");
  assert.equal(ok.status, 200, await ok.clone().text());
  await ok.body?.cancel();
  assert.equal((await open.executor.readFile(open.sandbox.id, "/tmp/zeros.bin")).length, 16 << 20);
  await open.executor.close();
  await dir.remove();
});

Deno.test("POST /files takes gzip, refuses bad gzip with a 400 and a gzip bomb with a 413", async () => {
  const dir = await stagingDir();
  const { app, headers, executor, sandbox } = await setup({
    staging: dir.staging,
    maxUploadBytes: 256 * 1024,
  });
  const gzip = (bytes: Uint8Array<ArrayBuffer>) =>
    new Blob([bytes]).stream().pipeThrough(new CompressionStream("gzip"));
  const post = (body: BodyInit, path: string) =>
    app.request(`/e2b/envd/files?path=${path}`, {
      method: "POST",
      headers: headers({
        "content-type": "application/octet-stream",
        "content-encoding": "gzip",
      }),
      body,
    });
  const data = new Uint8Array(200 * 1024).fill(65);
  const ok = await post(gzip(data), "/tmp/z.txt");
  assert.equal(ok.status, 200);
  await ok.body?.cancel();
  assert.deepEqual(await executor.readFile(sandbox.id, "/tmp/z.txt"), data);

  const bad = await post(new Uint8Array([1, 2, 3, 4, 5]), "/tmp/bad.txt");
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).message, /bad gzip/);

  // 4 MiB of zeros compress to a few KiB: the cap counts what comes out.
  const bomb = await post(gzip(new Uint8Array(4 * 1024 * 1024)), "/tmp/bomb.txt");
  assert.equal(bomb.status, 413);
  assert.match((await bomb.json()).message, /after decompression/);
  await assert.rejects(executor.readFile(sandbox.id, "/tmp/bomb.txt"));
  assert.deepEqual(await dir.leftovers(), []);

  const br = await app.request("/e2b/envd/files?path=/tmp/x", {
    method: "POST",
    headers: headers({ "content-type": "application/octet-stream", "content-encoding": "br" }),
    body: "x",
  });
  assert.equal(br.status, 400);
  assert.match((await br.json()).message, /Content-Encoding 'br'/);
  await executor.close();
  await dir.remove();
});

Deno.test("POST /files past the node's upload bound waits, then is a 503 with Retry-After", async () => {
  const uploads = new UploadSlots({ concurrent: 1, queued: 1, waitMs: 60_000 });
  const { app, headers, executor } = await setup({ uploads });
  const upload = (path: string) =>
    app.request(`/e2b/envd/files?path=${path}`, {
      method: "POST",
      headers: headers({ "content-type": "application/octet-stream" }),
      body: "data",
    });
  const release = executor.hooks.park("writeFile");
  const first = upload("/tmp/1");
  await executor.hooks.parked("writeFile");
  const second = upload("/tmp/2"); // waits in the queue
  while (uploads.waiting === 0) await new Promise((r) => setTimeout(r, 1));
  const third = await upload("/tmp/3");
  assert.equal(third.status, 503);
  assert.equal(third.headers.get("retry-after"), "2");
  const body = await third.json();
  assert.equal(body.code, 503);
  assert.match(body.message, /streaming 1 uploads at once .* 1 more wait: retry/);
  release();
  assert.equal((await first).status, 200);
  assert.equal((await second).status, 200);
  assert.equal(uploads.active, 0);
  await executor.close();
});

Deno.test("POST /files reads a slow upload before it takes the sandbox's slot: other verbs go on", async () => {
  const { app, headers, executor, service, sandbox } = await setup();
  const body = handFed();
  const upload = app.request("/e2b/envd/files?path=/tmp/slow.bin", {
    method: "POST",
    headers: headers({ "content-type": "application/octet-stream" }),
    body: body.stream,
  });
  await body.wanted();
  body.push(new Uint8Array(1000));
  // The node read the first chunk and waits for more: mid-body, a command on the same sandbox
  // must not wait behind it.
  await body.wanted();
  const exec = service.execCommand({ id: sandbox.id }, { cmd: ["echo", "hi"] });
  const outcome = await Promise.race([
    exec.then((r) => r.stdout),
    new Promise((r) => setTimeout(() => r("still waiting"), 5_000)),
  ]);
  assert.equal(outcome, "hi\n");
  body.push(new Uint8Array(24));
  body.end();
  assert.equal((await upload).status, 200);
  assert.equal((await executor.readFile(sandbox.id, "/tmp/slow.bin")).length, 1024);
  await executor.close();
});

Deno.test("POST /files refuses a declared length past the cap at once, naming the cap", async () => {
  const { app, headers, executor } = await setup({ maxUploadBytes: 1024 * 1024 });
  const res = await app.request("/e2b/envd/files?path=/tmp/x", {
    method: "POST",
    headers: headers({
      "content-type": "application/octet-stream",
      "content-length": String(5 * 1024 * 1024),
    }),
    body: new Uint8Array(16),
  });
  assert.equal(res.status, 413);
  assert.match((await res.json()).message, /cap of 1 MiB.*declares 5242880 bytes/);
  assert.equal(executor.hooks.calls.writeFile, 0);
  await executor.close();
});

Deno.test("POST /files keeps X-Metadata-* headers as the file's metadata; Stat and ListDir show it", async () => {
  const { app, headers, unary, executor } = await setup();
  const upload = (extra: Record<string, string>, path = "/tmp/meta/m.txt") =>
    app.request(`/e2b/envd/files?path=${path}`, {
      method: "POST",
      headers: headers({ "content-type": "application/octet-stream", ...extra }),
      body: "x",
    });
  const res = await upload({ "X-Metadata-Owner": "ana", "x-metadata-note": "a b=c" });
  assert.equal(res.status, 200);
  const meta = { owner: "ana", note: "a b=c" };
  assert.deepEqual((await res.json())[0].metadata, meta);
  const stat = await unary("filesystem.Filesystem/Stat", { path: "/tmp/meta/m.txt" });
  assert.deepEqual((await stat.json()).entry.metadata, meta);
  const plain = await upload({}, "/tmp/meta/plain.txt");
  assert.equal((await plain.json())[0].metadata, undefined);
  const list = await unary("filesystem.Filesystem/ListDir", { path: "/tmp/meta", depth: 1 });
  const entries = (await list.json()).entries as { name: string; metadata?: unknown }[];
  assert.deepEqual(entries.map((e) => [e.name, e.metadata]), [
    ["m.txt", meta],
    ["plain.txt", undefined],
  ]);
  // What the SDK refuses before sending is a 400 sentence here, and nothing is written.
  const bad = await upload({ "X-Metadata-k": "caf\u00e9" }, "/tmp/meta/bad.txt");
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).message, /metadata value of 'k' must be printable US-ASCII/);
  const many = Object.fromEntries(
    Array.from({ length: 33 }, (_, i) => [`X-Metadata-k${i}`, "v"]),
  );
  const tooMany = await upload(many, "/tmp/meta/bad.txt");
  assert.equal(tooMany.status, 400);
  assert.match((await tooMany.json()).message, /at most 32 metadata keys/);
  const huge = await upload({ "X-Metadata-big": "v".repeat(9000) }, "/tmp/meta/bad.txt");
  assert.equal(huge.status, 400);
  await huge.body?.cancel();
  const missing = await unary("filesystem.Filesystem/Stat", { path: "/tmp/meta/bad.txt" });
  assert.equal(missing.status, 404);
  await missing.body?.cancel();
  await executor.close();
});
