/**
 * A fan-out with a bound on the asks in flight: a lookup round at 10,000 nodes must not open
 * 10,000 connections at once (measured 2026-12-07: every node came back silent after 7.9 s, none
 * reached, the 2 s bound broken). Kept apart from `finder.ts` so any fan-out to the fleet can
 * share the rule.
 *
 * With a {@linkcode FanOutPace}, the bound is where the fan-out starts, not where it stays: when
 * the asks take so long that the nodes left could not all be asked before the deadline at the
 * present width, more asks go out at once, up to `maxLimit`. The width a round needs is the
 * nodes left times an ask's time over the time left, so a fleet whose nodes answer in 40 ms
 * (a far region, a connect each) needs ten times the width of one answering in 4 ms; a fixed
 * width made the round's length grow with the nodes' latency.
 *
 * @module
 */

/**
 * How a fan-out widens to end by a deadline (see {@linkcode boundedFanOut}).
 */
export interface FanOutPace {
  /** Milliseconds, from any origin (the caller's clock): the fan-out reads it as asks end. */
  now(): number;
  /** When the fan-out's signal will abort, from its start: the asks must be started before. */
  deadlineMs: number;
  /** The most asks in flight at once, however far behind the fan-out falls (≥ `limit`). */
  maxLimit: number;
}

/**
 * Share of the time left the remaining asks are planned into: the rest is room for the last
 * ones to answer and for the estimate to be wrong.
 */
const PLAN_SHARE = 0.6;

/**
 * Asks `items` with at most `limit` asks in flight, in order, until `signal` aborts; the items
 * not yet asked by then get `unasked(item)` at once, so the whole fan-out ends with the signal.
 * `ask` must not reject (turn a failure into an answer). With `pace`, the number in flight grows
 * past `limit` (up to `pace.maxLimit`) whenever, at the asks' mean time so far, the items left
 * would not all be asked within the deadline.
 *
 * @throws {RangeError} when `limit` is not a positive integer, or `pace.maxLimit` is below it.
 * @example
 * ```ts
 * import { boundedFanOut } from "./fan_out.ts";
 * const answers = await boundedFanOut(
 *   [1, 2, 3],
 *   2,
 *   AbortSignal.timeout(2000),
 *   (n) => Promise.resolve(n * 2),
 *   () => -1,
 * );
 * console.log(answers); // [2, 4, 6]
 * ```
 */
export async function boundedFanOut<T, R>(
  items: readonly T[],
  limit: number,
  signal: AbortSignal,
  ask: (item: T) => Promise<R>,
  unasked: (item: T) => R,
  pace?: FanOutPace,
): Promise<R[]> {
  if (!Number.isInteger(limit) || limit < 1) {
    throw new RangeError(`Cannot fan out as 'limit' must be a positive integer: received ${limit}`);
  }
  if (pace !== undefined && !(Number.isInteger(pace.maxLimit) && pace.maxLimit >= limit)) {
    throw new RangeError(
      `Cannot fan out as 'maxLimit' must be an integer of at least 'limit' (${limit}): ` +
        `received ${pace.maxLimit}`,
    );
  }
  const out = new Array<R>(items.length);
  let next = 0;
  let workers = 0;
  let answered = 0;
  let askMs = 0;
  const started = pace?.now() ?? 0;
  const running: Promise<void>[] = [];
  const widen = () => {
    if (pace === undefined || answered === 0 || workers >= pace.maxLimit) return;
    const left = items.length - next;
    if (left === 0) return;
    const mean = askMs / answered;
    const timeLeft = (pace.deadlineMs - (pace.now() - started)) * PLAN_SHARE - mean;
    // Little's law: asks in flight = rate × time per ask, the rate being what is left over the
    // time left to start it.
    const needed = timeLeft <= 0 ? pace.maxLimit : Math.ceil((left * mean) / timeLeft);
    const add = Math.min(pace.maxLimit, needed, items.length) - workers;
    for (let w = 0; w < add; w++) running.push(worker());
  };
  const worker = async () => {
    workers++;
    while (next < items.length) {
      const i = next++;
      if (signal.aborted) {
        out[i] = unasked(items[i]);
        continue;
      }
      if (pace === undefined) {
        out[i] = await ask(items[i]);
        continue;
      }
      const t0 = pace.now();
      out[i] = await ask(items[i]);
      askMs += pace.now() - t0;
      answered++;
      widen();
    }
  };
  for (let w = 0; w < Math.min(limit, items.length); w++) running.push(worker());
  // Workers added while waiting join `running`: wait until no more come.
  for (let seen = 0; seen < running.length;) {
    const batch = running.slice(seen);
    seen = running.length;
    await Promise.all(batch);
  }
  return out;
}
