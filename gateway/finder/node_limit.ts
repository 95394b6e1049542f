/**
 * A per-key concurrency limit with a first-in first-out queue whose waiters can leave.
 *
 * @module
 */

/**
 * Lets at most `limit` tasks per key run at once; the rest wait in arrival order. A waiter whose
 * signal aborts leaves the queue at once and rejects with the signal's reason, so time spent
 * queued counts against the caller's own deadline. A key with nothing running or waiting leaves
 * no memory behind.
 *
 * @example At most 16 lookups in flight to one node
 * ```ts
 * import { KeyedLimiter } from "./node_limit.ts";
 * const limiter = new KeyedLimiter(16);
 * const answer = await limiter.run("node-a", AbortSignal.timeout(2000), () => Promise.resolve(1));
 * ```
 */
export class KeyedLimiter {
  readonly #limit: number;
  readonly #running = new Map<string, number>();
  readonly #waiting = new Map<string, Array<() => void>>();

  /**
   * Builds a limiter allowing `limit` concurrent tasks per key.
   *
   * @throws {RangeError} when `limit` is not a positive integer.
   */
  constructor(limit: number) {
    if (!Number.isInteger(limit) || limit < 1) {
      throw new RangeError(
        `Cannot create KeyedLimiter as 'limit' must be a positive integer: received ${limit}`,
      );
    }
    this.#limit = limit;
  }

  /** Runs `task` once fewer than `limit` tasks hold `key`; rejects if `signal` aborts first. */
  async run<T>(key: string, signal: AbortSignal | undefined, task: () => Promise<T>): Promise<T> {
    await this.#enter(key, signal);
    try {
      return await task();
    } finally {
      this.#leave(key);
    }
  }

  /** Tasks running now for `key`. */
  running(key: string): number {
    return this.#running.get(key) ?? 0;
  }

  /** Tasks waiting now for `key`. */
  waiting(key: string): number {
    return this.#waiting.get(key)?.length ?? 0;
  }

  #enter(key: string, signal: AbortSignal | undefined): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    const running = this.#running.get(key) ?? 0;
    if (running < this.#limit) {
      this.#running.set(key, running + 1);
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const queue = this.#waiting.get(key) ?? [];
      this.#waiting.set(key, queue);
      const onAbort = () => {
        const i = queue.indexOf(admit);
        if (i >= 0) queue.splice(i, 1);
        if (queue.length === 0) this.#waiting.delete(key);
        reject(signal!.reason);
      };
      // The slot is handed over by #leave, which already counted it as running.
      const admit = () => {
        signal?.removeEventListener("abort", onAbort);
        resolve();
      };
      queue.push(admit);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  #leave(key: string): void {
    const queue = this.#waiting.get(key);
    const next = queue?.shift();
    if (queue && queue.length === 0) this.#waiting.delete(key);
    if (next) {
      next(); // the running count stays: the slot passes straight to the next waiter
      return;
    }
    const left = (this.#running.get(key) ?? 1) - 1;
    if (left === 0) this.#running.delete(key);
    else this.#running.set(key, left);
  }
}
