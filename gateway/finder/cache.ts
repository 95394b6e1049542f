/**
 * The Finder's cache: where a sandbox was last found, under two LRU indexes (by team-scoped
 * name and by id) that always agree. Kept apart from `finder.ts` because keeping the two
 * indexes in step is its own rule: an eviction under one key removes the same sandbox under the
 * other, and a name rebuilt under a new id drops the old id.
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import type { FindBy, FindOne } from "./outcomes.ts";
import type { FoundSandbox } from "./lookup_client.ts";
import { LruCache } from "../../shared/lru.ts";
import { teamScopedName } from "../../shared/teams.ts";

/**
 * The two indexes, each bounded to `max` entries.
 *
 * @example
 * ```ts ignore
 * const cache = new FoundCache(100_000);
 * cache.set(node, { id: "sbx-1", name: "agent-1", state: "active" });
 * cache.get("name", "agent-1"); // the entry, now the youngest
 * ```
 */
export class FoundCache {
  readonly #byName: LruCache<string, FindOne>;
  readonly #byId: LruCache<string, FindOne>;

  /** Both indexes hold at most `max` entries; the least recently used goes first. */
  constructor(max: number) {
    this.#byName = new LruCache({ max });
    this.#byId = new LruCache({ max });
  }

  /** How many entries each index holds. */
  get size(): { name: number; id: number } {
    return { name: this.#byName.size, id: this.#byId.size };
  }

  /**
   * The entry for `key`, moved to the young end; no allocation.
   *
   * @example
   * ```ts ignore
   * const hit = cache.get("id", sandboxId);
   * ```
   */
  get(by: FindBy, key: string): FindOne | undefined {
    return (by === "name" ? this.#byName : this.#byId).get(key);
  }

  /**
   * The entry for `key`, left where it is in the order.
   *
   * @example
   * ```ts ignore
   * const hit = cache.peek("name", "agent-1");
   * ```
   */
  peek(by: FindBy, key: string): FindOne | undefined {
    return (by === "name" ? this.#byName : this.#byId).peek(key);
  }

  /**
   * Caches `sandbox` on `node` under both keys and returns the entry.
   *
   * @example
   * ```ts ignore
   * const one = cache.set(node, sandbox);
   * ```
   */
  set(node: FleetNode, sandbox: FoundSandbox): FindOne {
    const one: FindOne = {
      kind: "one",
      node,
      sandbox: { id: sandbox.id, name: sandbox.name, state: sandbox.state, team: sandbox.team },
    };
    const nameKey = teamScopedName(sandbox.team, sandbox.name);
    // A name rebuilt under a new id: the old id must not keep routing to the old sandbox.
    const before = this.#byName.peek(nameKey);
    if (before !== undefined && before.sandbox.id !== sandbox.id) this.evict(before);
    this.#byName.set(nameKey, one);
    this.#byId.set(sandbox.id, one);
    return one;
  }

  /**
   * Removes `hit` under both keys, only where they still hold this very sandbox on this node.
   *
   * @example
   * ```ts ignore
   * cache.evict(hit);
   * ```
   */
  evict(hit: FindOne): void {
    const same = (v: FindOne) => v.node.id === hit.node.id && v.sandbox.id === hit.sandbox.id;
    this.#byName.evictIf(teamScopedName(hit.sandbox.team, hit.sandbox.name), same);
    this.#byId.evictIf(hit.sandbox.id, same);
  }

  /**
   * Removes every entry on `nodeId` (one pass over both indexes).
   *
   * @example
   * ```ts ignore
   * cache.forgetNode("node-c");
   * ```
   */
  forgetNode(nodeId: string): void {
    const ofNode = (v: FindOne) => v.node.id === nodeId;
    this.#byName.deleteWhere(ofNode);
    this.#byId.deleteWhere(ofNode);
  }

  /**
   * The entries on `nodeId` (a walk of the id index).
   *
   * @example
   * ```ts ignore
   * for (const one of cache.on("node-a")) console.log(one.sandbox.id);
   * ```
   */
  on(nodeId: string): FindOne[] {
    const out: FindOne[] = [];
    for (const id of this.#byId.keys()) {
      const entry = this.#byId.peek(id);
      if (entry !== undefined && entry.node.id === nodeId) out.push(entry);
    }
    return out;
  }
}
