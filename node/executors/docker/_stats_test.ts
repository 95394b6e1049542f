import assert from "node:assert/strict";
import { usageOf } from "./_stats.ts";

Deno.test("usageOf() measures CPU against the previous sample and leaves out the page cache", () => {
  const { stats, cpu } = usageOf(
    {
      cpu_stats: { cpu_usage: { total_usage: 1.5e9 }, system_cpu_usage: 12e9, online_cpus: 2 },
      memory_stats: { usage: 100 * 2 ** 20, stats: { inactive_file: 30 * 2 ** 20 } },
    },
    { HostConfig: { NanoCpus: 1.5e9, Memory: 512 * 2 ** 20 }, SizeRw: 4096 },
    { cpu: 1e9, system: 10e9 },
    1_700_000_000_000,
  );
  // (1.5e9 - 1e9) / (12e9 - 10e9) of the host's time, times its 2 cores: 50 % of one core.
  assert.equal(stats.cpuUsedPct, 50);
  // 1.5 cores of quota round up to 2 usable cores.
  assert.equal(stats.cpuCount, 2);
  assert.equal(stats.memoryUsedBytes, 70 * 2 ** 20);
  assert.equal(stats.memoryLimitBytes, 512 * 2 ** 20);
  assert.equal(stats.diskUsedBytes, 4096);
  assert.equal(stats.takenAt, 1_700_000_000_000);
  assert.deepEqual(cpu, { cpu: 1.5e9, system: 12e9 });
});
