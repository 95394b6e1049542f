/**
 * The volume exam on Docker: the official `e2b` SDK, unmodified, against a gateway in front of
 * two nodes on the Docker executor. A volume is created, written through the content API,
 * mounted in two sandboxes one after the other (the second sees the first's writes), listed,
 * refused deletion while mounted, invisible to another team, served again after its node
 * restarts, kept inside itself against a link made from inside a sandbox, and moved between the
 * nodes with its data intact.
 *
 * Needs an engine and the images (`.ci/docker.sh`): with `CI=true` it never skips; off CI it
 * skips with a printed reason.
 */
import assert from "node:assert/strict";
import { Sandbox, Volume, VolumeNotFoundError } from "e2b";
import { startGateway } from "./_gateway.ts";
import { freePort } from "./_processes.ts";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  unmountBelow,
  until,
} from "./_docker.ts";

const gate = await dockerGate("docker volume exam");

Deno.test({
  name: "volume exam on Docker: content API, two mounts in turn, isolation, restart, escape, move",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const suffix = crypto.randomUUID().slice(0, 6);
  const ids = [`dkvol-a-${suffix}`, `dkvol-b-${suffix}`];
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const dirs = await Promise.all(ids.map(() => Deno.makeTempDir({ prefix: "dormice-dkvol-" })));
  const ports = ids.map(() => freePort());
  const nodes: DockerNodeProcess[] = [];
  const start = (i: number) =>
    startDockerNode({
      token: gw.token,
      gatewayUrl: gw.url,
      nodeId: ids[i],
      dataDir: dirs[i],
      port: ports[i],
      env: { DORMICE_VOLUME_SIZE_GB: "1" },
    });
  const nodesAt = async () =>
    (await gw.json("listNodes")).body.nodes as { id: string; state: string; volumes: string[] }[];
  try {
    nodes.push(...await Promise.all([start(0), start(1)]));
    await until(
      "both docker nodes up",
      async () =>
        (await nodesAt()).filter((n) => ids.includes(n.id) && n.state === "up").length === 2,
    );
    const acme = (await gw.json("createApiKey", { team: "acme" })).body.key as string;
    const other = (await gw.json("createApiKey", { team: "other" })).body.key as string;
    const api = { apiUrl: `${gw.url}/e2b/api`, apiKey: acme };
    const sdk = { ...api, sandboxUrl: `${gw.url}/e2b/envd`, template: "minimal" };
    let vol!: Volume;
    let home = -1;

    await t.step("create a volume and write a file through the content API", async () => {
      vol = await Volume.create("work", api);
      await vol.writeFile("/seed/hello.txt", "written by the content API\n", {
        ...api,
        force: true,
      });
      await until(
        "a node advertising the volume",
        async () => (await nodesAt()).some((n) => n.volumes.includes(vol.volumeId)),
      );
      home = ids.indexOf((await nodesAt()).find((n) => n.volumes.includes(vol.volumeId))!.id);
      assert.ok(home >= 0);
    });

    await t.step(
      "two sandboxes mount it one after the other; the second sees the first's writes",
      async () => {
        const first = await Sandbox.create("minimal", { ...sdk, volumeMounts: { "/data": vol } });
        try {
          const seen = await first.commands.run("cat /data/seed/hello.txt", { user: "root" });
          assert.equal(seen.stdout, "written by the content API\n");
          // As the SDK's default user, into a directory the content API made (world-writable).
          const who = await first.commands.run(
            "echo from the first sandbox > /data/seed/first.txt && id -u",
          );
          await first.commands.run("cp /data/seed/first.txt /data/first.txt");
          // The SDK's own mount test: envd's file write into the mount, read by the next one.
          await first.files.write("/data/sdk.txt", "written by the writer");
          assert.match(who.stdout, /^\d+\n$/);
          // A link out of the volume, made from inside: the content API must not follow it.
          await first.commands.run("ln -s / /data/escape && ln -s /etc/passwd /data/pw", {
            user: "root",
          });
          await assert.rejects(
            Volume.destroy(vol.volumeId, api),
            (e: Error) =>
              e.message.includes(first.sandboxId) && /mounted by sandbox/.test(e.message),
          );
        } finally {
          await first.kill();
        }
        const second = await Sandbox.create("minimal", { ...sdk, volumeMounts: { "/data": vol } });
        try {
          const seen = await second.commands.run("cat /data/first.txt", { user: "root" });
          assert.equal(seen.stdout, "from the first sandbox\n");
          assert.equal(await second.files.read("/data/sdk.txt"), "written by the writer");
        } finally {
          await second.kill();
        }
        assert.equal(await vol.readFile("/first.txt", api), "from the first sandbox\n");
      },
    );

    await t.step("a link made inside a sandbox does not lead the content API out", async () => {
      for (const path of ["/escape/etc/passwd", "/pw", "/escape/etc/hostname"]) {
        const res = await fetch(
          `${gw.url}/e2b/api/volumecontent/${vol.volumeId}/file?path=${encodeURIComponent(path)}`,
          { headers: { authorization: `Bearer ${vol.token}` } },
        );
        const text = await res.text();
        assert.equal(res.status, 403, `${path}: ${text}`);
        assert.doesNotMatch(text, /root:x:0/);
      }
      await vol.remove("/escape", api);
      await vol.remove("/pw", api);
    });

    await t.step("list and getInfo; another team sees none of it", async () => {
      assert.deepEqual((await Volume.list(api)).map((v) => v.name), ["work"]);
      assert.equal((await Volume.getInfo(vol.volumeId, api)).name, "work");
      const theirs = { apiUrl: `${gw.url}/e2b/api`, apiKey: other };
      assert.deepEqual(await Volume.list(theirs), []);
      await assert.rejects(Volume.getInfo(vol.volumeId, theirs), VolumeNotFoundError);
      assert.equal(await Volume.destroy(vol.volumeId, theirs), false);
    });

    await t.step("the content API after the volume's node restarts", async () => {
      await nodes[home].stop();
      nodes[home] = await start(home);
      await until(
        "the node up again",
        async () => (await nodesAt()).find((n) => n.id === ids[home])?.state === "up",
      );
      assert.equal(await vol.readFile("/seed/hello.txt", api), "written by the content API\n");
    });

    await t.step("move between the two nodes with the data intact", async () => {
      const to = 1 - home;
      const moved = await gw.json("moveVolume", { volumeId: vol.volumeId, toNode: ids[to] });
      assert.equal(moved.status, 200, JSON.stringify(moved.body));
      // Where the kernel keeps caps (a root node with loop devices), the volume moved as an image.
      const image = (i: number) => `${dirs[i]}/volumes/.images/${vol.volumeId}.ext4`;
      const caps = (await (await fetch(`${nodes[to].url}/healthz`)).json()).volumeCaps;
      if (caps.enforcedBy === "kernel") {
        assert.ok((await Deno.stat(image(to))).isFile, "the moved volume is an image");
        await assert.rejects(Deno.stat(image(home)), Deno.errors.NotFound);
      } else console.log(`volume caps checked by the content API only: ${caps.why}`);
      assert.equal(await vol.readFile("/first.txt", api), "from the first sandbox\n");
      const s = await Sandbox.create("minimal", { ...sdk, volumeMounts: { "/data": vol } });
      try {
        const seen = await s.commands.run("cat /data/seed/hello.txt /data/first.txt", {
          user: "root",
        });
        assert.equal(seen.stdout, "written by the content API\nfrom the first sandbox\n");
      } finally {
        await s.kill();
      }
      assert.equal(await Volume.destroy(vol.volumeId, api), true);
    });
  } finally {
    await Promise.allSettled([gw.stop(), ...nodes.map((n) => n.stop())]);
    await removeContainersOf(ids);
    for (const dir of dirs) {
      await unmountBelow(dir);
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  }
});
