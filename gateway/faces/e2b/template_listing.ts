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
import { TEAM_HEADER } from "../../../shared/teams.ts";
import type { FleetNode } from "../../fleet/node.ts";
import type { GatewayParts } from "../parts.ts";
import { listAll } from "./snapshot_rows.ts";

/** How many pages of 100 snapshot rows `GET /templates` reads at most. */
export const LIST_PAGES = 50;

/** A template found: its id, the node holding it (a built one) and whether it is the fleet's. */
export interface FoundTemplate {
  templateID: string;
  node?: string;
  createdAt: string;
  public: boolean;
}

/**
 * How many `<team>/<name>` a node's check-in carries at most (`snapshotNames`): a node listing
 * that many may hold more names than it lists.
 */
export const ADVERTISED_NAMES_CAP = 256;

/** A built template's id: a snapshot id. */
const TEMPLATE_ID = /^snap-[a-z0-9]{20}$/;

/**
 * The nodes that may hold a built template by name or id, from their check-ins: those that
 * advertise the name (any team's: another team's published template is found too) or the id,
 * and those whose advertisement is cut at its cap. A node that finishes a build pushes its
 * check-in before the build reads ready, so the gateway it checks in with knows the new holder
 * at once, and every gateway of a shared fleet within one fleet poll (1 s).
 */
export function templateHolders(parts: GatewayParts, nameOrId: string): FleetNode[] {
  const suffix = `/${nameOrId}`;
  return [...parts.fleet.nodes()].filter((n) =>
    n.snapshotsTruncated === true ||
    (n.snapshotNames?.length ?? 0) >= ADVERTISED_NAMES_CAP ||
    n.snapshots?.has(nameOrId) === true ||
    n.snapshotNames?.some((s) => s.endsWith(suffix)) === true
  );
}

/**
 * The nodes that may hold, or build, snapshot or template `nameOrId` of `team`: the advertised
 * holders ({@linkcode templateHolders}), and in shared mode the nodes etcd records as having
 * just taken or built it (by id: a pushed take or finished build, and where the team's builds
 * of that id were placed; by name: where its newest build was placed). An empty answer means
 * no node holds it (a node pushes its check-in before a take or build answers).
 */
export async function holdersOf(
  parts: GatewayParts,
  nameOrId: string,
  team: string | undefined,
): Promise<FleetNode[]> {
  const holders = templateHolders(parts, nameOrId);
  for (const id of await builtRecently(parts, nameOrId, team)) {
    const node = parts.fleet.get(id);
    if (node && !holders.includes(node)) holders.push(node);
  }
  return holders;
}

/**
 * The team's template (built, or a fleet template) by name or id, or undefined. A built one is
 * asked of the nodes that may hold it only ({@linkcode templateHolders}); a name no node
 * advertises is not found without asking any.
 */
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
  const holders = await holdersOf(parts, nameOrId, headers[TEAM_HEADER]);
  if (holders.length === 0) return undefined;
  const { rows } = await listAll(
    parts,
    nodeApi,
    `?name=${encodeURIComponent(nameOrId)}`,
    { headers, signal, nodes: holders },
  );
  const row = rows.find((r) => r.names.includes(nameOrId) || r.snapshotID === nameOrId);
  return row
    ? { templateID: row.snapshotID, node: row.node, createdAt: row.createdAt, public: false }
    : undefined;
}

/**
 * Shared mode: the nodes etcd names for a template just built or placed, which the check-ins
 * this gateway read may not show yet: by id, the nodes that pushed a finished build of it; by
 * name, the node its team's newest build was placed on. None with one gateway (its node
 * table has a finished build's pushed check-in before the build reads ready), or when etcd
 * cannot be read (the check-ins then say, within one fleet poll).
 */
async function builtRecently(
  parts: GatewayParts,
  nameOrId: string,
  team: string | undefined,
): Promise<string[]> {
  try {
    if (TEMPLATE_ID.test(nameOrId)) {
      const taken = await parts.snapshotRetakes?.nodes(nameOrId) ?? [];
      const placed = team === undefined
        ? []
        : await parts.templateNames?.nodesOf(team, nameOrId) ?? [];
      return [...new Set([...taken, ...placed])];
    }
    if (team === undefined || parts.templateNames === undefined) return [];
    const placed = await parts.templateNames.get(`${team}/${nameOrId}`);
    return placed === undefined ? [] : [placed.node];
  } catch (error) {
    parts.log(
      "warn",
      "cannot read etcd's record of template builds: asking the advertised holders",
      {
        template: nameOrId,
        error: error instanceof Error ? error.message : String(error),
      },
    );
    return [];
  }
}

/**
 * `GET /templates`: the fleet's templates (public), then the team's named snapshots, each with
 * the newest build this gateway routed of it (`latestBuild`). A listing: it pages through the
 * rows of every node that may hold a named snapshot of the team ({@linkcode teamHolders}).
 */
export async function listTemplates(
  parts: GatewayParts,
  nodeApi: string,
  latestBuild: (templateId: string) => string | undefined,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<Response> {
  const nodes = await teamHolders(parts, headers[TEAM_HEADER]);
  const rows = nodes.length === 0 ? [] : await allRows(parts, nodeApi, headers, signal, nodes);
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
 * The nodes that may hold a named snapshot of `team` (every team's with none given): those
 * whose check-ins advertise a `<team>/<name>`, or whose advertisement is cut at its cap, and in
 * shared mode those etcd records the team's recent template builds on (a build placed there
 * that other gateways' check-ins may not show yet).
 */
async function teamHolders(parts: GatewayParts, team: string | undefined): Promise<FleetNode[]> {
  const prefix = `${team}/`;
  const nodes = [...parts.fleet.nodes()].filter((n) =>
    team === undefined || n.snapshotsTruncated === true ||
    (n.snapshotNames?.length ?? 0) >= ADVERTISED_NAMES_CAP ||
    n.snapshotNames?.some((s) => s.startsWith(prefix)) === true
  );
  if (team === undefined || parts.templateNames === undefined) return nodes;
  try {
    for (const id of await parts.templateNames.nodesOf(team, undefined)) {
      const node = parts.fleet.get(id);
      if (node && !nodes.includes(node)) nodes.push(node);
    }
  } catch (error) {
    parts.log("warn", "cannot read etcd's record of template builds: listing advertised holders", {
      team,
      error: error instanceof Error ? error.message : String(error),
    });
  }
  return nodes;
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
  nodes: FleetNode[],
): Promise<SnapshotRow[]> {
  const byId = new Map<string, SnapshotRow>();
  let token: string | undefined;
  for (let i = 0; i < LIST_PAGES; i++) {
    const search = `?limit=100${token ? `&nextToken=${token}` : ""}`;
    const { rows, more } = await listAll(parts, nodeApi, search, { headers, signal, nodes });
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
