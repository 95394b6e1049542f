/**
 * The gateway's E2B control plane (`/e2b/api`): a create placed or woken through the name's
 * slot, a kill through the slot, every other route with an id found by id and streamed, lists
 * and metrics asked of every node and merged (`merge.ts`), snapshots listed, deleted and
 * created from as `snapshots.ts` says. Kept apart from `e2b.ts`, which
 * only assembles the faces, and from envd's routing (`envd.ts`), which shares none of these
 * rules.
 *
 * @module
 */
import {
  HEAL_CREATED_HEADER,
  HEAL_FROM_HEADER,
  SNAPSHOT_ID_HEADER,
} from "../../../shared/snapshots.ts";
import { compareListCursors, encodeListCursor } from "../../../shared/list_cursor.ts";
import { Hono } from "hono";
import type { Context } from "hono";
import { type Caller, requireE2bCaller, scopeOf, teamOf } from "../../keys/auth.ts";
import type { GatewayParts } from "../parts.ts";
import type { CapturedAnswer } from "../../routing/create.ts";
import { cursorOf, gather, type ListedRow, parsePaging, TOTAL_RUNNING_HEADER } from "./merge.ts";
import { checkedId, decodeSegment, e2bError, locate, notFound, suffix } from "./door.ts";
import { unbuiltE2bRoute } from "../../../shared/e2b_unbuilt.ts";
import { asksForEgressRules } from "../../../shared/egress_rules.ts";
import { parseSandboxIds } from "../../../shared/e2b_metrics_ids.ts";
import { type PlacementAsk, placementAsk } from "../../placer/placer.ts";
import { HttpError } from "../../../shared/http_error.ts";
import { readJsonObject } from "../../../shared/json_body.ts";
import { describeZodError, sandboxNameSchema } from "../../../shared/schemas.ts";
import { TEAM_HEADER, teamScopedName } from "../../../shared/teams.ts";
import { deleteSnapshot, listSnapshots, resolveCreateSource } from "./snapshots.ts";
import { listAll } from "./snapshot_rows.ts";
import { forkWithinLimits } from "./fork.ts";
import type { FleetVolumes } from "../../volumes/fleet_volumes.ts";
import { VOLUME_ID } from "../../../shared/volumes.ts";
import { GatewayTemplates } from "./templates.ts";

/** The header a gateway names an unnamed create with (the node uses it when `metadata.name` is absent). */
export const SANDBOX_NAME_HEADER: string = "x-dormice-sandbox-name";
/** Tells a node the gateway's sandbox domain, which it answers as `domain` (see `node/faces/e2b_api.ts`). */
const SANDBOX_DOMAIN_HEADER = "x-dormice-sandbox-domain";

/**
 * The control plane over the gateway's parts; `nodeApi` is where each node serves its own, and
 * `randomName` names an unnamed create (see `E2bFacesOptions`).
 *
 * @example
 * ```ts ignore
 * app.route("/e2b/api", createE2bApi(parts, "/e2b/api", randomSandboxName));
 * ```
 */
export function createE2bApi(
  parts: GatewayParts,
  nodeApi: string,
  randomName: () => string,
): Hono {
  const { routing, identify, limits, log } = parts;
  const fleetAuthorization = routing.nodeHeaders.authorization;
  // Streamed requests carry the client's own headers: its X-API-KEY (a client key, which the
  // node must neither see nor be asked to accept) is replaced by the fleet token, and a client's
  // own X-Dormice-Team by its key's team.
  const nodeAuthFor = (caller: Caller): Record<string, string> => {
    const headers: Record<string, string> = {
      authorization: fleetAuthorization,
      "x-api-key": fleetAuthorization.slice("Bearer ".length),
    };
    const team = scopeOf(caller);
    if (team !== undefined) headers[TEAM_HEADER] = team;
    if (parts.sandboxDomain !== undefined) headers[SANDBOX_DOMAIN_HEADER] = parts.sandboxDomain;
    return headers;
  };
  const app = new Hono();
  const templates = new GatewayTemplates(parts, nodeApi);

  const create = async (c: Context, rest: string, caller: Caller): Promise<Response> => {
    const { text, value: body } = await readJsonObject(c.req.raw, {
      ...parts.jsonBodyCap,
      empty: "refuse",
      example: '{"templateID":"base"}',
    });
    const metadata = body.metadata;
    if (metadata !== undefined && (metadata === null || typeof metadata !== "object")) {
      throw new HttpError(400, '\'metadata\' must be an object of strings such as {"team":"a"}');
    }
    const given = (metadata as Record<string, unknown> | undefined)?.name;
    let name: string;
    const team = teamOf(caller);
    const headers: Record<string, string> = { ...routing.nodeHeadersFor(scopeOf(caller)) };
    if (parts.sandboxDomain !== undefined) headers[SANDBOX_DOMAIN_HEADER] = parts.sandboxDomain;
    if (given !== undefined) {
      const r = sandboxNameSchema.safeParse(given);
      if (!r.success) throw new HttpError(400, describeZodError(r.error, "'metadata.name'"));
      name = r.data;
    } else {
      // A fresh random name cannot exist anywhere, so the create skips the slot and the lookup
      // round, and is simply placed; the name only gives the placement and the Finder a key.
      name = randomName();
      headers[SANDBOX_NAME_HEADER] = name;
    }
    // A team's volumes are mounted by id, on the node that holds them.
    const mounts = await parts.volumes?.mountsOf(body, team);
    if (mounts) {
      try {
        return await createWith(c, rest, caller, mounts.body, JSON.stringify(mounts.body), {
          ids: mounts.ids,
          holders: mounts.holders,
          node: mounts.node,
        }, { name, given, team, headers });
      } finally {
        mounts.release();
      }
    }
    return await createWith(c, rest, caller, body, text, undefined, { name, given, team, headers });
  };

  const createWith = async (
    c: Context,
    rest: string,
    caller: Caller,
    body: Record<string, unknown>,
    text: string,
    volumes: { ids: string[]; holders: string[]; node: string | undefined } | undefined,
    named: { name: string; given: unknown; team: string; headers: Record<string, string> },
  ): Promise<Response> => {
    const signal = c.req.raw.signal;
    const { name, given, team } = named;
    let headers = named.headers;
    // A snapshot's id or name is placed on a node that holds it, and the node is told its id.
    let ask = e2bPlacementAsk(body);
    if (volumes) {
      // The mounts' names became ids: the team's local volumes are placed by the table's node,
      // its shared ones by what nodes advertise; the names left are the nodes' declared ones.
      const declared = (body.volumeMounts as { name?: unknown }[])
        .map((m) => m?.name)
        .filter((n): n is string => typeof n === "string" && !VOLUME_ID.test(n));
      ask = {
        ...ask,
        volumes: [...declared, ...volumes.ids],
        volumeHolders: volumes.holders,
        ...(volumes.node === undefined ? {} : { volumeNode: volumes.node }),
      };
    }
    let forwarded = text;
    let healFrom: string[] | undefined;
    if (typeof body.templateID === "string") {
      const templateID = await templates.untagged(
        body.templateID,
        nodeAuthFor(caller),
        signal,
      );
      if (templateID !== body.templateID) {
        body = { ...body, templateID };
        forwarded = JSON.stringify(body);
      }
      const source = await resolveCreateSource(
        parts,
        templateID,
        nodeApi,
        nodeAuthFor(caller),
        signal,
      );
      if (source.kind === "snapshot") {
        ask = {
          volumes: ask.volumes,
          volumeHolders: ask.volumeHolders,
          volumeNode: ask.volumeNode,
          snapshot: source.snapshotId,
          snapshotHolders: source.holders,
          ...(source.stale.length > 0 ? { snapshotStale: source.stale } : {}),
        };
        forwarded = JSON.stringify({ ...body, templateID: source.snapshotId });
        healFrom = source.holders;
        if (source.createdAt !== undefined) {
          // Some node holds an older build: whichever node takes the create, one holding
          // that older build gets the newest first.
          const from = source.holders.map((id) => parts.fleet.get(id))
            .filter((n) => n !== undefined && !parts.fleet.isDown(n))
            .map((n) => `${n!.id}=${n!.endpoint}`).join(",");
          headers = {
            ...headers,
            [HEAL_CREATED_HEADER]: String(source.createdAt),
            ...(from === "" ? {} : { [HEAL_FROM_HEADER]: from }),
          };
        }
      }
    }
    const answer = await routing.create({
      name: given === undefined ? undefined : teamScopedName(team, name),
      path: `${nodeApi}${rest}`,
      body: forwarded,
      signal,
      headers,
      identify: (t) => {
        const id = (JSON.parse(t) as { sandboxID?: unknown })?.sandboxID;
        return typeof id === "string" ? { id, name, state: "active", team } : undefined;
      },
      admit: () => limits.enter(caller.kind === "key" ? caller.key : undefined, team),
      ask,
      ...(healFrom === undefined ? {} : { healFrom }),
    });
    return relay(answer);
  };

  const kill = async (c: Context, id: string, caller: Caller): Promise<Response> => {
    const signal = c.req.raw.signal;
    const team = scopeOf(caller);
    const answer = await routing.destroy({
      by: "id",
      key: id,
      path: `${nodeApi}/sandboxes/${encodeURIComponent(id)}`,
      method: "DELETE",
      body: "",
      signal,
      team,
      headers: routing.nodeHeadersFor(team),
    });
    if (answer === null) throw notFound(id);
    return relay(answer);
  };

  const list = async (c: Context, v2: boolean, caller: Caller): Promise<Response> => {
    const url = new URL(c.req.url);
    const query = new URLSearchParams(url.search);
    const page = v2 ? parsePaging(query) : undefined;
    if (page) {
      query.set("limit", String(page.ask));
      if (page.cursor) query.set("nextToken", encodeListCursor(page.cursor));
      else query.delete("nextToken");
    }
    const qs = query.toString();
    const path = `${nodeApi}${v2 ? "/v2" : ""}/sandboxes${qs ? `?${qs}` : ""}`;
    const answers = await routing.fanOut(path, null, c.req.raw.signal, {
      method: "GET",
      headers: nodeAuthFor(caller),
    });
    const { answered, headers } = gather(
      answers,
      (json) => Array.isArray(json) ? json as ListedRow[] : undefined,
      "list",
      log,
    );
    const rows = answered.map((a) => a.value);
    // Each node counts its own running matches before paging; the fleet's count is their sum.
    const totals = answered.map((a) => a.answer.headers.get(TOTAL_RUNNING_HEADER))
      .filter((v): v is string => v !== null && /^\d+$/.test(v));
    if (totals.length > 0) {
      headers[TOTAL_RUNNING_HEADER] = String(totals.reduce((sum, v) => sum + Number(v), 0));
    }
    let merged = rows.flat();
    if (page) {
      const sign = page.order === "asc" ? 1 : -1;
      merged.sort((a, b) => sign * compareListCursors(cursorOf(a), cursorOf(b)));
      // Every node gave up to `ask` rows after the cursor; the next page starts after the last
      // row shown, so no row is skipped or repeated while all nodes answer.
      const more = merged.length > page.limit ||
        (page.ask === page.limit && rows.some((r) => r.length >= page.ask));
      merged = merged.slice(0, page.limit);
      if (more && merged.length > 0) {
        headers["x-next-token"] = encodeListCursor(cursorOf(merged[merged.length - 1]));
      }
    }
    return c.json(merged, 200, headers);
  };

  // Every node is asked (one request each, whatever the number of ids): the Finder would need
  // a lookup round per uncached id, and a node answers only for the ids it holds.
  const metricsOf = async (c: Context, caller: Caller): Promise<Response> => {
    const url = new URL(c.req.url);
    parseSandboxIds(url.searchParams.getAll("sandbox_ids"));
    const answers = await routing.fanOut(
      `${nodeApi}/sandboxes/metrics${url.search}`,
      null,
      c.req.raw.signal,
      {
        method: "GET",
        headers: nodeAuthFor(caller),
      },
    );
    const { answered, headers } = gather(
      answers,
      (json) => {
        const sandboxes = (json as { sandboxes?: unknown } | null)?.sandboxes;
        return sandboxes && typeof sandboxes === "object" && !Array.isArray(sandboxes)
          ? sandboxes as Record<string, unknown>
          : undefined;
      },
      "metrics call",
      log,
    );
    return c.json({ sandboxes: Object.assign({}, ...answered.map((a) => a.value)) }, 200, headers);
  };

  const forwardById = async (
    c: Context,
    id: string,
    rest: string,
    caller: Caller,
  ): Promise<Response> => {
    const signal = c.req.raw.signal;
    const found = await locate(parts, id, signal, scopeOf(caller));
    const path = `${nodeApi}${rest}${new URL(c.req.url).search}`;
    return await routing.stream(c.req.raw, {
      found,
      by: "id",
      key: id,
      path,
      headers: nodeAuthFor(caller),
    });
  };

  /**
   * `POST /sandboxes/{id}/snapshots`: a name the team already has (on any node) names the id
   * the node keeps the new build under, so a name taken again is a new build of one snapshot,
   * as in E2B, wherever the sandbox runs. The node pushes its check-in before it answers
   * (`snapshotRetaken`), so every gateway places a create from that id on the new build.
   */
  const takeSnapshot = async (
    c: Context,
    id: string,
    rest: string,
    caller: Caller,
  ): Promise<Response> => {
    const signal = c.req.raw.signal;
    const { text, value } = await readJsonObject(c.req.raw, {
      ...parts.jsonBodyCap,
      empty: "object",
      example: '{"name":"ready"}',
    });
    const headers = { ...nodeAuthFor(caller) };
    if (typeof value.name === "string" && value.name !== "") {
      const { rows } = await listAll(
        parts,
        nodeApi,
        `?name=${encodeURIComponent(value.name)}`,
        { headers, signal },
      );
      const held = rows.find((r) => r.names.includes(value.name as string));
      if (held) headers[SNAPSHOT_ID_HEADER] = held.snapshotID;
    }
    const found = await locate(parts, id, signal, scopeOf(caller));
    return await routing.stream(c.req.raw, {
      found,
      by: "id",
      key: id,
      path: `${nodeApi}${rest}${new URL(c.req.url).search}`,
      body: text,
      headers,
    });
  };

  app.all("*", async (c) => {
    const rest = suffix(c);
    const method = c.req.method;
    // The volume content API authenticates with the volume's own token, not an API key.
    const content = /^\/volumecontent\/([^/]+)\/(dir|path|file)$/.exec(rest);
    if (content && parts.volumes) {
      return await parts.volumes.content(c.req.raw, decodeSegment(content[1]), content[2]);
    }
    // A file context's upload URL carries its own token instead of a key.
    const uploaded = await templates.upload(c, rest);
    if (uploaded) return uploaded;
    const caller = requireE2bCaller(c.req.raw.headers, identify);
    if (parts.volumes && (rest === "/volumes" || rest.startsWith("/volumes/"))) {
      return await volumeRoute(c, parts.volumes, rest, caller);
    }
    const built = await templates.handle(c, rest, caller, nodeAuthFor(caller));
    if (built) return built;
    const m = /^(?:\/v2)?\/sandboxes\/([^/]+)(\/.*)?$/.exec(rest);
    // Answered here, as a node would: a route about one sandbox finds it first, so a fork of
    // a killed sandbox is E2B's 404 (the SDK's SandboxNotFoundError), and "not built" is for
    // an existing one.
    const unbuilt = unbuiltE2bRoute(method, rest);
    if (unbuilt) {
      if (unbuilt.namesSandbox && m) {
        await locate(parts, checkedId(decodeSegment(m[1])), c.req.raw.signal, scopeOf(caller));
      }
      throw new HttpError(501, unbuilt.message);
    }
    if (rest === "/sandboxes/metrics" && method === "GET") return await metricsOf(c, caller);
    if (rest === "/snapshots" && method === "GET") {
      return await listSnapshots(
        parts,
        nodeApi,
        new URL(c.req.url),
        nodeAuthFor(caller),
        c.req.raw.signal,
      );
    }
    const template = /^\/templates\/([^/]+)$/.exec(rest);
    if (template && method === "DELETE") {
      const signal = c.req.raw.signal;
      const team = teamOf(caller);
      const headers = nodeAuthFor(caller);
      const id = await templates.idOf(decodeSegment(template[1]), headers, signal);
      templates.forget(id);
      const deleted = await deleteSnapshot(parts, nodeApi, id, headers, signal);
      // Shared mode: a rebuild of the deleted name makes a new template, as with one gateway.
      await parts.templateNames?.forget(team, id).catch((error) =>
        parts.log("warn", "a deleted template's build record stays in etcd until it lapses", {
          template: id,
          error: error instanceof Error ? error.message : String(error),
          effect: "a rebuild of its name through another gateway may take the deleted id",
        })
      );
      return deleted;
    }
    if (rest === "/v2/sandboxes" || rest === "/sandboxes") {
      if (method === "POST") return await create(c, rest, caller);
      if (method === "GET") return await list(c, rest === "/v2/sandboxes", caller);
      throw new HttpError(405, `${method} is not allowed on ${rest}: use GET or POST`, {
        headers: { allow: "GET, POST" },
      });
    }
    if (m) {
      const id = checkedId(decodeSegment(m[1]));
      if (method === "DELETE" && m[2] === undefined && !rest.startsWith("/v2/")) {
        return await kill(c, id, caller);
      }
      if (method === "POST" && m[2] === "/fork" && !rest.startsWith("/v2/")) {
        const found = await locate(parts, id, c.req.raw.signal, scopeOf(caller));
        return await forkWithinLimits(parts, {
          request: c.req.raw,
          caller,
          found,
          path: `${nodeApi}${rest}`,
          headers: nodeAuthFor(caller),
        });
      }
      if (method === "POST" && m[2] === "/snapshots" && !rest.startsWith("/v2/")) {
        return await takeSnapshot(c, id, rest, caller);
      }
      if (method === "POST" && (m[2] === "/connect" || m[2] === "/resume")) {
        try {
          return await forwardById(c, id, rest, caller);
        } catch (error) {
          // Its node is down: a sandbox paused to disk resumes on another node when the
          // registry holds its files (`takeOverArchived`); otherwise the 503 stands.
          if (!(error instanceof HttpError) || error.status !== 503) throw error;
          const signal = c.req.raw.signal;
          if (!(await takeOverArchived(parts, nodeApi, id, nodeAuthFor(caller), signal))) {
            throw error;
          }
          return await forwardById(c, id, rest, caller);
        }
      }
      return await forwardById(c, id, rest, caller);
    }
    throw new HttpError(404, `No E2B API route ${method} ${rest} on the gateway`);
  });

  app.onError((error, c) => e2bError(error, c.req.raw, parts));
  return app;
}

/** `/volumes` and `/volumes/{id}`: E2B's volume routes (`volumes/fleet_volumes.ts`). */
async function volumeRoute(
  c: Context,
  volumes: FleetVolumes,
  rest: string,
  caller: Caller,
): Promise<Response> {
  const method = c.req.method;
  if (rest === "/volumes") {
    if (method === "POST") return await volumes.create(c, teamOf(caller));
    if (method === "GET") return await volumes.list(c, scopeOf(caller));
    throw new HttpError(405, `${method} is not allowed on /volumes: use GET or POST`, {
      headers: { allow: "GET, POST" },
    });
  }
  const m = /^\/volumes\/([^/]+)$/.exec(rest);
  if (m) {
    const id = decodeSegment(m[1]);
    if (method === "GET") return await volumes.info(c, id, scopeOf(caller));
    if (method === "DELETE") return await volumes.destroy(id, scopeOf(caller), c.req.raw.signal);
    throw new HttpError(405, `${method} is not allowed on /volumes/{id}: use GET or DELETE`, {
      headers: { allow: "GET, DELETE" },
    });
  }
  throw new HttpError(404, `No E2B API route ${method} ${rest} on the gateway`);
}

/**
 * The slot a take-over of sandbox `id` runs in (the routing's per-name slots: in etcd in shared
 * mode). No sandbox name or team starts with `@`, so it is no name's slot.
 */
function takeOverSlot(id: string): string {
  return `@take-over/${id}`;
}

/**
 * Asks a live node with a registry to take over sandbox `id`, paused to disk on a node that is
 * down (the node pulls its files and row from the registry); true when one did, and the Finder
 * then names that node. False when no such node is up or the registry does not hold it.
 *
 * Take-overs of one sandbox run one at a time in its take-over slot, across every gateway of a
 * shared fleet: one that got the slot after another ended first looks for the sandbox on the
 * live nodes, and goes where the first one put it, so two `connect`s at once (two gateways)
 * resume one sandbox on one node and both answer from it. The taker's id is published like a
 * create's (shared mode), so every gateway's lookup asks that node.
 *
 * @throws {HttpError} 503 when the slot's store is unreachable or another gateway holds it past
 *   its bound; 499 when the client left while waiting.
 */
async function takeOverArchived(
  parts: GatewayParts,
  nodeApi: string,
  id: string,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<boolean> {
  const live = () => {
    const now = parts.fleet.now();
    return [...parts.fleet.nodes()].filter((n) =>
      n.snapshotRegistry !== undefined && !parts.fleet.isDown(n, now)
    );
  };
  if (live().length === 0) return false;
  return await parts.routing.slots.run(takeOverSlot(id), async () => {
    if (signal.aborted) throw new HttpError(499, "The client closed the request");
    if (await foundAlive(parts, id, signal)) return true;
    const candidates = live();
    if (candidates.length === 0) return false;
    const pick = parts.placer.pick({});
    const node = pick.ok && candidates.includes(pick.node) ? pick.node : candidates[0];
    let res: Response;
    try {
      res = await fetch(
        new URL(`${nodeApi}/sandboxes/${encodeURIComponent(id)}/adopt`, node.endpoint),
        { method: "POST", headers, redirect: "manual", signal: AbortSignal.timeout(300_000) },
      );
    } catch (error) {
      parts.log("warn", "a node did not answer a take-over", { nodeId: node.id, id, error });
      return false;
    }
    const text = await res.text();
    if (!res.ok) {
      parts.log("info", "no take-over of a sandbox paused to disk", {
        nodeId: node.id,
        id,
        status: res.status,
        answer: text.slice(0, 300),
      });
      // The registry refused this node's claim: some other node took it over first (a gateway
      // outside these slots, or one whose slot lapsed), and that node is where it lives now.
      return res.status === 404 && await foundAlive(parts, id, signal);
    }
    const row = JSON.parse(text) as { sandboxID: string; name: string; team: string };
    parts.finder.remember(node, {
      id: row.sandboxID,
      name: row.name,
      state: "archived",
      team: row.team,
    });
    await parts.routing.publishCreated([row.sandboxID], node);
    parts.log("info", "a sandbox paused to disk on a down node was taken over", {
      nodeId: node.id,
      id,
    });
    return true;
  }, signal);
}

/**
 * Whether sandbox `id` is on a node that is up: this gateway's cache says so (its own take-over
 * ended), or a lookup round finds it (another gateway's did; the round caches the answer, so the
 * request that follows goes there). A round that finds it nowhere else, or cannot tell, is false.
 */
async function foundAlive(parts: GatewayParts, id: string, signal: AbortSignal): Promise<boolean> {
  const hit = parts.finder.cached("id", id);
  if (hit !== undefined && !parts.fleet.isDown(hit.node)) return true;
  const r = await parts.finder.lookup("id", id, { signal }).catch(() => undefined);
  return r?.kind === "one" && !parts.fleet.isDown(r.node);
}

/** A captured node answer, passed on as the node gave it (its errors are already E2B's). */
function relay(answer: CapturedAnswer): Response {
  const headers = new Headers();
  for (const name of ["content-type", "retry-after", "x-next-token"]) {
    const v = answer.headers.get(name);
    if (v !== null) headers.set(name, v);
  }
  const empty = answer.status === 204 || answer.status === 304 || answer.text === "";
  return new Response(empty ? null : answer.text, { status: answer.status, headers });
}

/**
 * What an E2B create asks of its node: `templateID`, the names in `volumeMounts` and whether
 * it has egress address rules (the node checks the rest of the body and answers its own 400).
 */
function e2bPlacementAsk(body: Record<string, unknown>): PlacementAsk {
  const template = typeof body.templateID === "string" ? body.templateID : undefined;
  const mounts = Array.isArray(body.volumeMounts) ? body.volumeMounts : [];
  const volumes = mounts
    .map((m) => (m as { name?: unknown } | null)?.name)
    .filter((n): n is string => typeof n === "string")
    .map((name) => ({ name, mountPath: "/" }));
  const ask = placementAsk(template, volumes.length > 0 ? { volumes } : {});
  return asksForEgressRules(body) ? { ...ask, egressRules: true } : ask;
}
