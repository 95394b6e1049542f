/**
 * The deadline scanner: kills or pauses E2B sandboxes past their deadline.
 *
 * @module
 */
import type { Clock } from "../shared/clock.ts";
import { systemClock } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import type { Ledger } from "./ledger.ts";
import type { SandboxService } from "./service.ts";
import type { SandboxRecord } from "./service_contract.ts";

/** Options of {@linkcode DeadlineScanner}. */
export interface DeadlineScannerOptions {
  /** Where the rows past their deadline are found. */
  ledger: Ledger;
  /** Applies each deadline inside the sandbox's slot. */
  service: Pick<SandboxService, "expireIfDue">;
  /** Seconds between scans (`DORMICE_SCAN_INTERVAL_SECONDS`). */
  intervalSeconds: number;
  /** Decides which deadlines have passed; `systemClock` when absent. */
  clock?: Clock;
  /** Where failed deadline actions are logged; `silentLog` when absent. */
  log?: Log;
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
  /** Ids whose expiry failed (logged; retried at the next scan). */
  failed: string[];
}

/**
 * Every interval, sandboxes whose `deadlineAt` has passed are destroyed (`kill`) or frozen with
 * their deadline cleared (`pause`). Each one is re-checked inside its slot, so a wake that pushed
 * the deadline out in the meantime wins. A failure is logged and retried at the next scan.
 *
 * @example
 * ```ts ignore
 * import { DeadlineScanner } from "@dormice/cluster/node";
 * const scanner = new DeadlineScanner({ ledger, service, intervalSeconds: 60 });
 * await scanner.scanOnce();
 * ```
 */
export class DeadlineScanner {
  #options: DeadlineScannerOptions;
  #clock: Clock;
  #log: Log;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running = false;
  #inFlight: Promise<ScanResult> | null = null;

  /** Builds the scanner; nothing runs until `start()` or `scanOnce()`. */
  constructor(options: DeadlineScannerOptions) {
    this.#options = options;
    this.#clock = options.clock ?? systemClock;
    this.#log = options.log ?? silentLog;
  }

  /** Applies every deadline that has passed now. */
  scanOnce(): Promise<ScanResult> {
    const scan = (async () => {
      const result: ScanResult = { killed: [], paused: [], failed: [] };
      for (const sandbox of this.#options.ledger.pastDeadline(this.#clock.now())) {
        try {
          const done = await this.#options.service.expireIfDue(sandbox.id);
          if (done === "killed") result.killed.push(sandbox.id);
          if (done === "paused") result.paused.push(sandbox.id);
          if (done !== "skipped") this.#options.onOutcome?.(sandbox, done);
        } catch (error) {
          result.failed.push(sandbox.id);
          this.#options.onOutcome?.(sandbox, "failed");
          this.#log("error", "deadline action failed; retrying at the next scan", {
            id: sandbox.id,
            name: sandbox.name,
            action: sandbox.deadlineAction,
            error,
          });
        }
      }
      return result;
    })();
    this.#inFlight = scan;
    return scan;
  }

  /** Scans every interval (timed from the end of the previous scan). */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    const tick = async () => {
      // A scan that throws (the ledger went away) must not end the daemon: log, try again later.
      await this.scanOnce().catch((error) => this.#log("error", "deadline scan failed", { error }));
      if (this.#running) this.#timer = setTimeout(tick, this.#options.intervalSeconds * 1000);
    };
    this.#timer = setTimeout(tick, this.#options.intervalSeconds * 1000);
  }

  /** Stops scanning and waits for a scan in flight. */
  async stop(): Promise<void> {
    this.#running = false;
    clearTimeout(this.#timer);
    await this.#inFlight;
    clearTimeout(this.#timer);
  }
}
