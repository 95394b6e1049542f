import assert from "node:assert/strict";
import { DatabaseLockedError } from "../shared/lock.ts";
import { Ledger, newSandboxId, type NewSandboxRow } from "./ledger.ts";

const options = { nodeId: "node-1", endpoint: "http://127.0.0.1:3676" };

function row(name: string, extra: Partial<NewSandboxRow> = {}): NewSandboxRow {
  return {
    id: newSandboxId(),
    name,
    state: "active",
    template: "base",
    metadata: { team: "a" },
    spec: { cpus: 1 },
    env: { A: "1" },
    createdAt: 1_700_000_000_000,
    deadlineAt: null,
    deadlineAction: null,
    ...extra,
  };
}

Deno.test("newSandboxId() mints URL-safe ids that differ", () => {
  const a = newSandboxId();
  assert.match(a, /^sbx_[a-z2-7]{20}$/);
  assert.notEqual(a, newSandboxId());
});

Deno.test("Ledger round-trips a row as a record", () => {
  const ledger = Ledger.inMemory(options);
  const r = row("a");
  const rec = ledger.insert(r);
  assert.deepEqual(rec, {
    id: r.id,
    name: "a",
    state: "active",
    nodeId: "node-1",
    endpoint: "http://127.0.0.1:3676",
    template: "base",
    metadata: { team: "a" },
    spec: { cpus: 1 },
    createdAt: "2023-11-14T22:13:20.000Z",
    lastActiveAt: "2023-11-14T22:13:20.000Z",
    env: { A: "1" },
    deadlineAt: null,
    deadlineAction: null,
  });
  assert.deepEqual(ledger.byName("a"), rec);
  assert.equal(ledger.byName("b"), undefined);
  ledger.close();
});

Deno.test("Ledger refuses a second row with the same name", () => {
  const ledger = Ledger.inMemory(options);
  ledger.insert(row("a"));
  assert.throws(() => ledger.insert(row("a")), /UNIQUE/);
  ledger.close();
});

Deno.test("Ledger.update() changes fields and census() counts states", () => {
  const ledger = Ledger.inMemory(options);
  const a = ledger.insert(row("a"));
  ledger.insert(row("b"));
  const updated = ledger.update(a.id, {
    state: "frozen",
    metadata: { x: "y" },
    lastActiveAt: 1_700_000_001_000,
    deadlineAt: 5,
    deadlineAction: "pause",
  });
  assert.equal(updated?.state, "frozen");
  assert.deepEqual(updated?.metadata, { x: "y" });
  assert.equal(updated?.lastActiveAt, "2023-11-14T22:13:21.000Z");
  assert.deepEqual(ledger.census(), {
    active: 1,
    frozen: 1,
    stopped: 0,
    archived: 0,
    restoring: 0,
  });
  assert.deepEqual(ledger.pastDeadline(5).map((r) => r.name), ["a"]);
  assert.deepEqual(ledger.pastDeadline(4), []);
  assert.equal(ledger.delete(a.id), true);
  assert.equal(ledger.delete(a.id), false);
  assert.equal(ledger.update(a.id, { state: "active" }), undefined);
  assert.deepEqual(ledger.all().map((r) => r.name), ["b"]);
  ledger.close();
});

Deno.test("Ledger.open() holds the data dir: a second open names DORMICE_DATA_DIR", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const first = Ledger.open(dir, options);
    first.insert(row("kept"));
    // One process, two connections: SQLite's file lock still refuses the second writer.
    assert.throws(() => Ledger.open(dir, options), (e) => {
      assert.ok(e instanceof DatabaseLockedError);
      assert.match(e.message, /ledger\.db.*DORMICE_DATA_DIR/);
      return true;
    });
    first.close();
    const again = Ledger.open(dir, options);
    assert.equal(again.byName("kept")?.name, "kept");
    again.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});
