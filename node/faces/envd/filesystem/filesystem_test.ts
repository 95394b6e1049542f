import assert from "node:assert/strict";
import { fileSignature } from "../../../../shared/access_tokens.ts";
import { decodeEnvelopes } from "../../connect_codec.ts";
import { setup } from "../_fixtures_test.ts";
import { entryJson } from "./entry.ts";
import { Watchers } from "./watchers.ts";

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

/**
 * Reads envelopes off a WatchDir stream until `count` events came (or the stream ended), for
 * at most 2 s.
 */
async function nextEvents(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  count: number,
): Promise<unknown[]> {
  const out: unknown[] = [];
  const deadline = Date.now() + 2000;
  while (out.length < count) {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const { value, done } = await Promise.race([
      reader.read(),
      new Promise<never>((_, reject) =>
        timer = setTimeout(
          () => reject(new Error(`${out.length} of ${count} events: ${JSON.stringify(out)}`)),
          Math.max(0, deadline - Date.now()),
        )
      ),
    ]).finally(() => clearTimeout(timer));
    if (done) break;
    for (const e of decodeEnvelopes(value)) {
      const m = e.message as { filesystem?: unknown };
      if (e.flags & 0x02) out.push({ end: e.message });
      else if (m.filesystem) out.push(m.filesystem);
    }
  }
  return out;
}

Deno.test("WatchDir sees uploads through both /files doors and commands' changes", async () => {
  const { app, service, stream, headers, sandbox, accessTokens, executor } = await setup();
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
  // As envd's inotify sees its own write: created, chowned to the user, written.
  assert.deepEqual(await nextEvents(reader, 3), [
    { name: "w.txt", type: "EVENT_TYPE_CREATE" },
    { name: "w.txt", type: "EVENT_TYPE_CHMOD" },
    { name: "w.txt", type: "EVENT_TYPE_WRITE" },
  ]);
  // The root door writes to the same sandbox, so the same watches see it.
  const signature = fileSignature({
    path: "/tmp/signed.txt",
    operation: "write",
    user: "",
    accessToken: accessTokens.forSandbox(sandbox.id),
  });
  const signed = await app.request(
    `/files?path=/tmp/signed.txt&signature=${encodeURIComponent(signature)}`,
    { method: "POST", headers: { "content-type": "application/octet-stream" }, body: "s" },
  );
  assert.equal(signed.status, 200, await signed.clone().text());
  await signed.body?.cancel();
  assert.deepEqual((await nextEvents(reader, 3)).map((e) => (e as { name: string }).name), [
    "signed.txt",
    "signed.txt",
    "signed.txt",
  ]);
  await service.execCommand({ id: sandbox.id }, {
    cmd: ["/bin/bash", "-c", "echo c > /tmp/cmd.txt"],
  });
  assert.deepEqual(await nextEvents(reader, 2), [
    { name: "cmd.txt", type: "EVENT_TYPE_CREATE" },
    { name: "cmd.txt", type: "EVENT_TYPE_WRITE" },
  ]);
  await reader.cancel();
  await executor.close();
});

Deno.test("GetWatcherEvents right after a write has its three events; entries on asking", async () => {
  const { app, unary, headers, executor } = await setup();
  await unary("filesystem.Filesystem/MakeDir", { path: "/tmp/p" });
  const created = await (await unary("filesystem.Filesystem/CreateWatcher", { path: "/tmp/p" }))
    .json();
  const withEntries = await (await unary("filesystem.Filesystem/CreateWatcher", {
    path: "/tmp/p",
    includeEntry: true,
  })).json();
  const up = await app.request("/e2b/envd/files?path=/tmp/p/f.txt", {
    method: "POST",
    headers: headers({ "content-type": "application/octet-stream" }),
    body: "five!",
  });
  assert.equal(up.status, 200);
  await up.body?.cancel();
  const polled = await (await unary("filesystem.Filesystem/GetWatcherEvents", created)).json();
  assert.deepEqual(polled.events.map((e: { type: string }) => e.type), [
    "EVENT_TYPE_CREATE",
    "EVENT_TYPE_CHMOD",
    "EVENT_TYPE_WRITE",
  ]);
  assert.deepEqual(
    (await (await unary("filesystem.Filesystem/GetWatcherEvents", created))
      .json()).events,
    [],
  );
  // Entries are stat'ed after the event, so they may come a moment later.
  const rich: { entry?: { path: string; size: string } }[] = [];
  for (let i = 0; i < 50 && rich.length < 3; i++) {
    rich.push(
      ...(await (await unary("filesystem.Filesystem/GetWatcherEvents", withEntries)).json())
        .events,
    );
    if (rich.length < 3) await new Promise((resolve) => setTimeout(resolve, 10));
  }
  assert.deepEqual(rich.map((e) => [e.entry?.path, e.entry?.size]), [
    ["/tmp/p/f.txt", "5"],
    ["/tmp/p/f.txt", "5"],
    ["/tmp/p/f.txt", "5"],
  ]);
  assert.deepEqual(await (await unary("filesystem.Filesystem/RemoveWatcher", created)).json(), {});
  const gone = await unary("filesystem.Filesystem/GetWatcherEvents", created);
  assert.equal((await gone.json()).code, "not_found");
  await executor.close();
});

Deno.test("watches end with their sandbox: the stream ends unavailable, a polled one is forgotten", async () => {
  const { stream, service, sandbox, executor } = await setup();
  const watchers = new Watchers(service);
  const spec = { sandboxId: sandbox.id, path: "/tmp", recursive: false, includeEntry: false };
  const polled = await watchers.createPolled({ ...spec, user: "user" });
  assert.deepEqual(watchers.takePolled(sandbox.id, polled), []);
  const res = await stream("filesystem.Filesystem/WatchDir", { path: "/tmp" });
  const reader = res.body!.getReader();
  await reader.read(); // the start event
  assert.equal(await service.destroy({ id: sandbox.id }), true);
  const [ended] = await nextEvents(reader, 1) as { end: { error: { code: string } } }[];
  assert.equal(ended.end.error.code, "unavailable");
  await Promise.resolve();
  assert.equal(watchers.takePolled(sandbox.id, polled), undefined);
  await executor.close();
});

Deno.test("a sandbox has at most maxWatchesPerSandbox watches; a removed one frees its place", async () => {
  const { unary, executor } = await setup({ maxWatchesPerSandbox: 2 });
  const create = () => unary("filesystem.Filesystem/CreateWatcher", { path: "/tmp" });
  const first = await (await create()).json();
  await (await create()).body?.cancel();
  const third = await create();
  assert.equal(third.status, 429);
  const refused = await third.json();
  assert.equal(refused.code, "resource_exhausted");
  assert.match(refused.message, /RemoveWatcher/);
  await (await unary("filesystem.Filesystem/RemoveWatcher", first)).body?.cancel();
  assert.equal((await create()).status, 200);
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

Deno.test("ListDir answers at most 10,000 entries and refuses more, naming the cap", async () => {
  const { unary, service, sandbox, executor } = await setup();
  const empty = new Uint8Array();
  for (let i = 0; i < 10_000; i++) {
    await service.writeFile({ id: sandbox.id }, `/tmp/many/f${i}`, empty);
  }
  const ok = await unary("filesystem.Filesystem/ListDir", { path: "/tmp/many" });
  assert.equal(ok.status, 200);
  assert.equal((await ok.json()).entries.length, 10_000);
  await service.writeFile({ id: sandbox.id }, "/tmp/many/one-more", empty);
  const over = await unary("filesystem.Filesystem/ListDir", { path: "/tmp/many" });
  assert.equal(over.status, 400);
  const body = await over.json();
  assert.equal(body.code, "invalid_argument");
  assert.match(body.message, /holds 10001 entries .*more than the 10,000 one ListDir answers/);
  await executor.close();
});
