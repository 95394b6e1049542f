/**
 * How many nodes a lookup round asks at once, chosen when the round begins: wide enough that the
 * fleet fits in half the round's deadline at the latency the nodes answered with lately (the
 * fastest tenth of the recent answers), and never narrower than the configured width or wider
 * than a ceiling.
 *
 * Why not a fixed width: at 128 asks at once, 10,000 nodes answering 40 ms late need 3.1 s, and
 * the round hit its 2 s deadline with 5,600-5,900 of them heard (measured 2026-12-07). Why not a
 * width that changes during the round: one that widened itself answered 175-550 ms past the
 * deadline on a starved CPU. The width here is fixed for the round, from figures the round
 * before it measured, and bounded on both sides.
 *
 * @module
 */
import type { Clock } from "../../shared/clock.ts";

/** Options of {@linkcode RoundWidth}. */
export interface RoundWidthOptions {
  /** The width with nothing measured yet, and the least width (`DORMICE_GATEWAY_LOOKUP_CONCURRENCY`). */
  floor: number;
  /** The most asks in flight one round may have (connections opened at once on a cold round). */
  ceiling: number;
  /** Time source of the asks' latencies. */
  clock: Clock;
  /** The share of a round's remaining time the fleet should fit in; 0.5 by default. */
  share?: number;
}

/** Latencies kept (a ring): the last answers of any round, a few kilobytes. */
export const LATENCY_SAMPLES = 1024;

/** The share of the recent answers, the fastest, whose latency the width is sized from. */
const FASTEST_SHARE = 0.1;

/**
 * The width rule, and the recent latencies it reads.
 *
 * `width(n, remainingMs)` is `ceil(n × L ÷ (share × remainingMs))` clamped to `[floor, ceiling]`
 * (and to `n`), where L is the latency the fastest tenth of the last {@linkcode LATENCY_SAMPLES}
 * answered asks came within. Not the median: on a busy gateway (its own work, or a machine it
 * shares) an ask's time includes its wait for the event loop, which grows with the width, and a
 * rule fed that wait widened itself to the ceiling with every node answering at once, and spent
 * twice the CPU a round for fewer nodes heard (10,000 nodes, load 5 on 2 cores, measured
 * 2026-12-07). The fastest answers carry the least of that wait and still the whole network's
 * time: with every node 40 ms late, none answers sooner.
 *
 * @example
 * ```ts
 * import { RoundWidth } from "./round_width.ts";
 * const width = new RoundWidth({ floor: 128, ceiling: 1024, clock: { now: () => Date.now() } });
 * const asks = width.width(10_000, 2000); // 128 until answers were timed
 * const timedAsk = width.timed(async (n: number) => n * 2);
 * console.log(asks, await timedAsk(21)); // 128 42
 * ```
 */
export class RoundWidth {
  readonly #floor: number;
  readonly #ceiling: number;
  readonly #share: number;
  readonly #clock: Clock;
  readonly #samples = new Float64Array(LATENCY_SAMPLES);
  #count = 0;
  #next = 0;

  /**
   * Builds the rule.
   *
   * @throws {RangeError} when `floor` or `ceiling` is not a positive integer, `ceiling` is below
   *   `floor`, or `share` is not in (0, 1].
   */
  constructor(options: RoundWidthOptions) {
    const { floor, ceiling, share = 0.5 } = options;
    if (!Number.isInteger(floor) || floor < 1) {
      throw new RangeError(
        `Cannot create RoundWidth as 'floor' must be a positive integer: received ${floor}`,
      );
    }
    if (!Number.isInteger(ceiling) || ceiling < floor) {
      throw new RangeError(
        `Cannot create RoundWidth as 'ceiling' must be an integer of at least 'floor' (${floor}): received ${ceiling}`,
      );
    }
    if (!(share > 0 && share <= 1)) {
      throw new RangeError(
        `Cannot create RoundWidth as 'share' must be above 0 and at most 1: received ${share}`,
      );
    }
    this.#floor = floor;
    this.#ceiling = ceiling;
    this.#share = share;
    this.#clock = options.clock;
  }

  /**
   * The latency in ms the fastest tenth of the recent answers came within, or undefined before
   * any answer was timed.
   */
  get latencyMs(): number | undefined {
    if (this.#count === 0) return undefined;
    const sorted = this.#samples.slice(0, this.#count).sort();
    return sorted[Math.floor((sorted.length - 1) * FASTEST_SHARE)];
  }

  /**
   * Asks in flight for a round of `nodes` nodes with `remainingMs` left before its deadline.
   *
   * @example
   * ```ts ignore
   * boundedFanOut(nodes, width.width(nodes.length, deadline - clock.now()), signal, ask, unasked);
   * ```
   */
  width(nodes: number, remainingMs: number): number {
    const cap = Math.max(1, Math.min(nodes, this.#ceiling));
    const latency = nodes > this.#floor ? this.latencyMs : undefined;
    if (latency === undefined) return Math.min(cap, this.#floor);
    const wanted = Math.ceil(nodes * latency / (this.#share * Math.max(1, remainingMs)));
    return Math.min(cap, Math.max(this.#floor, wanted));
  }

  /**
   * `ask`, with the latency of each answer it gives kept for the next rounds' widths. An ask that
   * `answered` says was no answer (silent: a timeout, a refused connection) is not kept: its time
   * is the deadline's or the failure's, not the nodes'.
   */
  timed<A extends unknown[], R>(
    ask: (...args: A) => Promise<R>,
    answered: (result: R) => boolean = () => true,
  ): (...args: A) => Promise<R> {
    return async (...args) => {
      const t0 = this.#clock.now();
      const result = await ask(...args);
      if (answered(result)) this.#record(this.#clock.now() - t0);
      return result;
    };
  }

  #record(ms: number): void {
    this.#samples[this.#next] = ms;
    this.#next = (this.#next + 1) % LATENCY_SAMPLES;
    if (this.#count < LATENCY_SAMPLES) this.#count++;
  }
}
