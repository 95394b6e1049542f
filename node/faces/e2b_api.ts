/**
 * The node's E2B control plane (the API the `e2b` SDK calls with `E2B_API_URL`): create (its
 * lifecycle and network options read by `e2b_create_options.ts`), connect/resume, timeout,
 * refresh, get, list, kill, pause and metrics, with E2B's `{code, message}` errors and
 * `X-API-KEY` auth.
 *
 * @module
 */
import {
  compareListCursors,
  decodeListCursor,
  encodeListCursor,
} from "../../shared/list_cursor.ts";
import { Hono } from "hono";
import type { Context } from "hono";
import { z } from "zod";
import { TEMPLATE_DELETE_NOT_BUILT, unbuiltE2bRoutes } from "../../shared/e2b_unbuilt.ts";
import {
  pageSnapshots,
  parseSnapshotQuery,
  snapshotCursor,
  snapshotRow,
} from "../../shared/snapshots.ts";
import { DEFAULT_TEAM } from "../../shared/teams.ts";
import { HttpError } from "../../shared/http_error.ts";
import {
  type BodyCapOptions,
  DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
  MESSAGE_ALTERNATIVE,
  readJsonObject,
} from "../../shared/json_body.ts";
import { jsonArrayResponse } from "../../shared/json_stream.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import { e2bKeyAuth } from "../../shared/e2b_auth.ts";
import { randomSandboxName } from "../../shared/random_name.ts";
import { teamOfRequest } from "../../shared/teams.ts";
import { cameDirect, slotTokenOf } from "../../shared/slot_token.ts";
import { tokensEqual } from "../../shared/token.ts";
import {
  describeZodError,
  envSchema,
  metadataSchema,
  sandboxNameSchema,
  type SandboxSpec,
  sandboxSpecSchema,
} from "../../shared/schemas.ts";
import type { SandboxState } from "../../shared/schemas.ts";
import {
  executorErrorToHttp,
  SNAPSHOT_ID_PATTERN,
  type SnapshotInfo,
  snapshotNotFound,
} from "../executors/contract.ts";
import type { NodeSnapshots } from "../snapshots.ts";
import type { AccessTokens } from "../../shared/access_tokens.ts";
import { portsArePrivate } from "./ports.ts";
import { parseCreateOptions, parseNetworkUpdate } from "./e2b_create_options.ts";
import { type E2bMetric, e2bMetric, parseMetricsRange } from "./e2b_metrics.ts";
import { parseSandboxIds } from "../../shared/e2b_metrics_ids.ts";
import type { SandboxOps, SandboxRecord, SandboxRef } from "../service_contract.ts";

/** The spec of E2B volume mounts, each checked as a native `spec.volumes` entry is. */
function volumeSpec(volumes: { name: string; mountPath: string }[]): SandboxSpec {
  const r = sandboxSpecSchema.safeParse({ volumes });
  if (!r.success) throw new HttpError(400, describeZodError(r.error, "'volumeMounts'"));
  return r.data;
}

/** Options of {@linkcode createE2bApi}. */
export interface E2bApiOptions {
  /** The fleet token; E2B clients send it as `X-API-KEY`. */
  apiToken: string;
  /** Per-sandbox envd tokens; when set, create/connect/get answer `envdAccessToken`. */
  accessTokens?: AccessTokens;
  /** Deadlines are computed from it. */
  clock?: Clock;
  /** Where unexpected errors are logged. */
  log?: Log;
  /** Reported envd version; the SDK gates features on it (default "0.6.13"). */
  envdVersion?: string;
  /** The `domain` in answers; null by default because the SDK uses `E2B_SANDBOX_URL`. */
  domain?: string | null;
  /** Lifetime of a sandbox created or resumed without `timeout`, seconds (E2B's 300). */
  defaultTimeoutSeconds?: number;
  /** Longest `timeout` accepted, seconds (default 30 days). */
  maxTimeoutSeconds?: number;
  /** Names an unnamed create that no gateway named (default `randomSandboxName`). */
  randomName?: () => string;
  /**
   * Cap of a JSON body, bytes (`DORMICE_JSON_MESSAGE_LIMIT_KB`); 1 MiB when absent: the control
   * plane never carries a file.
   */
  maxBodyBytes?: number;
  /**
   * The node's snapshots, behind create/list/delete snapshot, fork and a create from a
   * snapshot; those routes answer 501 when absent.
   */
  snapshots?: NodeSnapshots;
}

/** How many sandboxes of one fork are built at once (each is an engine create). */
const FORK_CONCURRENCY = 4;

/** The header of a v2 list counting the running sandboxes its filters match, before paging. */
const TOTAL_RUNNING_HEADER = "x-total-running";
/** The header a gateway names its sandbox domain in, for the `domain` of create answers. */
export const SANDBOX_DOMAIN_HEADER = "x-dormice-sandbox-domain";

/**
 * The E2B state of a Dormice state: only `running` and `paused` exist there.
 *
 * @example
 * ```ts
 * import { e2bState } from "./e2b_api.ts";
 * e2bState("frozen"); // "paused"
 * ```
 */
export function e2bState(state: SandboxState): "running" | "paused" {
  return state === "active" || state === "restoring" ? "running" : "paused";
}

/**
 * Builds the E2B control plane; `createNodeApp` mounts it at `/e2b/api`.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { createE2bApi } from "@dormice/cluster/node";
 * import { FakeExecutor, Ledger, SandboxService } from "@dormice/cluster/node";
 * const ops = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
 *   executor: new FakeExecutor(),
 * });
 * const app = new Hono();
 * app.route("/e2b/api", createE2bApi(ops, { apiToken: "t".repeat(32) }));
 * ```
 */
export function createE2bApi(ops: SandboxOps, options: E2bApiOptions): Hono {
  const clock = options.clock ?? systemClock;
  const log = options.log ?? silentLog;
  const envdVersion = options.envdVersion ?? "0.6.13";
  const domain = options.domain ?? null;
  const defaultTimeout = options.defaultTimeoutSeconds ?? 300;
  const maxTimeout = options.maxTimeoutSeconds ?? 30 * 24 * 3600;
  const randomName = options.randomName ?? randomSandboxName;
  const bodyCap = {
    maxBytes: options.maxBodyBytes ?? DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
    capVariable: "DORMICE_JSON_MESSAGE_LIMIT_KB",
    tooLargeHint: MESSAGE_ALTERNATIVE,
  };
  const app = new Hono();

  const timeoutSchema = z.number().int("must be whole seconds").min(0, "must be at least 0")
    .max(maxTimeout, `must be at most ${maxTimeout} seconds`);
  const createSchema = z.object({
    templateID: z.string().min(1).max(256),
    timeout: timeoutSchema.optional(),
    metadata: metadataSchema.optional(),
    envVars: envSchema.optional(),
    // E2B's SandboxVolumeMount: a volume the node declares (DORMICE_VOLUMES) and its path.
    volumeMounts: z.array(z.object({ name: z.string(), path: z.string() })).max(16).optional(),
  });
  const connectSchema = z.object({ timeout: timeoutSchema.optional() });
  const snapshotSchema = z.object({ name: z.string().max(256).optional() });
  const forkSchema = z.object({
    timeout: timeoutSchema.optional(),
    count: z.number().int("must be a whole number").min(1, "must be at least 1")
      .max(100, "must be at most 100").optional(),
  });
  // `memory: false` is E2B's filesystem-only pause (the SDK's pause({ keepMemory: false })).
  const pauseSchema = z.object({ memory: z.boolean().optional() });
  const setTimeoutSchema = z.object({ timeout: timeoutSchema });
  // E2B's refresh keeps a sandbox alive at least 15 s and at most an hour past now.
  const refreshSchema = z.object({
    duration: z.number().int("must be whole seconds").min(0, "must be at least 0")
      .max(3600, "must be at most 3600 seconds").optional(),
  });

  app.use("*", e2bKeyAuth((key) => tokensEqual(key, options.apiToken)));

  const token = (s: SandboxRecord) => options.accessTokens?.forSandbox(s.id);
  const endAt = (s: SandboxRecord) =>
    // No deadline (a native sandbox): E2B has no "never", so answer the far future.
    s.deadlineAt === null ? "9999-12-31T23:59:59.000Z" : new Date(s.deadlineAt).toISOString();

  /**
   * The `Sandbox` answer of create and connect. A gateway with a sandbox domain names it in
   * `X-Dormice-Sandbox-Domain`, so the SDK builds `<port>-<id>.<domain>` hosts that route there.
   */
  const created = (c: Context, s: SandboxRecord) => {
    const accessToken = token(s);
    const traffic = portsArePrivate(s) ? options.accessTokens?.forTraffic(s.id) : undefined;
    return {
      sandboxID: s.id,
      templateID: s.template,
      clientID: s.nodeId,
      envdVersion,
      ...(accessToken ? { envdAccessToken: accessToken } : {}),
      ...(traffic ? { trafficAccessToken: traffic } : {}),
      domain: c.req.header(SANDBOX_DOMAIN_HEADER) || domain,
    };
  };

  /** The `ListedSandbox` answer of the lists. */
  const listed = (s: SandboxRecord) => {
    // The sandbox's own limits, as its metrics report them (E2B counts whole cores).
    const limits = ops.limits(s);
    return {
      sandboxID: s.id,
      templateID: s.template,
      clientID: s.nodeId,
      startedAt: s.createdAt,
      endAt: endAt(s),
      cpuCount: Math.max(1, Math.ceil(limits.cpus)),
      memoryMB: Math.round(limits.memoryMB),
      diskSizeMB: 0,
      metadata: s.metadata,
      state: e2bState(s.state),
      envdVersion,
    };
  };

  /** The `SandboxDetail` answer of get. */
  const detail = (s: SandboxRecord) => {
    const accessToken = token(s);
    return {
      ...listed(s),
      ...(accessToken ? { envdAccessToken: accessToken } : {}),
      domain,
      lifecycle: { onTimeout: onTimeoutOf(s), autoResume: s.e2b.autoResume ?? false },
      // Null: the create did not say (and the sandbox then has no egress here).
      allowInternetAccess: s.e2b.allowInternetAccess ?? null,
      ...(network(s) === undefined ? {} : { network: network(s) }),
    };
  };

  /**
   * The `network` settings the sandbox keeps (the create's, its rules as last replaced), as
   * E2B's detail reports them.
   */
  const network = (s: SandboxRecord) => {
    const { allowPublicTraffic, maskRequestHost } = s.e2b;
    const rules = s.spec.egressRules;
    if (allowPublicTraffic === undefined && maskRequestHost === undefined && !rules) {
      return undefined;
    }
    return {
      ...(allowPublicTraffic === undefined ? {} : { allowPublicTraffic }),
      ...(maskRequestHost === undefined ? {} : { maskRequestHost }),
      ...(rules ? { allowOut: rules.allowOut, denyOut: rules.denyOut } : {}),
    };
  };

  /** What the sandbox's timeout does: its lifecycle's choice, else its deadline's. */
  const onTimeoutOf = (s: SandboxRecord) => s.e2b.onTimeout ?? s.deadlineAction ?? "kill";

  // The gateway's X-Dormice-Team scopes every id to the caller's team (read after the key check,
  // which only the fleet token passes); without it the caller is the operator, who sees all.
  const teamOf = (c: Context) => teamOfRequest(c.req.raw.headers);
  const at = (c: Context, id: string): SandboxRef => ({ id, team: teamOf(c) });

  const mustGet = (c: Context, id: string): SandboxRecord => {
    const s = ops.get(at(c, id));
    if (!s) throw new HttpError(404, `Sandbox '${id}' not found on this node`);
    return s;
  };

  const needSnapshots = (): NodeSnapshots => {
    if (!options.snapshots) {
      throw new HttpError(501, "Snapshots are not served by this node's E2B face");
    }
    return options.snapshots;
  };

  /**
   * The snapshot a create's `templateID` names (its id, or its name within the caller's team),
   * or undefined for a template. An id of a snapshot this node does not hold is a 404.
   */
  const snapshotOf = async (c: Context, templateID: string): Promise<SnapshotInfo | undefined> => {
    if (!options.snapshots) return undefined;
    const found = await options.snapshots.find(templateID, teamOf(c) ?? DEFAULT_TEAM);
    if (!found && SNAPSHOT_ID_PATTERN.test(templateID)) throw snapshotNotFound(templateID);
    return found;
  };

  const create = async (c: Context) => {
    const raw = await readBody(c, "refuse", `{"templateID":"base"}`, bodyCap);
    const body = parse(createSchema, raw);
    const timeoutSeconds = body.timeout ?? defaultTimeout;
    const options = parseCreateOptions(raw, timeoutSeconds);
    let name: string;
    if (body.metadata?.name !== undefined) {
      const r = sandboxNameSchema.safeParse(body.metadata.name);
      if (!r.success) throw new HttpError(400, describeZodError(r.error, "'metadata.name'"));
      name = r.data;
    } else {
      // A gateway names an unnamed create itself (the key of its slot, placement and cache).
      const named = c.req.header("x-dormice-sandbox-name");
      const r = named === undefined ? undefined : sandboxNameSchema.safeParse(named);
      if (r && !r.success) {
        throw new HttpError(400, describeZodError(r.error, "'X-Dormice-Sandbox-Name'"));
      }
      name = r?.data ?? randomName();
    }
    const from = await snapshotOf(c, body.templateID);
    const result = await ops.acquire({
      name,
      team: teamOf(c),
      template: body.templateID,
      ...(from ? { template: from.snapshotId, snapshot: from.snapshotId } : {}),
      metadata: body.metadata,
      env: body.envVars,
      spec: body.volumeMounts?.length
        ? {
          ...options.spec,
          ...volumeSpec(body.volumeMounts.map((v) => ({ name: v.name, mountPath: v.path }))),
        }
        : options.spec,
      deadline: { ms: timeoutSeconds * 1000, action: options.onTimeout },
      e2b: options.e2b,
      slotToken: slotTokenOf(c.req.raw.headers),
      direct: cameDirect(c.req.raw.headers),
    });
    return c.json(created(c, result.sandbox), 201);
  };
  app.post("/v2/sandboxes", create);
  app.post("/sandboxes", create);

  const connect = async (c: Context) => {
    const id = c.req.param("id")!;
    const body = parse(connectSchema, await readBody(c, "object", `{"timeout":300}`, bodyCap));
    mustGet(c, id);
    const { resumed, sandbox } = await ops.resume(at(c, id));
    const now = clock.now();
    let current = sandbox;
    // Connect only ever extends the lifetime; a sandbox without a deadline keeps none unless
    // the caller asked for one.
    if (body.timeout !== undefined || sandbox.deadlineAt !== null) {
      const wanted = now + (body.timeout ?? defaultTimeout) * 1000;
      if (sandbox.deadlineAt === null || wanted > sandbox.deadlineAt) {
        current = ops.setDeadline(at(c, id), wanted, onTimeoutOf(sandbox));
      }
    }
    return c.json(created(c, current), resumed ? 201 : 200);
  };
  app.post("/v2/sandboxes/:id/connect", connect);
  app.post("/sandboxes/:id/connect", connect);

  app.post("/sandboxes/:id/resume", async (c) => {
    const id = c.req.param("id");
    const body = parse(
      z.object({ timeout: timeoutSchema.optional(), autoPause: z.boolean().optional() }),
      await readBody(c, "object", `{"timeout":300}`, bodyCap),
    );
    const before = mustGet(c, id);
    if (e2bState(before.state) === "running") {
      throw new HttpError(409, `Sandbox '${id}' is already running: connect to it instead`);
    }
    const { sandbox } = await ops.resume(at(c, id));
    const action = body.autoPause === undefined
      ? onTimeoutOf(sandbox)
      : body.autoPause
      ? "pause"
      : "kill";
    const after = ops.setDeadline(
      at(c, id),
      clock.now() + (body.timeout ?? defaultTimeout) * 1000,
      action,
    );
    return c.json(created(c, after), 201);
  });

  app.post("/sandboxes/:id/timeout", async (c) => {
    const id = c.req.param("id");
    const body = parse(setTimeoutSchema, await readBody(c, "refuse", `{"timeout":300}`, bodyCap));
    const s = mustGet(c, id);
    ops.setDeadline(at(c, id), clock.now() + body.timeout * 1000, onTimeoutOf(s));
    return c.body(null, 204);
  });

  // Only ever extends, unlike /timeout (E2B's keep-alive); a sandbox with no deadline keeps none.
  app.post("/sandboxes/:id/refreshes", async (c) => {
    const id = c.req.param("id");
    const body = parse(refreshSchema, await readBody(c, "object", `{"duration":60}`, bodyCap));
    const s = mustGet(c, id);
    if (e2bState(s.state) === "paused") {
      throw new HttpError(409, `Sandbox '${id}' is paused: connect to it to resume it first`);
    }
    const wanted = clock.now() + Math.max(body.duration ?? 15, 15) * 1000;
    if (s.deadlineAt !== null && wanted > s.deadlineAt) {
      ops.setDeadline(at(c, id), wanted, onTimeoutOf(s));
    }
    return c.body(null, 204);
  });

  // E2B's updateNetwork: the address rules replaced whole (an omitted list is cleared).
  app.put("/sandboxes/:id/network", async (c) => {
    const id = c.req.param("id");
    const rules = parseNetworkUpdate(await readBody(c, "refuse", `{"allowOut":[]}`, bodyCap));
    mustGet(c, id);
    await ops.updateEgressRules(at(c, id), rules);
    return c.body(null, 204);
  });

  // Before /sandboxes/:id, which would take "metrics" for an id. The newest sample of each id
  // this node holds for the caller; others are left out (a gateway merges every node's).
  app.get("/sandboxes/metrics", async (c) => {
    const sandboxes: Record<string, E2bMetric> = {};
    for (const id of parseSandboxIds(c.req.queries("sandbox_ids"))) {
      if (!ops.get(at(c, id))) continue;
      const samples = await ops.metricsHistory(at(c, id)).catch((error) => {
        // Destroyed since the line above: as absent as one never here.
        if (error instanceof HttpError && error.status === 404) return [];
        throw error;
      });
      const latest = samples.at(-1);
      if (latest) sandboxes[id] = e2bMetric(latest);
    }
    return c.json({ sandboxes });
  });

  app.get("/sandboxes/:id", (c) => c.json(detail(mustGet(c, c.req.param("id")))));

  app.get("/sandboxes", async (c) => {
    const metadata = parseMetadataQuery(c.req.query("metadata"));
    const rows = await ops.listInSlices({
      metadata,
      team: teamOf(c),
      states: ["active", "restoring"],
    });
    return jsonArrayResponse(rows.map(listed));
  });

  app.get("/v2/sandboxes", async (c) => {
    const metadata = parseMetadataQuery(c.req.query("metadata"));
    const states = parseStates(c.req.queries("state"));
    const order = c.req.query("order") ?? "desc";
    if (order !== "asc" && order !== "desc") {
      throw new HttpError(400, `'order' must be asc or desc: received '${order.slice(0, 20)}'`);
    }
    const limitRaw = c.req.query("limit");
    const limit = limitRaw === undefined ? 100 : Number(limitRaw);
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
      throw new HttpError(
        400,
        `'limit' must be a whole number from 1 to 1000: received '${limitRaw}'`,
      );
    }
    const startedAfterRaw = c.req.query("startedAfter");
    const startedAfter = startedAfterRaw === undefined ? undefined : Date.parse(startedAfterRaw);
    if (startedAfter !== undefined && Number.isNaN(startedAfter)) {
      throw new HttpError(400, `'startedAfter' must be an RFC 3339 date-time`);
    }
    const template = c.req.query("template");
    const sign = order === "asc" ? 1 : -1;
    let rows = (await ops.listInSlices({ metadata, team: teamOf(c) }))
      .filter((s) => states.has(e2bState(s.state)))
      .filter((s) => startedAfter === undefined || Date.parse(s.createdAt) >= startedAfter)
      .filter((s) => !template || s.template === template)
      .sort((a, b) => sign * compareListCursors(a, b));
    // E2B's count of the running rows the filters match, before paging (and before the
    // cursor: the same on every page), given only when running ones were asked for.
    if (states.has("running")) {
      c.header(
        TOTAL_RUNNING_HEADER,
        String(rows.filter((s) => e2bState(s.state) === "running").length),
      );
    }
    const nextToken = c.req.query("nextToken");
    if (nextToken) {
      const cursor = decodeListCursor(nextToken, "node");
      rows = rows.filter((s) => sign * compareListCursors(s, cursor) > 0);
    }
    const page = rows.slice(0, limit);
    if (rows.length > limit) {
      const last = page[page.length - 1];
      c.header("x-next-token", encodeListCursor(last));
    }
    return c.json(page.map(listed));
  });

  app.delete("/sandboxes/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await ops.destroy(at(c, id)))) {
      throw new HttpError(404, `Sandbox '${id}' not found on this node`);
    }
    return c.body(null, 204);
  });

  app.post("/sandboxes/:id/pause", async (c) => {
    const id = c.req.param("id");
    const body = parse(pauseSchema, await readBody(c, "object", `{}`, bodyCap));
    const s = mustGet(c, id);
    if (e2bState(s.state) === "paused") {
      throw new HttpError(409, `Sandbox '${id}' is already paused: connect to resume it`);
    }
    // `memory: false` keeps the file system only and frees the rest (E2B's filesystem pause),
    // within the data-disk floor snapshots keep.
    const keepMemory = body.memory !== false;
    if (!keepMemory) await options.snapshots?.checkDisk(s.id, "A pause to disk");
    await ops.pause(at(c, id), { keepMemory });
    return c.body(null, 204);
  });

  // The samples of the range, from the node's history (a paused sandbox keeps what it did
  // while running, and reading never wakes it).
  app.get("/sandboxes/:id/metrics", async (c) => {
    const { fromMs, toMs } = parseMetricsRange(c.req.query("start"), c.req.query("end"));
    const s = mustGet(c, c.req.param("id"));
    return c.json((await ops.metricsHistory(at(c, s.id), fromMs, toMs)).map(e2bMetric));
  });

  app.post("/sandboxes/:id/snapshots", async (c) => {
    const id = c.req.param("id");
    const body = parse(snapshotSchema, await readBody(c, "object", `{"name":"ready"}`, bodyCap));
    mustGet(c, id);
    const info = await needSnapshots().take(at(c, id), body.name);
    return c.json(snapshotRow(info), 201);
  });

  app.get("/snapshots", async (c) => {
    const query = parseSnapshotQuery(new URL(c.req.url).searchParams, "node");
    const rows = (await needSnapshots().list(teamOf(c))).map(snapshotRow);
    const { page, more } = pageSnapshots(rows, query);
    if (more && page.length > 0) {
      c.header("x-next-token", encodeListCursor(snapshotCursor(page[page.length - 1])));
    }
    return c.json(page);
  });

  app.delete("/templates/:id", async (c) => {
    const id = c.req.param("id");
    if (!SNAPSHOT_ID_PATTERN.test(id)) throw new HttpError(501, TEMPLATE_DELETE_NOT_BUILT);
    if (!(await needSnapshots().delete(id, teamOf(c)))) {
      throw new HttpError(404, `Snapshot '${id}' not found on this node`);
    }
    return c.body(null, 204);
  });

  // E2B's fork: one snapshot of the source's files, `count` new sandboxes from it, each
  // answered or failed on its own; the snapshot is dropped after (its sandboxes keep their
  // files). The source goes on running.
  app.post("/sandboxes/:id/fork", async (c) => {
    const id = c.req.param("id");
    const body = parse(forkSchema, await readBody(c, "object", `{"count":1}`, bodyCap));
    const source = mustGet(c, id);
    const snapshots = needSnapshots();
    const snap = await snapshots.take(at(c, id));
    const { name: _name, ...metadata } = source.metadata;
    const timeoutSeconds = body.timeout ?? defaultTimeout;
    try {
      const results = await mapBounded(
        Array.from({ length: body.count ?? 1 }, (_, i) => i),
        FORK_CONCURRENCY,
        async () => {
          try {
            const { sandbox } = await ops.acquire({
              name: randomName(),
              team: source.team,
              template: source.template,
              snapshot: snap.snapshotId,
              metadata,
              env: source.env,
              spec: source.spec,
              deadline: { ms: timeoutSeconds * 1000, action: onTimeoutOf(source) },
              e2b: { ...source.e2b, timeoutSeconds },
              direct: cameDirect(c.req.raw.headers),
            });
            return { sandbox: created(c, sandbox) };
          } catch (thrown) {
            const error = executorErrorToHttp(thrown);
            if (error instanceof HttpError) {
              return { error: { code: error.status, message: error.message } };
            }
            log("error", "a fork failed", { source: id, error });
            return { error: { code: 500, message: `Internal error: ${errorText(error)}` } };
          }
        },
      );
      return c.json(results, 201);
    } finally {
      await snapshots.delete(snap.snapshotId).catch((error) =>
        log("warn", "could not drop a fork's snapshot", { snapshot: snap.snapshotId, error })
      );
    }
  });

  for (const route of unbuiltE2bRoutes) {
    app.on(route.method, route.path, (c) => {
      // A sandbox that does not exist is a 404 first (see shared/e2b_unbuilt.ts).
      if (route.namesSandbox) mustGet(c, c.req.param("id")!);
      return c.json({ code: 501, message: route.message }, 501);
    });
  }

  // A catch-all route rather than notFound(): a mounted sub-app's notFound is not used.
  app.all("*", (c) =>
    c.json({
      code: 404,
      message: `No E2B API route ${c.req.method} ${new URL(c.req.url).pathname} on this node`,
    }, 404));
  app.onError((thrown, c) => {
    const error = executorErrorToHttp(thrown);
    if (error instanceof HttpError) {
      for (const [k, v] of Object.entries(error.headers)) c.header(k, v);
      return c.json(
        { ...error.details, code: error.status, message: error.message },
        error.status as 400,
      );
    }
    log("error", "E2B API request failed", { path: c.req.path, error });
    return c.json({ code: 500, message: `Internal error: ${errorText(error)}` }, 500);
  });
  return app;
}

/**
 * Reads the body as one JSON object with the shared reader (its byte cap included); its 400 and
 * 413 are HttpErrors, which onError answers as `{code, message}`. `empty` says whether the
 * route needs a body (create, set timeout) or reads none as `{}` (connect, resume).
 */
async function readBody(
  c: Context,
  empty: "object" | "refuse",
  example: string,
  cap: BodyCapOptions,
) {
  return (await readJsonObject(c.req.raw, { ...cap, empty, example })).value;
}

function parse<T>(schema: z.ZodType<T>, value: unknown): T {
  const r = schema.safeParse(value);
  if (!r.success) throw new HttpError(400, describeZodError(r.error));
  return r.data;
}

/**
 * Parses E2B's `metadata` filter: a query string (`k=v&k2=v2`) whose keys and values are
 * URL-encoded once more, so each is decoded again after the query string is parsed.
 *
 * @example
 * ```ts
 * import { parseMetadataQuery } from "./e2b_api.ts";
 * parseMetadataQuery("team=a%2Bb"); // { team: "a+b" }
 * ```
 */
export function parseMetadataQuery(raw: string | undefined): Record<string, string> | undefined {
  if (raw === undefined || raw === "") return undefined;
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(raw)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      throw new HttpError(400, `'metadata' has a badly encoded pair '${k.slice(0, 40)}'`);
    }
  }
  return out;
}

function parseStates(raw: string[] | undefined): Set<"running" | "paused"> {
  const values = (raw ?? []).flatMap((r) => r.split(",")).map((s) => s.trim()).filter(Boolean);
  if (values.length === 0) return new Set(["running", "paused"]);
  const out = new Set<"running" | "paused">();
  for (const v of values) {
    if (v !== "running" && v !== "paused") {
      throw new HttpError(400, `'state' must be running or paused: received '${v.slice(0, 20)}'`);
    }
    out.add(v);
  }
  return out;
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** `fn` over every item, at most `limit` at once, the answers in the items' order. */
async function mapBounded<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
