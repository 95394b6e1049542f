/**
 * The E2B metrics wire: a sample as `SandboxMetric` and the `start`/`end` range of
 * `GET /sandboxes/{id}/metrics` (the `sandbox_ids` list is read by `shared/e2b_metrics_ids.ts`,
 * which the gateway reads too).
 *
 * @module
 */
import { HttpError } from "../../shared/http_error.ts";
import type { SandboxStats } from "../executors/contract.ts";

/** E2B's `SandboxMetric`. */
export interface E2bMetric {
  /** ISO 8601 (deprecated by E2B, still read by older SDKs). */
  timestamp: string;
  /** Seconds since the epoch. */
  timestampUnix: number;
  /** Cores the sandbox has. */
  cpuCount: number;
  /** CPU used, percent. */
  cpuUsedPct: number;
  /** Memory used, bytes. */
  memUsed: number;
  /** Memory limit, bytes. */
  memTotal: number;
  /** Page cache, bytes (not measured: 0). */
  memCache: number;
  /** Disk used, bytes. */
  diskUsed: number;
  /** Disk size, bytes (not measured: 0). */
  diskTotal: number;
}

/**
 * A sample as E2B's `SandboxMetric`, its time cut to the second.
 *
 * @example
 * ```ts
 * import { e2bMetric } from "./e2b_metrics.ts";
 * e2bMetric({
 *   takenAt: 1_700_000_000_500, cpuUsedPct: 3, cpuCount: 1, memoryUsedBytes: 8, memoryLimitBytes: 16,
 *   diskUsedBytes: 0,
 * }).timestampUnix; // 1700000000
 * ```
 */
export function e2bMetric(m: SandboxStats): E2bMetric {
  // Whole seconds, as E2B's buckets are: the SDK rounds a range's ends to seconds, so a
  // sample's own time given back as `start` must not round past the sample.
  const seconds = Math.floor(m.takenAt / 1000);
  return {
    timestamp: new Date(seconds * 1000).toISOString(),
    timestampUnix: seconds,
    cpuCount: m.cpuCount,
    cpuUsedPct: m.cpuUsedPct,
    memUsed: m.memoryUsedBytes,
    memTotal: m.memoryLimitBytes,
    memCache: 0,
    diskUsed: m.diskUsedBytes,
    diskTotal: 0,
  };
}

/**
 * The range of `start` and `end` (unix seconds, as the SDK rounds them) in ms, both ends
 * included to the end of their second; absent ends are open.
 *
 * @throws {HttpError} 400 naming a bound that is not a whole number of seconds, or a range
 * that ends before it starts.
 * @example
 * ```ts
 * import { parseMetricsRange } from "./e2b_metrics.ts";
 * parseMetricsRange("10", "20"); // { fromMs: 10000, toMs: 20999 }
 * ```
 */
export function parseMetricsRange(
  start: string | undefined,
  end: string | undefined,
): { fromMs?: number; toMs?: number } {
  const seconds = (raw: string | undefined, name: string) => {
    if (raw === undefined || raw === "") return undefined;
    const n = Number(raw);
    if (!/^\d{1,12}$/.test(raw) || !Number.isSafeInteger(n)) {
      throw new HttpError(
        400,
        `'${name}' must be unix seconds, a whole number: received '${raw.slice(0, 30)}'`,
      );
    }
    return n;
  };
  const from = seconds(start, "start");
  const to = seconds(end, "end");
  if (from !== undefined && to !== undefined && to < from) {
    throw new HttpError(400, `'end' (${to}) is before 'start' (${from}): swap them`);
  }
  return {
    ...(from === undefined ? {} : { fromMs: from * 1000 }),
    ...(to === undefined ? {} : { toMs: to * 1000 + 999 }),
  };
}
