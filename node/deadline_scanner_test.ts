import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { ExecutorError } from "./executors/contract.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { DeadlineScanner } from "./deadline_scanner.ts";
import { SandboxService } from "./service.ts";

function setup() {
  const clock = new FakeClock(1_700_000_000_000);
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor({ clock });
  const service = new SandboxService({ ledger, executor, clock });
  const scanner = new DeadlineScanner({
    ledger,
    service,
    clock,
    timers: clock,
    intervalSeconds: 60,
  });
  const close = async () => {
    await scanner.stop();
    await executor.close();
    ledger.close();
  };
  return { clock, ledger, executor, service, scanner, close };
}

Deno.test("DeadlineScanner.scanOnce() kills and pauses sandboxes past their deadline", async () => {
  const { clock, executor, service, scanner, close } = setup();
  const { sandbox: kill } = await service.acquire({
    name: "k",
    deadline: { ms: 300_000, action: "kill" },
  });
  const { sandbox: pause } = await service.acquire({
    name: "p",
    deadline: { ms: 600_000, action: "pause" },
  });
  await service.acquire({ name: "native" });
  assert.deepEqual(await scanner.scanOnce(), { killed: [], paused: [], failed: [] });
  clock.tick(300_000);
  assert.deepEqual(await scanner.scanOnce(), { killed: [kill.id], paused: [], failed: [] });
  assert.deepEqual(await executor.list(), [pause.id, service.get({ name: "native" })!.id]);
  clock.tick(300_000);
  assert.deepEqual(await scanner.scanOnce(), { killed: [], paused: [pause.id], failed: [] });
  const paused = service.get({ name: "p" })!;
  assert.equal(paused.state, "frozen");
  assert.equal(paused.deadlineAt, null);
  clock.tick(10_000_000);
  assert.deepEqual(await scanner.scanOnce(), { killed: [], paused: [], failed: [] });
  assert.deepEqual(service.list().map((s) => s.name), ["native", "p"]);
  await close();
});

Deno.test("DeadlineScanner: a deadline pushed out by a wake wins over the scan", async () => {
  const { clock, service, scanner, executor, close } = setup();
  await service.acquire({ name: "k", deadline: { ms: 1000, action: "kill" } });
  clock.tick(1000);
  // A verb holds the slot; a wake with a fresh deadline queues, then the scan sees the old row.
  const release = executor.hooks.park("stats");
  const metrics = service.metrics({ name: "k" });
  await executor.hooks.parked("stats");
  const waking = service.acquire({ name: "k", deadline: { ms: 1000, action: "kill" } });
  const scanning = scanner.scanOnce();
  release();
  await metrics;
  assert.equal((await waking).created, false);
  assert.deepEqual(await scanning, { killed: [], paused: [], failed: [] });
  assert.equal(service.get({ name: "k" })?.deadlineAt, clock.now() + 1000);
  await close();
});

Deno.test("DeadlineScanner logs a failed expiry and retries it next scan", async () => {
  const { clock, executor, service, close, ledger } = setup();
  const errors: string[] = [];
  const scanner = new DeadlineScanner({
    ledger,
    service,
    clock,
    intervalSeconds: 60,
    log: (level, msg) => errors.push(`${level} ${msg}`),
  });
  const { sandbox } = await service.acquire({ name: "k", deadline: { ms: 1, action: "kill" } });
  clock.tick(1);
  executor.hooks.fail("destroy", new ExecutorError("unavailable", "Engine down"));
  assert.deepEqual(await scanner.scanOnce(), { killed: [], paused: [], failed: [sandbox.id] });
  assert.deepEqual(errors, ["error deadline action failed; retrying after a backoff"]);
  assert.deepEqual(await scanner.scanOnce(), { killed: [sandbox.id], paused: [], failed: [] });
  scanner.start();
  await scanner.stop();
  await close();
});

Deno.test("DeadlineScanner fires a deadline at its moment, not at the next sweep", async () => {
  const { clock, service, scanner, close } = setup();
  const { sandbox } = await service.acquire({
    name: "k",
    deadline: { ms: 5_000, action: "kill" },
  });
  scanner.start();
  assert.equal(scanner.nextWakeAt, clock.now() + 5_000);
  clock.tick(4_999);
  await scanner.idle();
  assert.ok(service.get({ id: sandbox.id }), "still alive 1 ms before its deadline");
  clock.tick(1);
  await scanner.idle();
  assert.equal(service.get({ id: sandbox.id }), undefined);
  // Nothing left to wait for: the timer sleeps one sweep.
  assert.equal(scanner.nextWakeAt, clock.now() + 60_000);
  await close();
});

Deno.test("DeadlineScanner re-arms when a deadline moves, with one timer for every sandbox", async () => {
  const { clock, service, scanner, close } = setup();
  scanner.start();
  for (let i = 0; i < 50; i++) {
    await service.acquire({ name: `s-${i}`, deadline: { ms: 300_000 + i, action: "kill" } });
  }
  assert.equal(clock.pendingTimers, 1);
  assert.equal(scanner.nextWakeAt, clock.now() + 60_000, "capped at the sweep");
  // setTimeout(2): the deadline moves earlier and the timer follows at once.
  service.setDeadline({ name: "s-7" }, clock.now() + 2_000, "kill");
  assert.equal(scanner.nextWakeAt, clock.now() + 2_000);
  assert.equal(clock.pendingTimers, 1);
  clock.tick(2_000);
  await scanner.idle();
  assert.equal(service.get({ name: "s-7" }), undefined);
  assert.equal(service.list().length, 49);
  // A pause deadline freezes on time too, and clears itself.
  const { sandbox } = await service.acquire({
    name: "p",
    deadline: { ms: 1_000, action: "pause" },
  });
  clock.tick(1_000);
  await scanner.idle();
  assert.equal(service.get({ id: sandbox.id })?.state, "frozen");
  assert.equal(service.get({ id: sandbox.id })?.deadlineAt, null);
  assert.equal(clock.pendingTimers, 1);
  await close();
  assert.equal(clock.pendingTimers, 0, "stop() leaves no timer behind");
});

Deno.test("DeadlineScanner backs off after a failed expiry, then applies it", async () => {
  const { clock, executor, service, scanner, close } = setup();
  const { sandbox } = await service.acquire({
    name: "k",
    deadline: { ms: 1_000, action: "kill" },
  });
  scanner.start();
  executor.hooks.fail("destroy", new ExecutorError("unavailable", "Engine down"), 2);
  clock.tick(1_000);
  await scanner.idle();
  assert.ok(service.get({ id: sandbox.id }));
  // Not a hot loop on a deadline that stays past: the retry waits 1 s, then 2 s.
  assert.equal(scanner.nextWakeAt, clock.now() + 1_000);
  clock.tick(1_000);
  await scanner.idle();
  assert.ok(service.get({ id: sandbox.id }));
  assert.equal(scanner.nextWakeAt, clock.now() + 2_000);
  clock.tick(2_000);
  await scanner.idle();
  assert.equal(service.get({ id: sandbox.id }), undefined);
  await close();
});
