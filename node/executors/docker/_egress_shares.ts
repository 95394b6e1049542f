/**
 * {@linkcode ConnectionShares}: the egress proxy's fair shares of its connection (and request)
 * caps between sandboxes.
 *
 * @module
 */

/** Most sandbox connections through the proxy at once (see {@linkcode ConnectionShares}). */
export const MAX_CONNECTIONS = 4096;
/** Most connections of one sandbox at once. */
export const MAX_PER_SANDBOX = 512;

/**
 * Who holds the proxy's connections: at most `perSource` each and `max` in all, shared fairly.
 * With the node full, a newcomer holding fewer than an even share (`max` over the sources
 * holding any, itself counted) is admitted by closing the oldest connection of the source
 * holding the most; one at or over its share is refused. So a few sandboxes (one tenant's, or
 * connections held idle on purpose) can fill the node while nobody else asks, and never keep
 * another sandbox from its share.
 *
 * @example
 * ```ts
 * import { ConnectionShares } from "./_egress_shares.ts";
 * const shares = new ConnectionShares<string>(2, 2);
 * shares.admit("a", "a1", () => {}); // true
 * shares.admit("a", "a2", () => {}); // true: the node is full now
 * shares.admit("b", "b1", (x) => console.log(`closed ${x}`)); // true, after "closed a1"
 * ```
 */
export class ConnectionShares<T> {
  #max: number;
  #perSource: number;
  #held = new Map<string, Set<T>>();
  #total = 0;

  constructor(max: number, perSource: number) {
    this.#max = max;
    this.#perSource = perSource;
  }

  /** How many connections are held in all. */
  get total(): number {
    return this.#total;
  }

  /**
   * Admits `item` of `source`, closing (`evict`) another source's oldest item when that is its
   * share's price; false when `source` may not have one more.
   */
  admit(source: string, item: T, evict: (item: T) => void): boolean {
    const own = this.#held.get(source);
    const count = own?.size ?? 0;
    if (count >= this.#perSource) return false;
    if (this.#total >= this.#max) {
      const sources = this.#held.size + (own === undefined ? 1 : 0);
      if (count >= Math.floor(this.#max / sources)) return false;
      let biggest: [string, Set<T>] | undefined;
      for (const entry of this.#held) {
        if (biggest === undefined || entry[1].size > biggest[1].size) biggest = entry;
      }
      // The biggest holds more than an even share (the total is max, this one holds less).
      const oldest = biggest![1].values().next().value as T;
      this.release(biggest![0], oldest);
      evict(oldest);
    }
    if (own === undefined) this.#held.set(source, new Set([item]));
    else own.add(item);
    this.#total++;
    return true;
  }

  /** `item` of `source` is gone (a no-op when it was evicted or never admitted). */
  release(source: string, item: T): void {
    const own = this.#held.get(source);
    if (own === undefined || !own.delete(item)) return;
    this.#total--;
    if (own.size === 0) this.#held.delete(source);
  }
}
