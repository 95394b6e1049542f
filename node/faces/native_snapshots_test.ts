/** The node's native snapshot verbs, through the whole node app (`createNodeApp`). */
import assert from "node:assert/strict";
import { FakeClock } from "../../shared/clock.ts";
import { testNodeApp } from "../_app_fixtures_test.ts";
import { FakeExecutor } from "../executors/fake.ts";
import type { HostSampler } from "../host_reading.ts";

const token = "n".repeat(32);

const sampler: HostSampler = {
  cpuCount: () => 2,
  cpuTimes: () => null,
  memory: () => ({
    memoryTotalBytes: 4,
    memoryAvailableBytes: 2,
    swapTotalBytes: 0,
    swapFreeBytes: 0,
  }),
  dataDisk: () => null,
};

Deno.test("native face: snapshotSandbox, listSnapshots and deleteSnapshot, per team", async () => {
  const clock = new FakeClock(1_700_000_000_000);
  const executor = new FakeExecutor({ clock });
  const app = testNodeApp({
    token,
    endpoint: "http://127.0.0.1:3676",
    executor,
    clock,
    sampler,
    build: "t",
  });
  const call = async (verb: string, body: unknown, team?: string) => {
    const res = await app.fetch(
      new Request(`http://node/${verb}`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
          ...(team ? { "x-dormice-team": team } : {}),
        },
        body: JSON.stringify(body),
      }),
    );
    return { status: res.status, body: await res.json() };
  };
  try {
    const made = await call("acquireSandbox", { name: "a" }, "team-a");
    assert.equal(made.status, 200);
    const taken = await call("snapshotSandbox", { name: "a", snapshotName: "ready" }, "team-a");
    assert.equal(taken.status, 200, JSON.stringify(taken.body));
    const snap = taken.body.snapshot;
    assert.match(snap.snapshotId, /^snap-/);
    assert.equal(snap.team, "team-a");
    assert.equal(snap.name, "ready");
    assert.equal(snap.sandboxId, made.body.sandbox.id);
    const again = await call("snapshotSandbox", { name: "a", snapshotName: "ready" }, "team-a");
    assert.equal(again.status, 409);
    assert.match(again.body.message, /already used/);
    const ids = async (body: unknown, team?: string) =>
      (await call("listSnapshots", body, team)).body.snapshots.map((s: { snapshotId: string }) =>
        s.snapshotId
      );
    assert.deepEqual(await ids({}, "team-a"), [snap.snapshotId]);
    assert.deepEqual(await ids({ name: "ready" }, "team-a"), [snap.snapshotId]);
    assert.deepEqual(await ids({ sandboxId: snap.sandboxId }, "team-a"), [snap.snapshotId]);
    assert.deepEqual(await ids({}, "team-b"), []);
    assert.deepEqual(await ids({}), [snap.snapshotId], "the operator sees every team's");
    // Team B's sandbox 'a' does not exist, and it cannot delete team A's snapshot.
    assert.equal((await call("snapshotSandbox", { name: "a" }, "team-b")).status, 404);
    assert.deepEqual((await call("deleteSnapshot", snap, "team-b")).body, { deleted: false });
    const bad = await call("deleteSnapshot", { snapshotId: "x" }, "team-a");
    assert.equal(bad.status, 400);
    assert.match(bad.body.message, /snapshotId.*is not a snapshot id/);
    assert.deepEqual((await call("deleteSnapshot", snap, "team-a")).body, { deleted: true });
    assert.deepEqual(await ids({}, "team-a"), []);
  } finally {
    await app.close();
  }
});
