import assert from "node:assert/strict";
import { join } from "node:path";
import { NodeVolumes } from "../volumes.ts";
import { MIN_IMAGE_BYTES, VolumeImages } from "../volume_images.ts";
import { MAX_VOLUME_BYTES } from "../../shared/volumes.ts";
import { createVolumeFace, volumeRootId } from "./volumes.ts";
import { silentLog } from "../../shared/log.ts";
import type { SandboxSpec } from "../../shared/mod.ts";

const token = "node-volume-face-test-token-0123456789abcdef";
const auth = { authorization: `Bearer ${token}` };
const id = "vol-0123456789abcdef0123";

async function face(
  sandboxes: { id: string; name: string; state: string; spec: SandboxSpec }[],
  make: (options: ConstructorParameters<typeof NodeVolumes>[0]) => NodeVolumes = (o) =>
    new NodeVolumes(o),
) {
  const root = await Deno.makeTempDir();
  const volumes = make({
    root,
    shared: false,
    defaultSizeBytes: 1000,
    sandboxes: () => sandboxes as never,
  });
  const app = createVolumeFace(volumes, { token, nodeId: "node-7", log: silentLog });
  return {
    root,
    request: (path: string, init: RequestInit = {}) =>
      app.request(path, { ...init, headers: { ...auth, ...init.headers } }),
    async [Symbol.asyncDispose]() {
      await Deno.remove(root, { recursive: true });
    },
  };
}

Deno.test("volume face: a write past the volume's cap is a 507 and leaves no partial file", async () => {
  await using f = await face([]);
  const made = await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) });
  assert.equal(made.status, 201);
  const ok = await f.request(`/volumecontent/${id}/file?path=/a`, {
    method: "PUT",
    body: new Uint8Array(600),
  });
  assert.equal(ok.status, 201);
  await ok.body?.cancel();
  const full = await f.request(`/volumecontent/${id}/file?path=/b`, {
    method: "PUT",
    body: new Uint8Array(600),
  });
  assert.equal(full.status, 507);
  assert.match((await full.json()).message, /is full: its cap is 1000 bytes/);
  const listed = await (await f.request(`/volumecontent/${id}/dir?path=/`)).json();
  assert.deepEqual(listed.map((e: { name: string }) => e.name), ["a"]);
  // Replacing a file counts its old size back.
  const again = await f.request(`/volumecontent/${id}/file?path=/a`, {
    method: "PUT",
    body: new Uint8Array(900),
  });
  assert.equal(again.status, 201);
  await again.body?.cancel();
});

Deno.test("volume face: destroy and export are a 409 naming the sandboxes that mount it", async () => {
  await using f = await face([
    { id: "sbx1", name: "a", state: "active", spec: { volumes: [{ name: id, mountPath: "/d" }] } },
    { id: "sbx2", name: "b", state: "active", spec: {} },
  ]);
  await (await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) })).body
    ?.cancel();
  for (const verb of ["destroyVolume", "exportVolume"]) {
    const res = await f.request(`/${verb}`, { method: "POST", body: JSON.stringify({ id }) });
    const body = await res.json();
    assert.equal(res.status, 409, verb);
    assert.match(body.message, /mounted by sandbox 'sbx1' \(active\)/);
    assert.doesNotMatch(body.message, /sbx2/);
  }
  const bare = await f.request("/destroyVolume", {
    method: "POST",
    body: JSON.stringify({ id }),
    headers: { authorization: "Bearer nope" },
  });
  assert.equal(bare.status, 401);
  await bare.body?.cancel();
});

Deno.test("volume face: a PATCH body past 16 KiB is a 413, not read whole", async () => {
  await using f = await face([]);
  await (await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) })).body
    ?.cancel();
  await (await f.request(`/volumecontent/${id}/file?path=/a`, { method: "PUT", body: "x" })).body
    ?.cancel();
  const res = await f.request(`/volumecontent/${id}/path?path=/a`, {
    method: "PATCH",
    body: JSON.stringify({ mode: 420, pad: "x".repeat(100_000) }),
  });
  assert.equal(res.status, 413);
  await res.body?.cancel();
});

Deno.test("volume face: a directory swapped for a link during a write's usage walk is not written through", async () => {
  const outside = await Deno.makeTempDir();
  let swapped = false;
  // The sandbox's move: while the node counts the volume, `/a` becomes a link to a node path.
  class Racing extends NodeVolumes {
    override async usedBytes(vol: string): Promise<number> {
      const bytes = await super.usedBytes(vol);
      const a = `${this.root}/${vol}/data/a`;
      await Deno.remove(a, { recursive: true });
      await Deno.symlink(outside, a);
      swapped = true;
      return bytes;
    }
  }
  try {
    await using f = await face([], (o) => new Racing(o));
    await (await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) }))
      .body?.cancel();
    await (await f.request(`/volumecontent/${id}/dir?path=/a`, { method: "POST" })).body
      ?.cancel();
    const res = await f.request(`/volumecontent/${id}/file?path=/a/passwd`, {
      method: "PUT",
      body: "root::0:0::/:/bin/sh",
    });
    assert.ok(swapped, "the link was swapped in during the write");
    assert.equal(res.status, 403);
    assert.match((await res.json()).message, /'\/a' is a link that leads outside the volume/);
    assert.deepEqual([...Deno.readDirSync(outside)], []);
  } finally {
    await Deno.remove(outside, { recursive: true });
  }
});

Deno.test("volume face: concurrent uploads share the room under the cap", async () => {
  await using f = await face([]);
  await (await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) })).body
    ?.cancel();
  const streams = [0, 1].map(() => {
    let controller!: ReadableStreamDefaultController<Uint8Array>;
    const { promise: reading, resolve } = Promise.withResolvers<void>();
    const body = new ReadableStream<Uint8Array>({
      start: (c) => void (controller = c),
      // The node reads the body only once it has counted the room left.
      pull: () => resolve(),
    }, { highWaterMark: 0 });
    return { body, controller, reading };
  });
  const answers = streams.map((s, i) =>
    f.request(`/volumecontent/${id}/file?path=/f${i}`, {
      method: "PUT",
      body: s.body,
      duplex: "half",
    } as RequestInit)
  );
  // Both count their room before either sends a byte.
  await Promise.all(streams.map((s) => s.reading));
  for (const s of streams) {
    s.controller.enqueue(new Uint8Array(600));
    s.controller.close();
  }
  const statuses = (await Promise.all(answers)).map((r) => {
    r.body?.cancel();
    return r.status;
  }).sort();
  assert.deepEqual(statuses, [201, 507]);
  const listed = await (await f.request(`/volumecontent/${id}/dir?path=/`)).json();
  assert.equal(listed.length, 1);
});

Deno.test("volume face: a path too long for the node's filesystem is a 400 that names no node path", async () => {
  await using f = await face([]);
  await (await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) })).body
    ?.cancel();
  // 4090 characters fit the content API's limit; below the node's root they pass PATH_MAX.
  const res = await f.request(`/volumecontent/${id}/dir?path=${"d/".repeat(2045)}&force=true`, {
    method: "POST",
  });
  const body = await res.json();
  assert.equal(res.status, 400, JSON.stringify(body));
  assert.match(body.message, /too long for the node's filesystem/);
  assert.doesNotMatch(body.message, new RegExp(f.root));
  const data = `${f.root}/${id}/data`;
  assert.deepEqual([...Deno.readDirSync(data)], [], "no parent was made");
  const name = await f.request(`/volumecontent/${id}/file?path=/${"n".repeat(300)}`, {
    method: "PUT",
    body: "x",
  });
  assert.equal(name.status, 400);
  assert.match((await name.json()).message, /over 255 bytes/);
});

const noLoop = Deno.uid() !== 0 ||
  !new Deno.Command("test", { args: ["-c", "/dev/loop-control"] }).outputSync().success;
if (noLoop) console.log("volume face on a real image skipped: not root, or no loop devices");

Deno.test({
  name:
    "volume face: in an image whose every inode a sandbox took, a delete through the content API still frees them, before and after a restart",
  ignore: noLoop,
}, async () => {
  const root = await Deno.makeTempDir();
  const images = new VolumeImages(root);
  const make = () =>
    new NodeVolumes({ root, shared: false, defaultSizeBytes: 0, sandboxes: () => [], images });
  try {
    let volumes = make();
    let app = createVolumeFace(volumes, { token, log: silentLog });
    const request = (path: string, init: RequestInit = {}) =>
      app.request(path, { ...init, headers: { ...auth, ...init.headers } });
    const made = await request("/createVolume", {
      method: "POST",
      body: JSON.stringify({ id, sizeBytes: MIN_IMAGE_BYTES }),
    });
    assert.equal(made.status, 201, await made.text());
    const fill = async () => {
      // What a sandbox does in its bind mount: files until the kernel says ENOSPC.
      const dir = join(volumes.requireDataDir(id), "many");
      await Deno.mkdir(dir);
      let n = 0;
      try {
        for (;; n++) await Deno.writeFile(join(dir, String(n)), new Uint8Array(0));
      } catch (error) {
        assert.match((error as Error).message, /os error 28/);
      }
      // The precondition: the filesystem has no inode left (a file of 0 bytes takes no block).
      await assert.rejects(Deno.mkdir(join(dir, "more")), /os error 28/);
      return n;
    };
    const remove = async () => {
      const res = await request(`/volumecontent/${id}/path?path=/many`, { method: "DELETE" });
      assert.equal(res.status, 204, await res.text());
      const listed = await (await request(`/volumecontent/${id}/dir?path=/`)).json();
      assert.deepEqual(listed, []);
    };
    assert.ok(await fill() > 1000);
    await remove();
    // A restart sweeps the uploads directory; a volume filled after it still takes a delete.
    volumes = make();
    app = createVolumeFace(volumes, { token, log: silentLog });
    await volumes.open();
    await fill();
    await remove();
  } finally {
    await images.remove(id).catch(() => {});
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volume face: an import asking for a cap past MAX_VOLUME_BYTES is a 400 naming the bound", async () => {
  await using f = await face([]);
  const res = await f.request(`/importVolume?id=${id}&sizeBytes=${2 ** 51}`, {
    method: "POST",
    body: new Uint8Array(4),
  });
  assert.equal(res.status, 400);
  assert.match((await res.json()).message, new RegExp(`up to ${MAX_VOLUME_BYTES}`));
  assert.equal([...Deno.readDirSync(f.root)].length, 0, "nothing was made");
});

Deno.test("volume face: a node whose volume root is relative writes, makes, reads and removes through the confined renames", async () => {
  // `deno task fleet` gives its nodes relative data dirs; the confined renames run in a shell
  // that first enters the volume's directory, where a relative uploads path names nothing.
  const root = `.dormice/test-volface-${crypto.randomUUID().slice(0, 8)}`;
  assert.ok(!root.startsWith("/"));
  await Deno.mkdir(root, { recursive: true });
  try {
    const volumes = new NodeVolumes({
      root,
      shared: false,
      defaultSizeBytes: 1_000_000,
      sandboxes: () => [],
    });
    const app = createVolumeFace(volumes, { token, log: silentLog });
    const request = (path: string, init: RequestInit = {}) =>
      app.request(path, { ...init, headers: { ...auth, ...init.headers } });
    const made = await request("/createVolume", { method: "POST", body: JSON.stringify({ id }) });
    assert.equal(made.status, 201);
    await made.body?.cancel();
    const wrote = await request(`/volumecontent/${id}/file?path=/test.txt`, {
      method: "PUT",
      body: "Hello, World!",
    });
    assert.equal(wrote.status, 201, await wrote.clone().text());
    await wrote.body?.cancel();
    const dir = await request(`/volumecontent/${id}/dir?path=/a/b&force=true`, { method: "POST" });
    assert.equal(dir.status, 201, await dir.clone().text());
    await dir.body?.cancel();
    const read = await request(`/volumecontent/${id}/file?path=/test.txt`);
    assert.equal(await read.text(), "Hello, World!");
    const removed = await request(`/volumecontent/${id}/path?path=/test.txt`, {
      method: "DELETE",
    });
    assert.equal(removed.status, 204, await removed.clone().text());
    const listed = await (await request(`/volumecontent/${id}/dir?path=/`)).json();
    assert.deepEqual(listed.map((e: { name: string }) => e.name), ["a"]);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("volume face: /volumeUsers names the node answering (the gateway checks it before a drop)", async () => {
  await using f = await face([]);
  await (await f.request("/createVolume", { method: "POST", body: JSON.stringify({ id }) })).body
    ?.cancel();
  const users = await f.request("/volumeUsers", { method: "POST", body: JSON.stringify({ id }) });
  const answer = await users.json();
  assert.deepEqual({ ...answer, root: undefined }, {
    present: true,
    sandboxes: [],
    node: "node-7",
    root: undefined,
  });
  // The volume root's id: written once in the root, the same to every node reading that root.
  assert.match(answer.root, /^[0-9a-f-]{36}$/);
  assert.equal(await volumeRootId(f.root), answer.root);
  const again = await f.request("/volumeUsers", { method: "POST", body: JSON.stringify({ id }) });
  assert.equal((await again.json()).root, answer.root);
  const other = await Deno.makeTempDir();
  try {
    const made = await Promise.all([volumeRootId(other), volumeRootId(other)]);
    assert.equal(made[0], made[1], "two nodes racing over one root read one id");
    assert.notEqual(made[0], answer.root, "another root, another id");
  } finally {
    await Deno.remove(other, { recursive: true });
  }
});
