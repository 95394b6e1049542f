/**
 * The metrics sampler: every few seconds, one resource sample of each running sandbox into the
 * {@linkcode MetricsHistory}, as E2B samples its sandboxes.
 *
 * @module
 */
import type { TimerHandle, Timers } from "../shared/clock.ts";
import { systemTimers } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import type { Executor } from "./executors/contract.ts";
import type { Ledger } from "./ledger.ts";
import type { MetricsHistory } from "./metrics_history.ts";

/** Options of {@linkcode MetricsSampler}. */
export interface MetricsSamplerOptions {
  /** Which sandboxes run (sampled) and which are gone (a history left behind is dropped). */
  ledger: Ledger;
  /** Reads one sandbox's use. */
  executor: Pick<Executor, "stats">;
  /** Where the samples go. */
  history: MetricsHistory;
  /** From the end of one round to the start of the next, ms. Default 5000, E2B's bucket. */
  intervalMs?: number;
  /** Stats calls at once (each is two engine calls on Docker). Default 4. */
  concurrency?: number;
  /** `systemTimers` when absent (a `FakeClock` in tests). */
  timers?: Timers;
  /** Where a failing round is logged (when it starts failing and when it recovers). */
  log?: Log;
}

/**
 * Samples every running sandbox each interval, timed from the end of the previous round, so a
 * node with many sandboxes samples each less often rather than piling rounds on the engine.
 * Paused sandboxes are skipped (their history keeps what they did while running). A sandbox
 * destroyed during a round is not written back; the service drops a history at destroy, and
 * each round drops any left without a ledger row.
 *
 * @example
 * ```ts ignore
 * import { MetricsHistory, MetricsSampler } from "@dormice/cluster/node";
 * const sampler = new MetricsSampler({ ledger, executor, history: new MetricsHistory() });
 * sampler.start();
 * await sampler.stop();
 * ```
 */
export class MetricsSampler {
  #options: MetricsSamplerOptions;
  #timers: Timers;
  #log: Log;
  #timer: TimerHandle | undefined;
  #running = false;
  #inFlight: Promise<unknown> | null = null;
  #failing = false;

  /** Builds the sampler; nothing runs until `start()` or `sampleOnce()`. */
  constructor(options: MetricsSamplerOptions) {
    this.#options = options;
    this.#timers = options.timers ?? systemTimers;
    this.#log = options.log ?? silentLog;
  }

  /** Takes one sample of every running sandbox; resolves how many were taken. */
  sampleOnce(): Promise<number> {
    const { ledger, executor, history } = this.#options;
    const round = (async () => {
      // A history whose row is gone (destroyed mid-round, or behind the service's back) goes.
      const rows = ledger.keys();
      const known = new Set(rows.map((r) => r.id));
      for (const id of history.ids()) if (!known.has(id)) history.drop(id);
      const running = rows.filter((r) => r.state === "active" || r.state === "restoring");
      let taken = 0;
      let failures = 0;
      let next = 0;
      const worker = async () => {
        for (let i = next++; i < running.length; i = next++) {
          const { id } = running[i];
          try {
            const sample = await executor.stats(id);
            // Destroyed meanwhile: writing it back would leave a history nobody drops.
            if (ledger.byId(id)) history.add(id, sample), taken++;
          } catch {
            // A sandbox removed between the listing and its call is not a failure.
            if (ledger.byId(id)?.state === "active") failures++;
          }
        }
      };
      const workers = Math.min(this.#options.concurrency ?? 4, running.length);
      await Promise.all(Array.from({ length: workers }, worker));
      const failing = failures > 0 && taken === 0;
      if (failing !== this.#failing) {
        this.#failing = failing;
        this.#log(
          failing ? "warn" : "info",
          failing ? "metrics sampling fails for every sandbox" : "metrics sampling works again",
          { failures },
        );
      }
      return taken;
    })();
    this.#inFlight = round;
    return round;
  }

  /** Samples every interval until `stop()`. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#schedule();
  }

  /** Stops sampling and waits for a round in flight. */
  async stop(): Promise<void> {
    this.#running = false;
    this.#timers.clearTimer(this.#timer);
    await this.#inFlight?.catch(() => {});
    this.#timers.clearTimer(this.#timer);
  }

  /** Resolves once no round is in flight. */
  async idle(): Promise<void> {
    for (let seen = this.#inFlight; seen; seen = this.#inFlight) {
      await seen.catch(() => {});
      if (this.#inFlight === seen) return;
    }
  }

  #schedule(): void {
    this.#timer = this.#timers.setTimer(() => {
      if (!this.#running) return;
      this.sampleOnce()
        .catch((error) => this.#log("error", "a metrics round failed", { error }))
        .finally(() => {
          if (this.#running) this.#schedule();
        });
    }, this.#options.intervalMs ?? 5000);
  }
}
