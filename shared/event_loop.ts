/**
 * Sharing the event loop: a request that has a lot of CPU work to do (inflating a gzip body,
 * decoding a large base64 string, listing many rows) does it in slices and lets the loop run
 * between them, so `/healthz`, check-ins and every other request are answered meanwhile.
 *
 * @module
 */

/**
 * Lets every ready task (timers, network reads, other requests) run once before resolving.
 * A macrotask (`setTimeout`), not a microtask: awaiting a resolved promise would not let the
 * loop poll its sockets. A nested `setTimeout(0)` costs 1–4 ms of clamping, so callers yield
 * by elapsed time ({@linkcode LoopBudget}), not after every small piece of work.
 *
 * @example
 * ```ts
 * import { yieldToLoop } from "./event_loop.ts";
 * await yieldToLoop();
 * ```
 */
export function yieldToLoop(): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, 0));
}

/** Options of {@linkcode LoopBudget}. */
export interface LoopBudgetOptions {
  /** The most milliseconds of work between two yields (default 10). */
  sliceMs?: number;
  /** The clock, ms (default `performance.now`). */
  now?: () => number;
  /** How to yield (default {@linkcode yieldToLoop}). */
  yieldToLoop?: () => Promise<void>;
}

/**
 * A budget of CPU time per slice: call {@linkcode LoopBudget.pass} between small pieces of work
 * and it yields to the event loop once `sliceMs` have passed since the last yield, so a long
 * job holds the loop for at most one slice plus one piece at a time.
 *
 * @example
 * ```ts
 * import { LoopBudget } from "./event_loop.ts";
 * const budget = new LoopBudget({ sliceMs: 10 });
 * for (let i = 0; i < 1000; i++) await budget.pass();
 * ```
 */
export class LoopBudget {
  readonly #sliceMs: number;
  readonly #now: () => number;
  readonly #yield: () => Promise<void>;
  #since: number;
  /** How many times this budget has yielded. */
  yields = 0;

  /** A budget whose first slice starts now. */
  constructor(options: LoopBudgetOptions = {}) {
    this.#sliceMs = options.sliceMs ?? 10;
    this.#now = options.now ?? (() => performance.now());
    this.#yield = options.yieldToLoop ?? yieldToLoop;
    this.#since = this.#now();
  }

  /** Yields to the event loop when the current slice has used its time; resolves at once otherwise. */
  async pass(): Promise<void> {
    if (this.#now() - this.#since < this.#sliceMs) return;
    await this.#yield();
    this.yields++;
    this.#since = this.#now();
  }
}
