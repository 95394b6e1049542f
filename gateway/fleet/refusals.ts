/**
 * The sentences the Fleet refuses with: a check-in from the gateway's own address (400), a
 * second reporter under a live node id (409), and a `removeNode` of an unknown id (404) or of
 * a node that still checks in (409). Kept apart from `fleet.ts` so the Fleet reads as its rules, and each refusal, with the
 * variable or verb that fixes it, is found in one place.
 *
 * @module
 */
import type { FleetNode } from "./node.ts";
import type { CheckIn } from "../../shared/schemas.ts";
import { HttpError } from "../../shared/http_error.ts";

/**
 * A check-in whose endpoint is the gateway itself: every lookup and forward would come back.
 *
 * @example
 * ```ts ignore
 * if (isOwnEndpoint(body.endpoint)) throw ownEndpointRefusal(body);
 * ```
 */
export function ownEndpointRefusal(body: CheckIn): HttpError {
  return new HttpError(
    400,
    `Node '${body.nodeId}' checks in with the endpoint ${body.endpoint}, which is this ` +
      "gateway's own address: set the node's DORMICE_NODE_ENDPOINT to the address where " +
      "the gateway reaches that node",
    { details: { nodeId: body.nodeId, endpoint: body.endpoint } },
  );
}

/**
 * A second endpoint under the live id of `known`, silent for `silentMs` (at most
 * `moveAfterMs`, after which the move is accepted).
 *
 * @example
 * ```ts ignore
 * throw twinRefusal(known, body.endpoint, silentMs, moveAfterMs);
 * ```
 */
export function twinRefusal(
  known: FleetNode,
  endpoint: string,
  silentMs: number,
  moveAfterMs: number,
): HttpError {
  const message = `Node id '${known.id}' is checking in from ${known.endpoint} ` +
    `(last check-in ${seconds(silentMs)} ago), so ${endpoint} cannot use it: ` +
    `give the node at ${endpoint} its own DORMICE_NODE_ID, or, if the node really ` +
    `moved, stop the one at ${known.endpoint}; the new endpoint is accepted after ` +
    `${seconds(moveAfterMs)} of silence from the old one`;
  return new HttpError(409, message, {
    details: { nodeId: known.id, endpoint: known.endpoint, refusedEndpoint: endpoint },
  });
}

/**
 * `removeNode` of an id the Fleet does not know.
 *
 * @example
 * ```ts ignore
 * if (m === undefined) throw unknownNode(id);
 * ```
 */
export function unknownNode(id: string): HttpError {
  return new HttpError(404, `No node '${id}' in the fleet: listNodes shows the registered ids`);
}

/**
 * `removeNode` of a node that is not down yet: `downMs` is how long it must be silent.
 *
 * @example
 * ```ts ignore
 * if (!fleet.isDown(m, now)) throw stillChecksIn(m, now, downMs);
 * ```
 */
export function stillChecksIn(m: FleetNode, now: number, downMs: number): HttpError {
  return new HttpError(
    409,
    `Node '${m.id}' at ${m.endpoint} still checks in (last check-in ` +
      `${seconds(now - m.lastCheckIn)} ago): stop it (or unset its DORMICE_GATEWAY_ENDPOINT), ` +
      `wait two check-in intervals (${seconds(downMs)}) until listNodes shows it down, ` +
      `then remove it`,
    { details: { nodeId: m.id, endpoint: m.endpoint } },
  );
}

/**
 * `removeNode` of a node this gateway cannot hear of because it cannot read etcd (shared mode):
 * listNodes shows it down, but it may be checking in with another gateway, and the removal
 * could not reach the others anyway.
 *
 * @example
 * ```ts ignore
 * if (fleet.isUnheard(m, now)) throw unheardRemoval(m, now);
 * ```
 */
export function unheardRemoval(m: FleetNode, now: number): HttpError {
  return new HttpError(
    503,
    `Cannot remove node '${m.id}' at ${m.endpoint}: this gateway cannot read etcd, so it cannot ` +
      `tell whether the node still checks in with another gateway (last news ` +
      `${seconds(now - m.lastCheckIn)} ago), and the removal would not reach the others. Retry ` +
      "once etcd answers, or through a gateway that reaches it",
    { headers: { "retry-after": "5" }, details: { nodeId: m.id, endpoint: m.endpoint } },
  );
}

function seconds(ms: number): string {
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
}
