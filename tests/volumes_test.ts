/**
 * Managed volumes through a gateway in front of two nodes on the fake executor, with the
 * official `e2b` SDK's `Volume` and `Sandbox` (and raw fetch where a hostile tenant would not use
 * the SDK): the volume routes, per-team isolation, the content API routed to the volume's node,
 * mounts funnelled there, delete refused while mounted, the node down (503 naming it) and back,
 * a move between the nodes, path escapes refused, and a shared root every node serves.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import { Sandbox, Volume, VolumeNotFoundError } from "e2b";
import { freePort, newToken, nodePermissions, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what: string, check: () => Promise<boolean>, ms = 10_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

type NodeRow = { id: string; state: string; reading: unknown; volumes: string[] };

async function nodesOf(gw: GatewayProcess): Promise<NodeRow[]> {
  return (await gw.json("listNodes")).body.nodes;
}

/** Where the gateway put a sandbox, asked of each node directly. */
async function holderOf(
  nodes: Record<string, NodeProcess>,
  token: string,
  id: string,
): Promise<string | undefined> {
  for (const [name, node] of Object.entries(nodes)) {
    const res = await fetch(`${node.url}/lookupSandbox`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify({ id }),
    });
    if ((await res.json()).found) return name;
  }
  return undefined;
}

Deno.test({
  name: "volumes through a gateway: the SDK's Volume, mounts, isolation, node down, move, escapes",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  const gwPort = freePort();
  const gwUrl = `http://127.0.0.1:${gwPort}`;
  const nodeEnv = (id: string) => ({
    DORMICE_GATEWAY_ENDPOINT: gwUrl,
    DORMICE_NODE_ID: id,
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    DORMICE_VOLUME_SIZE_GB: "1",
  });
  const dirs = {
    "node-a": await Deno.makeTempDir({ prefix: "dormice-vol-a-" }),
    "node-b": await Deno.makeTempDir({ prefix: "dormice-vol-b-" }),
  };
  const ports = { "node-a": freePort(), "node-b": freePort() };
  const start = (id: "node-a" | "node-b") =>
    startNode({ token, env: nodeEnv(id), dataDir: dirs[id], port: ports[id] });
  let gw!: GatewayProcess;
  const nodes: Record<string, NodeProcess> = {};
  try {
    gw = await startGateway({
      token,
      port: gwPort,
      env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" },
    });
    [nodes["node-a"], nodes["node-b"]] = await Promise.all([start("node-a"), start("node-b")]);
    await until(
      "both nodes up",
      async () =>
        (await nodesOf(gw)).filter((n) => n.state === "up" && n.reading !== null).length === 2,
    );
    const acme = (await gw.json("createApiKey", { team: "acme" })).body.key as string;
    const other = (await gw.json("createApiKey", { team: "other" })).body.key as string;
    const opts = { apiUrl: `${gw.url}/e2b/api`, apiKey: acme };
    const sdk = { ...opts, sandboxUrl: `${gw.url}/e2b/envd` };
    const otherOpts = { apiUrl: `${gw.url}/e2b/api`, apiKey: other };
    let vol!: Volume;
    let home!: string;

    await t.step("Volume.create places a volume on a node, which advertises it", async () => {
      for (const node of Object.values(nodes)) {
        // The content API's renames are confined (the nodes may run sh): no in-process warning.
        assert.doesNotMatch(node.process.stderr(), /run in process/);
      }
      vol = await Volume.create("data", opts);
      assert.match(vol.volumeId, /^vol-[0-9a-f]{20}$/);
      assert.equal(vol.name, "data");
      assert.ok(vol.token);
      await until(
        "a node advertising the volume",
        async () => (await nodesOf(gw)).some((n) => n.volumes.includes(vol.volumeId)),
      );
      home = (await nodesOf(gw)).find((n) => n.volumes.includes(vol.volumeId))!.id;
      // Names are unique per team: a second "data" in acme is a 409, in another team fine.
      await assert.rejects(Volume.create("data", opts), /already has a volume named 'data'/);
      const theirs = await Volume.create("data", otherOpts);
      assert.notEqual(theirs.volumeId, vol.volumeId);
      await assert.rejects(Volume.create("no/slash", opts), /'name' must be/);
    });

    await t.step(
      "the content API writes, reads, lists and stats on the volume's node",
      async () => {
        const entry = await vol.writeFile("/notes/hello.txt", "hello volume\n", {
          ...opts,
          force: true,
        });
        assert.equal(entry.type, "file");
        assert.equal(entry.path, "/notes/hello.txt");
        assert.equal(entry.size, 13);
        assert.equal(await vol.readFile("/notes/hello.txt", opts), "hello volume\n");
        const bytes = new Uint8Array([0, 1, 2, 250, 255]);
        await vol.writeFile("/b.bin", bytes.buffer, opts);
        assert.deepEqual(await vol.readFile("/b.bin", { ...opts, format: "bytes" }), bytes);
        const listed = await vol.list("/", opts);
        assert.deepEqual(listed.map((e) => `${e.name}:${e.type}`).sort(), [
          "b.bin:file",
          "notes:directory",
        ]);
        const deep = await vol.list("/", { ...opts, depth: 2 });
        assert.ok(deep.some((e) => e.path === "/notes/hello.txt"));
        const dir = await vol.makeDir("/made/deep", { ...opts, force: true });
        assert.equal(dir.type, "directory");
        assert.equal((await vol.getInfo("/made", opts)).type, "directory");
        assert.equal(await vol.exists("/nope", opts), false);
        await vol.remove("/made", opts);
        assert.equal(await vol.exists("/made", opts), false);
        const patched = await vol.updateMetadata("/b.bin", { mode: 0o600 }, opts);
        assert.equal(patched.mode, 0o600);
        // The files are under the node's data dir, on that node only.
        const onDisk = join(dirs[home as "node-a"], "volumes", vol.volumeId, "data", "notes");
        assert.equal(await Deno.readTextFile(join(onDisk, "hello.txt")), "hello volume\n");
      },
    );

    await t.step("list and getInfo show the team's volumes; another team sees none", async () => {
      const mine = await Volume.list(opts);
      assert.deepEqual(mine.map((v) => v.name), ["data"]);
      const info = await Volume.getInfo(vol.volumeId, opts);
      assert.equal(info.name, "data");
      assert.equal(info.token, vol.token);
      const theirs = await Volume.list(otherOpts);
      assert.ok(theirs.every((v) => v.volumeId !== vol.volumeId));
      await assert.rejects(Volume.getInfo(vol.volumeId, otherOpts), VolumeNotFoundError);
      assert.equal(await Volume.destroy(vol.volumeId, otherOpts), false);
      // The content API with another volume's token (another team's, which opens its own volume)
      // or none reaches nothing.
      const theirToken = (await Volume.getInfo(theirs[0].volumeId, otherOpts)).token;
      const own = await fetch(`${gw.url}/e2b/api/volumecontent/${theirs[0].volumeId}/dir?path=/`, {
        headers: { authorization: `Bearer ${theirToken}` },
      });
      assert.equal(own.status, 200, "the other team's token opens its own volume");
      await own.body?.cancel();
      const res = await fetch(`${gw.url}/e2b/api/volumecontent/${vol.volumeId}/file?path=/b.bin`, {
        headers: { authorization: `Bearer ${theirToken}` },
      });
      assert.equal(res.status, 404);
      await res.body?.cancel();
      const bare = await fetch(`${gw.url}/e2b/api/volumecontent/${vol.volumeId}/file?path=/b.bin`);
      assert.equal(bare.status, 401);
      await bare.body?.cancel();
    });

    const content = (op: string, path: string, init: RequestInit = {}) =>
      fetch(
        `${gw.url}/e2b/api/volumecontent/${vol.volumeId}/${op}?path=${encodeURIComponent(path)}`,
        { ...init, headers: { authorization: `Bearer ${vol.token}`, ...init.headers } },
      );

    await t.step("a hostile tenant's paths stay inside the volume", async () => {
      const data = join(dirs[home as "node-a"], "volumes", vol.volumeId, "data");
      // What a sandbox that mounts the volume could make: links out of it, and one inside.
      await Deno.symlink("/", join(data, "escape"));
      await Deno.symlink("/etc/passwd", join(data, "pw"));
      await Deno.symlink("notes", join(data, "inside"));
      // Out of the volume but inside the node's own data dir (its ledger, other volumes): the
      // node's Deno permissions allow these, so only the volume's own check stops them.
      await Deno.symlink(dirs[home as "node-a"], join(data, "node"));
      await Deno.symlink("../../../pools.json", join(data, "rel"));
      for (
        const [op, path, method, want] of [
          ["file", "../../../../etc/passwd", "GET", 400],
          ["file", "/notes/../../x", "GET", 400],
          ["file", "/escape/etc/passwd", "GET", 403],
          ["file", "/pw", "GET", 403],
          ["dir", "/escape", "GET", 403],
          ["dir", "/escape/tmp", "GET", 403],
          ["file", "/escape/tmp/owned", "PUT", 403],
          ["dir", "/escape/tmp/owned", "POST", 403],
          ["path", "/escape/etc", "GET", 403],
          ["path", "/pw", "PATCH", 403],
          ["dir", "/node", "GET", 403],
          ["dir", "/node/volumes", "GET", 403],
          ["file", "/rel", "GET", 403],
          ["file", "/node/new-file", "PUT", 403],
        ] as const
      ) {
        const res = await content(op, path, {
          method,
          body: method === "PUT" ? "x" : method === "PATCH" ? '{"mode":511}' : undefined,
        });
        const text = await res.text();
        assert.equal(res.status, want, `${method} ${op} ${path}: ${text}`);
        assert.doesNotMatch(text, /root:x:0/);
      }
      // A link that stays inside is followed; a link's own info is given, not its target's.
      assert.equal(await vol.readFile("/inside/hello.txt", opts), "hello volume\n");
      const link = await vol.getInfo("/pw", opts);
      assert.equal(link.type, "symlink");
      assert.equal(link.target, "/etc/passwd");
      // Writing over a link replaces the link, never what it points at.
      await vol.writeFile("/pw", "mine", opts);
      assert.equal((await Deno.lstat(join(data, "pw"))).isFile, true);
      // Removing a link removes the link only.
      await vol.remove("/escape", opts);
      assert.ok((await Deno.stat("/etc")).isDirectory);
      await vol.remove("/pw", opts);
      await vol.remove("/inside", opts);
      await vol.remove("/node", opts);
      await vol.remove("/rel", opts);
    });

    const mounted: Sandbox[] = [];
    await t.step("a create that mounts the volume is funnelled to its node", async () => {
      for (let i = 0; i < 3; i++) {
        const s = await Sandbox.create({ ...sdk, volumeMounts: { "/data": vol } });
        mounted.push(s);
        assert.equal(await holderOf(nodes, token, s.sandboxId), home);
      }
      // By name too, as the SDK allows.
      const byName = await Sandbox.create({ ...sdk, volumeMounts: { "/data": "data" } });
      mounted.push(byName);
      assert.equal(await holderOf(nodes, token, byName.sandboxId), home);
      // Another team cannot mount it: the name is not theirs (their own "data" is mounted).
      const theirs = await Sandbox.create({
        ...sdk,
        apiKey: other,
        volumeMounts: { "/data": "data" },
      });
      await theirs.kill();
      // Nor by its id, which every node would mount: another team's id is a 404.
      await assert.rejects(
        Sandbox.create({ ...sdk, apiKey: other, volumeMounts: { "/data": vol.volumeId } }),
        /Volume 'vol-[0-9a-f]{20}' not found/,
      );
      const byIdNative = await fetch(`${gw.url}/acquireSandbox`, {
        method: "POST",
        headers: { authorization: `Bearer ${other}` },
        body: JSON.stringify({
          name: "thief",
          spec: { volumes: [{ name: vol.volumeId, mountPath: "/data" }] },
        }),
      });
      assert.equal(byIdNative.status, 404);
      assert.match((await byIdNative.json()).message, /not found/);
      // The native verb mounts the team's volume by name, on its node.
      const native = await fetch(`${gw.url}/acquireSandbox`, {
        method: "POST",
        headers: { authorization: `Bearer ${acme}` },
        body: JSON.stringify({
          name: "native-mount",
          template: "base",
          spec: { volumes: [{ name: "data", mountPath: "/data" }] },
        }),
      });
      const made = await native.json();
      assert.equal(native.status, 200, JSON.stringify(made));
      assert.equal(made.sandbox.nodeId, home);
      mounted.push(await Sandbox.connect(made.sandbox.id, sdk));
    });

    await t.step("destroy while mounted is a 409 naming the sandboxes", async () => {
      await assert.rejects(
        Volume.destroy(vol.volumeId, opts),
        (e: Error) => {
          assert.match(e.message, /mounted by sandbox/);
          for (const s of mounted) assert.ok(e.message.includes(s.sandboxId), e.message);
          return true;
        },
      );
      const moved = await gw.json("moveVolume", {
        volumeId: vol.volumeId,
        toNode: home === "node-a" ? "node-b" : "node-a",
      });
      assert.equal(moved.status, 409);
      assert.match(moved.body.message, /mounted by sandbox/);
      for (const s of mounted) await s.kill();
    });

    await t.step(
      "the volume's node killed during a write: the old file stays, nothing half-written shows",
      async () => {
        let controller!: ReadableStreamDefaultController<Uint8Array>;
        const { promise: reading, resolve } = Promise.withResolvers<void>();
        const body = new ReadableStream<Uint8Array>({
          start: (c) => void (controller = c),
          pull: () => resolve(),
        }, { highWaterMark: 0 });
        const put = fetch(
          `${gw.url}/e2b/api/volumecontent/${vol.volumeId}/file?path=/notes/hello.txt`,
          {
            method: "PUT",
            headers: { authorization: `Bearer ${vol.token}` },
            body,
            duplex: "half",
          } as RequestInit,
        ).catch((e) => e);
        await reading;
        controller.enqueue(new Uint8Array(100_000).fill(120));
        // Until the node has the bytes on its side of the volume.
        const uploads = join(dirs[home as "node-a"], "volumes", vol.volumeId, "uploads");
        await until("the body arriving on the node", async () => {
          for await (const e of Deno.readDir(uploads)) {
            if ((await Deno.stat(join(uploads, e.name))).size > 0) return true;
          }
          return false;
        });
        Deno.kill(nodes[home].process.child.pid, "SIGKILL");
        await nodes[home].process.exited;
        controller.error(new Error("client gone"));
        await put;
        nodes[home] = await start(home as "node-a");
        await until(
          `${home} up`,
          async () => (await nodesOf(gw)).find((n) => n.id === home)?.state === "up",
        );
        assert.equal(await vol.readFile("/notes/hello.txt", opts), "hello volume\n");
        const names = (await vol.list("/notes", opts)).map((e) => e.name);
        assert.deepEqual(names, ["hello.txt"]);
        // The node's side holds nothing of the killed write (the reads above pass through it).
        assert.deepEqual(
          [...Deno.readDirSync(uploads)],
          [],
          "the start swept the half-written body",
        );
      },
    );

    await t.step("the volume's node down: its content and mounts are a 503 naming it", async () => {
      await nodes[home].stop();
      await until(
        `${home} down`,
        async () => (await nodesOf(gw)).find((n) => n.id === home)?.state === "down",
      );
      const res = await content("file", "/notes/hello.txt");
      const body = await res.json();
      assert.equal(res.status, 503);
      assert.match(body.message, new RegExp(`node '${home}', which is down`));
      await assert.rejects(
        Sandbox.create({ ...sdk, volumeMounts: { "/data": vol } }),
        new RegExp(home),
      );
      nodes[home] = await start(home as "node-a");
      await until(
        `${home} up`,
        async () => (await nodesOf(gw)).find((n) => n.id === home)?.state === "up",
      );
      assert.equal(await vol.readFile("/notes/hello.txt", opts), "hello volume\n");
    });

    await t.step(
      "a move whose target dies mid-copy leaves the volume whole where it was",
      async () => {
        const to = home === "node-a" ? "node-b" : "node-a";
        await vol.writeFile("/mid.bin", new Uint8Array(4_000_000).fill(7).buffer, opts);
        // The target takes the connection but reads nothing, so the copy is in flight when it dies.
        Deno.kill(nodes[to].process.child.pid, "SIGSTOP");
        const moving = gw.json("moveVolume", { volumeId: vol.volumeId, toNode: to });
        await until("the move in flight", async () => {
          const res = await content("file", "/notes/hello.txt");
          await res.body?.cancel();
          return res.status === 409;
        });
        Deno.kill(nodes[to].process.child.pid, "SIGKILL");
        await nodes[to].process.exited;
        const failed = await moving;
        assert.equal(failed.status, 502, JSON.stringify(failed.body));
        assert.match(failed.body.message, new RegExp(`the volume stays on '${home}'`));
        assert.equal(await vol.readFile("/notes/hello.txt", opts), "hello volume\n");
        assert.equal(
          (await vol.readFile("/mid.bin", { ...opts, format: "bytes" })).length,
          4_000_000,
        );
        nodes[to] = await start(to as "node-a");
        await until(
          `${to} up`,
          async () => (await nodesOf(gw)).find((n) => n.id === to)?.state === "up",
        );
        assert.ok(
          !(await nodesOf(gw)).find((n) => n.id === to)!.volumes.includes(vol.volumeId),
          "the half-copied volume is not advertised by the target",
        );
        await vol.remove("/mid.bin", opts);
      },
    );

    await t.step("moveVolume copies the volume to another node with its data", async () => {
      const to = home === "node-a" ? "node-b" : "node-a";
      await vol.writeFile(
        "/big.bin",
        new Uint8Array(3_000_000).map((_, i) => i % 251).buffer,
        opts,
      );
      const key = await gw.call("moveVolume", { volumeId: vol.volumeId, toNode: to }, {
        headers: { authorization: `Bearer ${acme}`, "content-type": "application/json" },
      });
      assert.equal(key.status, 403, "a client key may not move volumes");
      await key.body?.cancel();
      // A link inside the volume: Deno makes links only under unscoped permissions, so a node
      // granted its data dir alone refuses the copy, and the volume stays where it is.
      const data = join(dirs[home as "node-a"], "volumes", vol.volumeId, "data");
      await Deno.symlink("notes/hello.txt", join(data, "link"));
      const refused = await gw.json("moveVolume", { volumeId: vol.volumeId, toNode: to });
      assert.equal(refused.status, 409, JSON.stringify(refused.body));
      assert.match(refused.body.message, /symbolic link\(s\) \('\/link'\)/);
      assert.equal(await vol.readFile("/link", opts), "hello volume\n");
      await vol.remove("/link", opts);
      // A sparse file five times the 1 GB cap, a few bytes written: it moves, and stays sparse.
      {
        using f = await Deno.open(join(data, "disk.img"), { write: true, create: true });
        await f.truncate(5e9);
        await f.seek(4096, Deno.SeekMode.Start);
        await f.write(new TextEncoder().encode("sparse"));
      }
      const moved = await gw.json("moveVolume", { volumeId: vol.volumeId, toNode: to });
      assert.equal(moved.status, 200, JSON.stringify(moved.body));
      assert.deepEqual([moved.body.from, moved.body.to], [home, to]);
      assert.equal(await vol.readFile("/notes/hello.txt", opts), "hello volume\n");
      const big = await vol.readFile("/big.bin", { ...opts, format: "bytes" });
      assert.equal(big.length, 3_000_000);
      assert.equal(big[1000], 1000 % 251);
      const disk = join(dirs[to as "node-a"], "volumes", vol.volumeId, "data", "disk.img");
      const sparse = await Deno.stat(disk);
      assert.equal(sparse.size, 5e9);
      assert.ok(sparse.blocks! * 512 < 1e6, "the moved file is sparse");
      {
        using f = await Deno.open(disk, { read: true });
        await f.seek(4096, Deno.SeekMode.Start);
        const b = new Uint8Array(6);
        await f.read(b);
        assert.equal(new TextDecoder().decode(b), "sparse");
      }
      assert.equal(
        await Deno.stat(join(dirs[home as "node-a"], "volumes", vol.volumeId)).catch(() => null),
        null,
        "the old copy is gone",
      );
      const s = await Sandbox.create({ ...sdk, volumeMounts: { "/data": vol } });
      assert.equal(await holderOf(nodes, token, s.sandboxId), to);
      await s.kill();
      await until(
        `${to} advertising the volume`,
        async () => (await nodesOf(gw)).find((n) => n.id === to)!.volumes.includes(vol.volumeId),
      );
      home = to;
    });

    await t.step("destroy once nothing mounts it", async () => {
      assert.equal(await Volume.destroy(vol.volumeId, opts), true);
      assert.equal(await Volume.destroy(vol.volumeId, opts), false);
      await assert.rejects(Volume.getInfo(vol.volumeId, opts), VolumeNotFoundError);
      const res = await content("file", "/notes/hello.txt");
      assert.equal(res.status, 404);
      await res.body?.cancel();
    });
  } finally {
    await Promise.allSettled([gw?.stop(), ...Object.values(nodes).map((n) => n.stop())]);
    for (const dir of Object.values(dirs)) await Deno.remove(dir, { recursive: true });
  }
});

Deno.test({
  name: "volumes on a shared root: every node serves every volume, none is funnelled or moved",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const token = newToken();
  const gwPort = freePort();
  const root = await Deno.makeTempDir({ prefix: "dormice-vol-shared-" });
  const nodes: NodeProcess[] = [];
  let gw!: GatewayProcess;
  try {
    gw = await startGateway({
      token,
      port: gwPort,
      env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" },
    });
    for (const id of ["node-a", "node-b"]) {
      nodes.push(
        await startNode({
          token,
          env: {
            DORMICE_GATEWAY_ENDPOINT: `http://127.0.0.1:${gwPort}`,
            DORMICE_NODE_ID: id,
            DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
            DORMICE_VOLUME_ROOT: root,
          },
          permissions: (dataDir) => [
            ...nodePermissions(dataDir).filter((p) => !/^--allow-(read|write)=/.test(p)),
            `--allow-read=${dataDir},${root}`,
            `--allow-write=${dataDir},${root}`,
          ],
        }),
      );
    }
    const opts = { apiUrl: `${gw.url}/e2b/api`, apiKey: token };
    await until(
      "both nodes up",
      async () =>
        (await nodesOf(gw)).filter((n) => n.state === "up" && n.reading !== null).length === 2,
    );
    const vol = await Volume.create("shared", opts);
    await vol.writeFile("/a.txt", "from the root", opts);
    await until(
      "both nodes advertising the volume",
      async () => (await nodesOf(gw)).every((n) => n.volumes.includes(vol.volumeId)),
    );
    const moved = await gw.json("moveVolume", { volumeId: vol.volumeId, toNode: "node-b" });
    assert.equal(moved.status, 409);
    assert.match(moved.body.message, /shared volume root/);
    // Creates mounting it go to either node (placement by load, not by volume).
    const sdk = { ...opts, sandboxUrl: `${gw.url}/e2b/envd` };
    const placed = new Set<string>();
    const made: Sandbox[] = [];
    for (let i = 0; i < 6; i++) {
      const s = await Sandbox.create({ ...sdk, volumeMounts: { "/data": vol } });
      made.push(s);
      for (const [i2, n] of nodes.entries()) {
        const r = await fetch(`${n.url}/lookupSandbox`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}` },
          body: JSON.stringify({ id: s.sandboxId }),
        });
        if ((await r.json()).found) placed.add(String(i2));
      }
    }
    assert.equal(placed.size, 2, "both nodes took creates that mount the volume");
    // Deleting asks every node: sandboxes on both are named.
    await assert.rejects(Volume.destroy(vol.volumeId, opts), /mounted by sandbox/);
    for (const s of made) await s.kill();
    // Either node down, the other serves the volume.
    const creator = (await nodesOf(gw)).find((n) => n.state === "up")!;
    await nodes[0].stop();
    await until(
      "node-a down",
      async () => (await nodesOf(gw)).find((n) => n.id === "node-a")?.state === "down",
    );
    assert.equal(await vol.readFile("/a.txt", opts), "from the root");
    assert.ok(creator);
    assert.equal(await Volume.destroy(vol.volumeId, opts), true);
  } finally {
    await Promise.allSettled([gw?.stop(), ...nodes.map((n) => n.stop())]);
    await Deno.remove(root, { recursive: true });
  }
});
