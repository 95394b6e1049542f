/**
 * The shared-mode pieces of team limits and slot fencing against a real etcd: the team ledger's
 * check-and-write transaction, and a slot hold's token and check. Skipped, saying why, when etcd
 * is not installed; never under CI.
 */
import assert from "node:assert/strict";
import { EtcdClient } from "../gateway/etcd/client.ts";
import { EtcdSession } from "../gateway/etcd/session.ts";
import { EtcdSlots, type SlotHold } from "../gateway/routing/slots.ts";
import { EtcdTeamLedger } from "../gateway/keys/team_ledger.ts";
import { systemClock } from "../shared/clock.ts";
import { HttpError } from "../shared/http_error.ts";
import { etcdMissing, startEtcd } from "./support/etcd.ts";

const missing = etcdMissing();
const skip = missing === null ? "" : ` (skipped: ${missing})`;

Deno.test({
  name:
    `EtcdTeamLedger: concurrent admissions through two gateways never pass a count both read${skip}`,
  ignore: missing !== null,
  async fn() {
    const etcd = await startEtcd(1);
    const prefix = `/t-${crypto.randomUUID().slice(0, 8)}/`;
    const clients = [0, 1].map(() => new EtcdClient({ endpoints: etcd.endpoints.split(",") }));
    const sessions = clients.map((client) => new EtcdSession({ client, ttlSeconds: 10 }));
    const ledgers = clients.map((client, i) =>
      new EtcdTeamLedger({ client, session: sessions[i], prefix, clock: systemClock })
    );
    try {
      // At most 3 records for the team; 12 admissions at once, alternating between the two.
      const decide = (records: unknown[]) => {
        if (records.length >= 3) throw new HttpError(429, "full");
        return { drop: [] };
      };
      const results = await Promise.allSettled(
        Array.from({ length: 12 }, (_, i) => ledgers[i % 2].admit("acme", undefined, decide)),
      );
      assert.equal(results.filter((r) => r.status === "fulfilled").length, 3);
      for (const r of results) {
        if (r.status === "rejected") assert.equal((r.reason as HttpError).status, 429);
      }
      assert.equal((await clients[0].range(`${prefix}teams/acme/`)).length, 3);
      // A cancel frees the place; placed records say where.
      const entries = results.flatMap((r) => r.status === "fulfilled" ? [r.value] : []);
      await entries[0].cancel();
      await entries[1].placed("node-1", 7);
      const kept = await clients[0].range(`${prefix}teams/acme/`);
      assert.equal(kept.length, 2);
      assert.ok(kept.some((kv) => JSON.parse(kv.value).node === "node-1"));
      // Dropped keys go in the admitting transaction; the bucket is written with it.
      const entry = await ledgers[1].admit("acme", { keyId: "key_1", perMinute: 5 }, (rs) => ({
        drop: rs.map((r) => r.key),
        bucket: { tokens: 4, at: 1 },
      }));
      assert.equal((await clients[0].range(`${prefix}teams/acme/`)).length, 1);
      assert.deepEqual(JSON.parse((await clients[0].get(`${prefix}rates/key_1`))!.value), {
        tokens: 4,
        at: 1,
      });
      await entry.cancel();
      assert.equal(
        JSON.parse((await clients[0].get(`${prefix}rates/key_1`))!.value).tokens,
        5,
        "a cancel gives the token back",
      );
      // etcd gone: a 503 naming etcd and the team.
      await etcd.kill(0);
      const refused = await ledgers[0].admit("acme", undefined, decide).catch((e) => e);
      assert.ok(refused instanceof HttpError && refused.status === 503, String(refused));
      assert.match(refused.message, /etcd is unreachable.*cannot count team 'acme''s sandboxes/);
    } finally {
      for (const s of sessions) await s.close().catch(() => {});
      await etcd.stop();
    }
  },
});

Deno.test({
  name:
    `EtcdSlots: a hold's token grows with every take, and its check fails once the lease lapsed${skip}`,
  ignore: missing !== null,
  sanitizeOps: false,
  sanitizeResources: false,
  async fn() {
    const etcd = await startEtcd(1);
    const prefix = `/t-${crypto.randomUUID().slice(0, 8)}/`;
    const client = new EtcdClient({ endpoints: etcd.endpoints.split(",") });
    const session = new EtcdSession({ client, ttlSeconds: 10 });
    const slots = new EtcdSlots({ client, session, prefix });
    try {
      const tokens: string[] = [];
      for (let i = 0; i < 2; i++) {
        await slots.run("acme/a", async (hold?: SlotHold) => {
          await hold!.check();
          tokens.push(hold!.token);
        });
      }
      assert.ok(Number(tokens[1]) > Number(tokens[0]), tokens.join(" then "));
      // The lease revoked under the take (as when it lapses): the check says the slot is lost.
      const lost = await slots.run("acme/a", async (hold?: SlotHold) => {
        await client.revoke(await session.lease());
        return await hold!.check().catch((e) => e);
      });
      assert.ok(lost instanceof HttpError && lost.status === 503, String(lost));
      assert.match(lost.message, /lost the name's slot in etcd .* the slot is free now/);
      assert.ok(Number(lost.headers["retry-after"]) > 0);
    } finally {
      await session.close().catch(() => {});
      await etcd.stop();
    }
  },
});
