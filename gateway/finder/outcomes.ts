/**
 * What a lookup answers: the key it is asked by, its four outcomes (`one`, `conflict`, `none`,
 * `unsure`), and the sentences a conflict and an unsure outcome carry to the client. Kept apart
 * from `finder.ts` so the routing and the faces, which only read outcomes, see them without the
 * rounds, and so each sentence with its remedy has one home.
 *
 * @module
 */
import type { FleetNode, NodeDirectory } from "../fleet/fleet.ts";
import type { FoundSandbox } from "./lookup_client.ts";

/**
 * What a lookup is keyed by: the sandbox name or its id. A name key is the name within its team
 * (`teamScopedName(team, name)`: the bare name in the default team, `team/name` otherwise), since
 * two teams may each hold an `agent-1`; an id key is the bare id, which is unique fleet-wide, and
 * the answer says the sandbox's team so the caller can tell whether it may see it.
 */
export type FindBy = "name" | "id";

/** Found on exactly one node: route there. */
export interface FindOne {
  /** `"one"`: route to `node`. A round's `one` is cached by name and id (unless the node left). */
  readonly kind: "one";
  /** The node (live: its endpoint follows check-ins). */
  readonly node: FleetNode;
  /** The sandbox it reported. */
  readonly sandbox: FoundSandbox;
}

/** Found on two or more nodes: a 409 naming them. */
export interface FindConflict {
  /** `"conflict"`: answer a 409 with `message`; nothing is cached or routed. */
  readonly kind: "conflict";
  /** Every node that reported it, with what it reported. */
  readonly nodes: ReadonlyArray<{ node: FleetNode; sandbox: FoundSandbox }>;
  /** A sentence naming both nodes and what to do. */
  readonly message: string;
}

/** Every node answered and none has it: absent (a creator may place it). */
export interface FindNone {
  /** `"none"`: absent everywhere; never cached, so the next miss asks the fleet again. */
  readonly kind: "none";
}

/** Nobody who answered has it, but some nodes did not answer: a 503 with Retry-After. */
export interface FindUnsure {
  /** `"unsure"`: answer a 503 with `message`; a creator must not build the name elsewhere. */
  readonly kind: "unsure";
  /** The nodes that did not answer, each with why. */
  readonly silent: ReadonlyArray<{ node: FleetNode; cause: string }>;
  /** A sentence naming the silent nodes and what to do. */
  readonly message: string;
  /** Seconds for the 503's Retry-After. */
  readonly retryAfterSeconds: number;
}

/** The outcome of a lookup. */
export type FindResult = FindOne | FindConflict | FindNone | FindUnsure;

/**
 * The outcome when two or more nodes report the key. Two ids at one endpoint are one daemon
 * answering twice, and the sentence says which id to remove or which endpoint to correct;
 * otherwise it is two copies, and the sentence says how to destroy one.
 *
 * @example
 * ```ts ignore
 * return conflictOf("name", "agent-1", found, fleet);
 * ```
 */
export function conflictOf(
  by: FindBy,
  key: string,
  found: { node: FleetNode; sandbox: FoundSandbox }[],
  fleet: NodeDirectory,
): FindConflict {
  const named = found.map(({ node, sandbox }) =>
    `'${node.id}' (${node.endpoint}, sandbox id ${sandbox.id})`
  ).join(" and ");
  const byEndpoint = new Map<string, FleetNode[]>();
  for (const { node } of found) {
    const list = byEndpoint.get(node.endpoint) ?? [];
    list.push(node);
    byEndpoint.set(node.endpoint, list);
  }
  const shared = [...byEndpoint.values()].find((list) => list.length > 1);
  let message: string;
  if (shared !== undefined) {
    // Two ids at one endpoint are one daemon answering twice, not two copies of the sandbox.
    const now = fleet.now();
    const endpoint = shared[0].endpoint;
    const stale = shared.filter((n) => fleet.isDown(n, now)).map((n) => `'${n.id}'`);
    const whoAnswers = `GET ${endpoint}/healthz names the id that really runs there`;
    message = `Sandbox ${by} '${key}' is reported by ${named}, which share the endpoint ` +
      `${endpoint}: one daemon answers for several node ids. ` +
      (stale.length > 0
        ? `Remove the id that no longer checks in (${stale.join(", ")}) with removeNode; if ` +
          `that node does still run elsewhere, its DORMICE_NODE_ENDPOINT names the wrong ` +
          `machine: correct it (${whoAnswers})`
        // Both check in, so neither will ever show down: waiting for one to do so is no remedy.
        : `Every one of them still checks in, so all but one name a machine they do not run ` +
          `on: correct the DORMICE_NODE_ENDPOINT of the others (${whoAnswers}); the gateway ` +
          `takes a corrected endpoint one check-in interval after the wrong one stops`);
  } else {
    message = `Sandbox ${by} '${key}' exists on ${found.length} nodes: ${named}. ` +
      `Destroy the copy you do not want by calling destroySandbox on that node directly`;
  }
  return { kind: "conflict", nodes: found, message };
}

/** The cause of a node a lookup round had no time to ask before its deadline. */
export const NOT_ASKED_CAUSE = "not asked before the round's deadline";

/**
 * The outcome when nobody who answered has the key but some nodes were silent (or not asked
 * before the deadline: counted, not named): Retry-After is
 * the shortest silent node's interval (by then the fleet knows whether it is back).
 *
 * @example
 * ```ts ignore
 * return unsureOf("agent-1", [{ node, cause: "connection refused" }]);
 * ```
 */
export function unsureOf(key: string, silent: { node: FleetNode; cause: string }[]): FindUnsure {
  let interval = Infinity;
  for (const s of silent) interval = Math.min(interval, s.node.intervalSeconds);
  const heard = silent.filter((s) => s.cause !== NOT_ASKED_CAUSE);
  const notAsked = silent.length - heard.length;
  const names = heard.slice(0, 10).map((s) => `'${s.node.id}' (${s.node.endpoint}: ${s.cause})`)
    .join(", ");
  const more = heard.length > 10 ? ` and ${heard.length - 10} more` : "";
  const didNot = heard.length > 0 ? `${names}${more} did not answer` : "";
  const unasked = notAsked === 0 ? "" : `${notAsked} node${notAsked === 1 ? " was" : "s were"} ` +
    "not asked before the round's deadline (a round asks DORMICE_GATEWAY_LOOKUP_CONCURRENCY " +
    "nodes at once, up to 1,024 when they answered slowly of late)";
  return {
    kind: "unsure",
    silent,
    message: `Cannot tell whether '${key}' exists: ${didNot}${didNot && unasked ? ", and " : ""}` +
      `${unasked}, and it may live there. Retry shortly; if a node is gone for good, stop it ` +
      `and remove it with removeNode once it is down, or wait until it is declared dead ` +
      `(DORMICE_GATEWAY_NODE_DEAD_AFTER_S without a check-in)`,
    // Within one check-in interval the fleet knows whether the silent node is back.
    retryAfterSeconds: Math.min(60, Math.max(1, Math.ceil(interval))),
  };
}
