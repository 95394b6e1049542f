/**
 * A bounded least-recently-used cache.
 *
 * @module
 */

/** Options for {@linkcode LruCache}. */
export interface LruCacheOptions {
  /**
   * The most entries kept; the least recently used one goes when a new key would exceed it.
   * Default 100,000: a lookup entry is a few hundred bytes, so the cache stays in the tens of
   * megabytes while covering every live sandbox of a large fleet.
   */
  max?: number;
}

/**
 * A bounded map that forgets its least recently used entry first. Every operation is O(1): a
 * `Map` keeps insertion order, so a hit is re-inserted at the young end and the oldest entry is
 * the first key.
 *
 * @example
 * ```ts
 * import { LruCache } from "./lru.ts";
 * const cache = new LruCache<string, number>({ max: 2 });
 * cache.set("a", 1);
 * cache.set("b", 2);
 * cache.get("a"); // 1, and "a" is now the youngest
 * cache.set("c", 3); // "b" goes
 * cache.has("b"); // false
 * ```
 */
export class LruCache<K, V> {
  /** The bound this cache was built with. */
  readonly max: number;
  #map = new Map<K, V>();
  /** The key most recently set or hit: hitting it again needs no re-insertion. */
  #youngest: K | undefined;
  #hasYoungest = false;

  /**
   * Builds an empty cache.
   *
   * @throws {RangeError} when `max` is not a positive integer.
   */
  constructor({ max = 100_000 }: LruCacheOptions = {}) {
    if (!Number.isInteger(max) || max < 1) {
      throw new RangeError(
        `Cannot create LruCache as 'max' must be a positive integer: received ${max}`,
      );
    }
    this.max = max;
  }

  /** How many entries the cache holds. */
  get size(): number {
    return this.#map.size;
  }

  /** The value for `key`, moving it to the young end; `undefined` on a miss. */
  get(key: K): V | undefined {
    const value = this.#map.get(key);
    if (value === undefined) return undefined;
    if (!(this.#hasYoungest && this.#youngest === key)) {
      this.#map.delete(key);
      this.#map.set(key, value);
      this.#youngest = key;
      this.#hasYoungest = true;
    }
    return value;
  }

  /** The value for `key` without touching its recency. */
  peek(key: K): V | undefined {
    return this.#map.get(key);
  }

  /** Whether `key` is cached (does not touch its recency). */
  has(key: K): boolean {
    return this.#map.has(key);
  }

  /** Stores `value` under `key` at the young end, dropping the oldest entry past the bound. */
  set(key: K, value: V): this {
    this.#map.delete(key);
    this.#map.set(key, value);
    this.#youngest = key;
    this.#hasYoungest = true;
    if (this.#map.size > this.max) {
      const oldest = this.#map.keys().next().value as K;
      this.#map.delete(oldest);
    }
    return this;
  }

  /** Removes `key`; returns whether it was there. */
  delete(key: K): boolean {
    if (this.#hasYoungest && this.#youngest === key) {
      this.#youngest = undefined;
      this.#hasYoungest = false;
    }
    return this.#map.delete(key);
  }

  /**
   * Removes `key` only when `predicate` holds for its current value, so a caller evicting what
   * it saw does not evict a newer entry someone else stored meanwhile. Returns whether it removed.
   */
  evictIf(key: K, predicate: (value: V) => boolean): boolean {
    const value = this.#map.get(key);
    if (value === undefined || !predicate(value)) return false;
    return this.delete(key);
  }

  /**
   * Removes every entry for which `predicate` holds, in one pass over the whole cache (O(n): for
   * rare events such as a node leaving the fleet, not for a hot path). Returns how many went.
   *
   * @example
   * ```ts
   * import { LruCache } from "./lru.ts";
   * const cache = new LruCache<string, string>();
   * cache.set("a", "node-1").set("b", "node-2");
   * cache.deleteWhere((node) => node === "node-1"); // 1
   * ```
   */
  deleteWhere(predicate: (value: V, key: K) => boolean): number {
    let removed = 0;
    for (const [key, value] of this.#map) {
      if (predicate(value, key)) {
        this.delete(key);
        removed++;
      }
    }
    return removed;
  }

  /** Removes every entry. */
  clear(): void {
    this.#map.clear();
    this.#youngest = undefined;
    this.#hasYoungest = false;
  }

  /** Keys from the oldest to the youngest (for tests and diagnostics). */
  keys(): IterableIterator<K> {
    return this.#map.keys();
  }
}
