/**
 * What the Finder's tests read of its insides and its public API does not offer: why a miss must
 * ask a node (the digest rules' table tests) and how many nodes the last round asked. Used only
 * inside `gateway/finder/` and by tests; not exported from any entry point.
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import type { AskReason } from "./digests.ts";
import type { FindBy } from "./outcomes.ts";

/** One Finder's probes. */
export interface FinderProbes {
  /** Why a miss for `key` must ask `node`, or `undefined` when its digest rules the key out. */
  mustAsk(node: FleetNode, by: FindBy, key: string): AskReason | undefined;
  /** Nodes asked by the last lookup round that started. */
  lastRoundAsked(): number;
}

const probes = new WeakMap<object, FinderProbes>();

/** Called by the Finder's constructor. */
export function registerProbes(finder: object, finderProbes: FinderProbes): void {
  probes.set(finder, finderProbes);
}

/** The probes of `finder`. */
export function probesOf(finder: object): FinderProbes {
  const found = probes.get(finder);
  if (found === undefined) throw new TypeError("Not a Finder: probesOf takes a Finder");
  return found;
}
