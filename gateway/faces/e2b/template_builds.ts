/**
 * A template build's node, as the gateway's template routes (`templates.ts`) reach it: the
 * build as the gateway routes it, the node that builds it and a request to that node, its
 * answer passed on, and a build's status (and logs) read where the gateway does not know the
 * build: of the nodes that may hold it first, then of the rest.
 *
 * @module
 */
import type { Context } from "hono";
import { HttpError } from "../../../shared/http_error.ts";
import { TEAM_HEADER } from "../../../shared/teams.ts";
import type { FleetNode } from "../../fleet/node.ts";
import type { FanOutAnswer } from "../../routing/routing.ts";
import type { GatewayParts } from "../parts.ts";
import { holdersOf } from "./template_listing.ts";

/**
 * One build the gateway routes: where it was placed. The node keeps the rest (its reservation:
 * name, limits, whether its steps arrived), so any gateway can route it.
 */
export interface BuildRoute {
  templateId: string;
  buildId: string;
  node: string;
  team: string;
  name: string;
  /** Whether its steps were sent through this gateway. */
  started: boolean;
  /** The SDK's `cpuCount` and `memoryMB`, which bound the build's steps. */
  limits: { cpuCount?: number; memoryMB?: number };
  createdAt: number;
}

/** A build as its node keeps it (`GET /templates/{id}/reservation`). */
interface Reservation {
  buildID: string;
  name: string;
  started: boolean;
  at: number;
  cpuCount?: number;
  memoryMB?: number;
}

/** The node building a template, up; a 503 naming it when it is down or gone. */
export function buildNode(parts: GatewayParts, id: string): FleetNode {
  const node = [...parts.fleet.nodes()].find((n) => n.id === id);
  if (!node || parts.fleet.isDown(node)) {
    throw new HttpError(
      503,
      `Node '${id}', which builds this template, is down: build again once it is back`,
      { headers: { "retry-after": "5" } },
    );
  }
  return node;
}

/** A request to the node that builds `build`, bounded at 30 s; a 502 when it does not answer. */
export async function askBuild(
  parts: GatewayParts,
  nodeApi: string,
  build: BuildRoute,
  path: string,
  init: { method: string; headers: Record<string, string>; body?: string; signal: AbortSignal },
): Promise<Response> {
  const node = buildNode(parts, build.node);
  try {
    return await fetch(`${node.endpoint}${nodeApi}${path}`, {
      ...init,
      signal: AbortSignal.any([init.signal, AbortSignal.timeout(30_000)]),
    });
  } catch (error) {
    throw new HttpError(
      502,
      `Node '${node.id}', which builds this template, did not answer: ${
        error instanceof Error ? error.message : error
      }`,
    );
  }
}

/**
 * A build's status, for a build this gateway did not accept, asked of the nodes that may
 * hold or build it, then of the rest when none has it ({@linkcode holdersFirst}): the one
 * answer that is no 404 stands; a 404 naming the build when every node says so.
 */
export async function statusAnywhere(
  parts: GatewayParts,
  nodeApi: string,
  c: Context,
  templateId: string,
  buildId: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<Response> {
  const search = new URL(c.req.url).search;
  const answers = await holdersFirst(
    parts,
    templateId,
    headers,
    `${nodeApi}/templates/${templateId}/builds/${encodeURIComponent(buildId)}/status` +
      search,
    signal,
  );
  const found = answers.find((a) => a.ok);
  if (found && found.ok) return Response.json(found.json, { status: found.status });
  const bad = answers.find((a) => !a.ok && /^HTTP 400:/.test(a.cause));
  if (bad && !bad.ok) throw new HttpError(400, bad.cause.replace(/^HTTP 400: /, ""));
  const silent = answers.filter((a) => !a.ok && !/^HTTP 404:/.test(a.cause));
  if (silent.length > 0) {
    throw new HttpError(
      503,
      `No node answered for build '${buildId}' of template '${templateId}', and ${
        silent.map((a) => `'${a.node.id}'`).join(", ")
      } did not answer (it may build it): retry shortly`,
      { headers: { "retry-after": "2" } },
    );
  }
  throw new HttpError(
    404,
    `Template build '${templateId}/${buildId}' not found on any node: request a build with ` +
      "POST /v3/templates first",
  );
}

/**
 * `GET` of `url` from the nodes that may hold or build template `templateId`
 * ({@linkcode holdersOf}: advertised, or in shared mode recorded in etcd where its builds were
 * placed), then, when none answered 2xx, from every other node: a build this gateway did not
 * accept and no record names (one gateway, restarted mid-build) is found still.
 */
export async function holdersFirst(
  parts: GatewayParts,
  templateId: string,
  headers: Record<string, string>,
  url: string,
  signal: AbortSignal,
): Promise<FanOutAnswer[]> {
  const holders = await holdersOf(parts, templateId, headers[TEAM_HEADER]);
  const first = holders.length === 0 ? [] : await parts.routing.fanOut(url, null, signal, {
    method: "GET",
    headers,
    nodes: holders,
  });
  if (first.some((a) => a.ok)) return first;
  const rest = [...parts.fleet.nodes()].filter((n) => !holders.includes(n));
  if (rest.length === 0) return first;
  return [
    ...first,
    ...await parts.routing.fanOut(url, null, signal, {
      method: "GET",
      headers,
      nodes: rest,
    }),
  ];
}

/**
 * Whether started build `route`, whose template no node advertises, is still running (its
 * template then keeps its id for the next build of the name), rather than finished with its
 * template deleted since (through another gateway: this one forgets a template's builds when
 * it deletes it), which makes the name's next build a new template. One status read of the
 * build's node; a node that does not answer leaves it running.
 */
export async function buildUnfinished(
  parts: GatewayParts,
  nodeApi: string,
  route: BuildRoute,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<boolean> {
  try {
    const res = await askBuild(
      parts,
      nodeApi,
      route,
      `/templates/${route.templateId}/builds/${route.buildId}/status?logsOffset=0`,
      { method: "GET", headers, signal },
    );
    if (res.status === 404) {
      await res.body?.cancel();
      return false;
    }
    if (!res.ok) {
      await res.body?.cancel();
      return true;
    }
    return (await res.json() as { status?: unknown }).status !== "ready";
  } catch {
    return true;
  }
}

/**
 * Build `buildId` of template `id` for `team` (without a build id: the newest whose steps have
 * not arrived, else the newest) as the node it was placed on keeps it (its reservation), asked
 * of the nodes that may hold it, then of the rest ({@linkcode holdersFirst}); undefined when no
 * node keeps it, a 503 when none does but some did not answer.
 */
export async function reservedBuild(
  parts: GatewayParts,
  nodeApi: string,
  id: string,
  team: string,
  buildId: string | undefined,
  { headers, signal }: { headers: Record<string, string>; signal: AbortSignal },
): Promise<BuildRoute | undefined> {
  const query = buildId === undefined ? "" : `?buildID=${encodeURIComponent(buildId)}`;
  const answers = await holdersFirst(
    parts,
    id,
    headers,
    `${nodeApi}/templates/${id}/reservation${query}`,
    signal,
  );
  let best: { node: string; r: Reservation } | undefined;
  for (const a of answers) {
    if (!a.ok || a.status !== 200) continue;
    const r = a.json as Reservation;
    if (typeof r?.buildID !== "string" || typeof r.name !== "string") continue;
    // Without a build id: the newest whose steps have not arrived, else the newest.
    const rank = (x: Reservation) => (x.started ? 0 : 1e15) + x.at;
    if (!best || rank(r) > rank(best.r)) best = { node: a.node.id, r };
  }
  if (!best) {
    const silent = answers.filter((a) => !a.ok && !/^HTTP (404|501):/.test(a.cause));
    if (silent.length > 0) {
      throw new HttpError(
        503,
        `Template build '${id}' was not found, and ${
          silent.map((a) => `'${a.node.id}'`).join(", ")
        } did not answer (it may build it): retry shortly`,
        { headers: { "retry-after": "2" } },
      );
    }
    return undefined;
  }
  const route: BuildRoute = {
    templateId: id,
    buildId: best.r.buildID,
    node: best.node,
    team,
    name: best.r.name,
    started: best.r.started,
    limits: {
      ...(best.r.cpuCount !== undefined ? { cpuCount: best.r.cpuCount } : {}),
      ...(best.r.memoryMB !== undefined ? { memoryMB: best.r.memoryMB } : {}),
    },
    createdAt: best.r.at,
  };
  return route;
}

/** A path part decoded; a 400 when its escapes are malformed. */
export function decoded(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new HttpError(
      400,
      `'${part.slice(0, 80)}' in the path has a malformed %-escape: encode it with ` +
        "encodeURIComponent",
    );
  }
}

/** A node's answer passed on: status, body and content type. */
export async function relay(res: Response): Promise<Response> {
  const text = await res.text();
  const headers = new Headers();
  for (const name of ["content-type", "retry-after"]) {
    const v = res.headers.get(name);
    if (v !== null) headers.set(name, v);
  }
  return new Response(res.status === 204 || text === "" ? null : text, {
    status: res.status,
    headers,
  });
}
