import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { MetricsSampler } from "./metrics_sampler.ts";
import { SandboxService } from "./service.ts";

function setup() {
  const clock = new FakeClock(1_700_000_000_000);
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor({ clock });
  const service = new SandboxService({ ledger, executor, clock });
  const sampler = new MetricsSampler({ ledger, executor, history: service.history, timers: clock });
  const close = async () => {
    await sampler.stop();
    await executor.close();
    ledger.close();
  };
  return { clock, ledger, executor, service, sampler, close };
}

Deno.test("MetricsSampler samples each running sandbox every 5 s on one timer", async () => {
  const { clock, service, sampler, close } = setup();
  const { sandbox: a } = await service.acquire({ name: "a" });
  const { sandbox: b } = await service.acquire({ name: "b" });
  await service.pause({ id: b.id });
  sampler.start();
  for (let i = 0; i < 3; i++) {
    clock.tick(5_000);
    await sampler.idle();
    assert.equal(clock.pendingTimers, 1);
  }
  const taken = service.history.range(a.id).map((s) => s.takenAt - 1_700_000_000_000);
  assert.deepEqual(taken, [5_000, 10_000, 15_000]);
  assert.deepEqual(service.history.range(b.id), [], "a paused sandbox is not sampled");
  await close();
  assert.equal(clock.pendingTimers, 0);
});

Deno.test("MetricsSampler: a destroyed sandbox's history goes, even one removed mid-round", async () => {
  const { clock, ledger, executor, service, sampler, close } = setup();
  const { sandbox: a } = await service.acquire({ name: "a" });
  const { sandbox: b } = await service.acquire({ name: "b" });
  await sampler.sampleOnce();
  assert.deepEqual(service.history.ids().sort(), [a.id, b.id].sort());
  await service.destroy({ id: a.id });
  assert.deepEqual(service.history.ids(), [b.id], "destroy drops it at once");
  // Removed while its stats call is in flight: the late sample is not written back.
  const release = executor.hooks.park("stats");
  clock.tick(5_000);
  const round = sampler.sampleOnce();
  await executor.hooks.parked("stats");
  ledger.delete(b.id);
  release();
  assert.equal(await round, 0);
  assert.equal(service.history.range(b.id).length, 1);
  await sampler.sampleOnce();
  assert.deepEqual(service.history.ids(), [], "a row gone behind the service's back is dropped");
  await close();
});
