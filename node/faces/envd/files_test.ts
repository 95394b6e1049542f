import assert from "node:assert/strict";
import { fileSignature } from "../../../shared/access_tokens.ts";
import { setup } from "./_fixtures_test.ts";

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
