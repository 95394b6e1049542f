/**
 * The gateway's reading of E2B templates: a team's template found by name or id (a fleet
 * template of `DORMICE_TEMPLATES`, or a named snapshot of the team on any node), and
 * `GET /templates`, the fleet's templates with the team's built ones.
 *
 * @module
 */
import { HttpError } from "../../../shared/http_error.ts";
import { encodeListCursor } from "../../../shared/list_cursor.ts";
import { pageSnapshots, snapshotCursor, type SnapshotRow } from "../../../shared/snapshots.ts";
import type { GatewayParts } from "../parts.ts";
import { listAll } from "./snapshots.ts";

/** How many pages of 100 snapshot rows `GET /templates` reads at most. */
export const LIST_PAGES = 50;

/** A template found: its id, the node holding it (a built one) and whether it is the fleet's. */
export interface FoundTemplate {
  templateID: string;
  node?: string;
  createdAt: string;
  public: boolean;
}

/** The team's template (built, or a fleet template) by name or id, or undefined. */
export async function findTemplate(
  parts: GatewayParts,
  nodeApi: string,
  nameOrId: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<FoundTemplate | undefined> {
  const nodes = [...parts.fleet.nodes()];
  if (nodes.some((n) => n.templates?.includes(nameOrId))) {
    return { templateID: nameOrId, createdAt: new Date(0).toISOString(), public: true };
  }
  const { rows } = await listAll(
    parts,
    nodeApi,
    `?name=${encodeURIComponent(nameOrId)}`,
    { headers, signal },
  );
  const row = rows.find((r) => r.names.includes(nameOrId) || r.snapshotID === nameOrId);
  return row
    ? { templateID: row.snapshotID, node: row.node, createdAt: row.createdAt, public: false }
    : undefined;
}

/**
 * `GET /templates`: the fleet's templates (public), then the team's named snapshots, each with
 * the newest build this gateway routed of it (`latestBuild`).
 */
export async function listTemplates(
  parts: GatewayParts,
  nodeApi: string,
  latestBuild: (templateId: string) => string | undefined,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<Response> {
  const rows = await allRows(parts, nodeApi, headers, signal);
  const fleet = new Set<string>();
  for (const n of parts.fleet.nodes()) for (const t of n.templates ?? []) fleet.add(t);
  const template = (id: string, names: string[], pub: boolean, createdAt: string) => ({
    templateID: id,
    buildID: latestBuild(id) ?? id,
    cpuCount: 2,
    memoryMB: 512,
    diskSizeMB: 0,
    public: pub,
    aliases: names,
    names,
    createdAt,
    updatedAt: createdAt,
    createdBy: null,
    lastSpawnedAt: null,
    spawnCount: 0,
    buildCount: 1,
    envdVersion: "0.6.13",
    buildStatus: "ready",
  });
  const epoch = new Date(0).toISOString();
  return Response.json([
    ...[...fleet].sort().map((t) => template(t, [t], true, epoch)),
    // The team's named snapshots, built templates among them: a create takes either by name.
    ...rows.filter((r) => r.names.length > 0)
      .map((r) => template(r.snapshotID, r.names, false, r.createdAt)),
  ]);
}

/**
 * Every snapshot row of the team, page after page (at most {@linkcode LIST_PAGES} of 100),
 * each snapshot once: a template healed to other nodes is listed by each holder, and the
 * row of its newest build stands for it.
 */
async function allRows(
  parts: GatewayParts,
  nodeApi: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<SnapshotRow[]> {
  const byId = new Map<string, SnapshotRow>();
  let token: string | undefined;
  for (let i = 0; i < LIST_PAGES; i++) {
    const search = `?limit=100${token ? `&nextToken=${token}` : ""}`;
    const { rows, more } = await listAll(parts, nodeApi, search, {
      headers,
      signal,
    });
    // Each node pages from the same cursor: the first 100 of the union are complete.
    const { page, more: moreHere } = pageSnapshots(rows, { limit: 100 });
    const pageIds = new Set(page.map((r) => r.snapshotID));
    for (const r of rows) {
      if (!pageIds.has(r.snapshotID)) continue;
      const held = byId.get(r.snapshotID);
      if (!held || Date.parse(r.createdAt) > Date.parse(held.createdAt)) {
        byId.set(r.snapshotID, r);
      }
    }
    if (!(more || moreHere) || page.length === 0) return [...byId.values()];
    token = encodeListCursor(snapshotCursor(page[page.length - 1]));
  }
  parts.log("warn", "a template listing stopped at its page bound", {
    pages: LIST_PAGES,
  });
  return [...byId.values()];
}

/** A 404 naming the template not found and how to find or make it. */
export function notFound(nameOrId: string): HttpError {
  return new HttpError(
    404,
    `Template '${nameOrId}' not found: list your templates with GET /templates, or build it`,
  );
}
