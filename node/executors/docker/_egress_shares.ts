/**
 * {@linkcode ConnectionShares}: the egress proxy's fair shares of its connection (and request)
 * caps between teams, and between the sandboxes of one team.
 *
 * @module
 */

/** Most sandbox connections through the proxy at once (see {@linkcode ConnectionShares}). */
export const MAX_CONNECTIONS = 4096;
/** Most connections of one sandbox at once. */
export const MAX_PER_SANDBOX = 512;

/** What one source (a sandbox) holds, and the team it was counted under. */
interface Held<T> {
  team: string;
  items: Set<T>;
}

/** What one team's sources hold together. */
interface TeamHeld {
  count: number;
  sources: Set<string>;
}

/**
 * Who holds the proxy's connections: at most `perSource` each and `max` in all, shared fairly
 * between teams first and between the sources (sandboxes) of one team second. With the node
 * full, a newcomer whose team holds fewer than an even share (`max` over the teams holding any,
 * its own counted) is admitted by closing the oldest connection of the biggest source of the
 * team holding the most; a newcomer whose team holds its share or more is admitted only while it
 * holds fewer than an even split of what its team holds (closing its biggest teammate's oldest),
 * and refused otherwise. So a few sandboxes, or one team's many, can fill the node while nobody
 * else asks, and never keep another team from its share: a team does not gain room by starting
 * more sandboxes. `teamOf` names a source's team when it first holds one (each source its own
 * team by default).
 *
 * @example
 * ```ts
 * import { ConnectionShares } from "./_egress_shares.ts";
 * const team = new Map([["a1", "A"], ["a2", "A"], ["b1", "B"]]);
 * const shares = new ConnectionShares<string>(2, 2, (s) => team.get(s)!);
 * shares.admit("a1", "x", () => {}); // true
 * shares.admit("a2", "y", () => {}); // true: the node is full now, all team A's
 * shares.admit("b1", "z", (c) => console.log(`closed ${c}`)); // true, after "closed x"
 * ```
 */
export class ConnectionShares<T> {
  #max: number;
  #perSource: number;
  #teamOf: (source: string) => string;
  #held = new Map<string, Held<T>>();
  #teams = new Map<string, TeamHeld>();
  #total = 0;

  constructor(max: number, perSource: number, teamOf: (source: string) => string = (s) => s) {
    this.#max = max;
    this.#perSource = perSource;
    this.#teamOf = teamOf;
  }

  /** How many connections are held in all. */
  get total(): number {
    return this.#total;
  }

  /** How many connections the sources of `team` hold together. */
  heldBy(team: string): number {
    return this.#teams.get(team)?.count ?? 0;
  }

  /**
   * Admits `item` of `source`, closing (`evict`) another source's oldest item when that is its
   * share's price; false when `source` may not have one more.
   */
  admit(source: string, item: T, evict: (item: T) => void): boolean {
    const own = this.#held.get(source);
    const count = own?.items.size ?? 0;
    if (count >= this.#perSource) return false;
    const team = own?.team ?? this.#teamOf(source);
    if (this.#total >= this.#max) {
      const mine = this.#teams.get(team);
      const teamCount = mine?.count ?? 0;
      const teams = this.#teams.size + (mine === undefined ? 1 : 0);
      let from: TeamHeld;
      if (teamCount < Math.floor(this.#max / teams)) {
        // Another team holds more than an even share (the total is max, this one holds less).
        from = [...this.#teams.values()].reduce((a, b) => (b.count > a.count ? b : a));
      } else {
        // At its team's share: room only from a teammate holding more than an even split.
        const sources = mine!.sources.size + (own === undefined ? 1 : 0);
        if (count >= Math.floor(teamCount / sources)) return false;
        from = mine!;
      }
      let biggest: [string, Held<T>] | undefined;
      for (const s of from.sources) {
        const held = this.#held.get(s)!;
        if (biggest === undefined || held.items.size > biggest[1].items.size) biggest = [s, held];
      }
      const oldest = biggest![1].items.values().next().value as T;
      this.release(biggest![0], oldest);
      evict(oldest);
    }
    const held = this.#held.get(source) ?? { team, items: new Set<T>() };
    this.#held.set(source, held);
    held.items.add(item);
    const together = this.#teams.get(held.team) ?? { count: 0, sources: new Set<string>() };
    this.#teams.set(held.team, together);
    together.count++;
    together.sources.add(source);
    this.#total++;
    return true;
  }

  /** `item` of `source` is gone (a no-op when it was evicted or never admitted). */
  release(source: string, item: T): void {
    const own = this.#held.get(source);
    if (own === undefined || !own.items.delete(item)) return;
    this.#total--;
    const together = this.#teams.get(own.team)!;
    together.count--;
    if (own.items.size === 0) {
      this.#held.delete(source);
      together.sources.delete(source);
    }
    if (together.count === 0) this.#teams.delete(own.team);
  }
}
