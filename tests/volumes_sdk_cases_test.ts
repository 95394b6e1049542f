/**
 * The behaviours the official SDK's own volume tests expect of a backend (e2b-dev/E2B
 * `packages/js-sdk/tests/volume/`: file operations, CRUD, reads in every format), asked of a
 * gateway in front of one node on the fake executor with the `e2b` package, unmodified.
 */
import assert from "node:assert/strict";
import { Volume, VolumeNotFoundError, VolumePathNotFoundError } from "e2b";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

Deno.test({
  name: "the SDK's own volume cases pass against the fleet",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  const gwPort = freePort();
  let gw!: GatewayProcess;
  let node!: NodeProcess;
  try {
    gw = await startGateway({
      token,
      port: gwPort,
      env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" },
    });
    node = await startNode({
      token,
      env: {
        DORMICE_GATEWAY_ENDPOINT: `http://127.0.0.1:${gwPort}`,
        DORMICE_NODE_ID: "node-a",
        DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
      },
    });
    for (let i = 0; i < 100; i++) {
      const { body } = await gw.json("listNodes");
      if (body.nodes.some((n: { reading: unknown }) => n.reading !== null)) break;
      await sleep(100);
    }
    const key = (await gw.json("createApiKey", { team: "cases" })).body.key as string;
    const opts = { apiUrl: `${gw.url}/e2b/api`, apiKey: key };
    const vol = await Volume.create("cases", opts);

    await t.step("CRUD: an empty team lists none; unknown ids are not found", async () => {
      const fresh = (await gw.json("createApiKey", { team: "empty" })).body.key as string;
      assert.deepEqual(await Volume.list({ ...opts, apiKey: fresh }), []);
      await assert.rejects(Volume.getInfo("non-existent-id", opts), VolumeNotFoundError);
      assert.equal(await Volume.destroy("non-existent-id", opts), false);
      const connected = await Volume.connect(vol.volumeId, opts);
      assert.equal(connected.name, "cases");
      assert.equal(connected.token, vol.token);
      const second = await Volume.create("cases-2", opts);
      assert.deepEqual((await Volume.list(opts)).map((v) => v.name).sort(), ["cases", "cases-2"]);
      assert.equal(await Volume.destroy(second.volumeId, opts), true);
      assert.deepEqual((await Volume.list(opts)).map((v) => v.name), ["cases"]);
    });

    await t.step("write and read text, bytes, blob, an empty file and a stream", async () => {
      await vol.writeFile("/test.txt", "Hello, World!", opts);
      assert.equal(await vol.readFile("/test.txt", { ...opts, format: "text" }), "Hello, World!");
      const bytes = new TextEncoder().encode("Test bytes content");
      await vol.writeFile("/test-bytes.txt", bytes.buffer, opts);
      assert.deepEqual(await vol.readFile("/test-bytes.txt", { ...opts, format: "bytes" }), bytes);
      await vol.writeFile("/test-blob.txt", new Blob(["Test blob content"]), opts);
      const blob = await vol.readFile("/test-blob.txt", { ...opts, format: "blob" });
      assert.equal(await blob.text(), "Test blob content");
      await vol.writeFile("/empty.txt", "", opts);
      assert.equal(await vol.readFile("/empty.txt", opts), "");
      assert.equal((await vol.readFile("/empty.txt", { ...opts, format: "bytes" })).length, 0);
      assert.equal((await vol.readFile("/empty.txt", { ...opts, format: "blob" })).size, 0);
      const stream = await vol.readFile("/test.txt", { ...opts, format: "stream" });
      assert.equal(await new Response(stream).text(), "Hello, World!");
      await vol.writeFile("/test.txt", "New content", { ...opts, force: true });
      assert.equal(await vol.readFile("/test.txt", opts), "New content");
      await assert.rejects(vol.readFile("/missing.txt", opts), VolumePathNotFoundError);
      await assert.rejects(
        vol.readFile("/missing.txt", { ...opts, format: "stream" }),
        VolumePathNotFoundError,
      );
    });

    await t.step("metadata: write with uid, gid and mode; update it; 404 for none", async () => {
      const asRoot = Deno.uid() === 0;
      const owner = asRoot ? { uid: 1000, gid: 1000 } : {};
      await vol.writeFile("/metadata.txt", "File with metadata", {
        ...opts,
        ...owner,
        mode: 0o644,
      });
      const info = await vol.getInfo("/metadata.txt", opts);
      assert.equal(info.type, "file");
      assert.equal(info.mode, 0o644);
      if (asRoot) assert.deepEqual([info.uid, info.gid], [1000, 1000]);
      const updated = await vol.updateMetadata(
        "/metadata.txt",
        { ...(asRoot ? { uid: 1001, gid: 1001 } : {}), mode: 0o755 },
        opts,
      );
      assert.equal(updated.path, "/metadata.txt");
      assert.equal(updated.mode, 0o755);
      if (asRoot) assert.deepEqual([updated.uid, updated.gid], [1001, 1001]);
      await assert.rejects(
        vol.updateMetadata("/non-existent.txt", { mode: 0o644 }, opts),
        VolumePathNotFoundError,
      );
      await vol.makeDir("/dir-with-metadata", { ...opts, ...owner, mode: 0o755 });
      const dir = await vol.getInfo("/dir-with-metadata", opts);
      assert.equal(dir.type, "directory");
      assert.equal(dir.mode & 0o777, 0o755);
      if (asRoot) assert.deepEqual([dir.uid, dir.gid], [1000, 1000]);
    });

    await t.step("getInfo of a file and a directory; exists", async () => {
      await vol.writeFile("/info-file.txt", "File for info test", opts);
      const info = await vol.getInfo("/info-file.txt", opts);
      assert.equal(info.name, "info-file.txt");
      assert.equal(info.path, "/info-file.txt");
      assert.ok(info.mtime instanceof Date && !Number.isNaN(info.mtime.getTime()));
      assert.ok(info.ctime instanceof Date && !Number.isNaN(info.ctime.getTime()));
      await vol.makeDir("/info-dir", opts);
      const dir = await vol.getInfo("/info-dir", opts);
      assert.deepEqual([dir.name, dir.type, dir.path], ["info-dir", "directory", "/info-dir"]);
      assert.equal(await vol.exists("/non-existent.txt", opts), false);
      assert.equal(await vol.exists("/info-dir", opts), true);
    });

    await t.step("makeDir, nested with force, then a file in it; list; list of none", async () => {
      await vol.makeDir("/nested/deep/path", { ...opts, force: true });
      await vol.writeFile("/nested/deep/path/file.txt", "Nested file content", opts);
      assert.equal(await vol.readFile("/nested/deep/path/file.txt", opts), "Nested file content");
      await vol.writeFile("/file1.txt", "Content 1", opts);
      await vol.makeDir("/dir1", opts);
      const names = (await vol.list("/", opts)).map((e) => e.name);
      for (const n of ["file1.txt", "dir1", "nested"]) assert.ok(names.includes(n), n);
      const nested = await vol.list("/nested/deep/path", opts);
      assert.ok(nested.some((e) => e.name === "file.txt"));
      const deep = await vol.list("/nested", { ...opts, depth: 3 });
      assert.ok(deep.some((e) => e.path === "/nested/deep/path/file.txt"));
      await assert.rejects(vol.list("/non-existent", opts), VolumePathNotFoundError);
      await assert.rejects(vol.makeDir("/dir1", opts), /already exists/);
    });

    await t.step("remove a file, a directory, one with contents; 404 for none", async () => {
      await vol.writeFile("/to-remove.txt", "Content", opts);
      await vol.remove("/to-remove.txt", opts);
      assert.equal(await vol.exists("/to-remove.txt", opts), false);
      await vol.makeDir("/multi-file-dir", opts);
      for (const f of ["file1.txt", "file2.txt", "file3.txt"]) {
        await vol.writeFile(`/multi-file-dir/${f}`, `Content of ${f}`, opts);
      }
      assert.equal((await vol.list("/multi-file-dir", opts)).length, 3);
      assert.equal(await vol.readFile("/multi-file-dir/file2.txt", opts), "Content of file2.txt");
      await vol.remove("/multi-file-dir", opts);
      assert.equal(await vol.exists("/multi-file-dir", opts), false);
      await assert.rejects(vol.remove("/non-existent.txt", opts), VolumePathNotFoundError);
    });

    assert.equal(await Volume.destroy(vol.volumeId, opts), true);
  } finally {
    await Promise.allSettled([gw?.stop(), node?.stop()]);
  }
});
