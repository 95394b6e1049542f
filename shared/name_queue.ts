/**
 * Per-key serialisation: tasks for one key never overlap, tasks for other keys run concurrently.
 *
 * @module
 */

/**
 * Runs tasks one key at a time: `run(key, task)` starts at once when nothing holds `key`,
 * otherwise it waits behind the holder and everything queued before it. A rejected task does not
 * block the next one, and a key with nothing running or waiting leaves no memory behind.
 *
 * @example Twenty callers, one create
 * ```ts
 * import { NameQueue } from "@dormice/cluster";
 * const q = new NameQueue();
 * let creates = 0;
 * const exists = new Set<string>();
 * await Promise.all(Array.from({ length: 20 }, () =>
 *   q.run("agent-1", async () => {
 *     if (!exists.has("agent-1")) { exists.add("agent-1"); creates++; }
 *   })));
 * console.log(creates); // 1
 * ```
 */
export class NameQueue {
  /** The tail of each busy key's chain; deleted when the last task of the key settles. */
  #tails = new Map<string, Promise<void>>();
  #depth = new Map<string, number>();

  /** Runs `task` when every earlier task for `key` has settled; resolves with its result. */
  run<T>(key: string, task: () => Promise<T> | T): Promise<T> {
    const before = this.#tails.get(key) ?? Promise.resolve();
    this.#depth.set(key, (this.#depth.get(key) ?? 0) + 1);
    const result = before.then(() => task());
    const tail = result.then(() => {}, () => {}).finally(() => {
      const left = (this.#depth.get(key) ?? 1) - 1;
      if (left === 0) {
        this.#depth.delete(key);
        this.#tails.delete(key);
      } else {
        this.#depth.set(key, left);
      }
    });
    this.#tails.set(key, tail);
    return result;
  }

  /** Whether a task for `key` is running or waiting. */
  isBusy(key: string): boolean {
    return this.#depth.has(key);
  }

  /**
   * Resolves once everything queued for `key` so far has settled (at once when idle).
   * Does not take the slot: work queued later may start before the caller resumes.
   */
  idle(key: string): Promise<void> {
    return this.#tails.get(key) ?? Promise.resolve();
  }

  /** The keys busy now (running or waiting): a node's lookup digest files them as held. */
  busyKeys(): IterableIterator<string> {
    return this.#depth.keys();
  }

  /** How many keys are busy now (running or waiting). */
  get size(): number {
    return this.#depth.size;
  }
}
