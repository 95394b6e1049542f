/**
 * The gateway's lifecycle events: what it sees on its own request path (creates it placed,
 * E2B pauses and resumes it forwarded, destroys it ran), what nodes report in their check-ins
 * (their deadline scanner's kills and pauses, which no client watches), and the sandboxes of a
 * node that stopped checking in. Each becomes one {@linkcode LifecycleEvent} for the webhook.
 *
 * What it cannot see: a call made to a node directly (not through this gateway), and the wake a
 * native verb (`execCommand` on a paused sandbox) does on the node without saying so. A lost
 * node's sandboxes are those the Finder's cache placed there, i.e. those this gateway routed to
 * or found since it started.
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import type { Finder, FindOne, FoundSandbox } from "../finder/finder.ts";
import { LruCache } from "../../shared/lru.ts";
import type { LifecycleEvent } from "./webhooks.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import type { LifecycleEventType, NodeLifecycleEvent } from "../../shared/schemas.ts";
import { DEFAULT_TEAM } from "../../shared/teams.ts";

/** Options of {@linkcode LifecycleEvents}. */
export interface LifecycleEventsOptions {
  /** Where each event goes (the webhook queue's `send`); nothing is built without one. */
  sink?: (event: LifecycleEvent) => void;
  /** Names a lost node's sandboxes, and forgets a sandbox a node killed at its deadline. */
  finder: Finder;
  /** Stamps events; the real clock by default. */
  clock?: Clock;
  /** Node event ids remembered to drop a repeat (a check-in re-sent after a lost answer). */
  seenIds?: number;
}

/** `/sandboxes/<id>/<verb>` on a node's E2B control plane, where pause and resume live. */
const e2bLifecycleRoute = /\/sandboxes\/[^/?]+\/(pause|resume|connect)(?:\?|$)/;

/**
 * Builds lifecycle events and hands them to the sink. Every method runs on the request path and
 * returns at once: without a sink it does nothing at all.
 *
 * @example
 * ```ts
 * import { Fleet, Finder } from "@dormice/cluster/gateway";
 * import { LifecycleEvents } from "./lifecycle.ts";
 * const fleet = new Fleet();
 * const seen: string[] = [];
 * const events = new LifecycleEvents({
 *   finder: new Finder({ fleet, token: "t".repeat(32) }),
 *   sink: (e) => seen.push(e.type),
 * });
 * events.fromNode("node-a", [{
 *   id: "e1", type: "timed_out", at: Date.now(), reason: "timeout", detail: "deadline passed",
 *   sandbox: { id: "sbx_1", name: "agent-1", team: "default" },
 * }]);
 * console.log(seen); // ["timed_out"]
 * fleet.close();
 * ```
 */
export class LifecycleEvents {
  readonly #sink?: (event: LifecycleEvent) => void;
  readonly #finder: Finder;
  readonly #clock: Clock;
  readonly #seen: LruCache<string, true>;

  /** Builds the event source over the Finder. */
  constructor(options: LifecycleEventsOptions) {
    this.#sink = options.sink;
    this.#finder = options.finder;
    this.#clock = options.clock ?? systemClock;
    this.#seen = new LruCache({ max: options.seenIds ?? 10_000 });
  }

  /** Whether events go anywhere (a webhook is configured). */
  get enabled(): boolean {
    return this.#sink !== undefined;
  }

  /** A create the gateway placed answered 2xx. */
  created(node: FleetNode, sandbox: FoundSandbox, path: string): void {
    if (!this.#sink) return;
    const verb = path.startsWith("/e2b/") ? "an E2B create" : path.slice(1);
    this.#emit("created", sandbox, node.id, "placed", `Created by ${verb} on node '${node.id}'`);
  }

  /** A destroy the gateway ran answered 2xx. */
  destroyed(found: FindOne, path: string): void {
    if (!this.#sink) return;
    const verb = path.startsWith("/e2b/") ? "an E2B kill" : path.slice(1);
    this.#emit("killed", found.sandbox, found.node.id, "requested", `Killed by ${verb}`);
  }

  /** A streamed forward ended: an E2B pause (204), resume or connect (201) is an event. */
  forwarded(path: string, status: number, found: FindOne | undefined): void {
    if (!this.#sink || found === undefined || (status !== 201 && status !== 204)) return;
    const m = e2bLifecycleRoute.exec(path);
    if (!m) return;
    if (m[1] === "pause" && status === 204) {
      this.#emit("paused", found.sandbox, found.node.id, "requested", "Paused by an E2B pause");
    } else if (m[1] !== "pause" && status === 201) {
      // 201 is E2B's "it was paused and is now running"; 200 means it already ran.
      this.#emit(
        "resumed",
        found.sandbox,
        found.node.id,
        "requested",
        `Resumed by an E2B ${m[1]}`,
      );
    }
  }

  /**
   * Events a node carried in its check-in. A repeat (same id, the node re-sent after losing the
   * gateway's answer) is dropped; a sandbox the node killed is forgotten by the Finder, so the
   * next request asks the fleet instead of being sent to a sandbox that is gone.
   */
  fromNode(nodeId: string, events: readonly NodeLifecycleEvent[] | undefined): void {
    if (events === undefined) return;
    for (const e of events) {
      if (e.type === "timed_out" || e.type === "killed") this.#finder.evict("id", e.sandbox.id);
      if (!this.#sink || this.#seen.has(e.id)) continue;
      this.#seen.set(e.id, true);
      this.#sink({
        id: e.id,
        type: e.type,
        at: new Date(e.at).toISOString(),
        sandbox: { id: e.sandbox.id, name: e.sandbox.name, team: e.sandbox.team },
        nodeId,
        reason: e.reason,
        detail: e.detail,
        source: "node",
      });
    }
  }

  /** A node went down: one `node_lost` per sandbox the Finder's cache places there. */
  nodeLost(node: FleetNode): void {
    if (!this.#sink) return;
    const silent = Math.round((this.#clock.now() - node.lastCheckIn) / 1000);
    for (const one of this.#finder.cachedOn(node.id)) {
      this.#emit(
        "node_lost",
        one.sandbox,
        node.id,
        "node_down",
        `Node '${node.id}' at ${node.endpoint} has not checked in for ${silent} s ` +
          `(interval ${node.intervalSeconds} s); its sandboxes are unreachable until it is back`,
      );
    }
  }

  #emit(
    type: LifecycleEventType,
    sandbox: FoundSandbox,
    nodeId: string,
    reason: string,
    detail: string,
  ): void {
    this.#sink!({
      id: crypto.randomUUID(),
      type,
      at: new Date(this.#clock.now()).toISOString(),
      sandbox: { id: sandbox.id, name: sandbox.name, team: sandbox.team ?? DEFAULT_TEAM },
      nodeId,
      reason,
      detail,
      source: "gateway",
    });
  }
}
