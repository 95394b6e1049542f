/**
 * The deadline scanner: kills or pauses E2B sandboxes when their deadline comes, on one timer
 * for the next deadline of the whole ledger.
 *
 * @module
 */
import type { Clock, TimerHandle, Timers } from "../shared/clock.ts";
import { systemClock, systemTimers } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import type { Ledger } from "./ledger.ts";
import type { SandboxService } from "./service.ts";
import type { SandboxRecord } from "./service_contract.ts";

/** Options of {@linkcode DeadlineScanner}. */
export interface DeadlineScannerOptions {
  /** Where the rows past their deadline are found, and whose writes re-arm the timer. */
  ledger: Ledger;
  /** Applies each deadline inside the sandbox's slot. */
  service: Pick<SandboxService, "expireIfDue">;
  /**
   * Seconds between safety sweeps (`DORMICE_SCAN_INTERVAL_SECONDS`): the longest the timer
   * sleeps, so a deadline written behind the ledger object's back is still applied, late.
   */
  intervalSeconds: number;
  /** Decides which deadlines have passed; `systemClock` when absent. */
  clock?: Clock;
  /** The one timer; `systemTimers` when absent (a `FakeClock` serves as both in tests). */
  timers?: Timers;
  /** Where failed deadline actions are logged; `silentLog` when absent. */
  log?: Log;
  /** Deadline actions run at once (engine calls, each in its own slot). Default 8. */
  concurrency?: number;
  /**
   * Hears of each sandbox acted on, with the row as it was before (the metrics count it, the
   * lifecycle outbox tells the gateway). Runs inline in the scan; must not throw.
   */
  onOutcome?: (sandbox: SandboxRecord, outcome: "killed" | "paused" | "failed") => void;
}

/** What one scan did. */
export interface ScanResult {
  /** Ids of the sandboxes destroyed by a `kill` deadline. */
  killed: string[];
  /** Ids of the sandboxes frozen by a `pause` deadline. */
  paused: string[];
  /** Ids whose expiry failed (logged; retried after a backoff). */
  failed: string[];
}

/** The first retry after a failed expiry; it doubles up to the sweep interval. */
const FIRST_RETRY_MS = 1000;

/**
 * Applies E2B deadlines on time. One timer sleeps until the ledger's earliest deadline (never
 * longer than the sweep interval); every ledger write that sets a deadline re-arms it, so a
 * `setTimeout(5)` fires five seconds later, not at the next minute's scan. When it fires,
 * every sandbox past its deadline is destroyed (`kill`) or frozen with its deadline cleared
 * (`pause`), each re-checked inside its slot so a wake that pushed the deadline out meanwhile
 * wins. A failed expiry is logged and retried after a backoff (1 s, doubling up to the sweep
 * interval), which also holds back the timer for the others: an engine that fails one call is
 * likely failing them all.
 *
 * @example
 * ```ts ignore
 * import { DeadlineScanner } from "@dormice/cluster/node";
 * const scanner = new DeadlineScanner({ ledger, service, intervalSeconds: 60 });
 * scanner.start();
 * await scanner.stop();
 * ```
 */
export class DeadlineScanner {
  #options: DeadlineScannerOptions;
  #clock: Clock;
  #timers: Timers;
  #log: Log;
  #sweepMs: number;
  #timer: TimerHandle | undefined;
  #running = false;
  #scanning = false;
  #inFlight: Promise<unknown> | null = null;
  #unsubscribe: (() => void) | null = null;
  #backoffMs = 0;
  #retryAt = 0;
  #armedAt: number | null = null;

  /** Builds the scanner; nothing runs until `start()` or `scanOnce()`. */
  constructor(options: DeadlineScannerOptions) {
    this.#options = options;
    this.#clock = options.clock ?? systemClock;
    this.#timers = options.timers ?? systemTimers;
    this.#log = options.log ?? silentLog;
    this.#sweepMs = options.intervalSeconds * 1000;
  }

  /** When the timer fires next (ms since the epoch), or null when it is not armed. */
  get nextWakeAt(): number | null {
    return this.#armedAt;
  }

  /** Resolves once no scan is in flight (a timer's scan included) and the timer is re-armed. */
  async idle(): Promise<void> {
    for (let seen = this.#inFlight; seen; seen = this.#inFlight) {
      await seen.catch(() => {});
      if (this.#inFlight === seen) return;
    }
  }

  /** Applies every deadline that has passed now. */
  scanOnce(): Promise<ScanResult> {
    const scan = (async () => {
      const result: ScanResult = { killed: [], paused: [], failed: [] };
      const due = this.#options.ledger.pastDeadline(this.#clock.now());
      const outcomes: ("killed" | "paused" | "skipped" | "failed")[] = [];
      let next = 0;
      // A few at a time: each waits for its own slot, so one busy sandbox does not hold back
      // the others, and the engine is not asked to remove hundreds of containers at once.
      const worker = async () => {
        for (let i = next++; i < due.length; i = next++) {
          const sandbox = due[i];
          try {
            const done = await this.#options.service.expireIfDue(sandbox.id);
            outcomes[i] = done;
            if (done !== "skipped") this.#options.onOutcome?.(sandbox, done);
          } catch (error) {
            outcomes[i] = "failed";
            this.#options.onOutcome?.(sandbox, "failed");
            this.#log("error", "deadline action failed; retrying after a backoff", {
              id: sandbox.id,
              name: sandbox.name,
              action: sandbox.deadlineAction,
              error,
            });
          }
        }
      };
      const workers = Math.min(this.#options.concurrency ?? 8, due.length);
      await Promise.all(Array.from({ length: workers }, worker));
      due.forEach((sandbox, i) => {
        if (outcomes[i] === "killed") result.killed.push(sandbox.id);
        if (outcomes[i] === "paused") result.paused.push(sandbox.id);
        if (outcomes[i] === "failed") result.failed.push(sandbox.id);
      });
      return result;
    })();
    this.#inFlight = scan;
    return scan;
  }

  /** Arms the timer and follows the ledger's deadline writes until `stop()`. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    this.#unsubscribe = this.#options.ledger.onChange((change) => {
      if (change.deadline) this.#arm();
    });
    this.#arm();
  }

  /** Stops the timer and waits for a scan in flight. */
  async stop(): Promise<void> {
    this.#running = false;
    this.#unsubscribe?.();
    this.#unsubscribe = null;
    this.#disarm();
    await this.#inFlight?.catch(() => {});
    this.#disarm();
  }

  /** Sets the one timer for the earliest deadline, the retry backoff or the sweep. */
  #arm(): void {
    // A scan re-arms when it ends, having read the deadlines its own writes left.
    if (!this.#running || this.#scanning) return;
    const now = this.#clock.now();
    const next = this.#options.ledger.nextDeadline();
    let at = Math.min(next ?? Infinity, now + this.#sweepMs);
    if (this.#retryAt > now) at = Math.max(at, this.#retryAt);
    at = Math.max(at, now);
    if (this.#timer !== undefined && this.#armedAt === at) return;
    this.#disarm();
    this.#armedAt = at;
    this.#timer = this.#timers.setTimer(() => this.#fire(), at - now);
  }

  #disarm(): void {
    this.#timers.clearTimer(this.#timer);
    this.#timer = undefined;
    this.#armedAt = null;
  }

  #fire(): void {
    this.#timer = undefined;
    this.#armedAt = null;
    if (!this.#running) return;
    this.#scanning = true;
    const scan = this.scanOnce().then(
      (result) => {
        if (result.failed.length > 0) {
          this.#backoffMs = Math.min(
            this.#backoffMs ? this.#backoffMs * 2 : FIRST_RETRY_MS,
            this.#sweepMs,
          );
          this.#retryAt = this.#clock.now() + this.#backoffMs;
        } else {
          this.#backoffMs = 0;
          this.#retryAt = 0;
        }
      },
      // A scan that throws (the ledger went away) must not end the daemon: log, sweep later.
      (error) => this.#log("error", "deadline scan failed", { error }),
    ).finally(() => {
      this.#scanning = false;
      try {
        this.#arm();
      } catch (error) {
        this.#log("error", "the deadline timer could not be re-armed", { error });
      }
    });
    this.#inFlight = scan;
  }
}
