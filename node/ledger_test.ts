import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { DatabaseLockedError } from "../shared/lock.ts";
import { Ledger, newSandboxId, type NewSandboxRow } from "./ledger.ts";
import { LedgerFullError } from "./ledger_space.ts";

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

Deno.test("newSandboxId() mints 20 lowercase letters and digits, as E2B's ids", () => {
  const a = newSandboxId();
  assert.match(a, /^[a-z0-9]{20}$/);
  assert.notEqual(a, newSandboxId());
  // Every character of the alphabet turns up, and nothing else: no '_' a TLS matcher refuses.
  const seen = new Set(Array.from({ length: 200 }, () => newSandboxId()).join(""));
  assert.equal([...seen].sort().join(""), "0123456789abcdefghijklmnopqrstuvwxyz");
});

Deno.test("Ledger round-trips a row as a record", () => {
  const ledger = Ledger.inMemory(options);
  const r = row("a");
  const rec = ledger.insert(r);
  assert.deepEqual(rec, {
    id: r.id,
    name: "a",
    team: "default",
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
    e2b: {},
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
    e2b: { onTimeout: "pause", autoResume: true },
  });
  assert.equal(updated?.state, "frozen");
  assert.deepEqual(updated?.e2b, { onTimeout: "pause", autoResume: true });
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

Deno.test("Ledger migrates a ledger written before teams: every row joins the default team", () => {
  const db = new DatabaseSync(":memory:");
  // The table as it was before teams: names unique across the ledger, no team column.
  db.exec(`CREATE TABLE sandboxes (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL, template TEXT NOT NULL, metadata TEXT NOT NULL, spec TEXT NOT NULL,
    env TEXT NOT NULL, created_at INTEGER NOT NULL, last_active_at INTEGER NOT NULL,
    deadline_at INTEGER, deadline_action TEXT)`);
  db.prepare(
    `INSERT INTO sandboxes VALUES ('sbx_old', 'agent-1', 'active', 'base', '{}', '{}', '{}', 1, 1,
      NULL, NULL)`,
  ).run();
  const ledger = new Ledger(db, options);
  assert.equal(ledger.byName("agent-1")?.id, "sbx_old");
  assert.equal(ledger.byId("sbx_old")?.team, "default");
  assert.deepEqual(ledger.byId("sbx_old")?.e2b, {}, "a row from before E2B settings has none");
  // The old UNIQUE(name) is gone: another team may now hold the same name.
  ledger.insert(row("agent-1", { team: "acme" }));
  assert.equal(ledger.byName("agent-1", "acme")?.team, "acme");
  assert.deepEqual(ledger.teamCounts(), { default: 1, acme: 1 });
  ledger.close();
});

Deno.test("Ledger names are unique per team, not across the ledger", () => {
  const ledger = Ledger.inMemory(options);
  const a = ledger.insert(row("agent-1", { team: "a" }));
  const b = ledger.insert(row("agent-1", { team: "b" }));
  assert.notEqual(a.id, b.id);
  assert.throws(() => ledger.insert(row("agent-1", { team: "a" })));
  assert.equal(ledger.byName("agent-1"), undefined, "the default team has no agent-1");
  ledger.insert(row("paused", { team: "a", state: "frozen" }));
  assert.deepEqual(ledger.teamCounts(), { a: 1, b: 1 }, "only running sandboxes count");
  ledger.close();
});

Deno.test("Ledger.touch() moves the idle clock in memory; flushTouches() writes it in one go", () => {
  const dir = Deno.makeTempDirSync();
  try {
    const ledger = Ledger.open(dir, options);
    const a = ledger.insert(row("a"));
    const b = ledger.insert(row("b"));
    ledger.touch(a.id, 1_700_000_005_000);
    ledger.touch(b.id, 1_700_000_006_000);
    ledger.touch("sbx_gone", 1);
    assert.equal(ledger.byId(a.id)?.lastActiveAt, "2023-11-14T22:13:25.000Z");
    assert.equal(ledger.all()[1].lastActiveAt, "2023-11-14T22:13:26.000Z");
    assert.equal(ledger.unflushedTouches, 3);
    assert.equal(ledger.flushTouches(), 3);
    assert.equal(ledger.unflushedTouches, 0);
    assert.equal(ledger.flushTouches(), 0);
    ledger.touch(b.id, 1_700_000_009_000);
    ledger.delete(b.id);
    assert.equal(ledger.unflushedTouches, 0, "a deleted row takes its clock along");
    ledger.close();
    const again = Ledger.open(dir, options);
    assert.equal(again.byId(a.id)?.lastActiveAt, "2023-11-14T22:13:25.000Z");
    again.close();
  } finally {
    Deno.removeSync(dir, { recursive: true });
  }
});

Deno.test("Ledger turns SQLite's 'database or disk is full' into a 507 naming DORMICE_DATA_DIR", () => {
  const db = new DatabaseSync(":memory:");
  const ledger = new Ledger(db, { ...options, dataDir: "/var/lib/dormice" });
  const a = ledger.insert(row("a"));
  // A page cap stands in for a full disk: SQLite answers SQLITE_FULL the same way.
  const { page_count } = db.prepare("PRAGMA page_count").get() as { page_count: number };
  db.exec(`PRAGMA max_page_count = ${page_count}`);
  const big = { blob: "x".repeat(64 * 1024) };
  for (
    const attempt of [
      () => ledger.insert(row("b", { metadata: big })),
      () => ledger.update(a.id, { metadata: big }),
    ]
  ) {
    assert.throws(attempt, (e) => {
      assert.ok(e instanceof LedgerFullError);
      assert.equal(e.status, 507);
      assert.match(e.message, /data disk is full: DORMICE_DATA_DIR \(\/var\/lib\/dormice\)/);
      return true;
    });
  }
  assert.equal(ledger.byId(a.id)?.name, "a");
  ledger.close();
});

Deno.test("Ledger.nextDeadline() and onChange() follow every deadline write", () => {
  const ledger = Ledger.inMemory(options);
  const seen: string[] = [];
  const stop = ledger.onChange((c) => seen.push(`${c.kind}:${c.deadline}`));
  assert.equal(ledger.nextDeadline(), null);
  const a = ledger.insert(row("a", { deadlineAt: 5_000, deadlineAction: "kill" }));
  const b = ledger.insert(row("b"));
  assert.equal(ledger.nextDeadline(), 5_000);
  ledger.update(b.id, { deadlineAt: 2_000, deadlineAction: "pause" });
  assert.equal(ledger.nextDeadline(), 2_000);
  ledger.update(b.id, { metadata: { x: "y" } });
  ledger.delete(b.id);
  assert.equal(ledger.nextDeadline(), 5_000);
  ledger.update("sbx_missing", { deadlineAt: 1 });
  stop();
  ledger.update(a.id, { deadlineAt: null });
  assert.equal(ledger.nextDeadline(), null);
  assert.deepEqual(seen, [
    "insert:true",
    "insert:false",
    "update:true",
    "update:false",
    "delete:false",
  ]);
  ledger.close();
});

Deno.test("Ledger.instanceId is minted once per ledger and kept across opens", async () => {
  const [a, b] = [await Deno.makeTempDir(), await Deno.makeTempDir()];
  try {
    const first = Ledger.open(a, options);
    const id = first.instanceId;
    assert.match(id, /^[0-9a-f]{16}$/);
    first.close();
    const again = Ledger.open(a, options);
    assert.equal(again.instanceId, id, "a restart owns what it made before");
    again.close();
    // Same node id, another data dir: another owner.
    const other = Ledger.open(b, options);
    assert.notEqual(other.instanceId, id);
    other.close();
  } finally {
    await Deno.remove(a, { recursive: true });
    await Deno.remove(b, { recursive: true });
  }
});

Deno.test("Ledger.pages() reads every row once, in all()'s order, yielding between pages", async () => {
  const ledger = Ledger.inMemory(options);
  // Ties on created_at (one ms, several names) must neither repeat nor lose a row at a page edge.
  for (let i = 0; i < 1234; i++) {
    ledger.insert(
      row(`s${String(i % 7)}-${i}`, { createdAt: 1_700_000_000_000 + Math.floor(i / 3) }),
    );
  }
  let yields = 0;
  const pages: number[] = [];
  const seen: string[] = [];
  for await (const page of ledger.pages(500, () => (yields++, Promise.resolve()))) {
    pages.push(page.length);
    seen.push(...page.map((r) => r.id));
  }
  assert.deepEqual(pages, [500, 500, 234]);
  assert.equal(yields, 2);
  assert.deepEqual(seen, ledger.all().map((r) => r.id));
  assert.deepEqual(new Set(ledger.keys().map((k) => k.id)), new Set(seen));
  ledger.close();
});
