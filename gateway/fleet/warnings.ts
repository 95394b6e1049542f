/**
 * The Fleet's warnings that are logged once per change, not once per check-in: two ids
 * reporting one endpoint, a node whose fleet-invariant settings differ from the fleet's, a
 * lookup digest that will not decode, and a second reporter refused under a live id. Kept apart
 * from `fleet.ts` because none of them changes what the Fleet decides; they tell the operator
 * what to fix, each with its own key in one `ChangeLog`.
 *
 * @module
 */
import type { FleetNode } from "./node.ts";
import type { CheckIn } from "../../shared/schemas.ts";
import type { ChangeLog } from "../../shared/log.ts";
import { LookupDigest } from "../../shared/lookup_digest.ts";

/**
 * The Fleet's once-per-change warnings, with the endpoint → ids index the shared-endpoint
 * warning needs.
 *
 * @example
 * ```ts ignore
 * const warnings = new FleetWarnings(new ChangeLog(log));
 * warnings.indexEndpoint("a", "http://10.0.0.5:3676");
 * warnings.reportShared("http://10.0.0.5:3676");
 * ```
 */
export class FleetWarnings {
  readonly #changes: ChangeLog;
  /** endpoint → ids reporting it, to warn when two ids share one daemon. */
  readonly #byEndpoint = new Map<string, Set<string>>();

  /** Reports through `changes`, shared with the node table's write failures. */
  constructor(changes: ChangeLog) {
    this.#changes = changes;
  }

  /** Every endpoint some id reports. */
  endpoints(): IterableIterator<string> {
    return this.#byEndpoint.keys();
  }

  /**
   * Records that `id` reports `endpoint`.
   *
   * @example
   * ```ts ignore
   * warnings.indexEndpoint(node.id, node.endpoint);
   * ```
   */
  indexEndpoint(id: string, endpoint: string): void {
    let ids = this.#byEndpoint.get(endpoint);
    if (!ids) this.#byEndpoint.set(endpoint, ids = new Set());
    ids.add(id);
  }

  /**
   * Records that `id` no longer reports `endpoint`.
   *
   * @example
   * ```ts ignore
   * warnings.unindexEndpoint(node.id, oldEndpoint);
   * ```
   */
  unindexEndpoint(id: string, endpoint: string): void {
    const ids = this.#byEndpoint.get(endpoint);
    if (!ids) return;
    ids.delete(id);
    if (ids.size === 0) this.#byEndpoint.delete(endpoint);
  }

  /**
   * `id` moved from `from` to `to`: re-indexed, and both endpoints' shared warnings re-judged.
   *
   * @example
   * ```ts ignore
   * warnings.moved(node.id, oldEndpoint, node.endpoint);
   * ```
   */
  moved(id: string, from: string, to: string): void {
    this.unindexEndpoint(id, from);
    this.indexEndpoint(id, to);
    this.reportShared(from);
    this.reportShared(to);
  }

  /**
   * Warns once per change when two or more ids report `endpoint`.
   *
   * @example
   * ```ts ignore
   * warnings.reportShared(node.endpoint);
   * ```
   */
  reportShared(endpoint: string): void {
    const ids = this.#byEndpoint.get(endpoint);
    const key = `shared:${endpoint}`;
    if (!ids || ids.size < 2) {
      this.#changes.clear(key);
      return;
    }
    const sorted = [...ids].sort();
    this.#changes.report(
      key,
      sorted.join(","),
      "warn",
      "several node ids report one endpoint: one daemon answers for all of them, so its " +
        "sandboxes look duplicated; remove the id that no longer checks in with removeNode, or " +
        "correct the DORMICE_NODE_ENDPOINT of a node that names the wrong machine",
      { endpoint, nodeIds: sorted },
    );
  }

  /**
   * Warns that `node`'s digest parts from the fleet's `reference` (once per change of either:
   * `DigestCounts` calls it at the moment the divergent node appears).
   *
   * @example
   * ```ts ignore
   * warnings.digestDiffers(node, "d1");
   * ```
   */
  digestDiffers(node: FleetNode, reference: string): void {
    this.#changes.report(
      `digest:${node.id}`,
      `${node.configDigest}/${reference}`,
      "warn",
      "node's fleet-invariant settings differ from the fleet's (DORMICE_TEMPLATES, " +
        "DORMICE_SANDBOX_DOMAIN or the fleet token's signing secret): it keeps serving; " +
        "align its settings, or finish the rolling change",
      {
        nodeId: node.id,
        endpoint: node.endpoint,
        digest: node.configDigest?.slice(0, 12),
        fleetDigest: reference.slice(0, 12),
      },
    );
  }

  /**
   * `id` agrees with the fleet again (or went down, or left): a later divergence is warned afresh.
   *
   * @example
   * ```ts ignore
   * warnings.digestAgrees(node.id);
   * ```
   */
  digestAgrees(id: string): void {
    this.#changes.clear(`digest:${id}`);
  }

  /**
   * A check-in's lookup digest; one that will not decode is dropped (the node is then always
   * asked) and warned once.
   *
   * @example
   * ```ts ignore
   * node.lookupDigest = warnings.lookupDigestOf(body);
   * ```
   */
  lookupDigestOf(body: CheckIn): LookupDigest | null {
    if (body.lookupDigest === undefined) return null;
    try {
      return LookupDigest.fromWire(body.lookupDigest);
    } catch (error) {
      this.#changes.report(
        `lookup-digest:${body.nodeId}`,
        String(error),
        "warn",
        "lookup digest refused",
        {
          nodeId: body.nodeId,
          cause: error instanceof Error ? error.message : String(error),
        },
      );
      return null;
    }
  }

  /**
   * Warns once that `refusedEndpoint` tried to use the live id of `known`.
   *
   * @example
   * ```ts ignore
   * warnings.twinRefused(known, body.endpoint);
   * ```
   */
  twinRefused(known: FleetNode, refusedEndpoint: string): void {
    this.#changes.report(
      `twin:${known.id}`,
      refusedEndpoint,
      "warn",
      "check-in refused: a second endpoint uses a live node id",
      { nodeId: known.id, endpoint: known.endpoint, refusedEndpoint },
    );
  }

  /**
   * The live id's reporter moved: its twin warning may fire again.
   *
   * @example
   * ```ts ignore
   * warnings.twinGone(known.id);
   * ```
   */
  twinGone(id: string): void {
    this.#changes.clear(`twin:${id}`);
  }

  /**
   * A removed node's warnings are forgotten, so an id that joins again is warned afresh.
   *
   * @example
   * ```ts ignore
   * warnings.forgotten(node.id);
   * ```
   */
  forgotten(id: string): void {
    this.#changes.clear(`twin:${id}`);
    this.#changes.clear(`lookup-digest:${id}`);
  }
}
