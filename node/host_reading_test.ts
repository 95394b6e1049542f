import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { hostReadingSchema } from "../shared/schemas.ts";
import {
  type CpuTimes,
  HostReader,
  type HostSampler,
  sumCpuTimes,
  systemSampler,
} from "./host_reading.ts";

const census = () => ({ active: 2, frozen: 1, stopped: 0, archived: 0, restoring: 0 });

function fakeSampler(samples: CpuTimes[]): HostSampler {
  return {
    cpuCount: () => 4,
    cpuTimes: () => samples.shift() ?? null,
    memory: () => ({
      memoryTotalBytes: 8e9,
      memoryAvailableBytes: 6e9,
      swapTotalBytes: 1e9,
      swapFreeBytes: 1e9,
    }),
    dataDisk: (path) => ({ path, totalBytes: 100, usedBytes: 40, availableBytes: 55 }),
  };
}

Deno.test("sumCpuTimes() adds every core's times", () => {
  const core = { user: 100, nice: 5, sys: 50, idle: 800, irq: 1 };
  assert.deepEqual(sumCpuTimes([{ times: core }, { times: core }]), { idle: 1600, total: 1912 });
  assert.equal(sumCpuTimes([]), null);
});

Deno.test("HostReader: the first cpu reading is null, then the delta between samples", () => {
  const clock = new FakeClock();
  const reader = new HostReader({
    dataDir: "/data",
    census,
    clock,
    sampler: fakeSampler([
      { idle: 1000, total: 2000 },
      { idle: 1050, total: 2100 }, // 500 ms later: too soon, repeats the last value (null)
      { idle: 1075, total: 2200 }, // 1 s after the first: 75 idle of 200 → 62.5 % busy
    ]),
  });
  const first = reader.read();
  assert.equal(first.cpuUsedPct, null);
  assert.deepEqual(hostReadingSchema.parse(first), first);
  clock.tick(500);
  assert.equal(reader.read().cpuUsedPct, null);
  clock.tick(500);
  const third = reader.read();
  assert.equal(third.cpuUsedPct, 62.5);
  assert.equal(third.cpuCount, 4);
  assert.deepEqual(third.sandboxes, census());
  assert.deepEqual(third.dataDisk, {
    path: "/data",
    totalBytes: 100,
    usedBytes: 40,
    availableBytes: 55,
  });
});

Deno.test("systemSampler reads this machine and the schema accepts it", () => {
  const reader = new HostReader({ dataDir: ".", census, minCpuSpanMs: 0 });
  reader.read();
  const reading = reader.read();
  assert.deepEqual(hostReadingSchema.parse(reading), reading);
  assert.ok(reading.memoryTotalBytes > 0);
  assert.ok(reading.dataDisk && reading.dataDisk.totalBytes > 0);
  assert.ok(systemSampler.cpuCount() >= 1);
});
