/**
 * An injectable clock and timers, so time-driven rules are tested without sleeping.
 *
 * @module
 */

/** The clock every time-driven component takes. `now()` is milliseconds since the epoch. */
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
}

/** The real clock. */
export const systemClock: Clock = { now: () => Date.now() };

/** What {@linkcode Timers.setTimer} hands back to cancel the timer with. */
export type TimerHandle = ReturnType<typeof setTimeout> | number;

/**
 * One-shot timers. A loop that sleeps until a moment takes these beside its {@linkcode Clock},
 * so a test with a {@linkcode FakeClock} (which is both) fires them by ticking.
 */
export interface Timers {
  /** Calls `fn` once, `ms` from now (at once for 0 or less). */
  setTimer(fn: () => void, ms: number): TimerHandle;
  /** Cancels a timer that has not fired; an unknown or fired handle is ignored. */
  clearTimer(handle: TimerHandle | undefined): void;
}

/** The real timers (`setTimeout` / `clearTimeout`). */
export const systemTimers: Timers = {
  setTimer: (fn, ms) => setTimeout(fn, Math.max(0, ms)),
  clearTimer: (handle) => clearTimeout(handle),
};

/**
 * A clock that only moves when told, with timers that fire as it moves: for tests.
 *
 * @example
 * ```ts
 * import { FakeClock } from "@dormice/cluster/shared";
 * const clock = new FakeClock(1_000);
 * let fired = 0;
 * clock.setTimer(() => fired = clock.now(), 300);
 * clock.tick(500);
 * clock.now(); // 1500
 * fired; // 1300: the timer ran at its own moment
 * ```
 */
export class FakeClock implements Clock, Timers {
  #t: number;
  #timers = new Map<TimerHandle, { at: number; fn: () => void }>();
  #nextHandle = 1;
  /** Starts at `start` ms. */
  constructor(start = 1_700_000_000_000) {
    this.#t = start;
  }
  /** The current fake time. */
  now(): number {
    return this.#t;
  }
  /**
   * Moves time forward by `ms`, firing each timer that falls due on the way at its own moment
   * (earliest first, ties in the order they were set), including timers set by those timers.
   */
  tick(ms: number): void {
    const target = this.#t + ms;
    for (;;) {
      let due: [TimerHandle, { at: number; fn: () => void }] | undefined;
      for (const entry of this.#timers) {
        if (entry[1].at <= target && (!due || entry[1].at < due[1].at)) due = entry;
      }
      if (!due) break;
      this.#timers.delete(due[0]);
      this.#t = Math.max(this.#t, due[1].at);
      due[1].fn();
    }
    this.#t = target;
  }
  /** Sets a timer that fires when the clock is ticked past `now() + ms`. */
  setTimer(fn: () => void, ms: number): TimerHandle {
    const handle = this.#nextHandle++;
    this.#timers.set(handle, { at: this.#t + Math.max(0, ms), fn });
    return handle;
  }
  /** Cancels a timer that has not fired. */
  clearTimer(handle: TimerHandle | undefined): void {
    if (handle !== undefined) this.#timers.delete(handle);
  }
  /** How many timers wait to fire (a test's check that a loop keeps one timer, not many). */
  get pendingTimers(): number {
    return this.#timers.size;
  }
}
