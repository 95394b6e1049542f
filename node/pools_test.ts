import assert from "node:assert/strict";
import { join } from "node:path";
import { FakeClock } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { WarmPools, type WarmPoolsOptions } from "./pools.ts";
import type { PoolTarget } from "../shared/pools.ts";
import { SandboxService } from "./service.ts";

function setup(options: Partial<WarmPoolsOptions> = {}) {
  const ledger = Ledger.inMemory({ nodeId: "n1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor();
  const clock = new FakeClock();
  // The refill after a claim at once, unless a case is about its delay.
  const pools = new WarmPools({
    ledger,
    executor,
    clock,
    setTimer: () => {},
    claimRefillDelayMs: 0,
    ...options,
  });
  // The service's own executor calls, apart from the refill's (which goes to `executor`).
  const serviceCalls: string[] = [];
  const counted = new Proxy(executor, {
    get(target, property) {
      const value = Reflect.get(target, property);
      if (typeof value !== "function") return value;
      return (...args: unknown[]) => {
        serviceCalls.push(String(property));
        return value.apply(target, args);
      };
    },
  });
  const service = new SandboxService({ ledger, executor: counted, clock, pools });
  return { ledger, executor, clock, pools, service, serviceCalls };
}

Deno.test("WarmPools.set() fills each pool to its target, each sandbox probed first", async () => {
  const { pools, executor, ledger } = setup();
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 3 }, {
    template: "minimal",
    spec: { cpus: 2 },
    warm: 1,
  }]);
  await pools.settled();
  assert.deepEqual(pools.list().map((p) => [p.template, p.warm, p.target, p.refilling]), [
    ["base", 3, 3, 0],
    ["minimal", 1, 1, 0],
  ]);
  assert.equal(executor.hooks.calls.create, 4);
  // The probe is one exec per warm sandbox.
  assert.equal(executor.hooks.calls.exec, 4);
  assert.equal(ledger.warmRows().length, 4);
  // Warm sandboxes are nobody's: not in the census, not in any team's count.
  assert.equal(ledger.census().active, 0);
  assert.deepEqual(ledger.teamCounts(), {});
  assert.equal(pools.warmCount(), 4);
});

Deno.test("SandboxService.acquire() claims a warm sandbox with no engine call", async () => {
  const { pools, service, ledger, clock, serviceCalls, executor } = setup();
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 2 }]);
  await pools.settled();
  // The identity files are written after the claim is answered, in the name's slot: held
  // here, the claim is answered all the same.
  const releaseExec = executor.hooks.park("exec");
  const { created, sandbox } = await service.acquire({
    name: "agent-1",
    team: "acme",
    metadata: { job: "7" },
    env: { GREETING: "hello" },
    deadline: { ms: 60_000, action: "kill" },
  });
  // Answered while the identity write is still parked: the claim does not wait for it.
  assert.equal(created, true);
  assert.deepEqual(
    serviceCalls.filter((call) => call !== "exec"),
    [],
    "no executor call on the claim path (the identity write comes after it)",
  );
  releaseExec();
  assert.equal(sandbox.name, "agent-1");
  assert.equal(sandbox.team, "acme");
  assert.deepEqual(sandbox.metadata, { job: "7" });
  assert.equal(sandbox.deadlineAt, clock.now() + 60_000);
  assert.equal(ledger.warmRows().length, 1);
  assert.deepEqual(ledger.teamCounts(), { acme: 1 });
  // The env the claim recorded reaches every later command (the container predates it).
  const r = await service.execCommand({ name: "agent-1", team: "acme" }, {
    cmd: ["sh", "-c", "echo $GREETING"],
  });
  assert.equal(r.stdout, "hello\n");
  await pools.settled();
  assert.equal(pools.list()[0].warm, 2, "refilled after the claim");
  assert.equal(pools.list()[0].claimed, 1);
});

Deno.test("SandboxService.acquire() builds cold on a miss: no pool, empty pool, other size", async () => {
  const { pools, executor, service } = setup();
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 1 }]);
  await pools.settled();
  const before = executor.hooks.calls.create;
  await service.acquire({ name: "other-template", template: "minimal" });
  await service.acquire({ name: "other-size", spec: { cpus: 2 } });
  await service.acquire({ name: "with-network", spec: { network: true } });
  // Address rules alone: a warm sandbox has neither egress nor rules.
  const ruled = await service.acquire({
    name: "with-rules",
    spec: { egressRules: { allowOut: [], denyOut: ["10.0.0.0/8"] } },
  });
  assert.deepEqual(executor.egressRulesOf(ruled.sandbox.id), {
    allowOut: [],
    denyOut: ["10.0.0.0/8"],
  });
  assert.equal(executor.hooks.calls.create - before, 4);
  assert.equal(pools.list()[0].warm, 1, "none of them took the warm one");
  // Two claims against a pool of one: the second is cold, never a failure.
  executor.hooks.park("create");
  const first = await service.acquire({ name: "w1" });
  const second = service.acquire({ name: "w2" });
  await executor.hooks.parked("create", 2); // the refill and the cold create
  executor.hooks.clear();
  assert.equal(first.created, true);
  assert.equal((await second).created, true);
  await pools.settled();
});

Deno.test("WarmPools.kick() coalesces a burst of claims into one refill wave", async () => {
  const { pools, service } = setup({ concurrency: 2 });
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 5 }]);
  await pools.settled();
  const waves = pools.waves;
  await Promise.all([1, 2, 3, 4].map((i) => service.acquire({ name: `c${i}` })));
  await pools.settled();
  // One wave for the burst; builds that finish start the next ones within it, two at a time.
  assert.equal(pools.waves - waves, 1);
  assert.equal(pools.list()[0].warm, 5);
});

Deno.test("WarmPools refills a claim's pool only after the claim's delay, once for a burst", async () => {
  const timers: { fn: () => void; ms: number }[] = [];
  const { pools, service, executor } = setup({
    claimRefillDelayMs: 1000,
    setTimer: (fn, ms) => timers.push({ fn, ms }),
  });
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 3 }]);
  await pools.settled();
  const built = executor.hooks.calls.create;
  await service.acquire({ name: "first" });
  await service.acquire({ name: "second" });
  await pools.settled();
  // The claimed sandboxes' first commands have the engine to themselves: no build yet.
  assert.equal(executor.hooks.calls.create, built, "no refill right after the claims");
  assert.deepEqual(timers.map((t) => t.ms), [1000], "one delayed refill for both claims");
  timers[0].fn();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, built + 2);
  assert.equal(pools.list()[0].warm, 3);
});

Deno.test("WarmPools backs off a failing pool and logs the failure once per change", async () => {
  const lines: string[] = [];
  const log: Log = (level, msg) => lines.push(`${level} ${msg}`);
  const { pools, executor, clock } = setup({ log, backoffBaseMs: 1000, concurrency: 1 });
  executor.hooks.fail("create", new Error("engine is sad"), 3);
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 1 }]);
  await pools.settled();
  assert.equal(executor.hooks.calls.create, 1);
  pools.kick();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, 1, "still in backoff: no attempt");
  clock.tick(1000);
  pools.kick();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, 2);
  clock.tick(1999);
  pools.kick();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, 2, "the second wait is twice the first");
  clock.tick(1);
  pools.kick();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, 3);
  assert.equal(lines.filter((l) => l.includes("refill failed")).length, 1);
  clock.tick(4000);
  pools.kick();
  await pools.settled();
  assert.equal(pools.list()[0].warm, 1, "recovers once the engine does");
});

Deno.test("WarmPools: a sandbox that fails its probe never joins and is removed", async () => {
  let probes = 0;
  const { pools, executor } = setup({
    probe: () => {
      probes++;
      return probes === 1 ? Promise.reject(new Error("probe failed")) : Promise.resolve();
    },
  });
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 1 }]);
  await pools.settled();
  assert.equal(pools.list()[0].warm, 0);
  assert.equal(executor.hooks.calls.destroy, 1);
  assert.deepEqual(await executor.list(), []);
});

Deno.test("SandboxService.reconcile() keeps warm containers, WarmPools.start() adopts them", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "pools.json");
    const ledger = Ledger.inMemory({ nodeId: "n1", endpoint: "http://127.0.0.1:3676" });
    const executor = new FakeExecutor();
    const first = new WarmPools({ ledger, executor, file });
    await first.start();
    await first.set([{ template: "base", spec: {}, warm: 2 }]);
    await first.settled();
    await first.close();
    // A container a crash left mid-build: no row of any kind.
    await executor.create({ id: "sbx_orphan", name: "x", template: "base", spec: {}, env: {} });
    const service = new SandboxService({ ledger, executor });
    const { removed } = await service.reconcile();
    assert.deepEqual(removed, ["sbx_orphan"]);
    const again = new WarmPools({ ledger, executor, file });
    await again.start();
    await again.settled();
    assert.equal(again.list()[0].warm, 2, "pools.json seeded the target, the rows the warm");
    assert.equal((await executor.list()).length, 2, "no new container, no orphan");
    assert.deepEqual(JSON.parse(await Deno.readTextFile(file)), {
      pools: [{ template: "base", spec: {}, warm: 2 }],
    });
    await again.close();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("WarmPools.set() empties a dropped pool and refuses a bad target", async () => {
  const { pools, executor } = setup();
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 2 }]);
  await pools.settled();
  await pools.set([]);
  await pools.settled();
  assert.deepEqual(await executor.list(), []);
  await assert.rejects(
    () => pools.set([{ template: "base", spec: {}, warm: 1000 }]),
    /Invalid pools: 'pools\.0\.warm': must be at most 256/,
  );
  await assert.rejects(
    () =>
      pools.set([{ template: "base", spec: {}, warm: 1 }, { template: "base", spec: {}, warm: 2 }]),
    /listed twice/,
  );
});

Deno.test("SandboxService.acquire() served by a claim keeps the E2B lifecycle it was asked for", async () => {
  const { pools, service } = setup();
  await pools.start();
  await pools.set([{ template: "base", spec: {}, warm: 1 }]);
  await pools.settled();
  const e2b = { onTimeout: "pause" as const, autoResume: true, timeoutSeconds: 60 };
  const { sandbox } = await service.acquire({
    name: "agent-2",
    deadline: { ms: 60_000, action: "pause" },
    e2b,
  });
  assert.equal(pools.list()[0].claimed, 1, "the create was served by a claim");
  assert.equal(sandbox.e2b.autoResume, true);
  assert.equal(sandbox.e2b.onTimeout, "pause");
});

Deno.test("WarmPools.set() sent again while a pool refills leaves the refill's count true", async () => {
  // The gateway's fan-out protocol is "send the whole set again to the nodes that failed", so a
  // node that did apply it sees the same set a second time, often mid-refill.
  const lines: string[] = [];
  const log: Log = (level, msg) => lines.push(`${level} ${msg}`);
  const { pools, executor, service, clock } = setup({ log, backoffBaseMs: 1000 });
  await pools.start();
  const targets = [{ template: "base", spec: {}, warm: 1 }];
  const release = executor.hooks.park("create");
  await pools.set(targets);
  await executor.hooks.parked("create");
  assert.equal(pools.list()[0].refilling, 1, "the build is in flight");
  await pools.set(targets);
  release();
  await pools.settled();
  assert.deepEqual(pools.list().map((p) => [p.warm, p.refilling]), [[1, 0]]);

  // A claim must start a refill: a count left at 1 would hold the pool empty for ever.
  await service.acquire({ name: "c1" });
  assert.equal(pools.list()[0].claimed, 1, "the create was served by a claim");
  await pools.settled();
  assert.deepEqual(pools.list().map((p) => [p.warm, p.refilling]), [[1, 0]], "refilled");

  // A build failing after a set sent again still puts the pool in backoff.
  const parkAgain = executor.hooks.park("create");
  await service.acquire({ name: "c2" });
  await executor.hooks.parked("create");
  executor.hooks.fail("create", new Error("engine is sad"), 5);
  await pools.set(targets);
  parkAgain();
  await pools.settled();
  const attempts = executor.hooks.calls.create;
  pools.kick();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, attempts, "still in backoff: no attempt");
  assert.equal(lines.filter((l) => l.includes("refill failed")).length, 1);
  clock.tick(1000);
  pools.kick();
  await pools.settled();
  assert.equal(executor.hooks.calls.create, attempts + 1, "retried after the backoff");
});

Deno.test("WarmPools.start() says it seeded from pools.json, and warns when DORMICE_POOLS differs", async () => {
  const dir = await Deno.makeTempDir();
  try {
    const file = join(dir, "pools.json");
    const boot = async (initial: PoolTarget[]) => {
      const lines: { level: string; msg: string; fields?: Record<string, unknown> }[] = [];
      const log: Log = (level, msg, fields) => lines.push({ level, msg, fields });
      const ledger = Ledger.inMemory({ nodeId: "n1", endpoint: "http://127.0.0.1:3676" });
      const pools = new WarmPools({ ledger, executor: new FakeExecutor(), file, initial, log });
      await pools.start();
      await pools.close();
      return { lines, targets: pools.list().map((p) => [p.template, p.spec, p.target]) };
    };
    const env = [{ template: "minimal", spec: {}, warm: 2 }];

    // No file yet: DORMICE_POOLS seeds, and nothing is said of a file.
    const first = await boot(env);
    assert.deepEqual(first.targets, [["minimal", {}, 2]]);
    assert.deepEqual(first.lines.filter((l) => /pools\.json/.test(l.msg)), []);

    await Deno.writeTextFile(
      file,
      JSON.stringify({
        pools: [{ template: "base", spec: { cpus: 1, memoryMB: 512 }, warm: 1 }, {
          template: "minimal",
          spec: { memoryMB: 256 },
          warm: 3,
        }],
      }),
    );
    const seeded = {
      level: "info",
      msg: "warm pools seeded from pools.json, which setPools wrote: it wins over DORMICE_POOLS " +
        "while it exists",
      fields: {
        file,
        pools: "base:1:512=1,minimal::256=3",
        fix: `delete ${file} and restart the node to go back to DORMICE_POOLS`,
      },
    };

    // The file disagrees with DORMICE_POOLS: the seed line, then the warning naming both.
    const disagreeing = await boot(env);
    assert.deepEqual(disagreeing.targets, [["base", { cpus: 1, memoryMB: 512 }, 1], [
      "minimal",
      { memoryMB: 256 },
      3,
    ]]);
    assert.deepEqual(disagreeing.lines, [seeded, {
      level: "warn",
      msg: "pools.json disagrees with DORMICE_POOLS, which is ignored while the file exists",
      fields: {
        file,
        pools: "base:1:512=1,minimal::256=3",
        DORMICE_POOLS: "minimal=2",
        fix: `send setPools with the pools you want (it rewrites ${file}), or delete ${file} ` +
          "and restart the node to use DORMICE_POOLS",
      },
    }]);

    // DORMICE_POOLS unset (the setPools way), or the same pools in another order: no warning.
    assert.deepEqual((await boot([])).lines, [seeded]);
    const same = [
      { template: "minimal", spec: { memoryMB: 256 }, warm: 3 },
      { template: "base", spec: { cpus: 1, memoryMB: 512 }, warm: 1 },
    ];
    assert.deepEqual((await boot(same)).lines, [seeded]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
