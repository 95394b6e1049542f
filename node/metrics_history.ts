/**
 * A short history of each sandbox's resource use, so E2B's metrics call can answer a time range
 * instead of one sample taken at the moment of the call.
 *
 * @module
 */
import type { SandboxStats } from "./executors/contract.ts";

/** Options of {@linkcode MetricsHistory}. */
export interface MetricsHistoryOptions {
  /**
   * Samples kept per sandbox, oldest dropped first. Default 120: ten minutes at the sampler's
   * 5 s, about 10 KiB a sandbox, so 400 sandboxes hold about 4 MiB.
   */
  capacity?: number;
}

/**
 * Samples per sandbox id, each list in time order and at most `capacity` long. Eviction: the
 * oldest sample goes when a new one comes past the cap, and a sandbox's whole list goes with
 * `drop(id)` (the sampler calls it when the ledger deletes the row).
 *
 * @example
 * ```ts
 * import { MetricsHistory } from "./metrics_history.ts";
 * const history = new MetricsHistory({ capacity: 2 });
 * for (const takenAt of [1_000, 2_000, 3_000]) {
 *   history.add("sbx_1", {
 *     takenAt, cpuUsedPct: 0, cpuCount: 1, memoryUsedBytes: 1, memoryLimitBytes: 2, diskUsedBytes: 0,
 *   });
 * }
 * history.range("sbx_1").map((s) => s.takenAt); // [2000, 3000]
 * ```
 */
export class MetricsHistory {
  #capacity: number;
  #samples = new Map<string, SandboxStats[]>();

  /** An empty history. */
  constructor({ capacity = 120 }: MetricsHistoryOptions = {}) {
    if (!Number.isInteger(capacity) || capacity < 1) {
      throw new RangeError(
        `Cannot create MetricsHistory as 'capacity' must be a positive integer: received ${capacity}`,
      );
    }
    this.#capacity = capacity;
  }

  /** Appends a sample; one not newer than the sandbox's last is ignored (time stays ordered). */
  add(id: string, sample: SandboxStats): void {
    let list = this.#samples.get(id);
    if (!list) this.#samples.set(id, list = []);
    const last = list.at(-1);
    if (last && sample.takenAt <= last.takenAt) return;
    list.push(sample);
    if (list.length > this.#capacity) list.splice(0, list.length - this.#capacity);
  }

  /** The samples taken from `fromMs` to `toMs` (both included, ms since the epoch), oldest first. */
  range(id: string, fromMs = -Infinity, toMs = Infinity): SandboxStats[] {
    return (this.#samples.get(id) ?? []).filter((s) => s.takenAt >= fromMs && s.takenAt <= toMs);
  }

  /** The newest sample, or undefined when there is none. */
  latest(id: string): SandboxStats | undefined {
    return this.#samples.get(id)?.at(-1);
  }

  /** Forgets a sandbox's samples. */
  drop(id: string): void {
    this.#samples.delete(id);
  }

  /** The ids that have samples. */
  ids(): string[] {
    return [...this.#samples.keys()];
  }
}
