/**
 * A fan-out with a bound on the asks in flight: a lookup round at 10,000 nodes must not open
 * 10,000 connections at once (measured 2026-12-07: every node came back silent after 7.9 s, none
 * reached, the 2 s bound broken). Kept apart from `finder.ts` so any fan-out to the fleet can
 * share the rule.
 *
 * @module
 */

/**
 * Asks `items` with at most `limit` asks in flight, in order, until `signal` aborts; the items
 * not yet asked by then get `unasked(item)` at once, so the whole fan-out ends with the signal.
 * `ask` must not reject (turn a failure into an answer).
 *
 * @throws {RangeError} when `limit` is not a positive integer.
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
): Promise<R[]> {
  if (!Number.isInteger(limit) || limit < 1) {
    throw new RangeError(`Cannot fan out as 'limit' must be a positive integer: received ${limit}`);
  }
  const out = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = signal.aborted ? unasked(items[i]) : await ask(items[i]);
    }
  };
  const workers: Promise<void>[] = [];
  for (let w = 0; w < Math.min(limit, items.length); w++) workers.push(worker());
  await Promise.all(workers);
  return out;
}
