import assert from "node:assert/strict";
import { DatabaseSync } from "node:sqlite";
import { Fleet, type FleetNode } from "./fleet.ts";
import { FakeClock } from "../../shared/clock.ts";
import { HttpError } from "../../shared/http_error.ts";
import { checkIn, reading, recordingLog } from "../_fixtures_test.ts";

const A = "http://10.0.0.1:3676";
const B = "http://10.0.0.2:3676";

function setup(options: { database?: DatabaseSync } = {}) {
  const clock = new FakeClock();
  const { log, lines } = recordingLog();
  const joined: string[] = [];
  const down: string[] = [];
  const fleet = new Fleet({
    clock,
    log,
    database: options.database,
    onJoin: (n) => joined.push(n.id),
    onDown: (n) => down.push(n.id),
  });
  return { clock, fleet, lines, joined, down };
}

function httpError(status: number, pattern: RegExp) {
  return (error: unknown) => {
    assert.ok(error instanceof HttpError, `expected HttpError, got ${error}`);
    assert.equal(error.status, status);
    assert.match(error.message, pattern);
    return true;
  };
}

Deno.test("Fleet.checkIn() joins a new id at its first check-in and updates it after", () => {
  const { fleet, joined } = setup();
  assert.equal(fleet.checkIn(checkIn("a", A)), "joined");
  assert.equal(fleet.checkIn(checkIn("a", A)), "updated");
  assert.deepEqual(joined, ["a"]);
  assert.equal(fleet.size, 1);
  assert.equal(fleet.isDown("a"), false);
  assert.equal(fleet.get("a")?.endpoint, A);
  fleet.close();
});

Deno.test("Fleet.checkIn() keeps the last reading and changes readingSeq each time", () => {
  const { fleet } = setup();
  fleet.checkIn(checkIn("a", A, { reading: reading({ active: 1 }) }));
  const node = fleet.get("a")!;
  const seq = node.readingSeq;
  fleet.checkIn(checkIn("a", A, { reading: reading({ active: 7 }) }));
  assert.equal(node.reading?.sandboxes.active, 7);
  assert.notEqual(node.readingSeq, seq);
  fleet.close();
});

Deno.test("Fleet.isDown() is true after more than two of the node's own intervals", () => {
  const { fleet, clock } = setup();
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 10 }));
  clock.tick(20_000); // exactly two intervals: still up
  assert.equal(fleet.isDown("a"), false);
  clock.tick(1);
  assert.equal(fleet.isDown("a"), true);
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 10 }));
  assert.equal(fleet.isDown("a"), false);
  assert.equal(fleet.isDown("unknown"), true);
  fleet.close();
});

Deno.test("Fleet.sweep() announces a node going down once, then up again on check-in", () => {
  const { fleet, clock, down, lines } = setup();
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 1 }));
  assert.deepEqual(fleet.sweep(), []);
  clock.tick(2_001);
  assert.deepEqual(fleet.sweep(), ["a"]);
  assert.deepEqual(fleet.sweep(), []);
  assert.deepEqual(down, ["a"]);
  assert.equal(lines.filter((l) => /node is down/.test(l.msg)).length, 1);
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 1 }));
  assert.ok(lines.some((l) => l.msg === "node is up again"));
  clock.tick(2_001);
  assert.deepEqual(fleet.sweep(), ["a"]);
  assert.deepEqual(down, ["a", "a"]);
  fleet.close();
});

Deno.test("Fleet hooks that throw are logged and do not break the check-in", () => {
  const clock = new FakeClock();
  const { log, lines } = recordingLog();
  const fleet = new Fleet({
    clock,
    log,
    onJoin: () => {
      throw new Error("boom");
    },
  });
  assert.equal(fleet.checkIn(checkIn("a", A)), "joined");
  assert.ok(lines.some((l) => l.level === "error" && /onJoin/.test(l.msg)));
  fleet.close();
});

Deno.test("Fleet.checkIn() refuses a second endpoint under a live id, naming both", () => {
  const { fleet, clock, lines } = setup();
  fleet.checkIn(checkIn("a", A));
  clock.tick(5_000);
  assert.throws(() => fleet.checkIn(checkIn("a", B)), (error: unknown) => {
    assert.ok(error instanceof HttpError);
    assert.equal(error.status, 409);
    assert.ok(error.message.includes(A), error.message);
    assert.ok(error.message.includes(B), error.message);
    assert.match(error.message, /DORMICE_NODE_ID/);
    return true;
  });
  // The first reporter keeps the id, untouched.
  assert.equal(fleet.get("a")?.endpoint, A);
  // Refused again at the twin's next check-in: warned once, not every time.
  assert.throws(() => fleet.checkIn(checkIn("a", B)), HttpError);
  assert.equal(lines.filter((l) => /second endpoint/.test(l.msg)).length, 1);
  fleet.close();
});

Deno.test("Fleet.checkIn() accepts a move once the old reporter was silent one interval", () => {
  const { fleet, clock, lines } = setup();
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 10 }));
  clock.tick(10_000); // exactly one interval: the old reporter may still be alive
  assert.throws(() => fleet.checkIn(checkIn("a", B)), httpError(409, /10 s of silence/));
  clock.tick(1);
  assert.equal(fleet.checkIn(checkIn("a", B)), "updated");
  assert.equal(fleet.get("a")?.endpoint, B);
  const moved = lines.filter((l) => l.msg === "node endpoint moved");
  assert.equal(moved.length, 1);
  assert.deepEqual([moved[0].fields.from, moved[0].fields.to], [A, B]);
  // Now the old endpoint is the twin.
  assert.throws(() => fleet.checkIn(checkIn("a", A)), httpError(409, /cannot use it/));
  fleet.close();
});

Deno.test("Fleet warns once when two ids report one endpoint, and again after a change", () => {
  const { fleet, clock, lines } = setup();
  const shared = () => lines.filter((l) => /several node ids report one endpoint/.test(l.msg));
  fleet.checkIn(checkIn("old", A, { intervalSeconds: 1 }));
  fleet.checkIn(checkIn("new", A, { intervalSeconds: 1 }));
  fleet.checkIn(checkIn("new", A, { intervalSeconds: 1 }));
  fleet.checkIn(checkIn("old", A, { intervalSeconds: 1 }));
  assert.equal(shared().length, 1);
  assert.deepEqual(shared()[0].fields.nodeIds, ["new", "old"]);
  assert.match(shared()[0].msg, /removeNode, or correct the DORMICE_NODE_ENDPOINT/);
  clock.tick(3_000);
  fleet.checkIn(checkIn("new", A, { intervalSeconds: 1 }));
  fleet.removeNode("old");
  fleet.checkIn(checkIn("third", A, { intervalSeconds: 1 }));
  assert.equal(shared().length, 2);
  fleet.close();
});

Deno.test("Fleet warns at the check-in where a node's config digest parts from the fleet's, once", () => {
  const { fleet, lines } = setup();
  const d = (id: string, digest: string, n: number) =>
    checkIn(id, `http://10.0.0.${n}:3676`, { configDigest: digest });
  const warned = () =>
    lines.filter((l) => l.level === "warn" && l.msg.includes("fleet-invariant"))
      .map((l) => l.fields.nodeId);
  fleet.checkIn(d("a", "same", 1));
  fleet.checkIn(d("b", "same", 2));
  assert.deepEqual(warned(), []);
  // A node that joins with another digest is warned of at its first check-in, not its second.
  fleet.checkIn(d("c", "other", 3));
  assert.deepEqual(warned(), ["c"], "at the moment the divergent node appears");
  fleet.checkIn(d("c", "other", 3));
  assert.deepEqual(warned(), ["c"], "once, not per check-in");
  assert.deepEqual(fleet.list().map((n) => [n.id, n.configDigestMismatch]), [
    ["a", false],
    ["b", false],
    ["c", true],
  ]);
  fleet.checkIn(d("c", "same", 3));
  assert.ok(fleet.list().every((n) => !n.configDigestMismatch));
  // A known node whose digest changes is warned of at that check-in too.
  fleet.checkIn(d("b", "changed", 2));
  assert.deepEqual(warned(), ["c", "b"]);
  fleet.close();
});

Deno.test("Fleet: a check-in judges no other node, however large the fleet", () => {
  // Counts every up/down judgement the Fleet makes; a check-in of a settled fleet of 200 nodes
  // must make one (its own node's), not one per node.
  let judged = 0;
  class Counting extends Fleet {
    override isDown(node: string | FleetNode, now?: number): boolean {
      judged++;
      return super.isDown(node, now);
    }
  }
  const fleet = new Counting({ clock: new FakeClock() });
  for (let i = 0; i < 200; i++) {
    fleet.checkIn(checkIn(`n${i}`, `http://10.0.${i >> 8}.${i & 255}:3676`, {
      configDigest: "same",
    }));
  }
  judged = 0;
  fleet.checkIn(checkIn("n7", "http://10.0.0.7:3676", { configDigest: "same" }));
  assert.ok(judged <= 1, `a check-in judged ${judged} nodes`);
  fleet.close();
});

Deno.test("Fleet: a node gone down no longer counts toward the fleet's digest", () => {
  const { fleet, clock, lines } = setup();
  const d = (id: string, digest: string, n: number, intervalSeconds = 15) =>
    checkIn(id, `http://10.0.0.${n}:3676`, { configDigest: digest, intervalSeconds });
  fleet.checkIn(d("a", "old", 1, 1));
  fleet.checkIn(d("b", "old", 2, 1));
  fleet.checkIn(d("c", "new", 3));
  assert.equal(fleet.list().find((n) => n.id === "c")?.configDigestMismatch, true);
  clock.tick(3_000); // a and b silent for three of their intervals: down
  fleet.checkIn(d("c", "new", 3));
  assert.deepEqual(fleet.sweep(), ["a", "b"]);
  fleet.checkIn(d("c", "new", 3));
  assert.ok(fleet.list().every((n) => !n.configDigestMismatch));
  // b comes back with the old settings: one each, the reference (new) stays.
  fleet.checkIn(d("b", "old", 2, 1));
  const warned = lines.filter((l) => l.msg.includes("fleet-invariant")).map((l) => l.fields.nodeId);
  assert.deepEqual(warned, ["c", "b"]);
  fleet.close();
});

Deno.test("Fleet batches check-ins into one write a second, and writes them at close", () => {
  const db = new DatabaseSync(":memory:");
  const { fleet, clock } = setup({ database: db });
  const stored = (id: string) =>
    db.prepare("SELECT build, first_seen, last_check_in FROM gateway_nodes WHERE id = ?").get(
      id,
    ) as { build: string; first_seen: number; last_check_in: number } | undefined;
  const t0 = clock.now();
  fleet.checkIn(checkIn("a", A));
  assert.equal(stored("a"), undefined, "a join waits for the batch too");
  clock.tick(300);
  fleet.checkIn(checkIn("a", A, { build: "v2" }));
  fleet.checkIn(checkIn("b", B));
  assert.equal(stored("a"), undefined);
  clock.tick(700);
  fleet.sweep();
  assert.deepEqual(
    { ...stored("a") },
    { build: "v2", first_seen: t0, last_check_in: t0 + 300 },
    "written within a second of the oldest, by the sweep, with its first check-in kept",
  );
  assert.equal(stored("b")?.last_check_in, t0 + 300);
  clock.tick(200);
  fleet.checkIn(checkIn("a", A, { build: "v2" }));
  assert.equal(stored("a")?.last_check_in, t0 + 300, "the next one waits");
  // A removal is written at once, and what waited for it is dropped.
  clock.tick(60_000);
  fleet.removeNode("b");
  assert.equal(stored("b"), undefined);
  fleet.close();
  assert.equal(stored("a")?.last_check_in, t0 + 1_200, "close writes what waits");
  db.close();
});

Deno.test("Fleet.removeNode() of a node still checking in is a 409 saying what to do", () => {
  const { fleet, clock } = setup();
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 15 }));
  clock.tick(20_000);
  assert.throws(
    () => fleet.removeNode("a"),
    httpError(409, /still checks in.*stop it.*wait two check-in intervals \(30 s\).*remove it/),
  );
  clock.tick(10_001);
  fleet.removeNode("a");
  assert.equal(fleet.get("a"), undefined);
  assert.equal(fleet.size, 0);
  fleet.close();
});

Deno.test("Fleet.removeNode() of an unknown id is a 404", () => {
  const { fleet } = setup();
  assert.throws(() => fleet.removeNode("ghost"), httpError(404, /No node 'ghost'/));
  fleet.close();
});

Deno.test("Fleet persists nodes; loaded rows are down until they check in with this process", () => {
  const db = new DatabaseSync(":memory:");
  const first = setup({ database: db });
  first.fleet.checkIn(checkIn("a", A, { intervalSeconds: 10 }));
  first.clock.tick(4_000);
  first.fleet.checkIn(checkIn("a", A, { intervalSeconds: 10, build: "v2" }));

  const clock = new FakeClock(first.clock.now() + 1_000);
  const down: string[] = [];
  const again = new Fleet({ database: db, clock, onDown: (n: FleetNode) => down.push(n.id) });
  const node = again.get("a")!;
  assert.equal(node.endpoint, A);
  assert.equal(node.build, "v2");
  assert.equal(node.reading, null);
  assert.equal(again.isDown("a"), true, "not heard since this gateway started");
  const [summary] = again.list();
  assert.equal(summary.state, "down");
  assert.equal(summary.lastCheckInAgeMs, 1_000);
  // Never up in this process, so no onDown for it.
  assert.deepEqual(again.sweep(), []);
  assert.deepEqual(down, []);
  // The old reporter's silence is measured from the persisted time: a move is still refused.
  assert.throws(() => again.checkIn(checkIn("a", B, { intervalSeconds: 10 })), HttpError);
  assert.equal(again.checkIn(checkIn("a", A, { intervalSeconds: 10 })), "updated");
  assert.equal(again.isDown("a"), false);
  assert.equal(again.get("a")!.firstSeen, first.clock.now() - 4_000);
  db.close();
});

Deno.test("Fleet.list() shows id, endpoint, state, age, reading and the in-flight count", () => {
  const { fleet, clock } = setup();
  fleet.checkIn(checkIn("a", A, { reading: reading({ active: 3 }) }));
  fleet.checkIn(checkIn("b", B, { intervalSeconds: 1 }));
  clock.tick(2_500);
  const list = fleet.list((id) => (id === "a" ? 2 : 0));
  assert.deepEqual(list.map((n) => [n.id, n.endpoint, n.state, n.lastCheckInAgeMs, n.inFlight]), [
    ["a", A, "up", 2_500, 2],
    ["b", B, "down", 2_500, 0],
  ]);
  assert.equal(list[0].reading?.sandboxes.active, 3);
  assert.equal(fleet.list()[0].inFlight, 0);
  fleet.close();
});

Deno.test("Fleet: in shared mode no silence is counted after the last read of etcd began", () => {
  const { fleet, clock } = setup();
  fleet.checkIn(checkIn("far", A, { intervalSeconds: 10 }), { at: clock.now(), replicated: true });
  fleet.checkIn(checkIn("near", B, { intervalSeconds: 10 }));
  clock.tick(5_000);
  fleet.replicaAsOf(clock.now());
  clock.tick(60_000); // far longer than two intervals without news of "far": a read is stuck
  assert.equal(fleet.isSilent("far"), false, "no news is not silence");
  assert.equal(fleet.isDown("far"), false, "nor is it down: placement may still pick it");
  fleet.checkIn(checkIn("near", B, { intervalSeconds: 10 })); // heard here meanwhile
  clock.tick(21_000);
  assert.equal(
    fleet.isSilent("near"),
    false,
    "silent since a check-in heard here: left to the head timeout",
  );
  fleet.replicaAsOf(clock.now()); // a read that began now had nothing newer
  assert.equal(fleet.isSilent("far"), true);
  assert.equal(fleet.isDown("far"), true);
  assert.equal(fleet.isSilent("near"), true);
  fleet.replicaAsOf(null); // not shared: silence runs to now
  fleet.checkIn(checkIn("far", A, { intervalSeconds: 10 }));
  clock.tick(21_000);
  assert.equal(fleet.isDown("far"), true);
  fleet.close();
});

Deno.test("Fleet: in shared mode silence before the last read still counts", () => {
  const { fleet, clock } = setup();
  fleet.checkIn(checkIn("a", A, { intervalSeconds: 10 }));
  clock.tick(25_000);
  fleet.replicaAsOf(clock.now());
  clock.tick(1_000);
  assert.equal(fleet.isSilent("a"), true);
  assert.equal(fleet.isDown("a"), true);
  fleet.close();
});

Deno.test("Fleet.isDead() declares a node dead after deadAfterMs of silence, once, and a check-in brings it back", () => {
  const clock = new FakeClock();
  const { log, lines } = recordingLog();
  const fleet = new Fleet({ clock, log, deadAfterMs: 600_000 });
  fleet.checkIn(checkIn("a", A)); // 15 s intervals: down after 30 s
  fleet.checkIn(checkIn("b", B));
  clock.tick(31_000);
  fleet.checkIn(checkIn("b", B));
  fleet.sweep();
  assert.equal(fleet.isDown("a"), true);
  assert.equal(fleet.isDead("a"), false, "down is not dead");
  assert.equal(fleet.list()[0].state, "down");
  clock.tick(600_000 - 31_000); // exactly deadAfterMs: not yet
  assert.equal(fleet.isDead("a"), false);
  clock.tick(1);
  assert.equal(fleet.isDead("a"), true);
  assert.equal(fleet.isDead("nobody"), false);
  assert.deepEqual(fleet.list().map((n) => [n.id, n.state]), [["a", "dead"], ["b", "down"]]);
  for (let i = 0; i < 5; i++) fleet.sweep();
  const declared = lines.filter((l) => l.msg.startsWith("node declared dead"));
  assert.equal(declared.length, 1, "logged once");
  assert.equal(declared[0].fields.nodeId, "a");
  assert.match(declared[0].msg, /DORMICE_GATEWAY_NODE_DEAD_AFTER_S/);
  // It checks in again: up, and said so once.
  fleet.checkIn(checkIn("a", A));
  assert.equal(fleet.isDead("a"), false);
  assert.equal(fleet.list()[0].state, "up");
  assert.equal(lines.filter((l) => l.msg.startsWith("a node declared dead checked in")).length, 1);
  // And it may die again, announced again.
  clock.tick(600_001);
  fleet.sweep();
  const aDeclared = lines.filter((l) =>
    l.msg.startsWith("node declared dead") && l.fields.nodeId === "a"
  );
  assert.equal(aDeclared.length, 2);
  fleet.close();
});

Deno.test("Fleet.isDead() is never true with deadAfterMs 0, and refuses a negative one", () => {
  const clock = new FakeClock();
  const fleet = new Fleet({ clock });
  fleet.checkIn(checkIn("a", A));
  clock.tick(365 * 86_400_000);
  assert.equal(fleet.isDown("a"), true);
  assert.equal(fleet.isDead("a"), false);
  assert.equal(fleet.list()[0].state, "down");
  fleet.close();
  assert.throws(() => new Fleet({ deadAfterMs: -1 }), /'deadAfterMs' must be 0 or more/);
});

Deno.test("Fleet.isDead() counts no silence before the Fleet was made, and in shared mode none past the last read", () => {
  const clock = new FakeClock();
  const database = new DatabaseSync(":memory:");
  const first = new Fleet({ clock, database, deadAfterMs: 600_000 });
  first.checkIn(checkIn("a", A));
  first.checkIn(checkIn("b", B));
  clock.tick(500_000);
  first.checkIn(checkIn("b", B));
  // A gateway restarted after its own long outage heard nothing meanwhile: it declares no node
  // dead until it has itself waited deadAfterMs (the nodes are about to check in).
  clock.tick(3_600_000);
  const second = new Fleet({ clock, database, deadAfterMs: 600_000 });
  assert.equal(second.isDown("a"), true);
  assert.equal(second.isDead("a"), false);
  clock.tick(600_001);
  assert.equal(second.isDead("a"), true);
  assert.equal(second.isDead("b"), true);
  // A check-in another gateway accepted, as etcd hands it over: dead on the time it was written.
  second.checkIn(checkIn("c", "http://10.0.0.3:3676"), { at: clock.now(), replicated: true });
  second.replicaAsOf(clock.now());
  clock.tick(3_600_000); // etcd unreadable for an hour: "c" may be checking in elsewhere
  assert.equal(second.isDead("c"), false, "no news is not death");
  second.replicaAsOf(clock.now()); // a read that began now had nothing newer
  assert.equal(second.isDead("c"), true);
  first.close();
  second.close();
  database.close();
});

Deno.test("Fleet.list() in shared mode shows a node it cannot hear of down and unheard, while routing still counts it", () => {
  const { fleet, clock } = setup();
  fleet.checkIn(checkIn("far", A, { intervalSeconds: 10 }), { at: clock.now(), replicated: true });
  fleet.checkIn(checkIn("near", B, { intervalSeconds: 10 }));
  fleet.replicaAsOf(clock.now());
  clock.tick(20_000);
  fleet.checkIn(checkIn("near", B, { intervalSeconds: 10 }));
  assert.equal(fleet.isUnheard("far"), false, "exactly two intervals: not yet");
  clock.tick(1);
  // etcd has not been read since: "far" may be checking in elsewhere, or dead.
  assert.equal(fleet.isUnheard("far"), true);
  assert.equal(fleet.isUnheard("near"), false, "heard here");
  assert.equal(fleet.isSilent("far"), false, "routing still serves it (bounded by a probe)");
  assert.deepEqual(fleet.list().map((n) => [n.id, n.state, n.unheard]), [
    ["far", "down", true],
    ["near", "up", false],
  ]);
  // Shown down, but it may live elsewhere and the removal would reach no other gateway.
  assert.throws(() => fleet.removeNode("far"), (error: unknown) => {
    assert.ok(error instanceof HttpError);
    assert.equal(error.status, 503);
    assert.match(error.message, /^Cannot remove node 'far' .*cannot read etcd/);
    return true;
  });
  fleet.replicaAsOf(clock.now()); // a read succeeded and had nothing newer: silent, not unheard
  assert.equal(fleet.isUnheard("far"), false);
  assert.deepEqual(fleet.list().map((n) => [n.id, n.state, n.unheard]), [
    ["far", "down", false],
    ["near", "up", false],
  ]);
  fleet.replicaAsOf(null);
  assert.equal(fleet.isUnheard("far"), false, "never outside shared mode");
  fleet.close();
});

Deno.test("Fleet.checkIn() refuses a body checkInSchema would refuse with a 400 naming the field", () => {
  const fleet = new Fleet();
  try {
    const base = reading();
    for (
      const [body, why] of [
        [checkIn("a", A, { reading: { ...base, cpuCount: 0 } }), /'reading\.cpuCount'/],
        [
          checkIn("a", A, { reading: { ...base, sandboxes: { ...base.sandboxes, active: -1 } } }),
          /'reading\.sandboxes\.active'/,
        ],
        [checkIn("a", "ssh://10.0.0.1:22"), /'endpoint': 'ssh:\/\/10\.0\.0\.1:22' uses ssh:/],
        [checkIn("node a", A), /'nodeId': a node id uses only letters/],
      ] as const
    ) {
      assert.throws(
        () => fleet.checkIn(body),
        (error: unknown) => {
          assert.ok(error instanceof HttpError, String(error));
          assert.equal(error.status, 400);
          assert.match(error.message, /^Cannot take the check-in of '[^']+': /);
          assert.match(error.message, why);
          return true;
        },
      );
    }
    assert.equal([...fleet.nodes()].length, 0, "nothing joined");
    // A valid one still joins, its endpoint as the schema writes it.
    fleet.checkIn(checkIn("a", `${A}/`));
    assert.equal(fleet.get("a")?.endpoint, A);
  } finally {
    fleet.close();
  }
});
