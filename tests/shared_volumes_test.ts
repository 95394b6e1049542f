/**
 * Shared mode, black box: managed volumes across two gateways on one etcd, with the official
 * `e2b` SDK. A volume created through gateway A is listed, written, mounted and deleted through
 * gateway B; a move started on A is seen as a move on B (its content and mounts a 409 there); a
 * leaked content token stops working on both once the volume is gone. Two nodes on the fake
 * executor check in with both gateways. Skipped, saying why, when etcd is not installed.
 */
import assert from "node:assert/strict";
import { Sandbox, Volume } from "e2b";
import { etcdMissing, startEtcd } from "./support/etcd.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { newToken, type NodeProcess, startNode } from "./_processes.ts";

const missing = etcdMissing();
const skip = missing === null ? "" : ` (skipped: ${missing})`;

async function until(what: string, check: () => Promise<boolean>, ms = 15_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

type NodeRow = { id: string; state: string; reading: unknown; volumes: string[] };

async function nodesOf(gw: GatewayProcess): Promise<NodeRow[]> {
  return (await gw.json("listNodes")).body.nodes;
}

Deno.test({
  name: `shared mode: a volume made through one gateway is served by another${skip}`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const etcd = await startEtcd(1);
  const token = newToken();
  const env = {
    DORMICE_GATEWAY_ETCD: etcd.endpoints,
    DORMICE_GATEWAY_ETCD_PREFIX: `/t-${crypto.randomUUID().slice(0, 8)}/`,
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
    // A node stopped on purpose below stays up meanwhile (its requests wait, as in flight).
    DORMICE_GATEWAY_NODE_DEAD_AFTER_S: "120",
  };
  const started: { stop(): Promise<unknown> }[] = [];
  try {
    const [a, b] = await Promise.all([0, 1].map(() => startGateway({ token, env })));
    started.push(a, b);
    const nodes: Record<string, NodeProcess> = {};
    for (const id of ["node-a", "node-b"]) {
      nodes[id] = await startNode({
        token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: `${a.url},${b.url}`,
          DORMICE_NODE_ID: id,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
          DORMICE_VOLUME_SIZE_GB: "1",
        },
      });
      started.push(nodes[id]);
    }
    for (const gw of [a, b]) {
      await until(
        `${gw.url} sees both nodes up`,
        async () =>
          (await nodesOf(gw)).filter((n) => n.state === "up" && n.reading !== null).length === 2,
      );
    }
    const minted = await a.json("createApiKey", { team: "acme" });
    const key = minted.body.key as string;
    const other = (await a.json("createApiKey", { team: "other" })).body.key as string;
    const optsOf = (gw: GatewayProcess, apiKey = key) => ({ apiUrl: `${gw.url}/e2b/api`, apiKey });
    await until("gateway B knows the keys", async () => {
      await Volume.list(optsOf(b, other));
      await Volume.list(optsOf(b));
      return true;
    });
    let vol!: Volume;
    let home!: string;

    await t.step("created through A: listed, read, written and mounted through B", async () => {
      vol = await Volume.create("data", optsOf(a));
      await vol.writeFile("/hello.txt", "from A\n", optsOf(a));
      assert.deepEqual((await Volume.list(optsOf(b))).map((v) => v.volumeId), [vol.volumeId]);
      const info = await Volume.getInfo(vol.volumeId, optsOf(b));
      assert.equal(info.name, "data");
      assert.equal(info.token, vol.token, "both gateways hand out the same content token");
      assert.equal(await vol.readFile("/hello.txt", optsOf(b)), "from A\n");
      await vol.writeFile("/b.txt", "from B\n", optsOf(b));
      assert.equal(await vol.readFile("/b.txt", optsOf(a)), "from B\n");
      // Names are unique per team across the gateways.
      await assert.rejects(Volume.create("data", optsOf(b)), /already has a volume named 'data'/);
      // Another team sees none of it through either gateway.
      assert.deepEqual(await Volume.list(optsOf(b, other)), []);
      await until(
        "a node advertising the volume",
        async () => (await nodesOf(b)).some((n) => n.volumes.includes(vol.volumeId)),
      );
      home = (await nodesOf(b)).find((n) => n.volumes.includes(vol.volumeId))!.id;
      const s = await Sandbox.create({
        ...optsOf(b),
        sandboxUrl: `${b.url}/e2b/envd`,
        volumeMounts: { "/data": vol },
      });
      await s.kill();
    });

    await t.step(
      "a create mounting it in flight through B makes a delete through A a 409",
      async () => {
        // The volume's node is stopped, so B's create waits at it, in flight.
        const pid = nodes[home].process.child.pid;
        Deno.kill(pid, "SIGSTOP");
        let creating: Promise<unknown>;
        try {
          creating = Sandbox.create({
            ...optsOf(b),
            sandboxUrl: `${b.url}/e2b/envd`,
            volumeMounts: { "/data": vol },
          }).then((s) => s.kill(), (e) => e);
          // Until B's create is in flight (its mark is in etcd, read over etcd's HTTP API).
          const mounting = `${env.DORMICE_GATEWAY_ETCD_PREFIX}volumes/mounting/${vol.volumeId}/`;
          await until("B's create in flight", async () => {
            const res = await fetch(`${etcd.endpoints.split(",")[0]}/v3/kv/range`, {
              method: "POST",
              body: JSON.stringify({
                key: btoa(mounting),
                range_end: btoa(mounting.slice(0, -1) + "0"),
                count_only: true,
              }),
            });
            return Number((await res.json()).count ?? 0) === 1;
          });
          const res = await fetch(`${a.url}/e2b/api/volumes/${vol.volumeId}`, {
            method: "DELETE",
            headers: { "x-api-key": key },
          });
          const text = await res.text();
          assert.equal(res.status, 409, text);
          assert.match(text, /1 sandbox create\(s\) mounting it are in flight/);
        } finally {
          Deno.kill(pid, "SIGCONT");
        }
        await creating;
        assert.ok(await Volume.getInfo(vol.volumeId, optsOf(a)), "the volume is still there");
      },
    );

    await t.step("a move started on A is a move on B until it ends", async () => {
      const to = home === "node-a" ? "node-b" : "node-a";
      // The target is stopped, so the copy hangs at it while B is asked.
      const pid = nodes[to].process.child.pid;
      Deno.kill(pid, "SIGSTOP");
      let moving: Promise<{ status: number; body: Record<string, unknown> }>;
      try {
        moving = a.json("moveVolume", { volumeId: vol.volumeId, toNode: to });
        await until("B refusing the content of a moving volume", async () => {
          const res = await fetch(
            `${b.url}/e2b/api/volumecontent/${vol.volumeId}/file?path=/hello.txt`,
            { headers: { authorization: `Bearer ${vol.token}` } },
          );
          const text = await res.text();
          return res.status === 409 && /being moved to another node/.test(text);
        });
        await assert.rejects(
          Sandbox.create({
            ...optsOf(b),
            sandboxUrl: `${b.url}/e2b/envd`,
            volumeMounts: { "/data": vol },
          }),
          /being moved to another node/,
        );
        // A delete through B is refused too: the move holds the volume.
        await assert.rejects(Volume.destroy(vol.volumeId, optsOf(b)), /being moved/);
      } finally {
        Deno.kill(pid, "SIGCONT");
      }
      const moved = await moving;
      assert.equal(moved.status, 200, JSON.stringify(moved.body));
      assert.equal(moved.body.to, to);
      assert.equal(await vol.readFile("/hello.txt", optsOf(b)), "from A\n");
      home = to;
    });

    await t.step("deleted through B: gone on A, and its content token stops working", async () => {
      assert.equal(await Volume.destroy(vol.volumeId, optsOf(b)), true);
      assert.equal(await Volume.destroy(vol.volumeId, optsOf(a)), false);
      assert.deepEqual(await Volume.list(optsOf(a)), []);
      for (const gw of [a, b]) {
        const res = await fetch(
          `${gw.url}/e2b/api/volumecontent/${vol.volumeId}/file?path=/hello.txt`,
          { headers: { authorization: `Bearer ${vol.token}` } },
        );
        assert.equal(res.status, 404, await res.text());
      }
      // The name is free again, through either gateway.
      const again = await Volume.create("data", optsOf(a));
      assert.notEqual(again.volumeId, vol.volumeId);
    });
  } finally {
    for (const p of started.reverse()) await p.stop().catch(() => {});
    await etcd.stop();
  }
});
