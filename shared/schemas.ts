/**
 * Wire schemas shared by the gateway and the nodes: one vocabulary for both ends.
 *
 * @module
 */
import { z } from "zod";
import { type PoolReport, poolReportSchema } from "./pools.ts";
import type { SandboxSpec } from "./sandbox_spec.ts";

export * from "./sandbox_spec.ts";

/** The most volume names one check-in carries (declared ones first, then managed ones). */
export const MAX_CHECK_IN_VOLUMES = 4096;

/** The lifecycle states a sandbox row can be in (Dormice's vocabulary). */
export const sandboxStates = ["active", "frozen", "stopped", "archived", "restoring"] as const;

/** One of {@linkcode sandboxStates}. */
export type SandboxState = "active" | "frozen" | "stopped" | "archived" | "restoring";

/** Zod schema of {@linkcode SandboxState}. */
export const sandboxStateSchema: z.ZodEnum<{ [K in SandboxState]: K }> = z.enum(sandboxStates);

/**
 * A sandbox name: 1–128 characters of `[A-Za-z0-9._-]`, starting with a letter or digit.
 *
 * A 129-character name is refused here (a 400), never looked up and silently missed.
 *
 * @example Validate a name
 * ```ts
 * import { sandboxNameSchema } from "./schemas.ts";
 * sandboxNameSchema.parse("agent-42");
 * ```
 */
export const sandboxNameSchema: z.ZodString = z.string()
  .min(1, "a sandbox name needs at least 1 character")
  .max(128, "a sandbox name has at most 128 characters")
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._-]*$/,
    "a sandbox name uses only letters, digits, '.', '_' and '-', and starts with a letter or digit",
  );

/**
 * A sandbox id as a ledger mints it (20 lowercase letters and digits; ledgers of earlier
 * versions hold `sbx_` ones, which stay valid) and as E2B clients send it back.
 */
export const sandboxIdSchema: z.ZodString = z.string()
  .min(1, "a sandbox id needs at least 1 character")
  .max(128, "a sandbox id has at most 128 characters")
  .regex(/^[A-Za-z0-9._-]+$/, "a sandbox id uses only letters, digits, '.', '_' and '-'");

/**
 * Parses an http(s) origin: a trailing slash is dropped, a path, query, fragment or
 * credentials are refused. Returns the origin string or an error sentence.
 *
 * @example
 * ```ts
 * import { parseEndpoint } from "./schemas.ts";
 * parseEndpoint("http://10.0.0.5:3676/"); // { ok: true, value: "http://10.0.0.5:3676" }
 * ```
 */
export function parseEndpoint(
  input: string,
): { ok: true; value: string } | { ok: false; error: string } {
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    return {
      ok: false,
      error: `'${input}' is not a URL: write an origin such as http://10.0.0.5:3676`,
    };
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    return {
      ok: false,
      error: `'${input}' uses ${url.protocol} where http: or https: is needed`,
    };
  }
  if (url.username || url.password) {
    return { ok: false, error: `'${input}' carries credentials: write only scheme, host and port` };
  }
  if ((url.pathname !== "/" && url.pathname !== "") || url.search || url.hash) {
    return {
      ok: false,
      error: `'${input}' has a path, query or fragment: write only the origin, e.g. ${url.origin}`,
    };
  }
  return { ok: true, value: url.origin };
}

/** An http(s) origin with the trailing slash dropped; a path or query is refused. */
export const endpointSchema: z.ZodType<string, string> = z.string().transform((s, ctx) => {
  const r = parseEndpoint(s);
  if (!r.ok) {
    ctx.addIssue({ code: "custom", message: r.error });
    return z.NEVER;
  }
  return r.value;
});

/** The data disk under a node's data dir, in bytes. */
export const dataDiskSchema: z.ZodObject<{
  path: z.ZodString;
  totalBytes: z.ZodNumber;
  usedBytes: z.ZodNumber;
  availableBytes: z.ZodNumber;
}> = z.object({
  path: z.string(),
  totalBytes: z.number().nonnegative(),
  usedBytes: z.number().nonnegative(),
  availableBytes: z.number().nonnegative(),
});

/** The data disk reading. */
export interface DataDisk {
  /** The directory measured (the node's data dir). */
  path: string;
  /** The filesystem's size, bytes. */
  totalBytes: number;
  /** Bytes in use. */
  usedBytes: number;
  /** Bytes this user may still write. */
  availableBytes: number;
}

/** The ledger's census: how many sandboxes are in each state. */
export const stateCountsSchema: z.ZodObject<{ [K in SandboxState]: z.ZodNumber }> = z.object({
  active: z.number().int().nonnegative(),
  frozen: z.number().int().nonnegative(),
  stopped: z.number().int().nonnegative(),
  archived: z.number().int().nonnegative(),
  restoring: z.number().int().nonnegative(),
});

/** The ledger's census by state: how many sandboxes are in each. */
export type StateCounts = { [K in SandboxState]: number };

/** What a node reports about its host in each check-in. */
export const hostReadingSchema: z.ZodObject<{
  takenAt: z.ZodNumber;
  cpuCount: z.ZodNumber;
  cpuUsedPct: z.ZodNullable<z.ZodNumber>;
  memoryTotalBytes: z.ZodNumber;
  memoryAvailableBytes: z.ZodNumber;
  swapTotalBytes: z.ZodNumber;
  swapFreeBytes: z.ZodNumber;
  dataDisk: z.ZodNullable<typeof dataDiskSchema>;
  sandboxes: typeof stateCountsSchema;
  teams: z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodNumber>>;
  ledgerSeq: z.ZodOptional<z.ZodNumber>;
  warm: z.ZodOptional<z.ZodNumber>;
}> = z.object({
  /** Milliseconds since the epoch when the reading was taken. */
  takenAt: z.number(),
  cpuCount: z.number().int().positive(),
  /** Percent of all cores busy since the previous sample; `null` on the first reading. */
  cpuUsedPct: z.number().min(0).max(100).nullable(),
  memoryTotalBytes: z.number().nonnegative(),
  memoryAvailableBytes: z.number().nonnegative(),
  swapTotalBytes: z.number().nonnegative(),
  swapFreeBytes: z.number().nonnegative(),
  dataDisk: dataDiskSchema.nullable(),
  sandboxes: stateCountsSchema,
  /**
   * Running sandboxes (active or restoring) per team, so the gateway can hold a team to its key's
   * `maxSandboxes` from the nodes' own counts. Absent from a node that predates teams.
   */
  teams: z.record(z.string().max(64), z.number().int().nonnegative()).optional(),
  /**
   * The node's ledger change number when `teams` was counted: an answer to a create or a destroy
   * names the number after its change (`x-dormice-ledger-seq`), so a reading with a smaller one
   * was taken before that change. Absent from a node that predates it.
   */
  ledgerSeq: z.number().int().nonnegative().optional(),
  /**
   * Warm pool sandboxes ready to be claimed: running containers that belong to no one yet, so
   * they are counted here and not in `sandboxes.active` or `teams`. Absent from a node without
   * pools.
   */
  warm: z.number().int().nonnegative().optional(),
});

/** A host reading: what a node reports about its host in each check-in. */
export interface HostReading {
  /** Milliseconds since the epoch when the reading was taken. */
  takenAt: number;
  /** Cores the node may use (at least 1). */
  cpuCount: number;
  /** Percent of all cores busy since the previous sample; `null` on the first reading. */
  cpuUsedPct: number | null;
  /** Memory of the host, bytes. */
  memoryTotalBytes: number;
  /** Memory still available, bytes. */
  memoryAvailableBytes: number;
  /** Swap of the host, bytes. */
  swapTotalBytes: number;
  /** Swap still free, bytes. */
  swapFreeBytes: number;
  /** The data disk, or `null` when it could not be read. */
  dataDisk: DataDisk | null;
  /** How many sandboxes the node holds in each state. */
  sandboxes: StateCounts;
  /** Running sandboxes per team; absent from a node that predates teams. */
  teams?: Record<string, number>;
  /** The node's ledger change number when `teams` was counted. */
  ledgerSeq?: number;
  /** Warm pool sandboxes ready to be claimed. */
  warm?: number;
}

/**
 * The answer header naming the node's ledger change number after the request's change (a create,
 * a destroy): compared with a reading's `ledgerSeq`, it tells whether the reading counts it.
 */
export const LEDGER_SEQ_HEADER = "x-dormice-ledger-seq";

/** A node id: the same alphabet as a sandbox name, at most 64 characters. */
export const nodeIdSchema: z.ZodString = z.string()
  .min(1, "a node id needs at least 1 character")
  .max(64, "a node id has at most 64 characters")
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._-]*$/,
    "a node id uses only letters, digits, '.', '_' and '-', and starts with a letter or digit",
  );

/**
 * The lifecycle changes a webhook reports. `timed_out` is a kill at the E2B deadline (a pause at
 * the deadline is `paused` with reason `timeout`); `node_lost` names a sandbox of a node that
 * stopped checking in.
 */
export const lifecycleEventTypes = [
  "created",
  "paused",
  "resumed",
  "killed",
  "timed_out",
  "node_lost",
] as const;

/** One of {@linkcode lifecycleEventTypes}. */
export type LifecycleEventType =
  | "created"
  | "paused"
  | "resumed"
  | "killed"
  | "timed_out"
  | "node_lost";

/** Most lifecycle events one check-in carries; a node keeps the rest for the next one. */
export const MAX_CHECK_IN_EVENTS = 100;

/**
 * A lifecycle change a node saw on its own (its deadline scanner's kills and pauses), carried to
 * the gateway by the next check-in so a webhook hears of it with no client watching.
 */
export const nodeLifecycleEventSchema: z.ZodObject<{
  id: z.ZodString;
  type: z.ZodEnum<{ [K in LifecycleEventType]: K }>;
  at: z.ZodNumber;
  sandbox: z.ZodObject<{ id: z.ZodString; name: z.ZodString; team: z.ZodString }>;
  reason: z.ZodString;
  detail: z.ZodString;
}> = z.object({
  /** Unique per event, kept across re-sends, so the gateway and receivers drop a repeat. */
  id: z.string().min(1).max(64),
  type: z.enum(lifecycleEventTypes),
  /** Milliseconds since the epoch when it happened (the node's clock). */
  at: z.number(),
  sandbox: z.object({
    id: z.string().max(128),
    name: z.string().max(128),
    team: z.string().max(64),
  }),
  /** A short code, e.g. `timeout`. */
  reason: z.string().max(64),
  /** A sentence for a person. */
  detail: z.string().max(500),
});

/** A node's lifecycle event (see {@linkcode nodeLifecycleEventSchema}). */
export interface NodeLifecycleEvent {
  /** Unique per event, kept across re-sends, so the gateway and receivers drop a repeat. */
  id: string;
  /** What happened. */
  type: LifecycleEventType;
  /** Milliseconds since the epoch when it happened (the node's clock). */
  at: number;
  /** The sandbox it happened to. */
  sandbox: { id: string; name: string; team: string };
  /** A short code, e.g. `timeout`. */
  reason: string;
  /** A sentence for a person. */
  detail: string;
}

/**
 * The longest check-in interval a gateway accepts, in seconds. A node is down after two silent
 * intervals and `removeNode` waits for that, so the interval bounds how long a node that stopped
 * (or a rogue check-in) keeps its place in the fleet: five minutes makes that ten.
 *
 * @example
 * ```ts
 * import { checkInSchema, maxCheckInIntervalSeconds } from "./schemas.ts";
 * const interval = checkInSchema.shape.intervalSeconds;
 * interval.safeParse(maxCheckInIntervalSeconds + 1).success; // false
 * ```
 */
export const maxCheckInIntervalSeconds: number = 300;

// lookup_digest.ts's MAX_DIGEST_BITS (2^23 bits, 1 MiB), written out: that module imports
// teams.ts, which imports this one, so importing it here would be a cycle.
const MAX_DIGEST_BASE64 = Math.ceil((1 << 20) / 3) * 4;

/**
 * A check-in's lookup digest (`LookupDigest.toWire()`): base64 bits, at most 1 MiB of them.
 *
 * @example
 * ```ts
 * import { lookupDigestSchema } from "./schemas.ts";
 * lookupDigestSchema.safeParse({ bits: "AAAAAAAAAAA=", hashes: 7, count: 0 }).success; // true
 * ```
 */
export const lookupDigestSchema: z.ZodObject<{
  bits: z.ZodString;
  hashes: z.ZodNumber;
  count: z.ZodNumber;
  directPushed: z.ZodOptional<z.ZodBoolean>;
}> = z.object({
  bits: z.string().min(12).max(MAX_DIGEST_BASE64, "a digest is at most 1 MiB")
    .regex(/^[A-Za-z0-9+/]*={0,2}$/, "a digest's bits are base64"),
  hashes: z.number().int().min(1).max(16),
  count: z.number().int().min(0),
  directPushed: z.boolean().optional(),
});

/** The body a node posts to `<gateway>/checkIn` every interval. */
export const checkInSchema: z.ZodObject<{
  nodeId: z.ZodString;
  endpoint: typeof endpointSchema;
  intervalSeconds: z.ZodNumber;
  build: z.ZodString;
  reading: typeof hostReadingSchema;
  events: z.ZodOptional<z.ZodArray<typeof nodeLifecycleEventSchema>>;
  pools: z.ZodOptional<z.ZodArray<z.ZodType<PoolReport>>>;
  templates: z.ZodOptional<z.ZodArray<z.ZodString>>;
  volumes: z.ZodOptional<z.ZodArray<z.ZodString>>;
  egressRules: z.ZodOptional<z.ZodBoolean>;
  configDigest: z.ZodOptional<z.ZodString>;
  lookupDigest: z.ZodOptional<typeof lookupDigestSchema>;
  snapshots: z.ZodOptional<z.ZodArray<z.ZodString>>;
  snapshotsTruncated: z.ZodOptional<z.ZodBoolean>;
  snapshotNames: z.ZodOptional<z.ZodArray<z.ZodString>>;
  snapshotRegistry: z.ZodOptional<z.ZodString>;
  heals: z.ZodOptional<z.ZodBoolean>;
  directCreate: z.ZodOptional<
    z.ZodObject<{ team: z.ZodString; name: z.ZodString; id: z.ZodOptional<z.ZodString> }>
  >;
  snapshotRetaken: z.ZodOptional<z.ZodString>;
}> = z.object({
  nodeId: nodeIdSchema,
  endpoint: endpointSchema,
  intervalSeconds: z.number()
    .min(1, "a check-in interval is at least 1 second")
    .max(
      maxCheckInIntervalSeconds,
      `a check-in interval is at most ${maxCheckInIntervalSeconds} seconds: set ` +
        `DORMICE_CHECK_IN_INTERVAL_SECONDS on the node to 1–${maxCheckInIntervalSeconds}`,
    ),
  build: z.string().max(200),
  reading: hostReadingSchema,
  /** Lifecycle changes since the last accepted check-in; absent from a node that predates them. */
  events: z.array(nodeLifecycleEventSchema).max(MAX_CHECK_IN_EVENTS).optional(),
  /** The node's warm pools; absent from a node that predates pools (it has none). */
  pools: z.array(poolReportSchema).max(64).optional(),
  /**
   * The templates whose images the node holds; absent from a node that predates capabilities,
   * which the placer then treats as able to serve any template (as before).
   */
  templates: z.array(z.string().max(256)).max(256).optional(),
  /** The volumes the node can mount (names only; absent = none declared). */
  volumes: z.array(z.string().max(64)).max(MAX_CHECK_IN_VOLUMES).optional(),
  /**
   * Whether the node enforces egress address rules (`spec.egressRules`); absent = it does not
   * (a node that predates them), and placement sends creates with rules elsewhere.
   */
  egressRules: z.boolean().optional(),
  /**
   * HMAC-SHA256 (keyed by the fleet token, hex) of the settings every node must share; the
   * gateway warns when nodes differ. See `shared/config_digest.ts`.
   */
  configDigest: z.string().max(128).optional(),
  /**
   * The snapshot ids the node holds, newest first, at most `MAX_CHECK_IN_SNAPSHOTS`
   * (`shared/snapshots.ts`); absent from a node that holds none or predates snapshots.
   */
  snapshots: z.array(z.string().regex(/^snap-[a-z0-9]{20}$/)).max(2048).optional(),
  /** The node holds more snapshots than `snapshots` lists. */
  snapshotsTruncated: z.boolean().optional(),
  /**
   * The names of the named snapshots it holds (built templates among them), each as
   * `<team>/<name>`, newest first, at most 256: for the operator's fleet view only.
   */
  snapshotNames: z.array(z.string().max(160)).max(256).optional(),
  /**
   * `host:port` of the registry the node pushes its snapshots to and pulls others' from
   * (`DORMICE_SNAPSHOT_REGISTRY`): it can start a sandbox from any snapshot there.
   */
  snapshotRegistry: z.string().max(300).optional(),
  /**
   * `false` from a node with `DORMICE_SNAPSHOT_HEAL=off`: it takes no heal (the gateway sends it
   * no create that needs one) and serves none; absent: it does both.
   */
  heals: z.boolean().optional(),
  /**
   * A Bloom filter of the names and ids the node held when it built this check-in; absent from
   * a node that predates it (the gateway then asks that node on every miss).
   */
  lookupDigest: lookupDigestSchema.optional(),
  /**
   * The create made behind the gateways' back that this check-in was pushed for (before the
   * build: its name; after it: its id too). In shared mode the gateway records it in etcd before
   * it answers, so every gateway's lookup asks this node for it (docs/lookup-digest.md).
   */
  directCreate: z.object({
    // The team's own rule (`teamSchema` in teams.ts, which imports this file).
    team: z.string().max(64).regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, "a team as teamSchema takes"),
    name: sandboxNameSchema,
    id: sandboxIdSchema.optional(),
  }).optional(),
  /**
   * The snapshot id this check-in was pushed for: the node just took a new build under an id
   * another node may hold an older build of (a name taken again). The gateway applies the
   * check-in, and in shared mode records it in etcd, before it answers, so every gateway's next
   * create from that id asks the holders which build is newest.
   */
  snapshotRetaken: z.string().regex(/^snap-[a-z0-9]{20}$/).optional(),
});

/** A check-in body: what a node posts to `<gateway>/checkIn` every interval. */
export interface CheckIn {
  /** The node's id: letters, digits, `.`, `_`, `-`, at most 64 characters. */
  nodeId: string;
  /** The node's http(s) base URL, as the gateway reaches it. */
  endpoint: string;
  /** Seconds between the node's check-ins, 1 to {@linkcode maxCheckInIntervalSeconds}. */
  intervalSeconds: number;
  /** The node's build. */
  build: string;
  /** The host reading. */
  reading: HostReading;
  /** Lifecycle changes since the last accepted check-in. */
  events?: NodeLifecycleEvent[];
  /** The node's warm pools. */
  pools?: PoolReport[];
  /** The templates whose images the node holds; absent: any template. */
  templates?: string[];
  /** The volumes the node can mount. */
  volumes?: string[];
  /** Whether the node enforces egress address rules. */
  egressRules?: boolean;
  /** HMAC-SHA256 of the settings every node must share (hex). */
  configDigest?: string;
  /** A Bloom filter of the names and ids the node held (`LookupDigest.toWire()`). */
  lookupDigest?: { bits: string; hashes: number; count: number };
  /** The snapshot ids the node holds, newest first. */
  snapshots?: string[];
  /** The node holds more snapshots than `snapshots` lists. */
  snapshotsTruncated?: boolean;
  /** The `<team>/<name>` of the named snapshots (built templates among them) it holds. */
  snapshotNames?: string[];
  /** The registry the node pulls snapshots from. */
  snapshotRegistry?: string;
  /** `false`: the node takes and serves no heal (`DORMICE_SNAPSHOT_HEAL=off`). */
  heals?: boolean;
  /** The create behind the gateways' back this check-in was pushed for. */
  directCreate?: { team: string; name: string; id?: string };
  /** The snapshot id taken again here that this check-in was pushed for. */
  snapshotRetaken?: string;
}

// The interfaces above are written out for the documentation; these fail to compile when one
// drifts from its schema.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const _checkInMatches: Same<CheckIn, z.infer<typeof checkInSchema>> = true;
const _readingMatches: Same<HostReading, z.infer<typeof hostReadingSchema>> = true;
const _eventMatches: Same<NodeLifecycleEvent, z.infer<typeof nodeLifecycleEventSchema>> = true;
const _diskMatches: Same<DataDisk, z.infer<typeof dataDiskSchema>> = true;
const _countsMatch: Same<StateCounts, z.infer<typeof stateCountsSchema>> = true;
const _statesMatch: Same<SandboxState, typeof sandboxStates[number]> = true;
const _typesMatch: Same<LifecycleEventType, typeof lifecycleEventTypes[number]> = true;
void [_statesMatch, _typesMatch];
void [_checkInMatches, _readingMatches, _eventMatches, _diskMatches, _countsMatch];

/** `lookupSandbox` asks by name or by id, exactly one of them. */
export const lookupRequestSchema: z.ZodUnion<
  [
    z.ZodObject<{ name: z.ZodString }, z.core.$strict>,
    z.ZodObject<{ id: z.ZodString }, z.core.$strict>,
  ]
> = z.union([
  z.object({ name: sandboxNameSchema }).strict(),
  z.object({ id: sandboxIdSchema }).strict(),
]);

/** A lookup request: by name or by id. */
export type LookupRequest = { name: string } | { id: string };

/**
 * The node's answer to `lookupSandbox`. `state` is any string, not {@linkcode sandboxStateSchema}:
 * a newer node may report a state this build does not know, and "found, in a state I cannot
 * name" is still found; refusing the answer would make the gateway read that node as silent
 * (a 503 for every sandbox it holds) until the gateway is upgraded too.
 */
export const lookupAnswerSchema: z.ZodDiscriminatedUnion<[
  z.ZodObject<{
    found: z.ZodLiteral<true>;
    sandbox: z.ZodObject<{
      id: z.ZodString;
      name: z.ZodString;
      state: z.ZodString;
      team: z.ZodDefault<z.ZodString>;
    }>;
  }>,
  z.ZodObject<{ found: z.ZodLiteral<false> }>,
]> = z.discriminatedUnion("found", [
  z.object({
    found: z.literal(true),
    sandbox: z.object({
      id: z.string(),
      name: z.string(),
      state: z.string().max(64),
      // A node that predates teams holds every sandbox in the default team.
      team: z.string().default("default"),
    }),
  }),
  z.object({ found: z.literal(false) }),
]);

/** A lookup answer: the sandbox the node holds under the key, or not found. */
export type LookupAnswer =
  | { found: true; sandbox: { id: string; name: string; state: string; team: string } }
  | { found: false };

const _lookupRequestMatches: Same<LookupRequest, z.infer<typeof lookupRequestSchema>> = true;
const _lookupAnswerMatches: Same<LookupAnswer, z.infer<typeof lookupAnswerSchema>> = true;
void [_lookupRequestMatches, _lookupAnswerMatches];

/** The sandbox object every native verb answers with. */
export interface Sandbox {
  /** The ledger id (lowercase letters and digits, or `sbx_…`), minted by the node on create. */
  id: string;
  /** The caller's name for the sandbox, unique within its team. */
  name: string;
  /** The team of the key that created it (`default` for the fleet token). */
  team: string;
  /** Where the sandbox is in its lifecycle. */
  state: SandboxState;
  /** The id of the node that holds the sandbox. */
  nodeId: string;
  /** The origin of the node that holds the sandbox. */
  endpoint: string;
  /** The template the sandbox was built from. */
  template: string;
  /** The caller's key/value labels. */
  metadata: Record<string, string>;
  /** The resource limits the sandbox was built with. */
  spec: SandboxSpec;
  /** Creation time, ISO 8601. */
  createdAt: string;
  /** Last use (the idle clock), ISO 8601. */
  lastActiveAt: string;
}

/**
 * Turns a zod error into one sentence naming the field(s) at fault.
 *
 * @example
 * ```ts
 * import { describeZodError, sandboxNameSchema } from "./schemas.ts";
 * const r = sandboxNameSchema.safeParse("");
 * if (!r.success) console.log(describeZodError(r.error));
 * ```
 */
export function describeZodError(error: z.ZodError, root = "body"): string {
  return error.issues.slice(0, 5).map((issue) => {
    const where = issue.path.length ? `'${issue.path.join(".")}'` : root;
    let message = issue.message;
    // Zod leaves `input` out of its issues unless asked, so a missing field is told from a
    // wrong-typed one by what it says it received.
    const missing = "input" in issue
      ? issue.input === undefined
      : /received undefined$/.test(issue.message);
    if (issue.code === "invalid_type" && missing) {
      message = "is required";
      return `${where} ${message}`;
    }
    return `${where}: ${message}`;
  }).join("; ");
}
