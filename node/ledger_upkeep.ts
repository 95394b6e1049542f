/**
 * The ledger's background writes: the idle clock flushed in one transaction every few
 * seconds, and the reserve written again once a full disk has room.
 *
 * @module
 */
import { ChangeLog, type Log, silentLog } from "../shared/log.ts";
import type { Ledger } from "./ledger.ts";
import { isDiskFull, LedgerFullError } from "./ledger_space.ts";

/** Options of {@linkcode LedgerUpkeep}. */
export interface LedgerUpkeepOptions {
  /** The ledger to flush. */
  ledger: Ledger;
  /** Where a failing flush and a missing reserve are logged (when they change); `silentLog` when absent. */
  log?: Log;
  /**
   * Between two flushes, ms: 5 s, so a crash loses at most that much of the idle clock (which
   * only orders sandboxes by last use) while a busy node writes once per tick, not per call.
   */
  intervalMs?: number;
}

/**
 * Flushes the ledger's idle clock every interval and restores its reserve when a destroy spent
 * it. A failed flush keeps the clocks in memory for the next tick and is logged when its cause
 * changes, a recovery once; never fatal.
 *
 * @example
 * ```ts
 * import { Ledger } from "./ledger.ts";
 * import { LedgerUpkeep } from "./ledger_upkeep.ts";
 * const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
 * const upkeep = new LedgerUpkeep({ ledger });
 * upkeep.start();
 * await upkeep.stop(); // flushes a last time
 * ledger.close();
 * ```
 */
export class LedgerUpkeep {
  #ledger: Ledger;
  #log: Log;
  #changes: ChangeLog;
  #intervalMs: number;
  #timer: ReturnType<typeof setInterval> | undefined;
  #flushFailing = false;
  #reserveMissing = false;

  /** Builds the loop; nothing runs until `start()`. */
  constructor(options: LedgerUpkeepOptions) {
    this.#ledger = options.ledger;
    this.#log = options.log ?? silentLog;
    this.#changes = new ChangeLog(this.#log);
    this.#intervalMs = options.intervalMs ?? 5_000;
  }

  /** Runs one tick now, then every interval. */
  start(): void {
    if (this.#timer !== undefined) return;
    this.tick();
    this.#timer = setInterval(() => this.tick(), this.#intervalMs);
  }

  /** Stops the loop and flushes a last time. */
  stop(): Promise<void> {
    clearInterval(this.#timer);
    this.#timer = undefined;
    this.tick();
    return Promise.resolve();
  }

  /** One flush and one reserve check; never throws. */
  tick(): void {
    this.#flush();
    this.#reserve();
  }

  #flush(): void {
    const pending = this.#ledger.unflushedTouches;
    try {
      this.#ledger.flushTouches();
    } catch (error) {
      this.#flushFailing = true;
      const full = error instanceof LedgerFullError || isDiskFull(error);
      const message = error instanceof Error ? error.message : String(error);
      this.#changes.report(
        "idle-clock",
        full ? "full" : message,
        "warn",
        "could not write the idle clock to the ledger; it stays in memory until a flush works",
        { pending, error: message },
      );
      return;
    }
    if (this.#flushFailing) {
      this.#flushFailing = false;
      this.#changes.report("idle-clock", "ok", "info", "the idle clock is written again", {});
    }
  }

  #reserve(): void {
    let present: boolean;
    try {
      present = this.#ledger.restoreReserve();
    } catch (error) {
      present = false;
      this.#changes.report(
        "reserve",
        `error ${(error as Error)?.message}`,
        "warn",
        "could not write the ledger's reserve",
        { error },
      );
    }
    if (!present && !this.#reserveMissing) {
      this.#reserveMissing = true;
      this.#log(
        "warn",
        "the data disk has no room for the ledger's reserve: new sandboxes are refused (507) " +
          "until it has",
        { fix: "free space on the data disk (DORMICE_DATA_DIR)" },
      );
    } else if (present && this.#reserveMissing) {
      this.#reserveMissing = false;
      this.#log("info", "the ledger's reserve is back: new sandboxes are accepted again", {});
    }
  }
}
