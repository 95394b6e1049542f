/**
 * Every node's snapshot rows: `GET /snapshots` asked of the nodes and their answers put
 * together, each row named with the node that answered. The snapshot routes (`snapshots.ts`)
 * and the template reading (`template_listing.ts`) both read the fleet's snapshots this way.
 *
 * @module
 */
import type { SnapshotRow } from "../../../shared/snapshots.ts";
import type { FleetNode } from "../../fleet/node.ts";
import type { GatewayParts } from "../parts.ts";
import { gather } from "./merge.ts";

/** Every node's answer to `GET /snapshots<search>`, the rows together (each with its node). */
export async function listAll(
  parts: GatewayParts,
  nodeApi: string,
  search: string,
  { headers, signal, nodes }: {
    headers: Record<string, string>;
    signal: AbortSignal;
    /** The nodes to ask; every registered node when absent. */
    nodes?: readonly FleetNode[];
  },
): Promise<{ rows: SnapshotRow[]; more: boolean; headers: Record<string, string> }> {
  const answers = await parts.routing.fanOut(`${nodeApi}/snapshots${search}`, null, signal, {
    method: "GET",
    headers,
    ...(nodes ? { nodes } : {}),
  });
  const { answered, headers: answerHeaders } = gather(
    answers,
    (json) => Array.isArray(json) ? json as SnapshotRow[] : undefined,
    "snapshot list",
    parts.log,
  );
  return {
    // The node that answered holds the row, whatever the row says of itself.
    rows: answered.flatMap((a) => a.value.map((r) => ({ ...r, node: a.answer.node.id }))),
    more: answered.some((a) => a.answer.headers.get("x-next-token") !== null),
    headers: answerHeaders,
  };
}
