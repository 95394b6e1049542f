/**
 * The host reading a node reports: cpu, memory, swap, the data disk and the ledger's census.
 *
 * @module
 */
import { statfsSync } from "node:fs";
import { cpus } from "node:os";
import type { Clock } from "../shared/clock.ts";
import { systemClock } from "../shared/clock.ts";
import type { DataDisk, HostReading, StateCounts } from "../shared/schemas.ts";

/** Cumulative cpu time of all cores (any unit, only deltas matter). */
export interface CpuTimes {
  /** Time all cores spent idle. */
  idle: number;
  /** Time all cores spent in any state, idle included. */
  total: number;
}

/** Memory and swap in bytes. */
export interface MemoryReading {
  /** Physical memory installed, bytes. */
  memoryTotalBytes: number;
  /** Memory available to new processes without swapping (`MemAvailable`, else free), bytes. */
  memoryAvailableBytes: number;
  /** Swap configured, bytes (0 when there is none). */
  swapTotalBytes: number;
  /** Swap not in use, bytes. */
  swapFreeBytes: number;
}

/** Where the raw numbers come from; injected so unit tests need no real host. */
export interface HostSampler {
  /** Number of logical cpus the node can use (at least 1). */
  cpuCount(): number;
  /** `null` where the platform does not report cpu times. */
  cpuTimes(): CpuTimes | null;
  /** Current memory and swap figures. */
  memory(): MemoryReading;
  /** `null` when the path cannot be measured. */
  dataDisk(path: string): DataDisk | null;
}

/**
 * Sums the cumulative per-core times `os.cpus()` reports (the kernel's `/proc/stat`, read by the
 * runtime: Deno 2.9 lets a script read `/proc` only with `--allow-all`, while this needs only
 * `--allow-sys=cpus`).
 *
 * @example
 * ```ts
 * import { sumCpuTimes } from "./host_reading.ts";
 * import { cpus } from "node:os";
 * const times = sumCpuTimes(cpus()); // { idle, total } or null
 * ```
 */
export function sumCpuTimes(
  cores: { times: { user: number; nice: number; sys: number; idle: number; irq: number } }[],
): CpuTimes | null {
  if (cores.length === 0) return null;
  let idle = 0;
  let total = 0;
  for (const { times: t } of cores) {
    idle += t.idle;
    total += t.user + t.nice + t.sys + t.idle + t.irq;
  }
  return { idle, total };
}

/**
 * The real sampler: `os.cpus()`, `Deno.systemMemoryInfo()` (both from `/proc` on Linux) and
 * `statfs` of the data dir. Requires `--allow-sys=cpus,systemMemoryInfo,statfs` and `--allow-read` on
 * the data dir.
 */
export const systemSampler: HostSampler = {
  cpuCount: () => navigator.hardwareConcurrency || 1,
  cpuTimes: () => {
    try {
      return sumCpuTimes(cpus());
    } catch {
      return null;
    }
  },
  memory: () => {
    const m = Deno.systemMemoryInfo();
    return {
      memoryTotalBytes: m.total,
      memoryAvailableBytes: m.available || m.free,
      swapTotalBytes: m.swapTotal,
      swapFreeBytes: m.swapFree,
    };
  },
  dataDisk: (path) => {
    try {
      const s = statfsSync(path);
      return {
        path,
        totalBytes: s.blocks * s.bsize,
        usedBytes: (s.blocks - s.bfree) * s.bsize,
        availableBytes: s.bavail * s.bsize,
      };
    } catch {
      return null;
    }
  },
};

/** Options of {@linkcode HostReader}. */
export interface HostReaderOptions {
  /** The data dir whose disk is reported. */
  dataDir: string;
  /** The ledger's census by state. */
  census: () => StateCounts;
  /** Running sandboxes per team (the ledger's `teamCounts`); left out of the reading when absent. */
  teams?: () => Record<string, number>;
  /** Warm pool sandboxes ready now, reported apart from the census; omitted when absent. */
  warm?: () => number;
  /** The ledger's change number (`Ledger.changeSeq`), read with `teams`; omitted when absent. */
  ledgerSeq?: () => number;
  /** Source of the raw numbers ({@linkcode systemSampler} by default). */
  sampler?: HostSampler;
  /** Stamps `takenAt` and measures the cpu span ({@linkcode systemClock} by default). */
  clock?: Clock;
  /**
   * The shortest span a cpu percentage is measured over (1 s): a reading asked sooner after the
   * previous sample repeats the last percentage instead of a number measured over a few ms.
   */
  minCpuSpanMs?: number;
}

/**
 * Takes host readings. The cpu percentage is the busy share of all cores between two samples of
 * the kernel's cpu times; the first reading is `null`, never a number measured over a few milliseconds.
 *
 * @example
 * ```ts ignore
 * import { HostReader } from "@dormice/cluster/node";
 * const reader = new HostReader({ dataDir: ".", census: () => ledger.census() });
 * reader.read().cpuUsedPct; // null the first time
 * ```
 */
export class HostReader {
  #options: Required<
    Omit<HostReaderOptions, "sampler" | "clock" | "teams" | "warm" | "ledgerSeq">
  >;
  #teams?: () => Record<string, number>;
  #ledgerSeq?: () => number;
  #warm?: () => number;
  #sampler: HostSampler;
  #clock: Clock;
  #baseline: { at: number; times: CpuTimes } | null = null;
  #lastPct: number | null = null;

  /** Builds a reader; no sample is taken until the first `read()`. */
  constructor(options: HostReaderOptions) {
    this.#options = {
      dataDir: options.dataDir,
      census: options.census,
      minCpuSpanMs: options.minCpuSpanMs ?? 1000,
    };
    this.#teams = options.teams;
    this.#ledgerSeq = options.ledgerSeq;
    this.#warm = options.warm;
    this.#sampler = options.sampler ?? systemSampler;
    this.#clock = options.clock ?? systemClock;
  }

  /**
   * Takes a reading now. Its cpu % is measured since the previous call (null on the first, and
   * the previous answer again when less than `minCpuSpanMs` passed).
   */
  read(): HostReading {
    const now = this.#clock.now();
    return {
      takenAt: now,
      cpuCount: Math.max(1, Math.trunc(this.#sampler.cpuCount())),
      cpuUsedPct: this.#cpu(now),
      ...this.#sampler.memory(),
      dataDisk: this.#sampler.dataDisk(this.#options.dataDir),
      sandboxes: this.#options.census(),
      ...(this.#teams ? { teams: this.#teams() } : {}),
      ...(this.#ledgerSeq ? { ledgerSeq: this.#ledgerSeq() } : {}),
      ...(this.#warm ? { warm: this.#warm() } : {}),
    };
  }

  #cpu(now: number): number | null {
    const times = this.#sampler.cpuTimes();
    if (times === null) return null;
    const base = this.#baseline;
    if (base === null) {
      this.#baseline = { at: now, times };
      return null;
    }
    if (now - base.at < this.#options.minCpuSpanMs) return this.#lastPct;
    const total = times.total - base.times.total;
    const idle = times.idle - base.times.idle;
    this.#baseline = { at: now, times };
    if (total <= 0) return this.#lastPct;
    const pct = Math.round(Math.min(100, Math.max(0, (1 - idle / total) * 100)) * 10) / 10;
    this.#lastPct = pct;
    return pct;
  }
}
