/**
 * How many nodes a lookup round asks at once, chosen when the round begins: wide enough that the
 * fleet fits in half the round's deadline at the latency the nodes answered with lately (the
 * fastest tenth of the recent answers), and never narrower than the configured width or wider
 * than a ceiling.
 *
 * Why not a fixed width: at 128 asks at once, 10,000 nodes answering 40 ms late need 3.1 s, and
 * the round hit its 2 s deadline with 5,600-5,900 of them heard (measured 2026-12-07). Why not a
 * width that changes during the round: one that widened itself answered 175-550 ms past the
 * deadline on a starved CPU. The width here is chosen from figures the rounds before it
 * measured, re-sized at most once, when the round's own first answers are in
 * ({@linkcode RoundWidth.rewidth}: the first slow round after fast ones, which the history alone
 * sizes too narrow), and bounded on both sides. Fleet-wide calls (listings) use the same rule
 * over their own bound, each with its own `RoundWidth`.
 *
 * @module
 */
import type { Clock } from "../../shared/clock.ts";
import type { FanOutWiden } from "./fan_out.ts";

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

/** The most first answers of one round a re-size reads (one per worker at most). */
export const FIRST_ANSWERS = LATENCY_SAMPLES;

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

  /** The time on the clock the latencies are timed on, in ms (for a round's time left). */
  now(): number {
    return this.#clock.now();
  }

  /**
   * The latency in ms the fastest tenth of the recent answers came within, or undefined before
   * any answer was timed.
   */
  get latencyMs(): number | undefined {
    return fastest(this.#samples.slice(0, this.#count));
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
    return Math.min(cap, Math.max(this.#floor, this.#wanted(nodes, latency, remainingMs)));
  }

  /**
   * The width a round wants once its own first answers are in (`latenciesMs`, in ms): the same
   * rule over the `left` nodes not yet asked and the `remainingMs` left, from those answers'
   * fastest tenth instead of the recent ones'. This is what corrects a round whose nodes turned
   * slow after fast rounds, which the history alone sizes too narrow (see `boundedFanOut`'s
   * `widen`, called once a round). Never above the ceiling; the floor when nothing was timed.
   *
   * @example
   * ```ts
   * import { RoundWidth } from "./round_width.ts";
   * const width = new RoundWidth({ floor: 128, ceiling: 1024, clock: { now: () => Date.now() } });
   * console.log(width.rewidth(new Array(128).fill(40), 9_872, 1_950)); // 406
   * ```
   */
  rewidth(latenciesMs: ArrayLike<number>, left: number, remainingMs: number): number {
    const latency = fastest(Float64Array.from(latenciesMs));
    if (latency === undefined) return this.#floor;
    return Math.min(this.#ceiling, Math.max(this.#floor, this.#wanted(left, latency, remainingMs)));
  }

  /**
   * One fan-out's (or one round's) own first answers, and the one re-size they feed: `add` is
   * the `onTimed` of {@linkcode RoundWidth.timed}, and `widen(width, remainingMs)` the `widen`
   * of a `boundedFanOut` begun at `width` (undefined at the ceiling: nothing to widen to). It
   * keeps at most `FIRST_ANSWERS` latencies.
   *
   * @example
   * ```ts ignore
   * const first = width.firstAnswers();
   * const ask = width.timed(askNode, isAnswer, first.add);
   * const w = width.width(nodes.length, left());
   * await boundedFanOut(nodes, w, signal, ask, notAsked, late, first.widen(w, left));
   * ```
   */
  firstAnswers(): {
    add: (ms: number) => void;
    widen: (width: number, remainingMs: () => number) => FanOutWiden | undefined;
  } {
    const first: number[] = [];
    return {
      add: (ms) => {
        if (first.length < FIRST_ANSWERS) first.push(ms);
      },
      widen: (width, remainingMs) =>
        width >= this.#ceiling ? undefined : {
          after: Math.min(width, FIRST_ANSWERS),
          to: (left) => this.rewidth(first, left, remainingMs()),
        },
    };
  }

  #wanted(nodes: number, latencyMs: number, remainingMs: number): number {
    return Math.ceil(nodes * latencyMs / (this.#share * Math.max(1, remainingMs)));
  }

  /**
   * `ask`, with the latency of each answer it gives kept for the next rounds' widths. An ask that
   * `answered` says was no answer (silent: a timeout, a refused connection) is not kept: its time
   * is the deadline's or the failure's, not the nodes'. Each kept latency also goes to `onTimed`
   * when given (a round collecting its own first answers for {@linkcode RoundWidth.rewidth}).
   */
  timed<A extends unknown[], R>(
    ask: (...args: A) => Promise<R>,
    answered: (result: R) => boolean = () => true,
    onTimed?: (ms: number) => void,
  ): (...args: A) => Promise<R> {
    return async (...args) => {
      const t0 = this.#clock.now();
      const result = await ask(...args);
      if (answered(result)) {
        const ms = this.#clock.now() - t0;
        this.#record(ms);
        onTimed?.(ms);
      }
      return result;
    };
  }

  #record(ms: number): void {
    this.#samples[this.#next] = ms;
    this.#next = (this.#next + 1) % LATENCY_SAMPLES;
    if (this.#count < LATENCY_SAMPLES) this.#count++;
  }
}

/** The latency the fastest tenth of `samples` came within (sorts them), or undefined if none. */
function fastest(samples: Float64Array): number | undefined {
  if (samples.length === 0) return undefined;
  samples.sort();
  return samples[Math.floor((samples.length - 1) * FASTEST_SHARE)];
}
