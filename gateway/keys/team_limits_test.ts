import assert from "node:assert/strict";
import { FakeClock } from "../../shared/clock.ts";
import { HttpError } from "../../shared/http_error.ts";
import type { HostReading } from "../../shared/schemas.ts";
import { Fleet } from "../fleet/fleet.ts";
import type { ApiKeyInfo } from "./keys.ts";
import { TeamLimits } from "./team_limits.ts";
import type {
  LedgerEntry,
  LedgerVerdict,
  RateBucket,
  TeamLedger,
  TeamRecord,
} from "./team_ledger.ts";

function reading(teams: Record<string, number>, ledgerSeq?: number): HostReading {
  return {
    ...(ledgerSeq === undefined ? {} : { ledgerSeq }),
    takenAt: 0,
    cpuCount: 4,
    cpuUsedPct: null,
    memoryTotalBytes: 8e9,
    memoryAvailableBytes: 4e9,
    swapTotalBytes: 0,
    swapFreeBytes: 0,
    dataDisk: null,
    sandboxes: { active: 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    teams,
  };
}

function key(extra: Partial<ApiKeyInfo>): ApiKeyInfo {
  return {
    id: "key_0000000000000001",
    team: "acme",
    label: null,
    maxSandboxes: null,
    createsPerMinute: null,
    createdAt: "",
    lastUsedAt: null,
    ...extra,
  };
}

function setup() {
  const clock = new FakeClock(1_700_000_000_000);
  const fleet = new Fleet({ clock });
  const checkIn = (nodeId: string, teams: Record<string, number>, ledgerSeq?: number) =>
    fleet.checkIn({
      nodeId,
      endpoint: `http://10.0.0.${nodeId.length}:3676`,
      intervalSeconds: 5,
      build: "t",
      reading: reading(teams, ledgerSeq),
    });
  return { clock, fleet, checkIn, limits: new TeamLimits({ fleet, clock }) };
}

Deno.test("TeamLimits.running() sums the readings, then the gateway's own work since each", () => {
  const { fleet, checkIn, limits } = setup();
  checkIn("a", { acme: 2, other: 5 });
  checkIn("bb", { acme: 1 });
  assert.equal(limits.running("acme"), 3);
  const admitted = limits.admit(key({ maxSandboxes: 10 }), "acme");
  assert.equal(limits.running("acme"), 4, "a create in flight counts");
  admitted.placed("a");
  assert.equal(limits.running("acme"), 4, "placed: counted against node a until its reading");
  limits.destroyed("bb", "acme");
  assert.equal(limits.running("acme"), 3);
  checkIn("a", { acme: 3 });
  assert.equal(limits.running("acme"), 3, "the new reading already holds the placement");
  assert.equal(limits.running("other"), 0);
  fleet.close();
});

Deno.test("TeamLimits.admit() refuses a create at maxSandboxes with E2B's 429, no retry invited", () => {
  const { fleet, checkIn, limits } = setup();
  checkIn("a", { acme: 1 });
  const k = key({ maxSandboxes: 2 });
  const first = limits.admit(k, "acme");
  // Removing the in-flight count lets this second concurrent create through (reverse-proved).
  // Only a kill clears the limit, so no Retry-After: the SDK raises at once instead of retrying.
  assert.throws(
    () => limits.admit(k, "acme"),
    (e) =>
      e instanceof HttpError && e.status === 429 && !("retry-after" in e.headers) &&
      /^You have reached the maximum number of concurrent E2B sandboxes \(2\)\. /.test(
        e.message,
      ) && /maxSandboxes 2/.test(e.message),
  );
  first.cancel();
  limits.admit(k, "acme").placed("a");
  assert.throws(() => limits.admit(k, "acme"), HttpError);
  limits.destroyed("a", "acme");
  limits.admit(k, "acme");
  assert.doesNotThrow(() => limits.admit(undefined, "acme"), "the operator has no limits");
  fleet.close();
});

Deno.test("TeamLimits.admit() holds a key to createsPerMinute, one token back per 60/n s", () => {
  const { clock, fleet, checkIn, limits } = setup();
  checkIn("a", {});
  const k = key({ createsPerMinute: 2 });
  limits.admit(k, "acme").placed("a");
  limits.admit(k, "acme").placed("a");
  assert.throws(
    () => limits.admit(k, "acme"),
    (e) => e instanceof HttpError && e.status === 429 && e.headers["retry-after"] === "30",
  );
  clock.tick(30_000);
  limits.admit(k, "acme").cancel();
  // A cancelled create (no node fitted, the node refused) gives its token back.
  limits.admit(k, "acme").placed("a");
  assert.throws(() => limits.admit(k, "acme"), HttpError);
  fleet.close();
});

Deno.test("TeamLimits: a reading taken before a numbered create or destroy, heard after it, still has it added", () => {
  const { clock, checkIn, limits } = setup();
  const k = key({ maxSandboxes: 2 });
  checkIn("a", { acme: 1 }, 10);
  // The create's answer names the node's change number 20; a check-in whose counts were read at
  // 15 arrives after it (the two travel apart): it does not count the new sandbox yet.
  limits.admit(k, "acme").placed("a", 20);
  checkIn("a", { acme: 1 }, 15);
  assert.equal(limits.running("acme"), 2, "the stale reading plus the create it lacks");
  assert.throws(() => limits.admit(k, "acme"), (e) => e instanceof HttpError && e.status === 429);
  checkIn("a", { acme: 2 }, 25);
  assert.equal(limits.running("acme"), 2, "a reading at 25 counts it: not twice");
  // The same for a destroy: a reading from before it still has the sandbox.
  limits.destroyed("a", "acme", 30);
  checkIn("a", { acme: 2 }, 28);
  assert.equal(limits.running("acme"), 1, "the stale reading less the destroy it lacks");
  assert.doesNotThrow(() => limits.admit(k, "acme").cancel());
  checkIn("a", { acme: 1 }, 31);
  assert.equal(limits.running("acme"), 1);
  // A node whose readings never catch up cannot pin the count: 10 minutes at most.
  limits.admit(key({}), "acme").placed("a", 1_000);
  checkIn("a", { acme: 1 }, 40);
  assert.equal(limits.running("acme"), 2);
  clock.tick(10 * 60_000 + 1);
  assert.equal(limits.running("acme"), 1, "past the age bound the reading is taken as it is");
});

Deno.test("TeamLimits: a reading without a change number counts every change before it", () => {
  const { checkIn, limits } = setup();
  checkIn("a", { acme: 1 });
  limits.admit(key({ maxSandboxes: 5 }), "acme").placed("a", 20);
  assert.equal(limits.running("acme"), 2);
  // A node that numbers its readings not (one that predates the number): as before.
  checkIn("a", { acme: 2 });
  assert.equal(limits.running("acme"), 2);
});

/**
 * The shared ledger as etcd keeps it, in memory: every "gateway" (TeamLimits) given it sees the
 * others' records and buckets; `admit` is atomic here as etcd's transaction makes it.
 */
class MemoryLedger implements TeamLedger {
  records = new Map<string, TeamRecord[]>();
  buckets = new Map<string, RateBucket>();
  dropped: string[] = [];
  #n = 0;
  constructor(private clock: FakeClock) {}
  admit(
    team: string,
    rate: { keyId: string; perMinute: number } | undefined,
    decide: (records: TeamRecord[], bucket: RateBucket | undefined) => LedgerVerdict,
  ): Promise<LedgerEntry> {
    const list = this.records.get(team) ?? [];
    const verdict = decide([...list], rate && this.buckets.get(rate.keyId));
    const kept = list.filter((r) => !verdict.drop.includes(r.key));
    this.dropped.push(...verdict.drop);
    const record: TeamRecord = { key: `r${++this.#n}`, t: this.clock.now() };
    kept.push(record);
    this.records.set(team, kept);
    if (rate && verdict.bucket) this.buckets.set(rate.keyId, verdict.bucket);
    return Promise.resolve({
      placed: (node, at) => {
        Object.assign(record, { node, at, t: this.clock.now() });
        return Promise.resolve();
      },
      cancel: () => {
        this.records.set(team, this.records.get(team)!.filter((r) => r !== record));
        return Promise.resolve();
      },
    });
  }
}

Deno.test("TeamLimits.enter(): with a shared ledger, two gateways count each other's creates", async () => {
  const { clock, fleet, checkIn } = setup();
  const ledger = new MemoryLedger(clock);
  const gw1 = new TeamLimits({ fleet, clock, ledger });
  const gw2 = new TeamLimits({ fleet, clock, ledger });
  checkIn("a", { acme: 1 }, 10);
  const k = key({ maxSandboxes: 3 });
  const first = await gw1.enter(k, "acme");
  const second = await gw2.enter(k, "acme");
  // 1 running + 2 in flight, one through each gateway: the third is refused on either.
  for (const gw of [gw1, gw2]) {
    await assert.rejects(
      () => gw.enter(k, "acme"),
      (e) => e instanceof HttpError && e.status === 429 && /Team 'acme' runs 3/.test(e.message),
    );
  }
  // Nothing built: the place is free again, for every gateway.
  second.cancel();
  await gw1.enter(k, "acme").then((a) => a.cancel());
  // Placed at change 20: counted on its node until a reading at 20 or later.
  first.placed("a", 20);
  checkIn("a", { acme: 1 }, 15);
  assert.equal(gw2.running("acme"), 1, "the readings alone");
  await assert.rejects(() => gw2.enter(k, "acme").then(() => gw2.enter(k, "acme")), HttpError);
  assert.equal(ledger.records.get("acme")!.length, 2, "one placed, one in flight");
  ledger.records.get("acme")!.pop(); // the in-flight one, as its cancel would
  checkIn("a", { acme: 2 }, 21);
  // Counted by a reading: not twice, yet kept until every gateway has had 5 s to read it.
  const third = await gw1.enter(k, "acme");
  assert.deepEqual(ledger.dropped, []);
  third.cancel();
  clock.tick(5000);
  (await gw1.enter(k, "acme")).cancel();
  assert.equal(ledger.dropped.length, 1, "the placed record, counted 5 s ago, is dropped");
  // A key without limits writes nothing.
  await gw1.enter(key({}), "acme");
  assert.equal(ledger.records.get("acme")!.length, 0);
  fleet.close();
});

Deno.test("TeamLimits.enter(): createsPerMinute is one bucket for every gateway sharing the ledger", async () => {
  const { clock, fleet } = setup();
  const ledger = new MemoryLedger(clock);
  const gateways = [0, 1, 2].map(() => new TeamLimits({ fleet, clock, ledger }));
  const k = key({ createsPerMinute: 2 });
  await gateways[0].enter(k, "acme");
  await gateways[1].enter(k, "acme");
  await assert.rejects(
    () => gateways[2].enter(k, "acme"),
    (e) =>
      e instanceof HttpError && e.status === 429 && e.headers["retry-after"] === "30" &&
      /createsPerMinute 2\): retry in 30 s/.test(e.message),
  );
  clock.tick(30_000);
  await gateways[2].enter(k, "acme");
  await assert.rejects(() => gateways[0].enter(k, "acme"), HttpError);
  fleet.close();
});
