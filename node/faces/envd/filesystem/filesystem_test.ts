import assert from "node:assert/strict";
import { decodeEnvelopes } from "../../connect_codec.ts";
import { setup } from "../_fixtures_test.ts";
import { entryJson } from "./entry.ts";

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

Deno.test("Filesystem RPCs and /files run as the user the request names", async () => {
  const { app, unary, headers, executor } = await setup();
  const asRoot = headers({ authorization: `Basic ${btoa("root:")}` });
  const made = await (await unary("filesystem.Filesystem/MakeDir", { path: "/opt/x" }, asRoot))
    .json();
  assert.equal(made.entry.owner, "root");
  const up = await app.request("/e2b/envd/files?path=/root/r.txt&username=root", {
    method: "POST",
    headers: { ...headers(), "content-type": "application/octet-stream" },
    body: "r",
  });
  assert.equal(up.status, 200, await up.clone().text());
  await up.body?.cancel();
  const listed = await (await unary("filesystem.Filesystem/ListDir", { path: "~" }, asRoot))
    .json();
  assert.deepEqual(
    listed.entries.map((e: { path: string; owner: string }) => [e.path, e.owner]),
    [["/root/r.txt", "root"]],
  );
  // Without a user, E2B's default user: relative paths from its home, and it owns its files.
  await unary("filesystem.Filesystem/MakeDir", { path: "mine" });
  const mine = await (await unary("filesystem.Filesystem/Stat", { path: "mine" })).json();
  assert.deepEqual([mine.entry.path, mine.entry.owner], ["/home/user/mine", "user"]);
  await executor.close();
});

Deno.test("entryJson() answers as envd: Go's mode string, a link's target type and mode", () => {
  const base = { owner: "root", group: "root", modifiedAt: 1_700_000_000_500 };
  const tmp = entryJson({
    ...base,
    name: "tmp",
    path: "/tmp",
    type: "dir",
    size: 4096,
    mode: 0o1777,
  });
  assert.deepEqual([tmp.permissions, tmp.mode, tmp.size], ["dtrwxrwxrwx", 0o777, "4096"]);
  const sudo = entryJson({
    ...base,
    name: "su",
    path: "/bin/su",
    type: "file",
    size: 9,
    mode: 0o4755,
  });
  assert.deepEqual([sudo.permissions, sudo.type], ["urwxr-xr-x", "FILE_TYPE_FILE"]);
  const link = entryJson({
    ...base,
    name: "l",
    path: "/tmp/l",
    type: "symlink",
    size: 5,
    mode: 0o777,
    symlinkTarget: "/etc/hosts",
    targetType: "file",
    targetMode: 0o644,
  });
  assert.deepEqual(
    [link.type, link.mode, link.permissions, link.symlinkTarget, link.modifiedTime],
    ["FILE_TYPE_FILE", 0o644, "Lrwxrwxrwx", "/etc/hosts", "2023-11-14T22:13:20.500Z"],
  );
  const broken = entryJson({
    ...base,
    name: "b",
    path: "/b",
    type: "symlink",
    size: 2,
    mode: 0o777,
  });
  assert.deepEqual([broken.type, broken.mode], ["FILE_TYPE_UNSPECIFIED", 0]);
});
