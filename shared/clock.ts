/**
 * An injectable clock, so time-driven rules are tested without sleeping.
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

/**
 * A clock that only moves when told: for tests.
 *
 * @example
 * ```ts
 * import { FakeClock } from "@dormice/cluster/shared";
 * const clock = new FakeClock(1_000);
 * clock.tick(500);
 * clock.now(); // 1500
 * ```
 */
export class FakeClock implements Clock {
  #t: number;
  /** Starts at `start` ms. */
  constructor(start = 1_700_000_000_000) {
    this.#t = start;
  }
  /** The current fake time. */
  now(): number {
    return this.#t;
  }
  /** Moves time forward by `ms`. */
  tick(ms: number): void {
    this.#t += ms;
  }
}
