/**
 * `gateway/faces/` owns what clients and operators speak to: the native face (`native.ts`, with the
 * 404's list of routes `route_summary.ts`), its routed verbs served from their bytes under the
 * bytes engine (`bytes_lane.ts`, with its memo of small bodies `body_memo.ts`), the E2B faces
 * (`e2b/`), the sandbox ports (`ports.ts`), the sandbox domain's Host routing
 * (`sandbox_domain.ts`), and the operator's view (`operator.ts`: metrics and the fleet page `ui/`).
 *
 * The gateway's native face: `POST /<verb>` with a JSON body and the fleet token as a bearer token
 * (see `gateway/keys/auth.ts`), errors `{ "message": "…" }` from one handler. The same verbs as a
 * node's native face (`node/faces/native.ts`), answered by routing each to the node that holds the
 * sandbox, plus the fleet's own verbs:
 *
 * | verb | what the gateway does |
 * |---|---|
 * | `acquireSandbox` | the name's slot, the creators' confirm, then wakes it where it lives or places it; relays the node's answer |
 * | `destroySandbox` | the name's slot, then the node that holds it; `{destroyed:false}` when none does |
 * | `execCommand`, `writeFile`, `readFile`, `updateMetadata`, `getSandboxMetrics` | found by name (the cache, then one lookup round) and streamed both ways |
 * | `lookupSandbox` | found by name or id and asked of that node; `{found:false}` answered here when no node has it |
 * | `listSandboxes` | every node asked, 128 at once or more after slow answers (up to 1,024), within 5 s; the lists merged, nodes not heard named in `unreachable` |
 * | `getHostMetrics` | a 501 naming each node to ask: it describes one machine |
 * | `checkIn`, `listNodes`, `removeNode` | the Fleet's own verbs (fleet token only) |
 * | `createApiKey`, `listApiKeys`, `revokeApiKey` | the key table (fleet token only) |
 * | `moveVolume` | copies a volume to another node while nothing mounts it (fleet token only; `volumes/move.ts`) |
 *
 * A client's API key scopes every sandbox verb to its team: names are the team's, an id of
 * another team is a 404 as if absent, listings show the team's sandboxes only, and a create past
 * the key's limits is a 429. The fleet token is the operator (see `gateway/keys/auth.ts`).
 *
 * `GET /healthz` is open and answers `{ok:true, nodes}`.
 *
 * @module
 */
import type { CreateApiKeyInput } from "../keys/keys.ts";
import { Hono } from "hono";
import type { Context } from "hono";
import { z } from "zod";
import { type Caller, callerGate, requireCaller, scopeOf, teamOf } from "../keys/auth.ts";
import type { FoundSandbox } from "../finder/finder.ts";
import type { GatewayParts } from "./parts.ts";
import { clientGone } from "../routing/answers.ts";
import { HttpError, messageResponse } from "../../shared/http_error.ts";
import { type BodyCapOptions, readJsonObject } from "../../shared/json_body.ts";
import type { Log } from "../../shared/log.ts";
import { nativeRequestSchemas } from "../../shared/native_schemas.ts";
import { checkInSchema, describeZodError, nodeIdSchema } from "../../shared/schemas.ts";
import { poolTargetsSchema } from "../../shared/pools.ts";
import { placementAsk } from "../placer/placer.ts";
import { teamScopedName } from "../../shared/teams.ts";
import { revokeApiKeySchema } from "../keys/keys.ts";
import { describeRoutes } from "./route_summary.ts";
import { moveVolume, moveVolumeSchema } from "../volumes/move.ts";
import { VOLUME_ID } from "../../shared/volumes.ts";
import { unreachableHeaders } from "./e2b/merge.ts";
import { createBytesLane, type GatewayBytesLane, type LaneVerb } from "./bytes_lane.ts";
import type { H1Client } from "../../shared/http1/mod.ts";

/** Options of {@linkcode createNativeFace}. */
export interface NativeFaceOptions {
  /**
   * Mounts other faces on the root app after the bearer gate and before the native verbs, so
   * middleware a face adds at the root runs before the verbs' handlers (see `GatewayOptions.mount`).
   */
  mount?: (app: Hono, parts: GatewayParts) => void;
}

/** The native face as the gateway's root. */
export interface NativeFace {
  /** The root Hono app: the native dialect's 404 and error answers, `/healthz`, every verb. */
  app: Hono;
  /**
   * Serves a request: a POST to a routed verb's exact path is answered before Hono (the fast
   * path, a tenth of a forward's cost), everything else by `app`.
   */
  fetch(request: Request): Promise<Response>;
  /**
   * The routed verbs' bytes lane over `client` (`bytes_lane.ts`), for a gateway served by the
   * bytes engine: the same verbs as the fast path, answered without Request or Response objects
   * where they can be, and handed back to `fetch` where they cannot.
   */
  lane(client: H1Client): GatewayBytesLane;
}

/** The verbs found by name and streamed to their node; each has the fast path. */
const streamedVerbs = [
  "execCommand",
  "writeFile",
  "readFile",
  "updateMetadata",
  "getSandboxMetrics",
] as const;

/**
 * Builds the gateway's root app with its native face. Registration order matters to Hono, which
 * runs the first matching handler: the 404 and error answers, `/healthz` (before the gate, so it
 * stays open whatever a mounted face adds), the fleet bearer gate, then `options.mount`, then the
 * verbs.
 *
 * @example
 * ```ts
 * import { buildGateway } from "../app.ts";
 * import { createNativeFace } from "./native.ts";
 * const gateway = buildGateway({ token: "t".repeat(32) });
 * const face = createNativeFace(gateway);
 * const res = await face.fetch(new Request("http://gw/healthz"));
 * console.log(res.status); // 200
 * gateway.close();
 * ```
 */
export function createNativeFace(parts: GatewayParts, options: NativeFaceOptions = {}): NativeFace {
  const { fleet, finder, placer, routing, identify, keys, limits, log, jsonBodyCap } = parts;
  // The gate hands each request's caller to its handler; collected with the request.
  const callers = new WeakMap<Request, Caller>();
  const callerOf = (c: Context): Caller => callers.get(c.req.raw)!;
  const app = new Hono();
  app.onError((error, c) => errorResponse(error, c.req.raw, log));
  // Read off app.routes, so the list is what is mounted; built again only when a route was added.
  let answers = { routes: -1, text: "" };
  app.notFound((c) => {
    const path = new URL(c.req.url).pathname;
    if (answers.routes !== app.routes.length) {
      answers = { routes: app.routes.length, text: describeRoutes(app.routes) };
    }
    return c.json({
      message: (/^\/[^/]+$/.test(path)
        ? `Unknown verb '${path.slice(1)}'`
        : `No route ${c.req.method} ${path}`) +
        `: the gateway answers ${answers.text}`,
    }, 404);
  });

  app.get("/healthz", (c) => c.json({ ok: true, nodes: fleet.size }));
  app.use("*", callerGate(identify, (request, caller) => callers.set(request, caller)));

  options.mount?.(app, parts);

  const post = (name: string, handler: (c: Context) => Promise<Response> | Response) => {
    app.post(`/${name}`, handler);
    app.all(`/${name}`, (c) => {
      throw new HttpError(405, `${c.req.method} is not allowed on /${name}: use POST`, {
        headers: { allow: "POST" },
      });
    });
  };

  // --- the fleet's own verbs ---
  post("checkIn", async (c) => {
    const { value: body } = await readBody(c.req.raw, checkInSchema, jsonBodyCap);
    const { directCreate, snapshotRetaken, ...value } = body;
    if (directCreate !== undefined && parts.recordDirect !== undefined) {
      // Shared mode: every gateway must be able to find the name before the node builds it; a
      // failure here makes the node refuse the create (docs/lookup-digest.md).
      try {
        await parts.recordDirect(value.nodeId, directCreate);
      } catch (error) {
        throw new HttpError(
          503,
          `Cannot record the direct create of '${directCreate.name}' on node '${value.nodeId}' ` +
            `in etcd (${error instanceof Error ? error.message : String(error)}): every gateway ` +
            "must be able to find a name before a node builds it, so the node builds nothing; " +
            "create it through a gateway, or retry once etcd answers",
          { headers: { "retry-after": "2" } },
        );
      }
    }
    if (snapshotRetaken !== undefined && parts.snapshotRetakes !== undefined) {
      // Shared mode: every gateway's create from that id must see the newer build before the
      // take is answered, while their node tables may lag a poll behind this one.
      try {
        await parts.snapshotRetakes.record(value.nodeId, snapshotRetaken);
      } catch (error) {
        throw new HttpError(
          503,
          `Cannot record in etcd that node '${value.nodeId}' took snapshot '${snapshotRetaken}' ` +
            `again (${error instanceof Error ? error.message : String(error)}): other gateways ` +
            "would start it from an older build; the node tries another gateway, or retry once " +
            "etcd answers",
          { headers: { "retry-after": "2" } },
        );
      }
    }
    const outcome = fleet.checkIn(value, { parsed: true });
    parts.lifecycle.fromNode(value.nodeId, value.events);
    // The node refuses a create behind the gateway's back that it cannot make known to a
    // gateway that skips nodes by digest (docs/lookup-digest.md).
    return c.json({ ok: true, outcome, lookupDigests: finder.digestMode });
  });
  post("listNodes", (c) => c.json({ nodes: fleet.list((id) => placer.inFlight(id)) }));
  post("removeNode", async (c) => {
    const { value: { nodeId } } = await readBody(c.req.raw, removeNodeSchema, jsonBodyCap);
    fleet.removeNode(nodeId);
    return c.json({ removed: nodeId });
  });

  // One result per node, so retrying the failed nodes (nodeIds) is the whole protocol.
  post("setPools", async (c) => {
    const { value } = await readBody(c.req.raw, gatewaySetPoolsSchema, jsonBodyCap);
    const known = [...fleet.nodes()];
    // `{results: []}` would read as a success that told nobody: a gateway nobody found, or
    // one that lost its node table, must not look like a fleet that took the pools.
    if (value.nodeIds === undefined && known.length === 0) throw noNodeForPools();
    const wanted = value.nodeIds ?? known.map((n) => n.id);
    const results: { nodeId: string; ok: boolean; pools?: unknown; error?: string }[] = [];
    const targets = [];
    for (const id of wanted) {
      const node = fleet.get(id);
      if (node === undefined) {
        results.push({
          nodeId: id,
          ok: false,
          error: `No node '${id}' in the fleet: listNodes shows the registered ids`,
        });
      } else targets.push(node);
    }
    const answers = await routing.fanOut(
      "/setPools",
      JSON.stringify({ pools: value.pools }),
      c.req.raw.signal,
      { nodes: targets },
    );
    for (const a of answers) {
      if (a.ok) {
        results.push({ nodeId: a.node.id, ok: true, pools: (a.json as { pools?: unknown }).pools });
      } else results.push({ nodeId: a.node.id, ok: false, error: a.cause });
    }
    const failed = results.filter((r) => !r.ok).length;
    if (failed > 0) {
      log("warn", "setPools failed on some nodes; retry them with nodeIds", {
        failed: results.filter((r) => !r.ok).map((r) => r.nodeId),
      });
    }
    return c.json({ results });
  });

  // --- managed volumes (the gate let only the fleet token through) ---
  post("moveVolume", async (c) => {
    const { value } = await readBody(c.req.raw, moveVolumeSchema, jsonBodyCap);
    if (parts.volumes === undefined) throw new HttpError(501, "This gateway serves no volumes");
    return c.json(await moveVolume(parts, parts.volumes, value, c.req.raw.signal));
  });

  // --- the key table (the gate let only the fleet token through) ---
  post("createApiKey", async (c) => {
    const { value } = await readJsonObject(c.req.raw, jsonBodyCap);
    // ApiKeys.create checks its input at run time and answers a 400 naming each wrong field.
    const input = value as unknown as CreateApiKeyInput;
    return c.json(parts.keySync ? await parts.keySync.create(input) : keys.create(input));
  });
  post("listApiKeys", async (c) => {
    await readBody(c.req.raw, z.object({}).strict(), jsonBodyCap);
    return c.json({ keys: keys.list() });
  });
  post("revokeApiKey", async (c) => {
    const { value: { id } } = await readBody(c.req.raw, revokeApiKeySchema, jsonBodyCap);
    if (parts.keySync) await parts.keySync.revoke(id);
    else keys.revoke(id);
    return c.json({ revoked: true });
  });

  // --- the native sandbox verbs ---
  post("acquireSandbox", async (c) => {
    const caller = callerOf(c);
    const team = teamOf(caller);
    const { text, value } = await readBody(
      c.req.raw,
      nativeRequestSchemas.acquireSandbox,
      jsonBodyCap,
    );
    // The team's managed volumes, by name or id, are mounted by id on the node that holds them.
    const mounts = value.spec?.volumes && await parts.volumes?.mountsOf({
      volumeMounts: value.spec.volumes.map((v) => ({ ...v })),
    }, team);
    let body = text;
    let ask = placementAsk(value.template, value.spec);
    if (mounts) {
      const volumes = mounts.body.volumeMounts as { name: string; mountPath: string }[];
      body = JSON.stringify({ ...value, spec: { ...value.spec, volumes } });
      ask = {
        ...ask,
        volumes: [
          ...volumes.map((v) => v.name).filter((n) => !VOLUME_ID.test(n)),
          ...mounts.ids,
        ],
        volumeHolders: mounts.holders,
        ...(mounts.node === undefined ? {} : { volumeNode: mounts.node }),
      };
    }
    try {
      const answer = await routing.create({
        name: teamScopedName(team, value.name),
        path: "/acquireSandbox",
        body,
        signal: c.req.raw.signal,
        headers: routing.nodeHeadersFor(scopeOf(caller)),
        identify: (t) => sandboxOf(t, team),
        admit: () => limits.enter(caller.kind === "key" ? caller.key : undefined, team),
        ask,
      });
      return relay(answer);
    } finally {
      mounts?.release();
    }
  });
  post("destroySandbox", async (c) => {
    const caller = callerOf(c);
    const { text, value } = await readBody(
      c.req.raw,
      nativeRequestSchemas.destroySandbox,
      jsonBodyCap,
    );
    const answer = await routing.destroy({
      by: "name",
      key: teamScopedName(teamOf(caller), value.name),
      path: "/destroySandbox",
      body: text,
      signal: c.req.raw.signal,
      headers: routing.nodeHeadersFor(scopeOf(caller)),
    });
    return answer === null ? c.json({ destroyed: false }) : relay(answer);
  });
  // The routed verbs, by path: registered in Hono and also answered before it (see `fast`).
  // `request.signal` is read only on a cache miss: reading it costs every request an abort.
  // A name is the caller's team's (the key in the Finder and slots says so); the node hears the
  // team in X-Dormice-Team and filters by it too.
  const routed = new Map<string, (request: Request, caller: Caller) => Promise<Response>>();
  for (const verb of streamedVerbs) {
    const schema: z.ZodType<{ name: string }> = nativeRequestSchemas[verb];
    const path = `/${verb}`;
    routed.set(path, async (request, caller) => {
      const { text, value } = await readBody(request, schema, jsonBodyCap);
      const key = teamScopedName(teamOf(caller), value.name);
      const found = finder.cached("name", key) ??
        await routing.locate("name", key, request.signal);
      return await routing.stream(request, {
        found,
        by: "name",
        key,
        path,
        body: text,
        headers: routing.nodeHeadersFor(scopeOf(caller)),
        headTimeoutMs: commandHeadBound(value),
      });
    });
  }
  routed.set("/lookupSandbox", async (request, caller) => {
    const { text, value } = await readBody(
      request,
      nativeRequestSchemas.lookupSandbox,
      jsonBodyCap,
    );
    const [by, key] = "name" in value
      ? ["name", teamScopedName(teamOf(caller), value.name)] as const
      : ["id", value.id] as const;
    const r = await routing.resolve(by, key, request.signal, scopeOf(caller));
    if (r.kind === "none") return Response.json({ found: false });
    return await routing.stream(request, {
      found: r,
      by,
      key,
      path: "/lookupSandbox",
      body: text,
      headers: routing.nodeHeadersFor(scopeOf(caller)),
    });
  });
  for (const [path, handler] of routed) {
    post(path.slice(1), (c) => handler(c.req.raw, callerOf(c)));
  }

  /**
   * The routed verbs' fast path: a POST to one of their exact paths skips Hono's router and
   * middleware chain (a tenth of a forward's cost) for the same bearer check, handler and error
   * answer. Anything else (another method or path, a percent-encoded path) goes to Hono.
   */
  const fast = (request: Request): Promise<Response> | undefined => {
    if (request.method !== "POST") return undefined;
    const handler = routed.get(pathOf(request.url));
    if (handler === undefined) return undefined;
    try {
      const caller = requireCaller(request.headers.get("authorization"), identify);
      return handler(request, caller).catch((error) => errorResponse(error, request, log));
    } catch (error) {
      return Promise.resolve(errorResponse(error, request, log));
    }
  };
  post("listSandboxes", async (c) => {
    const { text } = await readBody(c.req.raw, nativeRequestSchemas.listSandboxes, jsonBodyCap);
    // Each node lists only the caller's team (every team for the operator).
    const answers = await routing.fanOut("/listSandboxes", text, c.req.raw.signal, {
      headers: routing.nodeHeadersFor(scopeOf(callerOf(c))),
    });
    const sandboxes: unknown[] = [];
    const unreachable: { nodeId: string; endpoint: string; cause: string }[] = [];
    for (const a of answers) {
      const list = a.ok ? (a.json as { sandboxes?: unknown })?.sandboxes : undefined;
      if (a.ok && Array.isArray(list)) sandboxes.push(...list);
      else {
        unreachable.push({
          nodeId: a.node.id,
          endpoint: a.node.endpoint,
          cause: a.ok ? "its listSandboxes answer has no 'sandboxes' list" : a.cause,
        });
      }
    }
    // The body names every node not heard; the header the first 100, and the count.
    const headers = unreachableHeaders(unreachable.map((u) => u.nodeId));
    return c.json({ sandboxes, unreachable }, 200, headers);
  });
  post("getHostMetrics", async (c) => {
    await readBody(c.req.raw, nativeRequestSchemas.getHostMetrics, jsonBodyCap);
    const nodes = [...fleet.nodes()].map((n) => ({ nodeId: n.id, endpoint: n.endpoint }));
    const where = nodes.length === 0
      ? "no node has checked in yet"
      : nodes.map((n) => `POST ${n.endpoint}/getHostMetrics for '${n.nodeId}'`).join(", ");
    throw new HttpError(
      501,
      `getHostMetrics describes one machine, so the gateway does not answer it: call each node ` +
        `directly (${where}); listNodes shows every node's last reading`,
      { details: { nodes } },
    );
  });

  const laneVerbs = new Map<string, LaneVerb>(
    streamedVerbs.map((verb) => [`/${verb}`, {
      schema: nativeRequestSchemas[verb],
      headBound: commandHeadBound,
    }]),
  );
  return {
    app,
    fetch: (request: Request) => fast(request) ?? Promise.resolve(app.fetch(request)),
    lane: (client) =>
      createBytesLane({
        parts,
        client,
        verbs: laneVerbs,
        answerError: (error) => messageResponse(error, "gateway", log),
      }),
  };
}

const removeNodeSchema = z.object({ nodeId: nodeIdSchema });

/** The refusal of a `setPools` for the whole fleet when no node has checked in. */
function noNodeForPools(): HttpError {
  return new HttpError(
    409,
    "No node has checked in with this gateway, so setPools reached no node and changed no " +
      "pool: start the nodes with DORMICE_GATEWAY_ENDPOINT naming this gateway, wait until " +
      "listNodes shows them, then send setPools again (with DORMICE_GATEWAY_ETCD, a gateway " +
      "that cannot read etcd knows only the nodes that checked in with it: look in its log " +
      "for 'cannot read or write the node table in etcd')",
  );
}

/** The gateway's `setPools`: the node's body, and the nodes to send it to (every node when absent). */
const gatewaySetPoolsSchema = z.object({
  pools: poolTargetsSchema,
  nodeIds: z.array(nodeIdSchema).min(1).max(10_000).optional(),
}).strict();

/**
 * The sandbox `{id, name, state, team}` inside a native `acquireSandbox` answer; `team` is the
 * caller's (the node was told it), trusted over a node that predates teams.
 */
function sandboxOf(text: string, team: string): FoundSandbox | undefined {
  const s = (JSON.parse(text) as { sandbox?: FoundSandbox })?.sandbox;
  return s && typeof s.id === "string" && typeof s.name === "string"
    ? { id: s.id, name: s.name, state: String(s.state), team }
    : undefined;
}

/**
 * A node answers `execCommand` when the command ends, so its head may come as late as the
 * command's own timeout: the bound is that plus a margin for the node's work around it. Other
 * verbs (and a command without `timeoutSeconds`) keep the routing's head bound.
 */
function commandHeadBound(value: object): number | undefined {
  const seconds = (value as { timeoutSeconds?: unknown }).timeoutSeconds;
  return typeof seconds === "number" ? seconds * 1000 + 30_000 : undefined;
}

/** The path of an absolute URL, without its query: cheaper than `new URL()` on the fast path. */
function pathOf(url: string): string {
  const start = url.indexOf("/", url.indexOf("//") + 2);
  if (start === -1) return "/";
  const query = url.indexOf("?", start);
  return query === -1 ? url.slice(start) : url.slice(start, query);
}

/** A captured node answer, passed on as the node gave it. */
function relay(answer: { status: number; headers: Headers; text: string }): Response {
  return new Response(answer.text, {
    status: answer.status,
    headers: { "content-type": answer.headers.get("content-type") ?? "application/json" },
  });
}

/**
 * Reads the body as one JSON object (an empty body is `{}`) and validates it; `text` is what the
 * node is sent, so the gateway forwards exactly the bytes it checked.
 */
async function readBody<T>(
  request: Request,
  schema: { safeParse(v: unknown): z.ZodSafeParseResult<T> },
  cap: BodyCapOptions,
): Promise<{ text: string; value: T }> {
  const { text, value } = await readJsonObject(request, cap);
  const r = schema.safeParse(value);
  if (!r.success) throw new HttpError(400, describeZodError(r.error));
  return { text, value: r.data };
}

/** The one place an error becomes a native `{message}` answer. */
function errorResponse(error: unknown, request: Request, log: Log): Response {
  if (!(error instanceof HttpError) && request.signal.aborted) {
    // The client hung up mid-lookup or mid-forward: nobody reads this answer.
    error = clientGone();
  }
  return messageResponse(error, "gateway", log);
}
