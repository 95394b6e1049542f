/**
 * The executor contract for snapshots (take, list, delete, create from one), run against both
 * executors by `_contract_fixtures_test.ts`.
 */
import assert from "node:assert/strict";
import { type Case, contractSuite, encoder, rejectsWith, run } from "./_contract_fixtures_test.ts";
import { SNAPSHOT_ID_PATTERN } from "./contract.ts";

const decoder = new TextDecoder();
const unique = () => `n${Math.random().toString(36).slice(2, 10)}`;

const cases: Record<string, Case> = {
  "snapshot() keeps the file system, and a create from it starts with those files": async (
    ex,
    id,
  ) => {
    await ex.writeFile(id, "/tmp/kept.txt", encoder.encode("before"));
    const name = unique();
    const snap = await ex.snapshot(id, { team: "team-a", name });
    assert.match(snap.snapshotId, SNAPSHOT_ID_PATTERN);
    assert.equal(snap.team, "team-a");
    assert.equal(snap.name, name);
    assert.equal(snap.sandboxId, id);
    assert.ok(snap.createdAt > 0);
    // Written after the snapshot: neither the snapshot nor its sandboxes see it.
    await ex.writeFile(id, "/tmp/kept.txt", encoder.encode("after"));
    const copies = [`${id}-c1`, `${id}-c2`];
    try {
      for (const copy of copies) {
        await ex.create({
          id: copy,
          name: copy,
          template: snap.snapshotId,
          snapshot: snap.snapshotId,
          spec: { cpus: 1, memoryMB: 128, pids: 64 },
          env: {},
        });
      }
      assert.equal(decoder.decode(await ex.readFile(copies[0], "/tmp/kept.txt")), "before");
      // Each copy is its own: a write in one is not seen in the other or the origin.
      await ex.writeFile(copies[0], "/tmp/kept.txt", encoder.encode("copy one"));
      assert.equal((await run(ex, copies[1], "cat /tmp/kept.txt")).stdout, "before");
      assert.equal(decoder.decode(await ex.readFile(id, "/tmp/kept.txt")), "after");
      assert.equal(decoder.decode(await ex.readFile(copies[0], "/tmp/kept.txt")), "copy one");
    } finally {
      for (const copy of copies) await ex.destroy(copy);
      await ex.deleteSnapshot(snap.snapshotId);
    }
  },
  "listSnapshots() is per team, names are unique per team, and deleteSnapshot() removes": async (
    ex,
    id,
  ) => {
    const name = unique();
    const a = await ex.snapshot(id, { team: "team-a", name });
    try {
      await rejectsWith(ex.snapshot(id, { team: "team-a", name }), "exists");
      const b = await ex.snapshot(id, { team: "team-b", name }); // another team may use it
      const unnamed = await ex.snapshot(id, { team: "team-a" });
      const mine = (await ex.listSnapshots("team-a")).map((s) => s.snapshotId);
      assert.ok(mine.includes(a.snapshotId) && mine.includes(unnamed.snapshotId), `${mine}`);
      assert.ok(!mine.includes(b.snapshotId));
      const listed = (await ex.listSnapshots("team-a")).find((s) => s.snapshotId === a.snapshotId);
      assert.deepEqual(
        { ...listed, sizeBytes: 0 },
        { ...a, sizeBytes: 0 },
        "the list describes it as the take did",
      );
      assert.equal(
        (await ex.listSnapshots("team-a")).find((s) => s.snapshotId === unnamed.snapshotId)
          ?.name,
        undefined,
      );
      const all = (await ex.listSnapshots()).map((s) => s.snapshotId);
      assert.ok(all.includes(b.snapshotId) && all.includes(a.snapshotId));
      // Another team's snapshot is not found, and not deleted.
      assert.equal(await ex.deleteSnapshot(b.snapshotId, "team-a"), false);
      assert.equal(await ex.deleteSnapshot(b.snapshotId, "team-b"), true);
      assert.equal(await ex.deleteSnapshot(b.snapshotId, "team-b"), false);
      assert.equal(await ex.deleteSnapshot(unnamed.snapshotId), true);
      assert.ok(!(await ex.listSnapshots()).some((s) => s.snapshotId === b.snapshotId));
    } finally {
      await ex.deleteSnapshot(a.snapshotId);
    }
    assert.ok(!(await ex.listSnapshots("team-a")).some((s) => s.snapshotId === a.snapshotId));
    // A deleted snapshot's name is free again, and nothing starts from its id.
    const again = await ex.snapshot(id, { team: "team-a", name });
    await ex.deleteSnapshot(again.snapshotId);
    await rejectsWith(
      ex.create({
        id: `${id}-from-deleted`,
        name: "x",
        template: a.snapshotId,
        snapshot: a.snapshotId,
        spec: {},
        env: {},
      }),
      "not_found",
    );
  },
  "snapshot() of a paused sandbox keeps its files, and resume() thaws the sandbox after": async (
    ex,
    id,
  ) => {
    await ex.writeFile(id, "/tmp/paused.txt", encoder.encode("frozen"));
    await ex.pause(id);
    const snap = await ex.snapshot(id, { team: "team-a" });
    const copy = `${id}-p`;
    try {
      await ex.create({
        id: copy,
        name: copy,
        template: snap.snapshotId,
        snapshot: snap.snapshotId,
        spec: { cpus: 1, memoryMB: 128, pids: 64 },
        env: {},
      });
      assert.equal(decoder.decode(await ex.readFile(copy, "/tmp/paused.txt")), "frozen");
      await ex.resume(id);
      assert.equal((await run(ex, id, "cat /tmp/paused.txt")).stdout, "frozen");
    } finally {
      await ex.destroy(copy);
      await ex.deleteSnapshot(snap.snapshotId);
    }
  },
  "snapshot() of a sandbox that is gone is `gone`": async (ex, id) => {
    await ex.destroy(id);
    await rejectsWith(ex.snapshot(id, { team: "team-a" }), "gone");
  },
};

await contractSuite(cases);
