/**
 * The gateway's E2B faces: the control plane under `/e2b/api` (create placed or woken through
 * the name's slot, everything with an id found by id and forwarded, lists and metrics merged
 * across nodes by `e2b_merge.ts`), envd under `/e2b/envd` (routed by the `E2b-Sandbox-Id`
 * header, streamed both ways), and the SDK's bare signed `/files` door at the root.
 *
 * @module
 */
import { type ConnectCode, statusToConnectCode } from "../shared/connect_codes.ts";
import { compareListCursors, encodeListCursor } from "../shared/list_cursor.ts";
import { Hono } from "hono";
import type { Context } from "hono";
import { type Caller, optionalE2bCaller, requireE2bCaller, scopeOf, teamOf } from "./auth.ts";
import type { FindOne } from "./finder.ts";
import type { GatewayParts } from "./parts.ts";
import type { CapturedAnswer } from "./routing_create.ts";
import {
  cursorOf,
  gather,
  type ListedRow,
  parsePaging,
  TOTAL_RUNNING_HEADER,
} from "./e2b_merge.ts";
import { unbuiltE2bRoute } from "../shared/e2b_unbuilt.ts";
import { parseSandboxIds } from "../shared/e2b_metrics_ids.ts";
import { envdCredentialsRefusal, envdRequestAuthorized } from "../shared/access_tokens.ts";
import { type PlacementAsk, placementAsk } from "./placer.ts";
import { createPortProxy, type PortProxy } from "./ports.ts";
import { ENVD_PORT } from "./sandbox_domain.ts";
import { HttpError } from "../shared/http_error.ts";
import { readJsonObject } from "../shared/json_body.ts";
import { randomSandboxName } from "../shared/random_name.ts";
import { describeZodError, sandboxIdSchema, sandboxNameSchema } from "../shared/schemas.ts";
import { TEAM_HEADER, teamScopedName } from "../shared/teams.ts";

/** Options of {@linkcode createE2bFaces} and {@linkcode mountE2b}. */
export interface E2bFacesOptions {
  /** Where each node serves its E2B control plane. Default `/e2b/api`. */
  nodeApiPath?: string;
  /** Where each node serves envd. Default `/e2b/envd`. */
  nodeEnvdPath?: string;
  /**
   * Names an unnamed create, so the slot and placement rules have a key and the Finder knows
   * the sandbox by name too. Default `randomSandboxName` (`e2b-` and 20 random hex digits), the
   * node's own form.
   */
  randomName?: () => string;
}

/** The three faces, each a Hono app to mount. */
export interface E2bFaces {
  /** The control plane; mount at `/e2b/api`. */
  api: Hono;
  /** envd; mount at `/e2b/envd`. */
  envd: Hono;
  /** The root `/files` door; mount at `/`. */
  files: Hono;
}

/** The header a gateway names an unnamed create with (the node uses it when `metadata.name` is absent). */
export const SANDBOX_NAME_HEADER: string = "x-dormice-sandbox-name";
export { UNREACHABLE_HEADER } from "./e2b_merge.ts";
/** The header the SDK names the sandbox with on every envd request. */
const SANDBOX_ID_HEADER = "e2b-sandbox-id";
/** The header the SDK names the port with; other than envd's, it reaches that sandbox port. */
const SANDBOX_PORT_HEADER = "e2b-sandbox-port";
/** Tells a node the gateway's sandbox domain, which it answers as `domain` (see `node/faces/e2b_api.ts`). */
const SANDBOX_DOMAIN_HEADER = "x-dormice-sandbox-domain";

/**
 * Builds the gateway's E2B faces over the gateway's parts (see `createGateway({ mount })`).
 *
 * - `api`: auth `X-API-KEY` (or `Authorization: Bearer`), errors always `{code:<int>, message}`.
 *   `POST /v2/sandboxes` and `/sandboxes` with `metadata.name` go through the name's slot, the
 *   creators' confirm and placement exactly like `acquireSandbox`; an unnamed create is named
 *   here (see `randomName`) and placed. Every route with an id is found by id and streamed;
 *   `DELETE /sandboxes/{id}` takes the name's slot, gives a fresh placement back and evicts.
 *   `GET /v2/sandboxes` and `GET /sandboxes` merge every node's list; nodes that did not answer
 *   are named in `x-dormice-unreachable` (every node silent is a 503). Paging is keyset paging
 *   over the nodes' own order (start time, then id): each node is asked for `limit + 1` rows
 *   after the cursor, the answers are merged and cut at `limit`, and `x-next-token` is the
 *   position of the last row shown, in the node's token form, so every node understands it and
 *   the gateway keeps no paging state. A node silent on one page and back on the next is not
 *   revisited for the rows it missed: the header says which page lacked it.
 *   `GET /sandboxes/metrics?sandbox_ids=` (at most 100 ids) asks every node and merges their
 *   `sandboxes` maps the same way. The routes the fleet does not build yet (snapshots, fork,
 *   network updates, template deletion: `shared/e2b_unbuilt.ts`) are a 501 answered here.
 * - `envd`: the id in `E2b-Sandbox-Id` and that sandbox's `X-Access-Token` (or, on REST paths,
 *   a signed URL) are checked first, so a request without them is a 400 or 401 that asks no
 *   node; then the node is found by the id; requests and answers stream both ways;
 *   routing errors are Connect `{code:"unavailable"|…, message}` on RPC paths and
 *   `{code:<int>, message}` on `/files` and `/health`.
 * - `files`: the root signed `/files` is a 501 (the signature does not name the sandbox) unless
 *   the request names its sandbox with `E2b-Sandbox-Id`; then its signature (or token) is
 *   checked like envd's before it is forwarded.
 *
 * @example
 * ```ts
 * import { createGateway } from "@dormice/cluster/gateway";
 * import { mountE2b } from "./e2b.ts";
 * const gateway = createGateway({ token: "t".repeat(32), mount: (app, parts) => mountE2b(app, parts) });
 * gateway.close();
 * ```
 */
export function createE2bFaces(parts: GatewayParts, options: E2bFacesOptions = {}): E2bFaces {
  return {
    api: createApi(parts, options),
    envd: createEnvd(parts, options),
    files: createFilesDoor(parts, options),
  };
}

/**
 * Mounts the E2B faces at `/e2b/api`, `/e2b/envd` and the root `/files`: pass it as
 * `createGateway`'s `mount` option.
 *
 * @example
 * ```ts
 * import { createGateway } from "@dormice/cluster/gateway";
 * import { mountE2b } from "./e2b.ts";
 * const gateway = createGateway({ token: "t".repeat(32), mount: (app, parts) => mountE2b(app, parts) });
 * const res = await gateway.fetch(new Request("http://gw/e2b/api/v2/sandboxes"));
 * console.log(res.status); // 401: no X-API-KEY
 * await res.body?.cancel();
 * gateway.close();
 * ```
 */
export function mountE2b(app: Hono, parts: GatewayParts, options: E2bFacesOptions = {}): void {
  const faces = createE2bFaces(parts, options);
  app.route("/e2b/api", faces.api);
  app.route("/e2b/envd", faces.envd);
  app.route("/", faces.files);
}

// --- the control plane -------------------------------------------------------------------------

function createApi(parts: GatewayParts, options: E2bFacesOptions): Hono {
  const { routing, identify, limits, log } = parts;
  const nodeApi = options.nodeApiPath ?? "/e2b/api";
  const randomName = options.randomName ?? randomSandboxName;
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

  const create = async (c: Context, rest: string, caller: Caller): Promise<Response> => {
    const signal = c.req.raw.signal;
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
    const answer = await routing.create({
      name: given === undefined ? undefined : teamScopedName(team, name),
      path: `${nodeApi}${rest}`,
      body: text,
      signal,
      headers,
      identify: (t) => {
        const id = (JSON.parse(t) as { sandboxID?: unknown })?.sandboxID;
        return typeof id === "string" ? { id, name, state: "active", team } : undefined;
      },
      admit: () => limits.admit(caller.kind === "key" ? caller.key : undefined, team),
      ask: e2bPlacementAsk(body),
    });
    return relay(answer);
  };

  const kill = async (c: Context, id: string, caller: Caller): Promise<Response> => {
    const signal = c.req.raw.signal;
    const team = scopeOf(caller);
    // Found first, so the destroy runs in the name's slot (the Finder now knows id → name).
    const r = await routing.resolve("id", id, signal, team);
    const answer = r.kind === "none" ? null : await routing.destroy({
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

  app.all("*", async (c) => {
    const caller = requireE2bCaller(c.req.raw.headers, identify);
    const rest = suffix(c);
    const method = c.req.method;
    // Answered here, whatever the sandbox: a node would say the same, and a missing sandbox
    // must not turn "not built" into "not found".
    const unbuilt = unbuiltE2bRoute(method, rest);
    if (unbuilt) throw new HttpError(501, unbuilt.message);
    if (rest === "/sandboxes/metrics" && method === "GET") return await metricsOf(c, caller);
    if (rest === "/v2/sandboxes" || rest === "/sandboxes") {
      if (method === "POST") return await create(c, rest, caller);
      if (method === "GET") return await list(c, rest === "/v2/sandboxes", caller);
      throw new HttpError(405, `${method} is not allowed on ${rest}: use GET or POST`, {
        headers: { allow: "GET, POST" },
      });
    }
    const m = /^(?:\/v2)?\/sandboxes\/([^/]+)(\/.*)?$/.exec(rest);
    if (m) {
      const id = checkedId(decodeSegment(m[1]));
      if (method === "DELETE" && m[2] === undefined && !rest.startsWith("/v2/")) {
        return await kill(c, id, caller);
      }
      return await forwardById(c, id, rest, caller);
    }
    throw new HttpError(404, `No E2B API route ${method} ${rest} on the gateway`);
  });

  app.onError((error, c) => e2bError(error, c.req.raw, parts));
  return app;
}

/** `locate` by id, with E2B's wording for a miss (another team's sandbox is a miss too). */
async function locate(
  parts: GatewayParts,
  id: string,
  signal: AbortSignal,
  team?: string,
): Promise<FindOne> {
  const r = await parts.routing.resolve("id", id, signal, team);
  if (r.kind === "none") throw notFound(id);
  return r;
}

function notFound(id: string): HttpError {
  return new HttpError(
    404,
    `Sandbox '${id}' not found on any node of the fleet: it was killed, or never existed`,
  );
}

// --- envd --------------------------------------------------------------------------------------

function createEnvd(parts: GatewayParts, options: E2bFacesOptions): Hono {
  const nodeEnvd = options.nodeEnvdPath ?? "/e2b/envd";
  const ports = createPortProxy(parts);
  const app = new Hono();
  app.all("*", async (c) => {
    const rest = suffix(c);
    const port = c.req.header(SANDBOX_PORT_HEADER);
    if (port !== undefined && port !== String(ENVD_PORT)) {
      return await portByHeader(c.req.raw, c.req.header(SANDBOX_ID_HEADER), port, rest, ports);
    }
    const dialect = isRpc(rest) ? "connect" : "rest";
    try {
      const header = c.req.header(SANDBOX_ID_HEADER);
      if (!header) {
        throw new HttpError(
          400,
          "The E2b-Sandbox-Id header is missing: name the sandbox the request is for",
        );
      }
      const id = checkedId(header);
      requireCredentials(parts, id, c.req.raw, dialect === "rest");
      const signal = c.req.raw.signal;
      // The SDK sends envd no API key (the sandbox's access token guards it); a request that
      // does send one sees its own team's sandboxes only, another team's as absent.
      const caller = optionalE2bCaller(c.req.raw.headers, parts.identify);
      const team = caller === undefined ? undefined : scopeOf(caller);
      const r = await parts.routing.resolve("id", id, signal, team);
      if (r.kind === "none") {
        // E2B's own proxy answers 502 for a sandbox that is not running; the SDK reads it (and
        // Connect's `unavailable`) as "the sandbox is gone or timed out".
        throw new HttpError(
          502,
          `No sandbox '${id}' on any node of the fleet: it was killed or timed out`,
        );
      }
      const path = `${nodeEnvd}${rest}${new URL(c.req.url).search}`;
      // No header is replaced: `Authorization: Basic` names the run-as user and `X-Access-Token`
      // is verified by the node, so both pass through untouched.
      return await parts.routing.stream(c.req.raw, {
        found: r,
        by: "id",
        key: id,
        path,
        headers: {},
      });
    } catch (error) {
      return dialect === "connect"
        ? connectError(error, c.req.raw, parts)
        : e2bError(error, c.req.raw, parts);
    }
  });
  return app;
}

/** `E2b-Sandbox-Port` other than envd's: that port of that sandbox, as by Host. */
function portByHeader(
  request: Request,
  id: string | undefined,
  port: string,
  rest: string,
  ports: PortProxy,
): Promise<Response> {
  const n = Number(port);
  if (!/^\d{1,5}$/.test(port) || n < 1 || n > 65535) {
    return Promise.resolve(Response.json({
      code: 400,
      message: `E2b-Sandbox-Port must be a port from 1 to 65535: received '${port.slice(0, 20)}'`,
    }, { status: 400 }));
  }
  if (!id) {
    return Promise.resolve(Response.json({
      code: 400,
      message: "The E2b-Sandbox-Id header is missing: name the sandbox the request is for",
    }, { status: 400 }));
  }
  return ports(request, id, n, rest + new URL(request.url).search);
}

/** Connect RPC paths look like `/process.Process/Start`; everything else is envd's REST. */
function isRpc(path: string): boolean {
  return /^\/[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)+\/[A-Za-z0-9_]+$/.test(path);
}

/**
 * Connect codes for the statuses routing raises. A 409 here is the same sandbox on two nodes,
 * which the client cannot fix by retrying with other input: `aborted`, not `already_exists`.
 */
function connectCodeOf(status: number): ConnectCode {
  return status === 409 ? "aborted" : statusToConnectCode(status);
}

function connectError(error: unknown, request: Request, parts: GatewayParts): Response {
  const e = httpErrorOrBug(error, request, parts);
  return Response.json({ code: connectCodeOf(e.status), message: e.message }, {
    status: e.status,
    headers: e.headers,
  });
}

// --- the root /files door ----------------------------------------------------------------------

function createFilesDoor(parts: GatewayParts, options: E2bFacesOptions): Hono {
  const nodeEnvd = options.nodeEnvdPath ?? "/e2b/envd";
  const app = new Hono();
  const serve = async (c: Context): Promise<Response> => {
    try {
      const id = c.req.header(SANDBOX_ID_HEADER);
      if (!id) {
        throw new HttpError(
          501,
          "The gateway cannot route a bare signed /files URL: the signature does not name the " +
            "sandbox. Build signed URLs against the node's own address (sandboxUrl " +
            "http://<node>/e2b/envd; the gateway's listNodes names each node's address), or read and write " +
            "through the sandbox (files.read / files.write), which the gateway routes",
        );
      }
      requireCredentials(parts, checkedId(id), c.req.raw, true);
      const caller = optionalE2bCaller(c.req.raw.headers, parts.identify);
      const team = caller === undefined ? undefined : scopeOf(caller);
      const found = await locate(parts, id, c.req.raw.signal, team);
      const path = `${nodeEnvd}/files${new URL(c.req.url).search}`;
      return await parts.routing.stream(c.req.raw, { found, by: "id", key: id, path, headers: {} });
    } catch (error) {
      return e2bError(error, c.req.raw, parts);
    }
  };
  app.get("/files", serve);
  app.post("/files", serve);
  app.all("/files", (c) =>
    e2bError(
      new HttpError(405, `${c.req.method} is not allowed on /files: use GET or POST`, {
        headers: { allow: "GET, POST" },
      }),
      c.req.raw,
      parts,
    ));
  return app;
}

// --- shared pieces -----------------------------------------------------------------------------

/** The request's path below the face's mount point, still percent-encoded. */
function suffix(c: Context): string {
  const pathname = new URL(c.req.url).pathname;
  // In a sub-app's catch-all the route path is `<mount>/*`.
  const mount = c.req.routePath.replace(/\/?\*$/, "");
  const rest = pathname.startsWith(mount) ? pathname.slice(mount.length) : pathname;
  return rest === "" ? "/" : rest;
}

/**
 * envd's credentials checked at the gateway's door, as the node would check them (the same
 * tokens, derived from the fleet token): a request without them costs no lookup round and
 * reaches no node, so random sandbox ids with no token are a flood of cheap 401s.
 */
function requireCredentials(
  parts: GatewayParts,
  id: string,
  request: Request,
  signedUrlAllowed: boolean,
): void {
  const accessToken = request.headers.get("x-access-token");
  const ok = envdRequestAuthorized(parts.accessTokens, id, {
    accessToken,
    url: new URL(request.url),
    method: request.method,
    signedUrlAllowed,
  }, Date.now());
  if (!ok) throw new HttpError(401, envdCredentialsRefusal(id, Boolean(accessToken)));
}

/**
 * An id no node can hold is refused at the door (a 400 in the face's dialect) before it costs a
 * lookup round: every node would refuse it anyway, with the same shared rules.
 */
function checkedId(id: string): string {
  const r = sandboxIdSchema.safeParse(id);
  if (r.success) return r.data;
  const shown = id.length > 60 ? `${id.slice(0, 60)}…` : id;
  throw new HttpError(
    400,
    `'${shown}' is not a sandbox id: ${r.error.issues[0].message}`,
  );
}

function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new HttpError(400, `The sandbox id '${segment.slice(0, 60)}' is badly percent-encoded`);
  }
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
 * What an E2B or Connect error answer is built from: an `HttpError` as thrown, a 499 when the
 * client already left, and anything else logged with its stack and called a bug (a 500).
 */
function httpErrorOrBug(error: unknown, request: Request, parts: GatewayParts): HttpError {
  if (error instanceof HttpError) return error;
  if (request.signal.aborted) return new HttpError(499, "The client closed the request");
  parts.log("error", "unexpected error in the gateway's E2B face", {
    error: error instanceof Error ? error.stack ?? error.message : String(error),
  });
  return new HttpError(
    500,
    `The gateway failed unexpectedly (${(error as Error)?.message ?? error}): this is a bug; ` +
      "the gateway's log has the details",
  );
}

/**
 * What an E2B create asks of its node: `templateID` and the names in `volumeMounts` (the node
 * checks the rest of the body and answers its own 400).
 */
function e2bPlacementAsk(body: Record<string, unknown>): PlacementAsk {
  const template = typeof body.templateID === "string" ? body.templateID : undefined;
  const mounts = Array.isArray(body.volumeMounts) ? body.volumeMounts : [];
  const volumes = mounts
    .map((m) => (m as { name?: unknown } | null)?.name)
    .filter((n): n is string => typeof n === "string")
    .map((name) => ({ name, mountPath: "/" }));
  return placementAsk(template, volumes.length > 0 ? { volumes } : {});
}

/** The one place an error becomes E2B's `{code:<int>, message}`. */
function e2bError(error: unknown, request: Request, parts: GatewayParts): Response {
  const e = httpErrorOrBug(error, request, parts);
  return Response.json({ ...e.details, code: e.status, message: e.message }, {
    status: e.status,
    headers: e.headers,
  });
}
