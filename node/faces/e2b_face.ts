/**
 * What every route of the node's E2B control plane shares: its settings and body schemas, the
 * caller's team and sandbox, and E2B's shapes of a sandbox (`Sandbox`, `ListedSandbox`,
 * `SandboxDetail`).
 *
 * @module
 */
import type { Context } from "hono";
import { z } from "zod";
import { DEFAULT_TEAM, teamOfRequest } from "../../shared/teams.ts";
import { HttpError } from "../../shared/http_error.ts";
import {
  type BodyCapOptions,
  DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
  MESSAGE_ALTERNATIVE,
  readJsonObject,
} from "../../shared/json_body.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import { randomSandboxName } from "../../shared/random_name.ts";
import {
  describeZodError,
  envSchema,
  metadataSchema,
  type SandboxSpec,
  sandboxSpecSchema,
  type SandboxState,
} from "../../shared/schemas.ts";
import { SNAPSHOT_ID_PATTERN, type SnapshotInfo, snapshotNotFound } from "../executors/contract.ts";
import type { NodeSnapshots } from "../snapshots.ts";
import type { TemplateBuilds } from "../templates_build.ts";
import { HEAL_FROM_HEADER, parseHealFrom } from "../image_moves.ts";
import { HEAL_CREATED_HEADER } from "../../shared/snapshots.ts";
import type { AccessTokens } from "../../shared/access_tokens.ts";
import { portsArePrivate } from "./ports.ts";
import type { SandboxOps, SandboxRecord, SandboxRef } from "../service_contract.ts";

/** Options of `createE2bApi` (node/faces/e2b_api.ts). */
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
  /**
   * Egress for a create that does not say `allowInternetAccess`, as if it said `true`
   * (`DORMICE_EGRESS_E2B_DEFAULT=on`, E2B's cloud default); false when absent: no egress.
   */
  defaultEgress?: boolean;
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
  /** The node's template builds (`templates_build.ts`); the build routes answer 501 without. */
  builds?: TemplateBuilds;
  /** The node's templates (`DORMICE_TEMPLATES`' names), which a build may start from. */
  templates?: () => Promise<string[] | undefined>;
}

/** The header a gateway names its sandbox domain in, for the `domain` of create answers. */
export const SANDBOX_DOMAIN_HEADER = "x-dormice-sandbox-domain";

/**
 * The E2B state of a Dormice state: only `running` and `paused` exist there.
 *
 * @example
 * ```ts
 * import { e2bState } from "./e2b_face.ts";
 * e2bState("frozen"); // "paused"
 * ```
 */
export function e2bState(state: SandboxState): "running" | "paused" {
  return state === "active" || state === "restoring" ? "running" : "paused";
}

/** The spec of E2B volume mounts, each checked as a native `spec.volumes` entry is. */
export function volumeSpec(volumes: { name: string; mountPath: string }[]): SandboxSpec {
  const r = sandboxSpecSchema.safeParse({ volumes });
  if (!r.success) throw new HttpError(400, describeZodError(r.error, "'volumeMounts'"));
  return r.data;
}

/** `value` checked by `schema`; a 400 naming what is wrong when it fails. */
export function parse<T>(schema: z.ZodType<T>, value: unknown): T {
  const r = schema.safeParse(value);
  if (!r.success) throw new HttpError(400, describeZodError(r.error));
  return r.data;
}

/** An error's message, or the thrown value as text. */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The body schemas of the routes, `timeout` bounded by the face's longest. */
function bodySchemas(maxTimeout: number) {
  const timeout = z.number().int("must be whole seconds").min(0, "must be at least 0")
    .max(maxTimeout, `must be at most ${maxTimeout} seconds`);
  return {
    timeout,
    create: z.object({
      templateID: z.string().min(1).max(256),
      timeout: timeout.optional(),
      metadata: metadataSchema.optional(),
      envVars: envSchema.optional(),
      // E2B's SandboxVolumeMount: a volume the node declares (DORMICE_VOLUMES) and its path.
      volumeMounts: z.array(z.object({ name: z.string(), path: z.string() })).max(16).optional(),
    }),
    connect: z.object({ timeout: timeout.optional() }),
    snapshot: z.object({ name: z.string().max(256).optional() }),
    fork: z.object({
      timeout: timeout.optional(),
      count: z.number().int("must be a whole number").min(1, "must be at least 1")
        .max(100, "must be at most 100").optional(),
    }),
    // `memory: false` is E2B's filesystem-only pause (the SDK's pause({ keepMemory: false })).
    pause: z.object({ memory: z.boolean().optional() }),
    setTimeout: z.object({ timeout }),
    // E2B's refresh keeps a sandbox alive at least 15 s and at most an hour past now.
    refresh: z.object({
      duration: z.number().int("must be whole seconds").min(0, "must be at least 0")
        .max(3600, "must be at most 3600 seconds").optional(),
    }),
  };
}

/** The E2B face's settings, and what its routes ask of a request and answer of a sandbox. */
export class E2bFace {
  /** The sandbox verbs. */
  readonly ops: SandboxOps;
  /** Deadlines are computed from it. */
  readonly clock: Clock;
  /** Where unexpected errors are logged. */
  readonly log: Log;
  /** Lifetime of a sandbox created or resumed without `timeout`, seconds. */
  readonly defaultTimeout: number;
  /** Whether a create that does not say `allowInternetAccess` gets egress. */
  readonly defaultEgress: boolean;
  /** Names an unnamed create that no gateway named. */
  readonly randomName: () => string;
  /** The node's snapshots, when it serves them. */
  readonly snapshots: NodeSnapshots | undefined;
  /** The routes' body schemas. */
  readonly schemas: ReturnType<typeof bodySchemas>;
  #options: E2bApiOptions;
  #envdVersion: string;
  #domain: string | null;
  #bodyCap: BodyCapOptions;

  /** The face over `ops` with `options`' settings and their defaults. */
  constructor(ops: SandboxOps, options: E2bApiOptions) {
    this.ops = ops;
    this.#options = options;
    this.clock = options.clock ?? systemClock;
    this.log = options.log ?? silentLog;
    this.#envdVersion = options.envdVersion ?? "0.6.13";
    this.#domain = options.domain ?? null;
    this.defaultTimeout = options.defaultTimeoutSeconds ?? 300;
    this.defaultEgress = options.defaultEgress ?? false;
    this.randomName = options.randomName ?? randomSandboxName;
    this.snapshots = options.snapshots;
    this.schemas = bodySchemas(options.maxTimeoutSeconds ?? 30 * 24 * 3600);
    this.#bodyCap = {
      maxBytes: options.maxBodyBytes ?? DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
      capVariable: "DORMICE_JSON_MESSAGE_LIMIT_KB",
      tooLargeHint: MESSAGE_ALTERNATIVE,
    };
  }

  /**
   * Reads the body as one JSON object with the shared reader (its byte cap included); its 400
   * and 413 are HttpErrors, which onError answers as `{code, message}`. `empty` says whether the
   * route needs a body (create, set timeout) or reads none as `{}` (connect, resume).
   */
  async readBody(c: Context, empty: "object" | "refuse", example: string) {
    return (await readJsonObject(c.req.raw, { ...this.#bodyCap, empty, example })).value;
  }

  /**
   * The caller's team: the gateway's X-Dormice-Team scopes every id to it (read after the key
   * check, which only the fleet token passes); without it the caller is the operator, who sees
   * all.
   */
  teamOf(c: Context): string | undefined {
    return teamOfRequest(c.req.raw.headers);
  }

  /** The sandbox `id` within the caller's team. */
  at(c: Context, id: string): SandboxRef {
    return { id, team: this.teamOf(c) };
  }

  /** The caller's sandbox `id`, or a 404. */
  mustGet(c: Context, id: string): SandboxRecord {
    const s = this.ops.get(this.at(c, id));
    if (!s) throw new HttpError(404, `Sandbox '${id}' not found on this node`);
    return s;
  }

  /** The node's snapshots, or a 501 when the face serves none. */
  needSnapshots(): NodeSnapshots {
    if (!this.snapshots) {
      throw new HttpError(501, "Snapshots are not served by this node's E2B face");
    }
    return this.snapshots;
  }

  /**
   * The snapshot a create's `templateID` names (its id, or its name within the caller's team),
   * or undefined for a template. An id of a snapshot this node does not hold is a 404.
   */
  async snapshotOf(c: Context, templateID: string): Promise<SnapshotInfo | undefined> {
    if (!this.snapshots) return undefined;
    const found = await this.snapshots.findOrHeal(
      templateID,
      this.teamOf(c) ?? DEFAULT_TEAM,
      parseHealFrom(c.req.header(HEAL_FROM_HEADER)),
      healCreatedOf(c.req.header(HEAL_CREATED_HEADER)),
    );
    if (!found && SNAPSHOT_ID_PATTERN.test(templateID)) throw snapshotNotFound(templateID);
    return found;
  }

  /** What the sandbox's timeout does: its lifecycle's choice, else its deadline's. */
  onTimeoutOf(s: SandboxRecord): "kill" | "pause" {
    return s.e2b.onTimeout ?? s.deadlineAction ?? "kill";
  }

  /**
   * The `Sandbox` answer of create and connect. A gateway with a sandbox domain names it in
   * `X-Dormice-Sandbox-Domain`, so the SDK builds `<port>-<id>.<domain>` hosts that route there.
   */
  created(c: Context, s: SandboxRecord) {
    const accessToken = this.#token(s);
    const traffic = portsArePrivate(s) ? this.#options.accessTokens?.forTraffic(s.id) : undefined;
    return {
      sandboxID: s.id,
      templateID: s.template,
      clientID: s.nodeId,
      envdVersion: this.#envdVersion,
      ...(accessToken ? { envdAccessToken: accessToken } : {}),
      ...(traffic ? { trafficAccessToken: traffic } : {}),
      domain: c.req.header(SANDBOX_DOMAIN_HEADER) || this.#domain,
    };
  }

  /** The `ListedSandbox` answer of the lists. */
  listed(s: SandboxRecord) {
    // The sandbox's own limits, as its metrics report them (E2B counts whole cores).
    const limits = this.ops.limits(s);
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
      envdVersion: this.#envdVersion,
    };
  }

  /** The `SandboxDetail` answer of get. */
  detail(s: SandboxRecord) {
    const accessToken = this.#token(s);
    const net = network(s);
    return {
      ...this.listed(s),
      ...(accessToken ? { envdAccessToken: accessToken } : {}),
      domain: this.#domain,
      lifecycle: { onTimeout: this.onTimeoutOf(s), autoResume: s.e2b.autoResume ?? false },
      // Null: the create did not say (and the sandbox then has no egress here).
      allowInternetAccess: s.e2b.allowInternetAccess ?? null,
      ...(net === undefined ? {} : { network: net }),
    };
  }

  #token(s: SandboxRecord): string | undefined {
    return this.#options.accessTokens?.forSandbox(s.id);
  }
}

/** When the sandbox's deadline falls, as E2B's `endAt`. */
function endAt(s: SandboxRecord): string {
  // No deadline (a native sandbox): E2B has no "never", so answer the far future.
  return s.deadlineAt === null ? "9999-12-31T23:59:59.000Z" : new Date(s.deadlineAt).toISOString();
}

/**
 * The `network` settings the sandbox keeps (the create's, its rules as last replaced), as
 * E2B's detail reports them.
 */
function network(s: SandboxRecord) {
  const { allowPublicTraffic, maskRequestHost } = s.e2b;
  const rules = s.spec.egressRules;
  const httpsPorts = s.spec.httpsPorts;
  if (
    allowPublicTraffic === undefined && maskRequestHost === undefined && !rules && !httpsPorts
  ) {
    return undefined;
  }
  return {
    ...(allowPublicTraffic === undefined ? {} : { allowPublicTraffic }),
    ...(maskRequestHost === undefined ? {} : { maskRequestHost }),
    ...(httpsPorts === undefined ? {} : { httpsPorts }),
    ...(rules
      ? {
        allowOut: [...rules.allowOut, ...rules.allowDomains ?? []],
        denyOut: [...rules.denyOut, ...rules.denyDomains ?? []],
      }
      : {}),
    // Header names only: a value is a credential, and the detail is readable by every holder
    // of the team's key.
    ...(rules?.transforms
      ? {
        rules: Object.fromEntries(
          Object.entries(rules.transforms).map(([domain, list]) => [
            domain,
            list.map((t) => ({
              transform: t.headers
                ? { headers: Object.fromEntries(Object.keys(t.headers).map((h) => [h, "***"])) }
                : {},
            })),
          ]),
        ),
      }
      : {}),
  };
}

/** {@linkcode HEAL_CREATED_HEADER}'s time, or undefined for an absent or bad value. */
function healCreatedOf(value: string | undefined): number | undefined {
  const ms = value === undefined ? NaN : Number(value);
  return Number.isSafeInteger(ms) && ms > 0 ? ms : undefined;
}
