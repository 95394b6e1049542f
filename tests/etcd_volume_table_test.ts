/**
 * The shared-mode volume table against a real etcd, through two gateways' clients: a name is
 * taken once, a volume is claimed by one move or delete at a time, and a gateway that stops in
 * the middle of a create, move or delete leaves nothing held once its lease ends. Skipped,
 * saying why, when etcd is not installed.
 */
import assert from "node:assert/strict";
import { EtcdClient } from "../gateway/etcd/client.ts";
import { EtcdSession } from "../gateway/etcd/session.ts";
import { EtcdVolumeTable } from "../gateway/volumes/etcd_table.ts";
import type { HttpError } from "../shared/http_error.ts";
import { etcdMissing, startEtcd } from "./support/etcd.ts";

const missing = etcdMissing();
const skip = missing === null ? "" : ` (skipped: ${missing})`;

/**
 * A fresh etcd and the volume table as two gateways see it (tables `a` and `b`, each on its own
 * client and lease session, under one random prefix); `stop()` ends both sessions and etcd.
 */
async function twoGateways() {
  const etcd = await startEtcd(1);
  const prefix = `/t-${crypto.randomUUID().slice(0, 8)}/`;
  const clients = [0, 1].map(() => new EtcdClient({ endpoints: etcd.endpoints.split(",") }));
  const sessions = clients.map((client) => new EtcdSession({ client, ttlSeconds: 10 }));
  const [a, b] = clients.map((client, i) =>
    new EtcdVolumeTable({ client, session: sessions[i], prefix })
  );
  return {
    clients,
    sessions,
    a,
    b,
    async stop() {
      await Promise.all(sessions.map((s) => s.close().catch(() => {})));
      await etcd.stop();
    },
  };
}

Deno.test({
  name:
    `EtcdVolumeTable: names and claims hold across gateways, and a stopped gateway's steps end with its lease${skip}`,
  ignore: missing !== null,
  async fn() {
    const gateways = await twoGateways();
    const { sessions, a, b } = gateways;
    try {
      const ids = ["vol-0000000000000000000a", "vol-0000000000000000000b"];
      const reserved = await Promise.allSettled(
        [a, b].map((t, i) => t.reserve({ id: ids[i], team: "acme", name: "data", node: "n1" })),
      );
      assert.equal(reserved.filter((r) => r.status === "fulfilled").length, 1);
      const lost = reserved.find((r) => r.status === "rejected") as PromiseRejectedResult;
      assert.equal((lost.reason as HttpError).status, 409);
      const id = ids[reserved.findIndex((r) => r.status === "fulfilled")];
      assert.equal((await b.get(id))?.state, "creating");
      await a.update(id, { state: "ready", sizeBytes: 5 });
      assert.deepEqual(
        (await b.byName("acme", "data"))?.state,
        "ready",
      );
      assert.equal(await b.get(id, "other"), undefined, "another team's is absent");

      // One move or delete at a time, whichever gateway asks.
      const claims = await Promise.all([a.claim(id, "moving"), b.claim(id, "deleting")]);
      assert.deepEqual(claims.filter(Boolean).length, 1);
      const held = (await a.get(id))!.state;
      assert.ok(held === "moving" || held === "deleting", held);
      await (claims[0] ? a : b).release((claims[0] ?? claims[1])!, { node: "n2" });
      assert.deepEqual([(await b.get(id))?.state, (await b.get(id))?.node], ["ready", "n2"]);

      // Gateway B stops mid-move and mid-create: its lease ends, and both are undone.
      assert.ok(await b.claim(id, "moving"));
      await b.reserve({ id: ids[1 - ids.indexOf(id)], team: "acme", name: "half", node: "n1" });
      await sessions[1].close();
      assert.equal((await a.get(id))?.state, "ready", "the move's claim went with B's lease");
      assert.equal(await a.byName("acme", "half"), undefined, "the half-made create went too");
      assert.deepEqual((await a.list("acme")).map((r) => r.name), ["data"]);
      // A ready volume outlives the gateway that made it; a delete frees its name.
      await a.delete(id);
      assert.deepEqual(await a.list(), []);
      await a.reserve({ id, team: "acme", name: "data", node: "n1" });
    } finally {
      await gateways.stop();
    }
  },
});

Deno.test({
  name:
    `EtcdVolumeTable: a create mounting a volume through one gateway and a delete through another never both go ahead${skip}`,
  ignore: missing !== null,
  async fn() {
    const gateways = await twoGateways();
    const { sessions, a, b } = gateways;
    try {
      const id = "vol-0000000000000000000c";
      await a.reserve({ id, team: "acme", name: "data", node: "n1" });
      await a.update(id, { state: "ready" });
      // A's create is in flight: B sees it, and B's claim fails.
      const release = await a.mountStart(id);
      assert.ok(release);
      assert.equal(await b.mountsInFlight(id), 1);
      assert.equal(await b.claim(id, "deleting"), undefined);
      await release();
      assert.equal(await b.mountsInFlight(id), 0);
      // B's delete claimed it: A's next create may not mark it.
      const deleting = await b.claim(id, "deleting");
      assert.ok(deleting);
      assert.equal(await a.mountStart(id), undefined);
      // A gateway that stops with a create in flight frees the volume with its lease.
      await b.release(deleting);
      assert.ok(await b.mountStart(id));
      await sessions[1].close();
      assert.equal(await a.mountsInFlight(id), 0);
      assert.ok(await a.claim(id, "moving"));
    } finally {
      await gateways.stop();
    }
  },
});

Deno.test({
  name:
    `EtcdVolumeTable: a gateway whose lease lapsed mid-step cannot release, write back or delete over the gateway that took the volume over${skip}`,
  ignore: missing !== null,
  async fn() {
    const gateways = await twoGateways();
    const { clients, sessions, a, b } = gateways;
    try {
      const id = "vol-0000000000000000000d";
      await a.reserve({ id, team: "acme", name: "data", node: "n1" });
      await a.update(id, { state: "ready", sizeBytes: 5 });

      // A claims for a move; its lease lapses mid-copy (revoked here, as a partition or a long
      // pause past the TTL would end it); B claims the volume for a delete.
      const moving = await a.claim(id, "moving");
      assert.ok(moving);
      assert.equal(
        await b.claim(id, "deleting"),
        undefined,
        "A's claim holds while its lease does",
      );
      await clients[0].revoke(await sessions[0].lease());
      assert.equal((await b.get(id))?.state, "ready", "A's claim went with its lease");
      const deleting = await b.claim(id, "deleting");
      assert.ok(deleting, "B takes the volume over");

      // A's late write-back of the new node, its plain release and a delete under its claim are
      // each refused with a 409 naming the takeover.
      for (
        const late of [
          () => a.release(moving, { node: "n2" }),
          () => a.release(moving),
          () => a.remove(moving),
        ]
      ) {
        await assert.rejects(late, (error: HttpError) => {
          assert.equal(error.status, 409);
          assert.match(error.message, /Another gateway took over volume 'vol-0+d'/);
          return true;
        });
      }
      // B's claim and the row are intact.
      const row = await b.get(id);
      assert.deepEqual([row?.state, row?.node, row?.sizeBytes], ["deleting", "n1", 5]);
      assert.equal((await b.byName("acme", "data"))?.id, id);

      // B's own delete goes through; a stale claim of B's, after it, is refused too.
      await b.remove(deleting);
      assert.equal(await a.get(id), undefined);
      assert.equal(await a.byName("acme", "data"), undefined);
      await assert.rejects(() => b.release(deleting), (e: HttpError) => e.status === 409);

      // A write-back from a row read before another claim changed it is refused as well.
      await b.reserve({ id, team: "acme", name: "data", node: "n1" });
      await b.update(id, { state: "ready" });
      const first = await b.claim(id, "moving");
      assert.ok(first);
      await b.release(first, { node: "n2" });
      const second = await b.claim(id, "moving");
      assert.ok(second);
      await assert.rejects(
        () => b.release(first, { node: "n3" }),
        (e: HttpError) => e.status === 409,
      );
      await b.release(second);
      assert.deepEqual([(await a.get(id))?.state, (await a.get(id))?.node], ["ready", "n2"]);
    } finally {
      await gateways.stop();
    }
  },
});
