/**
 * Which nodes a lookup round must ask when lookup digests are on (`"on"`, `"sole-writer"`): a node is
 * skipped only when its digest proves it cannot hold the key and nothing since could have put
 * the key there (it checked in fewer than two times to this process, or this gateway's own
 * create to it is not yet in its digest; in shared mode, its last check-in is older than the
 * trust window, the records of recent creates standing in for the rest). A down node is judged by
 * its last digest too, so its silence blocks only the names that digest may hold. Kept apart from `finder.ts` because this
 * soundness argument (docs/lookup-digest.md) is its own, and the rounds only need its answer.
 *
 * @module
 */
import type { FleetNode, NodeDirectory } from "../fleet/fleet.ts";
import type { FindBy } from "./outcomes.ts";
import { digestProbe, idDigestKey } from "../../shared/lookup_digest.ts";

/** Why a round asked a node rather than trusting its digest (tests and the bench read it). */
export type AskReason =
  | "may-hold"
  | "no-digest"
  | "first-check-in"
  | "own-create"
  | "stale-digest";

/**
 * The digest rule of the Finder, with the creates this gateway sent that a node's digest may
 * not show yet.
 *
 * @example
 * ```ts ignore
 * const skips = new DigestSkips(fleet);
 * const nodes = skips.toAsk([...fleet.nodes()], "name", "agent-1");
 * ```
 */
export class DigestSkips {
  readonly #fleet: NodeDirectory;
  /** In mode `on`, a digest counts only when its node pushes creates made behind our back. */
  readonly #needsPushed: boolean;
  /**
   * node id → this gateway's creates there that the node's digest may not show yet. An entry
   * goes once its node's digest is sure to include them (two check-ins after the last one
   * ended) or the node leaves (`forget`), so it never outgrows the fleet.
   */
  readonly #ownCreates = new Map<string, { inFlight: number; cleanAt: number }>();
  /**
   * Shared mode: how old a node's last check-in may be for its digest to be trusted. Records of
   * recent creates (`RecentCreates`) stand in for the check-in counts there, and they live long
   * enough to cover every create a digest that young may predate.
   */
  readonly #sharedTrustMs: number | undefined;

  /**
   * Reads check-in counts and the clock from `fleet`. With `needsPushed` (mode `on`), a digest
   * that does not say `directPushed` is as good as none: that node may take creates behind the
   * gateway's back that no digest shows yet. With `sharedTrustMs` (shared mode), the rules of
   * this gateway's own creates give way to the records of every gateway's creates, and a digest
   * counts while its node's last check-in is at most that old.
   */
  constructor(fleet: NodeDirectory, needsPushed = false, sharedTrustMs?: number) {
    this.#fleet = fleet;
    this.#needsPushed = needsPushed;
    this.#sharedTrustMs = sharedTrustMs;
  }

  /**
   * Records that a create is being sent to `nodeId`, so lookups keep asking that node until
   * its digest must show the create; call the returned function once the create ended, with
   * whether the node answered. A create the node never answered may still land there at any
   * time, so the node is asked on every miss for the rest of this process.
   *
   * @example
   * ```ts ignore
   * const ended = finder.placing(node.id);
   * try { answer = await send(node); ended(true); } catch (e) { ended(false); throw e; }
   * ```
   */
  placing(nodeId: string): (answered: boolean) => void {
    let entry = this.#ownCreates.get(nodeId);
    if (entry === undefined) this.#ownCreates.set(nodeId, entry = { inFlight: 0, cleanAt: 0 });
    entry.inFlight++;
    const own = entry;
    let ended = false;
    return (answered) => {
      if (ended) return;
      ended = true;
      own.inFlight--;
      const node = this.#fleet.get(nodeId);
      // The next check-in may have been built before the create committed; the one after was
      // built after that check-in's answer, so after the create's answer (docs/lookup-digest.md).
      const at = answered && node !== undefined ? (node.checkInsSinceStart ?? 0) + 2 : Infinity;
      own.cleanAt = Math.max(own.cleanAt, at);
    };
  }

  /**
   * Why a miss for `key` must ask `node`, or `undefined` when its digest proves it cannot hold
   * the key.
   *
   * @example
   * ```ts ignore
   * skips.mustAsk(node, "name", "agent-1"); // "may-hold" | … | undefined
   * ```
   */
  mustAsk(node: FleetNode, by: FindBy, key: string): AskReason | undefined {
    return this.#mustAsk(node, probeOf(by, key));
  }

  /**
   * The nodes of `all` a round for `key` must ask.
   *
   * @example
   * ```ts ignore
   * const nodes = skips.toAsk([...fleet.nodes()], "id", sandboxId);
   * ```
   */
  toAsk(all: FleetNode[], by: FindBy, key: string): FleetNode[] {
    const probe = probeOf(by, key);
    const nodes = all.filter((node) => this.#mustAsk(node, probe) !== undefined);
    // Entries whose node left without forget (an embedder's own directory).
    if (this.#ownCreates.size > all.length) {
      for (const id of [...this.#ownCreates.keys()]) {
        if (this.#fleet.get(id) === undefined) this.#ownCreates.delete(id);
      }
    }
    return nodes;
  }

  /**
   * Lets go of a node that left the fleet.
   *
   * @example
   * ```ts ignore
   * skips.forget("node-c");
   * ```
   */
  forget(nodeId: string): void {
    this.#ownCreates.delete(nodeId);
  }

  #mustAsk(
    node: FleetNode,
    probe: ReturnType<typeof digestProbe>,
  ): AskReason | undefined {
    const digest = node.lookupDigest ?? null;
    if (digest === null || (this.#needsPushed && !digest.directPushed)) return "no-digest";
    if (digest.mayHoldProbe(probe)) return "may-hold";
    if (this.#sharedTrustMs !== undefined) {
      // Shared mode: every gateway's creates of the last `ttl` are asked by their records (the
      // Finder adds the node a key's record names). A create whose record lapsed was sent more
      // than trust + create bound ago, so a digest from a check-in younger than the trust window
      // was built after it landed (docs/lookup-digest.md, "Several gateways").
      const age = this.#fleet.now() - node.lastCheckIn;
      return age <= this.#sharedTrustMs ? undefined : "stale-digest";
    }
    // A down node is judged by its last digest like any other. Nothing but this gateway creates
    // there (sole-writer), the rules below ask it while a create this gateway sent may be
    // missing from that digest, and the placer sends no create to a down node: so a name the
    // last digest rules out cannot be there, and the node's silence makes no such name unsure
    // (docs/lookup-digest.md, "A silent node blocks only the names it may hold").
    // The first check-in to this process may predate a create the previous process sent.
    const checkIns = node.checkInsSinceStart ?? 0;
    if (checkIns < 2) return "first-check-in";
    const own = this.#ownCreates.get(node.id);
    if (own !== undefined) {
      if (own.inFlight > 0 || checkIns < own.cleanAt) return "own-create";
      this.#ownCreates.delete(node.id);
    }
    return undefined;
  }
}

function probeOf(by: FindBy, key: string): ReturnType<typeof digestProbe> {
  return digestProbe(by === "name" ? `n:${key}` : idDigestKey(key));
}
