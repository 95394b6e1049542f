/**
 * What node and gateway share about snapshots on the E2B face: the listed row (E2B's
 * `SnapshotInfo`, `{snapshotID, names}`, with the origin sandbox, node and time a gateway merges
 * by), the list's filters and paging (`limit` 1–100, `nextToken`, `X-Next-Token`), and the bound
 * of the ids a node advertises in its check-in.
 *
 * @module
 */
import { compareListCursors, decodeListCursor, type ListCursor } from "./list_cursor.ts";
import { HttpError } from "./http_error.ts";

/**
 * The most snapshot ids one check-in advertises (the newest; about 26 bytes each, so at most
 * about 53 KB). A node holding more says so (`snapshotsTruncated`), and the gateway then counts
 * it as a possible holder of any snapshot it does not see advertised anywhere.
 */
export const MAX_CHECK_IN_SNAPSHOTS = 2048;

/** One snapshot as the E2B list and create answer it. */
export interface SnapshotRow {
  /** The id `Sandbox.create()` starts from. */
  snapshotID: string;
  /** Its name, when it has one (E2B's full names; here the team's own name). */
  names: string[];
  /** The sandbox it was taken from. */
  sandboxID: string;
  /** The node that holds it. */
  node: string;
  /** When it was taken, ISO 8601. */
  createdAt: string;
}

/** A snapshot as an executor describes it (the part of `SnapshotInfo` a row needs). */
export interface SnapshotFacts {
  snapshotId: string;
  name?: string;
  sandboxId: string;
  node: string;
  createdAt: number;
}

/**
 * The E2B row of a snapshot.
 *
 * @example
 * ```ts
 * import { snapshotRow } from "./snapshots.ts";
 * snapshotRow({ snapshotId: "snap-1", name: "a", sandboxId: "s", node: "n", createdAt: 0 })
 *   .names; // ["a"]
 * ```
 */
export function snapshotRow(s: SnapshotFacts): SnapshotRow {
  return {
    snapshotID: s.snapshotId,
    names: s.name === undefined ? [] : [s.name],
    sandboxID: s.sandboxId,
    node: s.node,
    createdAt: new Date(s.createdAt).toISOString(),
  };
}

/** The list's filters and page, read from its query. */
export interface SnapshotQuery {
  /** Only snapshots taken from this sandbox. */
  sandboxId?: string;
  /** Only the snapshot with this id or name (a `:tag` suffix is ignored: there are no tags). */
  name?: string;
  /** Rows per page, 1–100 (E2B's default 100). */
  limit: number;
  /** Rows after this position only. */
  after?: ListCursor;
}

/**
 * Reads `sandboxID`, `name`, `limit` and `nextToken`; a bad one is a 400 naming it.
 *
 * @throws {HttpError} 400 for a limit outside 1–100 or a token this fleet did not issue.
 * @example
 * ```ts
 * import { parseSnapshotQuery } from "./snapshots.ts";
 * parseSnapshotQuery(new URLSearchParams("limit=5"), "node").limit; // 5
 * ```
 */
export function parseSnapshotQuery(query: URLSearchParams, issuer: string): SnapshotQuery {
  const raw = query.get("limit");
  const limit = raw === null || raw === "" ? 100 : Number(raw);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100) {
    throw new HttpError(
      400,
      `'limit' must be a whole number from 1 to 100: received '${raw?.slice(0, 20)}'`,
    );
  }
  const token = query.get("nextToken");
  const sandboxId = query.get("sandboxID") || undefined;
  const name = query.get("name")?.replace(/:[^/:]*$/, "") || undefined;
  return {
    limit,
    ...(sandboxId ? { sandboxId } : {}),
    ...(name ? { name } : {}),
    ...(token ? { after: decodeListCursor(token, issuer) } : {}),
  };
}

/** Whether a row passes the query's filters (not its page). */
export function snapshotMatches(row: SnapshotRow, query: SnapshotQuery): boolean {
  if (query.sandboxId !== undefined && row.sandboxID !== query.sandboxId) return false;
  if (query.name !== undefined) {
    const bare = query.name.includes("/") ? query.name.slice(query.name.indexOf("/") + 1) : "";
    if (
      row.snapshotID !== query.name && !row.names.includes(query.name) &&
      !(bare && row.names.includes(bare))
    ) return false;
  }
  return true;
}

/** A row's position in the listing order (oldest first, ties by id). */
export function snapshotCursor(row: SnapshotRow): ListCursor {
  return { createdAt: row.createdAt, id: row.snapshotID };
}

/**
 * One page of `rows` (any order; filters applied here too): the rows after the query's cursor,
 * oldest first, at most `limit`, and whether more follow.
 *
 * @example
 * ```ts
 * import { pageSnapshots } from "./snapshots.ts";
 * pageSnapshots([], { limit: 10 }); // { page: [], more: false }
 * ```
 */
export function pageSnapshots(
  rows: readonly SnapshotRow[],
  query: SnapshotQuery,
): { page: SnapshotRow[]; more: boolean } {
  const after = query.after;
  const sorted = rows.filter((r) => snapshotMatches(r, query))
    .filter((r) => after === undefined || compareListCursors(snapshotCursor(r), after) > 0)
    .sort((a, b) => compareListCursors(snapshotCursor(a), snapshotCursor(b)));
  return { page: sorted.slice(0, query.limit), more: sorted.length > query.limit };
}

/**
 * The header a gateway names the holders a create's snapshot may be healed from in:
 * `<node id>=<endpoint>` pairs, comma-separated, the one to try first first. Only a caller with
 * the fleet token reaches a node's create, so only a gateway (or the operator) names them.
 */
export const HEAL_FROM_HEADER = "x-dormice-heal-from";

/**
 * The header a gateway names the creation time (ms since the epoch) of a snapshot's newest
 * build in, when some node holds an older one (a template built again after a node healed
 * it): a node whose copy is older gets the newest first, from {@linkcode HEAL_FROM_HEADER}'s
 * holders or the registry.
 */
export const HEAL_CREATED_HEADER = "x-dormice-heal-created";

/**
 * The header a gateway names, on a snapshot's take with a name, the id the caller's team already
 * has by that name on some node: the node keeps the new snapshot under it (a new build of that
 * snapshot, as E2B's `createSnapshot({name})` is), so one name is one id across the fleet.
 */
export const SNAPSHOT_ID_HEADER = "x-dormice-snapshot-id";
