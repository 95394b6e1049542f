/**
 * The sentences the routing rules answer with: how a Finder's conflict or unsure result, a node
 * that stopped checking in, a create nothing can take and a client that left become the
 * `HttpError`s the faces relay. Kept apart from `routing.ts` so the class there reads as the
 * order of the rules, and a reader looking for "where does this 503 come from" finds every
 * one of them here.
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import type { FindNone, FindOne, FindResult } from "../finder/finder.ts";
import type { PickResult } from "../placer/placer.ts";
import { HttpError } from "../../shared/http_error.ts";
import { DEFAULT_TEAM } from "../../shared/teams.ts";

/**
 * The error a client that already hung up gets (nobody reads it; it stops the work).
 *
 * @example
 * ```ts ignore
 * if (request.signal.aborted) throw clientGone();
 * ```
 */
export function clientGone(): HttpError {
  return new HttpError(499, "The client closed the request before the gateway answered");
}

/**
 * A fleet-wide call's answer for a node that stopped checking in: not asked, since the fleet
 * reads it as down (asking would only spend the call's bound on it).
 *
 * @example
 * ```ts ignore
 * if (fleet.isSilent(node, now)) return notAskedSilent(node, now);
 * ```
 */
export function notAskedSilent(
  node: FleetNode,
  now: number,
): { node: FleetNode; ok: false; cause: string } {
  const seconds = Math.round((now - node.lastCheckIn) / 1000);
  return {
    node,
    ok: false,
    cause: `not asked: no check-in for ${seconds} s, so the fleet reads it as down`,
  };
}

/**
 * The 503 for a node that stopped checking in and holds the sandbox, with Retry-After one of its
 * intervals (by then it has checked in again, or it is still gone).
 *
 * @example
 * ```ts ignore
 * if (fleet.isSilent(node, now)) throw silentNodeError(node, now);
 * ```
 */
export function silentNodeError(node: FleetNode, now: number): HttpError {
  const interval = node.intervalSeconds;
  return new HttpError(
    503,
    `Node '${node.id}' at ${node.endpoint} holds this sandbox but has not checked in for ` +
      `${Math.round((now - node.lastCheckIn) / 1000)} s (more than two of its ${interval} s ` +
      "intervals): it may be frozen, stopped or cut off from the gateway. Retry once it " +
      "checks in again; if it is gone for good, stop it and remove it with removeNode (its " +
      "sandboxes go with it), or wait until it is declared dead " +
      "(DORMICE_GATEWAY_NODE_DEAD_AFTER_S without a check-in)",
    {
      headers: { "retry-after": String(Math.min(60, Math.max(1, Math.ceil(interval)))) },
      details: { nodeId: node.id, endpoint: node.endpoint },
    },
  );
}

/**
 * The 503 for a node this gateway cannot hear of (etcd unreadable) that failed its health check:
 * it may have died during the outage. Retry-After one of its intervals.
 *
 * @example
 * ```ts ignore
 * throw unheardNodeError(node, now, "connection refused");
 * ```
 */
export function unheardNodeError(node: FleetNode, now: number, cause: string): HttpError {
  return new HttpError(
    503,
    `Node '${node.id}' at ${node.endpoint} holds this sandbox but did not answer a health ` +
      `check (${cause}), and this gateway cannot read etcd to learn whether it still checks in ` +
      `(last news ${Math.round((now - node.lastCheckIn) / 1000)} s ago): it may be down. ` +
      "Retry shortly, or through another gateway",
    {
      headers: {
        "retry-after": String(Math.min(60, Math.max(1, Math.ceil(node.intervalSeconds)))),
      },
      details: { nodeId: node.id, endpoint: node.endpoint },
    },
  );
}

/**
 * Why a forward still waiting for an unheard node's head stops: its health check failed.
 *
 * @example
 * ```ts ignore
 * const cause = unheardWhileWaiting(node, fleet.now(), "connection refused");
 * ```
 */
export function unheardWhileWaiting(node: FleetNode, now: number, cause: string): string {
  return `Node '${node.id}' at ${node.endpoint} did not answer a health check (${cause}) ` +
    "while this request waited for its answer, and this gateway cannot read etcd to learn " +
    `whether it still checks in (last news ${Math.round((now - node.lastCheckIn) / 1000)} s ` +
    "ago): it may be down, and the request may still run there. Retry shortly, or through " +
    "another gateway";
}

/**
 * Why a forward still waiting for a node's head stops: the node fell silent meanwhile.
 *
 * @example
 * ```ts ignore
 * const cause = silentWhileWaiting(node, fleet.now());
 * ```
 */
export function silentWhileWaiting(node: FleetNode, now: number): string {
  return `Node '${node.id}' at ${node.endpoint} stopped checking in (last check-in ` +
    `${Math.round((now - node.lastCheckIn) / 1000)} s ago, more than two of its ` +
    `${node.intervalSeconds} s intervals) while this request waited for its answer: it may ` +
    "be frozen or cut off, and the request may still run there. listNodes shows it down; " +
    "retry once it checks in again, or remove it with removeNode if it is gone for good";
}

/**
 * Why no node takes a create: a 400 when no node offers its template at all (waiting will not
 * help), otherwise a 503 with the Placer's Retry-After and every node's named reason.
 *
 * @example
 * ```ts ignore
 * if (!pick.ok) throw placementRefusal(pick);
 * ```
 */
export function placementRefusal(pick: Extract<PickResult, { ok: false }>): HttpError {
  if (pick.templateNowhere) {
    const { template, offered } = pick.templateNowhere;
    return new HttpError(
      400,
      `No node of the fleet has template '${template}': the fleet offers ` +
        `${offered.length === 0 ? "no templates" : offered.join(", ")}`,
      { details: { template, offered } },
    );
  }
  return new HttpError(503, pick.message, {
    headers: { "retry-after": String(pick.retryAfterSeconds) },
    details: { reasons: pick.explain.rejections },
  });
}

/**
 * The status a failed forward is counted under: its HttpError's (502, 504), or 499.
 *
 * @example
 * ```ts ignore
 * observer.forwarded?.(path, statusOf(error), seconds);
 * ```
 */
export function statusOf(error: unknown): number {
  return error instanceof HttpError ? error.status : 499;
}

/**
 * `one` when it belongs to `team` (or no team limits the caller), `none` otherwise.
 *
 * @example
 * ```ts ignore
 * return ownedBy(settle(result), team);
 * ```
 */
export function ownedBy(r: FindOne | FindNone, team: string | undefined): FindOne | FindNone {
  return r.kind === "one" && team !== undefined && (r.sandbox.team ?? DEFAULT_TEAM) !== team
    ? { kind: "none" }
    : r;
}

/**
 * Turns conflict and unsure into their HTTP errors; passes one and none through.
 *
 * @throws {HttpError} 409 naming every node that holds the key, 503 with Retry-After naming the
 *   silent nodes.
 * @example
 * ```ts ignore
 * const r = settle(await finder.find("name", key));
 * ```
 */
export function settle(result: FindResult): FindOne | FindNone {
  switch (result.kind) {
    case "one":
    case "none":
      return result;
    case "conflict":
      throw new HttpError(409, result.message, {
        details: {
          nodes: result.nodes.map(({ node, sandbox }) => ({
            nodeId: node.id,
            endpoint: node.endpoint,
            sandboxId: sandbox.id,
          })),
        },
      });
    case "unsure":
      throw new HttpError(503, result.message, {
        headers: { "retry-after": String(result.retryAfterSeconds) },
        details: {
          silent: result.silent.map(({ node, cause }) => ({
            nodeId: node.id,
            endpoint: node.endpoint,
            cause,
          })),
        },
      });
  }
}
