/**
 * A Docker sandbox's resource use, from the engine's raw stats sample and container inspect.
 *
 * @module
 */
import type { SandboxStats } from "../contract.ts";
import type { ContainerInspect, StatsSample } from "./engine.ts";

/** The last CPU sample of one sandbox, for a delta on the next stats call. */
export interface CpuSample {
  cpu: number;
  system: number;
}

/**
 * A sandbox's resource use from one stats sample and its inspect. CPU is the delta against the
 * previous sample of the same sandbox when there is one, else the average since the container
 * started; memory leaves out the page cache the kernel may reclaim.
 */
export function usageOf(
  sample: StatsSample,
  inspect: ContainerInspect,
  previous: CpuSample | undefined,
  takenAt: number,
): { stats: SandboxStats; cpu: CpuSample } {
  const cpu = Number(sample.cpu_stats?.cpu_usage?.total_usage ?? 0);
  const system = Number(sample.cpu_stats?.system_cpu_usage ?? 0);
  const online = Number(sample.cpu_stats?.online_cpus ?? 1) || 1;
  let cpuUsedPct = 0;
  if (previous && system > previous.system) {
    cpuUsedPct = ((cpu - previous.cpu) / (system - previous.system)) * online * 100;
  } else {
    // No earlier sample: the average since the container started.
    const started = Date.parse(inspect.State?.StartedAt ?? "");
    const elapsedNs = (Date.now() - started) * 1e6;
    if (elapsedNs > 0) cpuUsedPct = (cpu / elapsedNs) * 100;
  }
  const memoryStats = sample.memory_stats ?? {};
  const cache = Number(
    memoryStats.stats?.inactive_file ?? memoryStats.stats?.total_inactive_file ?? 0,
  );
  const nanoCpus = Number(inspect.HostConfig?.NanoCpus ?? 0);
  return {
    cpu: { cpu, system },
    stats: {
      takenAt,
      cpuUsedPct: Math.max(0, Math.round(cpuUsedPct * 100) / 100),
      cpuCount: nanoCpus > 0 ? Math.max(1, Math.ceil(nanoCpus / 1e9)) : online,
      memoryUsedBytes: Math.max(0, Number(memoryStats.usage ?? 0) - cache),
      memoryLimitBytes: Number(inspect.HostConfig?.Memory ?? 0),
      diskUsedBytes: Number(inspect.SizeRw ?? 0),
    },
  };
}
