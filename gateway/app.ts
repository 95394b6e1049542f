/**
 * `createGateway()`: the whole gateway (Fleet, Finder, Placer, slots, forwarding and the native
 * face) as one object whose `fetch(Request)` an embedder mounts in its own server.
 *
 * @module
 */
import { Hono } from "hono";
import type { Context } from "hono";
import type { DatabaseSync } from "node:sqlite";
import { z } from "zod";
import { Fleet } from "./fleet.ts";
import { Finder } from "./finder.ts";
import { Placer } from "./placer.ts";
import { clientGone, GatewayRouting } from "./routing.ts";
import { type Clock, systemClock } from "../shared/clock.ts";
import { HttpError, messageResponse } from "../shared/http_error.ts";
import { type Log, silentLog } from "../shared/log.ts";
import { checkInSchema, describeZodError, nodeIdSchema } from "../shared/schemas.ts";
import type { FoundSandbox } from "./finder.ts";
import { nativeRequestSchemas, nativeVerbs } from "../shared/native_schemas.ts";
import { bearerToken, tokenMatcher } from "../shared/token.ts";

/** Options for {@linkcode createGateway}. */
export interface GatewayOptions {
  /** The fleet token: clients and nodes present it, and the gateway forwards with it. */
  token: string;
  /**
   * The Fleet's table; `main.ts` passes `openExclusiveDatabase(path, "DORMICE_GATEWAY_DB")`.
   * A private in-memory database by default.
   */
  database?: DatabaseSync;
  /** Reject a node above this CPU %. Default 70. */
  cpuLimitPct?: number;
  /** Reject a node at this many active + in-flight sandboxes. Default 400. */
  activeLimit?: number;
  /** Reject a node with less available data disk. Default 10 GB. */
  minDiskGB?: number;
  /** One deadline for a lookup round, connect included. Default 2000 ms. */
  lookupTimeoutMs?: number;
  /** Bound of each node's answer to a fleet-wide listing. Default 5000 ms. */
  fanOutTimeoutMs?: number;
  /** Finder cache entries per index. Default 100,000. */
  cacheSize?: number;
  /** Time source; the real clock by default. */
  clock?: Clock;
  /** HTTP client to the nodes; the global `fetch` (pooled connections) by default. */
  fetch?: typeof fetch;
  /** Where events go; silent by default. */
  log?: Log;
  /**
   * Mounts more faces before the app serves its first request (Hono locks its router then), e.g.
   * the E2B control plane and envd:
   * `mount: (app, gw) => { app.route("/e2b/api", e2bApi(gw)); app.route("/e2b/envd", envd(gw)); }`.
   * Paths under `/e2b/` and `/files` are left to the mounted faces, which answer auth and errors
   * in their own dialect. A POST to a routed native verb (`/execCommand`, `/getSandboxMetrics`,
   * …) is answered before Hono, so middleware mounted at the root does not see it.
   */
  mount?: (app: Hono, gateway: GatewayParts) => void;
}

/** The pieces a mounted face builds on. */
export interface GatewayParts {
  /** The nodes that checked in. */
  fleet: Fleet;
  /** Name/id → node. */
  finder: Finder;
  /** New sandbox → node. */
  placer: Placer;
  /** Locate, stream, create, destroy and fan out, with the slots. */
  routing: GatewayRouting;
  /** Constant-time check of a presented token against the fleet token. */
  authorized(token: string | undefined): boolean;
  /** Where events go. */
  log: Log;
}

/** A built gateway. */
export interface Gateway extends GatewayParts {
  /** Serves every route. Mount it in `Deno.serve` or an embedder's Hono app. */
  fetch(request: Request): Promise<Response>;
  /** The root Hono app (mount more faces through the `mount` option). */
  app: Hono;
  /** Announces nodes that went down; call it every second or so. */
  sweep(): string[];
  /** Closes the Fleet's database when the gateway opened it itself. */
  close(): void;
}

/** The verbs the gateway answers, in the order the 404 lists them: the native ones and its own. */
const verbs = [...nativeVerbs, "checkIn", "listNodes", "removeNode"];

/** Paths the gateway's bearer check leaves to a mounted face (E2B speaks `X-API-KEY`). */
const ownAuthPrefixes = ["/e2b/", "/files"];

/**
 * Builds the gateway: `GET /healthz` (open), the fleet verbs `checkIn`, `listNodes`,
 * `removeNode`, and the native sandbox verbs routed to the node that holds the sandbox (or placed
 * for `acquireSandbox`). One fleet token guards every route but `/healthz`; every error is
 * `{message}` from one handler.
 *
 * @example
 * ```ts
 * import { createGateway } from "@dormice/cluster/gateway";
 * const gateway = createGateway({ token: "t".repeat(32) });
 * const res = await gateway.fetch(new Request("http://gw/healthz"));
 * console.log(res.status); // 200
 * gateway.close();
 * ```
 */
export function createGateway(options: GatewayOptions): Gateway {
  const {
    token,
    database,
    cpuLimitPct,
    activeLimit,
    minDiskGB,
    lookupTimeoutMs,
    fanOutTimeoutMs,
    cacheSize,
    clock = systemClock,
    fetch: fetchFn = globalThis.fetch,
    log = silentLog,
  } = options;
  if (typeof token !== "string" || token.length === 0) {
    throw new TypeError("Cannot create the gateway as 'token' is empty: pass the fleet token");
  }
  const fleet = new Fleet({ database, clock, log });
  const finder = new Finder({
    fleet,
    token,
    timeoutMs: lookupTimeoutMs,
    cacheSize,
    fetch: fetchFn,
    clock,
    log,
  });
  const placer = new Placer({ fleet, cpuLimitPct, activeLimit, minDiskGB });
  const routing = new GatewayRouting({
    fleet,
    finder,
    placer,
    token,
    fetch: fetchFn,
    log,
    fanOutTimeoutMs,
  });
  const matches = tokenMatcher(token);
  const authorized = (given: string | undefined) => given !== undefined && matches(given);
  const parts: GatewayParts = { fleet, finder, placer, routing, authorized, log };

  const app = new Hono();
  app.onError((error, c) => errorResponse(error, c.req.raw, log));
  app.notFound((c) => {
    const path = new URL(c.req.url).pathname;
    return c.json({
      message: (/^\/[^/]+$/.test(path) ? `Unknown verb '${path.slice(1)}'` : `No route ${path}`) +
        `: the gateway answers POST /<verb> for ${verbs.join(", ")}, and GET /healthz`,
    }, 404);
  });

  app.get("/healthz", (c) => c.json({ ok: true, nodes: fleet.size }));

  const checkBearer = (header: string | undefined | null): void => {
    const given = bearerToken(header ?? undefined);
    if (given === undefined) {
      throw new HttpError(
        401,
        "Missing bearer token: send the header 'Authorization: Bearer <DORMICE_API_TOKEN>'",
        { headers: { "www-authenticate": "Bearer" } },
      );
    }
    if (!authorized(given)) {
      throw new HttpError(
        401,
        "The bearer token does not match the gateway's DORMICE_API_TOKEN: send the fleet token",
        { headers: { "www-authenticate": "Bearer" } },
      );
    }
  };

  app.use("*", (c, next) => {
    const path = c.req.path;
    if (path === "/healthz" || ownAuthPrefixes.some((p) => path.startsWith(p))) return next();
    checkBearer(c.req.header("authorization"));
    return next();
  });

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
    const body = parse(checkInSchema, await readJson(c.req.raw));
    const outcome = fleet.checkIn(body);
    return c.json({ ok: true, outcome });
  });
  post("listNodes", (c) => c.json({ nodes: fleet.list((id) => placer.inFlight(id)) }));
  post("removeNode", async (c) => {
    const { nodeId } = parse(removeNodeSchema, await readJson(c.req.raw));
    fleet.removeNode(nodeId);
    return c.json({ removed: nodeId });
  });

  // --- the native sandbox verbs ---
  post("acquireSandbox", async (c) => {
    const { text, value } = await readBody(c.req.raw, nativeRequestSchemas.acquireSandbox);
    const answer = await routing.create({
      name: value.name,
      path: "/acquireSandbox",
      body: text,
      signal: c.req.raw.signal,
      identify: sandboxOf,
    });
    return relay(answer);
  });
  post("destroySandbox", async (c) => {
    const { text, value } = await readBody(c.req.raw, nativeRequestSchemas.destroySandbox);
    const answer = await routing.destroy({
      by: "name",
      key: value.name,
      path: "/destroySandbox",
      body: text,
      signal: c.req.raw.signal,
    });
    return answer === null ? c.json({ destroyed: false }) : relay(answer);
  });
  // The routed verbs, by path: registered in Hono and also answered before it (see `fetch`).
  // `request.signal` is read only on a cache miss: reading it costs every request an abort.
  const routed = new Map<string, (request: Request) => Promise<Response>>();
  for (
    const verb of [
      "execCommand",
      "writeFile",
      "readFile",
      "updateMetadata",
      "getSandboxMetrics",
    ] as const
  ) {
    const schema: z.ZodType<{ name: string }> = nativeRequestSchemas[verb];
    const path = `/${verb}`;
    routed.set(path, async (request) => {
      const { text, value } = await readBody(request, schema);
      const found = finder.cached("name", value.name) ??
        await routing.locate("name", value.name, request.signal);
      return await routing.stream(request, found, "name", value.name, path, text);
    });
  }
  routed.set("/lookupSandbox", async (request) => {
    const { text, value } = await readBody(request, nativeRequestSchemas.lookupSandbox);
    const [by, key] = "name" in value ? ["name", value.name] as const : ["id", value.id] as const;
    const r = finder.cached(by, key) ?? await routing.resolve(by, key, request.signal);
    if (r.kind === "none") return Response.json({ found: false });
    return await routing.stream(request, r, by, key, "/lookupSandbox", text);
  });
  for (const [path, handler] of routed) post(path.slice(1), (c) => handler(c.req.raw));

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
      checkBearer(request.headers.get("authorization"));
      return handler(request).catch((error) => errorResponse(error, request, log));
    } catch (error) {
      return Promise.resolve(errorResponse(error, request, log));
    }
  };
  post("listSandboxes", async (c) => {
    const { text } = await readBody(c.req.raw, nativeRequestSchemas.listSandboxes);
    const answers = await routing.fanOut("/listSandboxes", text, c.req.raw.signal);
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
    const headers: Record<string, string> = {};
    if (unreachable.length > 0) {
      headers["x-dormice-unreachable"] = unreachable.map((u) => u.nodeId).join(",");
    }
    return c.json({ sandboxes, unreachable }, 200, headers);
  });
  post("getHostMetrics", async (c) => {
    await readBody(c.req.raw, nativeRequestSchemas.getHostMetrics);
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

  return {
    ...parts,
    app,
    fetch: (request: Request) => fast(request) ?? Promise.resolve(app.fetch(request)),
    sweep: () => fleet.sweep(),
    close: () => fleet.close(),
  };
}

const removeNodeSchema = z.object({ nodeId: nodeIdSchema });

/** The sandbox `{id, name, state}` inside a native `acquireSandbox` answer. */
function sandboxOf(text: string): FoundSandbox | undefined {
  const s = (JSON.parse(text) as { sandbox?: FoundSandbox })?.sandbox;
  return s && typeof s.id === "string" && typeof s.name === "string"
    ? { id: s.id, name: s.name, state: String(s.state) }
    : undefined;
}

/** The path of an absolute URL, without its query. */
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

async function readJson(request: Request): Promise<unknown> {
  return (await readBody(request)).value;
}

/** Reads the body as one JSON object (an empty body is `{}`) and validates it. */
async function readBody<T = unknown>(
  request: Request,
  schema?: { safeParse(v: unknown): z.ZodSafeParseResult<T> },
): Promise<{ text: string; value: T }> {
  let text: string;
  try {
    text = await request.text();
  } catch (error) {
    if (request.signal.aborted) throw clientGone();
    throw new HttpError(400, `The body could not be read (${(error as Error)?.message})`);
  }
  let value: unknown = {};
  if (text.trim() !== "") {
    try {
      value = JSON.parse(text);
    } catch (error) {
      throw new HttpError(
        400,
        `The body is not valid JSON (${(error as Error).message}): send a JSON object such as ` +
          `{"name":"agent-1"}`,
      );
    }
  } else text = "{}";
  if (value === null || typeof value !== "object" || Array.isArray(value)) {
    throw new HttpError(400, `The body must be a JSON object such as {"name":"agent-1"}`);
  }
  return { text, value: schema ? parse(schema, value) : value as T };
}

function parse<T>(schema: { safeParse(v: unknown): z.ZodSafeParseResult<T> }, value: unknown): T {
  const r = schema.safeParse(value);
  if (!r.success) throw new HttpError(400, describeZodError(r.error));
  return r.data;
}

/** The one place an error becomes a native `{message}` answer. */
function errorResponse(error: unknown, request: Request, log: Log): Response {
  if (!(error instanceof HttpError) && request.signal.aborted) {
    // The client hung up mid-lookup or mid-forward: nobody reads this answer.
    error = clientGone();
  }
  return messageResponse(error, "gateway", log);
}
