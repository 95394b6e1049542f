import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import type { HttpError } from "../../shared/http_error.ts";
import { VolumeTable } from "./table.ts";

const id = "vol-0000000000000000000e";

Deno.test("VolumeTable: a step whose claim was ended cannot release, write back or delete over the next claim", async () => {
  const db = new DatabaseSync(":memory:");
  const table = new VolumeTable(db);
  await table.reserve({ id, team: "acme", name: "data", node: "n1" });
  await table.update(id, { state: "ready", sizeBytes: 5 });
  const stale = await table.claim(id, "moving");
  assert.ok(stale);
  assert.equal(await table.claim(id, "deleting"), undefined, "one claim at a time");
  // A restart ends every claim (the step is no longer running there); a new step claims it.
  const again = new VolumeTable(db);
  const deleting = await again.claim(id, "deleting");
  assert.ok(deleting);
  for (
    const late of [
      () => again.release(stale, { node: "n2" }),
      () => again.release(stale),
      () => again.remove(stale),
    ]
  ) {
    await assert.rejects(late, (error: HttpError) => {
      assert.equal(error.status, 409);
      assert.match(error.message, /Another gateway took over volume 'vol-0+e'/);
      return true;
    });
  }
  const row = await again.get(id);
  assert.deepEqual([row?.state, row?.node, row?.sizeBytes], ["deleting", "n1", 5]);
  await again.remove(deleting);
  assert.equal(await again.get(id), undefined);
});

Deno.test("VolumeTable: a release writes back the node under its own claim only once", async () => {
  const table = new VolumeTable(new DatabaseSync(":memory:"));
  await table.reserve({ id, team: "acme", name: "data", node: "n1" });
  await table.update(id, { state: "ready" });
  const claim = await table.claim(id, "moving");
  assert.ok(claim);
  await table.release(claim, { node: "n2" });
  assert.deepEqual([(await table.get(id))?.state, (await table.get(id))?.node], ["ready", "n2"]);
  const next = await table.claim(id, "moving");
  assert.ok(next);
  await assert.rejects(
    () => table.release(claim, { node: "n3" }),
    (e: HttpError) => e.status === 409,
  );
  assert.equal((await table.get(id))?.node, "n2");
});

Deno.test("VolumeTable: a database from before claim tokens gains the column", () => {
  const db = new DatabaseSync(":memory:");
  db.exec(`CREATE TABLE volumes (id TEXT PRIMARY KEY, team TEXT NOT NULL, name TEXT NOT NULL,
    node TEXT NOT NULL, shared INTEGER NOT NULL DEFAULT 0, state TEXT NOT NULL,
    size_bytes INTEGER NOT NULL DEFAULT 0, created_at TEXT NOT NULL, UNIQUE (team, name))`);
  new VolumeTable(db);
  const columns = db.prepare("PRAGMA table_info(volumes)").all() as { name: string }[];
  assert.ok(columns.some((c) => c.name === "claim"));
});
