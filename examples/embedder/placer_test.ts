/**
 * The placer alone, as a scheduler that is not a gateway would embed it: a `Fleet` fed check-ins
 * built by hand (no node, no HTTP), a `Placer` over it, and the choice with every rejected node
 * and its reason. Imported only through the package's root entry point.
 */
import assert from "node:assert/strict";
import { type CheckIn, type Clock, Fleet, HttpError, Placer } from "@dormice/cluster";

/** A check-in of a machine with 8 cpus and 16 GB, as a node would send it every 15 s. */
function machine(
  nodeId: string,
  at: number,
  load: { cpuUsedPct?: number; active?: number; diskFreeGB?: number; templates?: string[] } = {},
): CheckIn {
  return {
    nodeId,
    endpoint: `http://${nodeId}.internal:3676`,
    intervalSeconds: 15,
    build: "hand-made",
    templates: load.templates,
    reading: {
      takenAt: at,
      cpuCount: 8,
      cpuUsedPct: load.cpuUsedPct ?? 10,
      memoryTotalBytes: 16e9,
      memoryAvailableBytes: 12e9,
      swapTotalBytes: 0,
      swapFreeBytes: 0,
      dataDisk: {
        path: "/var/lib/dormice",
        totalBytes: 500e9,
        usedBytes: 500e9 - (load.diskFreeGB ?? 200) * 1e9,
        availableBytes: (load.diskFreeGB ?? 200) * 1e9,
      },
      sandboxes: { active: load.active ?? 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    },
  };
}

/** Each rejection as `<node>: <reason>`, sorted. */
function reasons(explain: { rejections: { nodeId: string; reason: string }[] }): string[] {
  return explain.rejections.map((r) => `${r.nodeId}: ${r.reason}`).sort();
}

Deno.test("the placer alone picks among hand-fed machines and names every rejected node's reason", () => {
  let now = 1_800_000_000_000;
  const clock: Clock = { now: () => now };
  const fleet = new Fleet({ clock });
  try {
    // "silent" checks in first, then says nothing for more than two of its 15 s intervals.
    assert.equal(fleet.checkIn(machine("silent", now)), "joined");
    now += 31_000;
    fleet.checkIn(machine("busy", now, { cpuUsedPct: 95 }));
    fleet.checkIn(machine("full", now, { active: 400 }));
    fleet.checkIn(machine("tight", now, { diskFreeGB: 4 }));
    fleet.checkIn(machine("roomy", now, { active: 3 }));
    fleet.checkIn(machine("idle", now, { active: 1 }));

    const placer = new Placer({ fleet, seed: 1 });
    const choice = placer.pick();
    assert.ok(choice.ok, choice.ok ? "" : choice.message);
    assert.equal(choice.node.id, "idle");
    assert.equal(choice.node.endpoint, "http://idle.internal:3676");
    assert.equal(choice.explain.considered, 6);
    assert.equal(choice.explain.feasible, 2);
    assert.deepEqual(reasons(choice.explain), [
      "busy: cpu",
      "full: active-limit",
      "silent: down",
      "tight: disk",
    ]);
    // Each reason is a sentence with the numbers and the setting that moves the limit.
    const busy = choice.explain.rejections.find((r) => r.nodeId === "busy")!;
    assert.match(busy.detail, /95% is above the limit 70%/);

    // The limits are the embedder's: with room for 100% cpu, "busy" is feasible.
    const lenient = new Placer({ fleet, cpuLimitPct: 100, seed: 1 }).pick();
    assert.ok(lenient.ok);
    assert.equal(lenient.explain.feasible, 3);

    // A create that asks for a template only some machines hold.
    fleet.checkIn(machine("idle", now, { active: 1, templates: ["base"] }));
    const python = placer.pick({ template: "python" });
    assert.ok(python.ok);
    assert.equal(python.node.id, "roomy");
    assert.ok(reasons(python.explain).includes("idle: template"));
  } finally {
    fleet.close();
  }
});

Deno.test("the placer alone: when nothing fits, a sentence naming each machine and when to retry", () => {
  const now = 1_800_000_000_000;
  const fleet = new Fleet({ clock: { now: () => now } });
  try {
    fleet.checkIn(machine("busy", now, { cpuUsedPct: 95 }));
    fleet.checkIn(machine("full", now, { active: 400 }));
    const none = new Placer({ fleet }).pick();
    assert.equal(none.ok, false);
    if (none.ok) return;
    assert.match(none.message, /busy/);
    assert.match(none.message, /full/);
    assert.ok(
      none.retryAfterSeconds > 0 && none.retryAfterSeconds <= 15,
      `${none.retryAfterSeconds}`,
    );
    assert.deepEqual(reasons(none.explain), ["busy: cpu", "full: active-limit"]);
  } finally {
    fleet.close();
  }
});

Deno.test("the placer alone: a hand-made check-in the check-in route would refuse is an HttpError 400 naming the field", () => {
  const fleet = new Fleet();
  try {
    const broken = machine("a", Date.now());
    broken.reading.cpuCount = 0;
    assert.throws(() => fleet.checkIn(broken), (error) => {
      assert.ok(error instanceof HttpError);
      assert.equal(error.status, 400);
      assert.match(error.message, /'reading\.cpuCount'/);
      return true;
    });
    assert.equal(fleet.get("a"), undefined, "the refused machine is not a member");
  } finally {
    fleet.close();
  }
});
