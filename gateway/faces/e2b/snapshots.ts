/**
 * The gateway's E2B snapshot routes, beside the control plane (`control.ts`): the list is
 * the union of every node's (each filtered to the caller's team on its node), merged and paged
 * here; a delete is told to every node; and a create whose `templateID` is a snapshot (its id,
 * or its name within the caller's team) is placed only on a node that advertises it. Creating a
 * snapshot and forking are about one sandbox and are streamed to its node by id, as any such
 * route is. No state is kept here: the nodes hold the snapshots and advertise their ids.
 *
 * @module
 */
import { encodeListCursor } from "../../../shared/list_cursor.ts";
import { HttpError } from "../../../shared/http_error.ts";
import { TEMPLATE_DELETE_NOT_BUILT } from "../../../shared/e2b_unbuilt.ts";
import {
  pageSnapshots,
  parseSnapshotQuery,
  snapshotCursor,
  type SnapshotRow,
} from "../../../shared/snapshots.ts";
import { UNREACHABLE_HEADER } from "./merge.ts";
import type { GatewayParts } from "../parts.ts";
import { holdersOf } from "./template_listing.ts";
import { listAll } from "./snapshot_rows.ts";
import { TEAM_HEADER } from "../../../shared/teams.ts";

/** The shape of a snapshot id (as the nodes make them). */
const SNAPSHOT_ID = /^snap-[a-z0-9]{20}$/;

/** How a create's `templateID` resolved: a template, or a snapshot and the nodes holding it. */
export type CreateSource =
  | { kind: "template" }
  | {
    kind: "snapshot";
    snapshotId: string;
    holders: string[];
    /** Nodes holding an older build of it (healed before its template was built again). */
    stale: string[];
    /** When its newest build was made, ms; given when some node holds an older one. */
    createdAt?: number;
  };

/**
 * Whether a create's `templateID` names a snapshot, and which nodes hold it. A name is looked
 * up among the caller's team's snapshots on the nodes that may hold it (`holdersOf`), unless some node serves a template by
 * that name (templates win: a node refuses a snapshot named like its templates). An id no
 * node advertises yet (taken since the last check-ins) is asked of every node, and so is one
 * several nodes advertise, or (shared mode) one etcd records as taken again on a node (each
 * node pushes its check-in after taking a name again, before the take is answered), so the
 * newest build is found by the nodes' own rows. A snapshot
 * whose every holder is down is a 503 naming them (unless a node with a registry is up: it
 * pulls it from there), never a create from something else; one no node holds is E2B's 404.
 *
 * @throws {HttpError} 404 for a snapshot no node holds, 503 when only down nodes hold it.
 */
export async function resolveCreateSource(
  parts: GatewayParts,
  templateID: string,
  nodeApi: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<CreateSource> {
  const nodes = [...parts.fleet.nodes()];
  let snapshotId: string;
  let holders: string[];
  let stale: string[] = [];
  let createdAt: number | undefined;
  if (SNAPSHOT_ID.test(templateID)) {
    snapshotId = templateID;
    holders = nodes.filter((n) => n.snapshots?.has(snapshotId)).map((n) => n.id);
    // More than one holder: a template built again, or a name taken again on another node,
    // leaves an older build on some of them, and only the nodes' rows say which (their
    // creation times).
    if (holders.length !== 1 || await retakenElsewhere(parts, snapshotId, holders)) {
      const { rows } = await listAll(parts, nodeApi, `?name=${snapshotId}`, { headers, signal });
      const held = rows.filter((r) => r.snapshotID === snapshotId);
      const advertised = holders;
      ({ holders, stale, createdAt } = newestBuild(held));
      // A holder that did not answer keeps its check-in's word.
      holders.push(...advertised.filter((id) => !held.some((r) => r.node === id)));
    }
  } else {
    const isTemplate = nodes.some((n) => n.templates === null || n.templates.includes(templateID));
    if (isTemplate) return { kind: "template" };
    // Only the nodes that may hold a snapshot by that name: those advertising it (a take
    // pushes its check-in before it answers), and in shared mode the node etcd records for
    // the team's newest build of it. None: no such snapshot, and no node is asked.
    const candidates = await holdersOf(parts, templateID, headers[TEAM_HEADER]);
    if (candidates.length === 0) return { kind: "template" };
    const { rows, headers: answered } = await listAll(
      parts,
      nodeApi,
      `?name=${encodeURIComponent(templateID)}`,
      { headers, signal, nodes: candidates },
    );
    const named = rows.filter((r) => r.names.includes(templateID));
    const match = named.length === 0 ? undefined : newestRow(named);
    const silent = answered[UNREACHABLE_HEADER];
    if (!match && silent) {
      // No template has the name, and a node that did not answer may hold a snapshot by it.
      throw new HttpError(
        503,
        `No node that answered has a template or snapshot named '${templateID}', and node ` +
          `${silent} did not answer (it may hold that snapshot): retry once it checks in again`,
        { headers: { "retry-after": "5", [UNREACHABLE_HEADER]: silent } },
      );
    }
    if (!match) return { kind: "template" };
    snapshotId = match.snapshotID;
    ({ holders, stale, createdAt } = newestBuild(
      named.filter((r) => r.snapshotID === snapshotId),
    ));
  }
  if (holders.length === 0) {
    // Silent nodes were not asked an answer: one of them may hold it.
    const silent = nodes.filter((n) => parts.fleet.isDown(n)).map((n) => n.id);
    if (silent.length === 0) {
      throw new HttpError(
        404,
        `Snapshot '${snapshotId}' not found on any node: list your team's snapshots ` +
          `(GET /snapshots) for their ids and names`,
      );
    }
    holders = silent;
  }
  const now = parts.fleet.now();
  const down = holders.filter((id) => parts.fleet.isDown(id, now));
  // A node with a registry pulls the snapshot from there (every node pushes what it takes).
  const registry = nodes.some((n) =>
    n.snapshotRegistry !== undefined && !parts.fleet.isDown(n, now)
  );
  if (down.length === holders.length && !registry) {
    throw new HttpError(
      503,
      `Snapshot '${snapshotId}' is held only by node ${
        down.map((id) => `'${id}'`).join(", ")
      }, which is down: retry once it checks in again (a sandbox is never started from ` +
        `anything else)`,
      { headers: { "retry-after": "5" } },
    );
  }
  return {
    kind: "snapshot",
    snapshotId,
    holders,
    stale,
    ...(stale.length > 0 && createdAt !== undefined ? { createdAt } : {}),
  };
}

/**
 * Shared mode: whether etcd records snapshot `snapshotId` as taken again on a node `holders`
 * (this gateway's node table) does not name yet: the taking node's check-in reached another
 * gateway, and this one's table lags a poll behind. When etcd cannot be asked, the nodes are
 * (true): asking costs one round, a wrong build costs a wrong sandbox.
 */
async function retakenElsewhere(
  parts: GatewayParts,
  snapshotId: string,
  holders: readonly string[],
): Promise<boolean> {
  if (parts.snapshotRetakes === undefined) return false;
  try {
    return (await parts.snapshotRetakes.nodes(snapshotId)).some((id) => !holders.includes(id));
  } catch (error) {
    parts.log("warn", "cannot read etcd's record of snapshots taken again: asking the nodes", {
      snapshot: snapshotId,
      error: error instanceof Error ? error.message : String(error),
    });
    return true;
  }
}

/** The row created last (a template's newest build). */
function newestRow(rows: SnapshotRow[]): SnapshotRow {
  return rows.reduce((a, b) => (Date.parse(b.createdAt) > Date.parse(a.createdAt) ? b : a));
}

/**
 * The nodes holding the newest build of one snapshot id, and those holding an older one (its
 * template was built again after they healed it); `rows` are that id's rows.
 */
function newestBuild(
  rows: SnapshotRow[],
): { holders: string[]; stale: string[]; createdAt?: number } {
  if (rows.length === 0) return { holders: [], stale: [] };
  const newest = newestRow(rows).createdAt;
  return {
    createdAt: Date.parse(newest),
    holders: rows.filter((r) => r.createdAt === newest).map((r) => r.node),
    stale: rows.filter((r) => r.createdAt !== newest).map((r) => r.node),
  };
}

/** `GET /snapshots`: every node's rows for the caller's team, merged, filtered and paged. */
export async function listSnapshots(
  parts: GatewayParts,
  nodeApi: string,
  url: URL,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<Response> {
  const query = parseSnapshotQuery(url.searchParams, "gateway");
  // Each node pages the same way from the same cursor: the first `limit` rows of the union
  // after the cursor are among the first `limit` of some node.
  const { rows, more, headers: answerHeaders } = await listAll(parts, nodeApi, url.search, {
    headers,
    signal,
  });
  // A snapshot healed to other nodes is listed by each holder: it is one snapshot, listed once.
  const seen = new Set<string>();
  const unique = rows.filter((r) =>
    !seen.has(r.snapshotID) && seen.add(r.snapshotID) !== undefined
  );
  const { page, more: moreHere } = pageSnapshots(unique, query);
  const out = new Headers(answerHeaders);
  out.set("content-type", "application/json");
  if ((moreHere || more) && page.length > 0) {
    out.set("x-next-token", encodeListCursor(snapshotCursor(page[page.length - 1])));
  }
  return new Response(JSON.stringify(page), { status: 200, headers: out });
}

/**
 * `DELETE /templates/:id` of a snapshot (a built template is one): told to every node, best
 * effort. Its holders advertise it, but a copy pulled from the registry or healed a moment ago
 * may not be advertised yet, and a delete must leave no copy a later create could start from.
 * A 204 when one deleted it; a 404 when every node answered it has none; a 503 naming the nodes
 * that did not answer when no node deleted it, since one of them may hold it.
 */
export async function deleteSnapshot(
  parts: GatewayParts,
  nodeApi: string,
  id: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<Response> {
  if (!SNAPSHOT_ID.test(id)) throw new HttpError(501, TEMPLATE_DELETE_NOT_BUILT);
  const answers = await parts.routing.fanOut(
    `${nodeApi}/templates/${encodeURIComponent(id)}`,
    null,
    signal,
    { method: "DELETE", headers },
  );
  const deleted = answers.some((a) => a.ok);
  const silent = answers.filter((a) => !a.ok && !/^HTTP 404:/.test(a.cause))
    .map((a) => a.node.id);
  for (const a of answers) {
    if (!a.ok && !/^HTTP 404:/.test(a.cause)) {
      parts.log("warn", "a node did not answer a snapshot delete", {
        nodeId: a.node.id,
        snapshot: id,
        cause: a.cause,
      });
    }
  }
  if (deleted) {
    return new Response(null, {
      status: 204,
      headers: silent.length > 0 ? { [UNREACHABLE_HEADER]: silent.join(",") } : {},
    });
  }
  if (silent.length > 0) {
    throw new HttpError(
      503,
      `No node deleted snapshot '${id}', and ${
        silent.map((n) => `'${n}'`).join(", ")
      } did not answer (it may hold it): retry shortly`,
      { headers: { "retry-after": "2", [UNREACHABLE_HEADER]: silent.join(",") } },
    );
  }
  throw new HttpError(404, `Snapshot '${id}' not found on any node`);
}
