import assert from "node:assert/strict";
import { decodeEnvelopes } from "../../connect_codec.ts";
import { setup } from "../_fixtures_test.ts";

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
