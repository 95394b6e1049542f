/**
 * The gateway library: the pieces that turn N nodes into one fleet behind one door, as plain
 * classes an embedder can host in its own service, and the whole gateway in one call.
 *
 * - {@linkcode Fleet}: the nodes that checked in, their readings, who is up;
 * - {@linkcode Finder}: which node holds a sandbox (a bounded cache, then one lookup round);
 * - {@linkcode Placer}: which node takes a new sandbox (filters with named reasons, then
 *   {@linkcode loadScore}; {@linkcode pickTwoChoices} and {@linkcode seededRandom} for a placer
 *   of one's own);
 * - {@linkcode NameQueue}: per-name slots, so twenty acquires of one name build one sandbox;
 * - {@linkcode createGateway}: the whole gateway (every face, the sweep for down nodes) as a
 *   `fetch(Request)` handler to serve or mount under a path of a host app;
 * - {@linkcode verifyWebhook}: checks the signature of a lifecycle webhook the gateway sent.
 *
 * The daemon is `gateway/main.ts`, runnable from the package:
 * `deno run --unstable-no-legacy-abort --allow-net --allow-env=<gatewayEnvVariables>
 * --allow-read=.dormice --allow-write=.dormice jsr:@dormice/cluster/gateway/main` (the README's
 * settings tables say what each variable in {@linkcode gatewayEnvVariables} does).
 *
 * The faces, the routing rules, the HTTP/1.1 client, the etcd client and the key table are built
 * by `createGateway` and are not part of the package's surface: their types would tie callers to
 * Hono, prom-client and the wire's internals.
 *
 * @example Answer "where should this go?" from check-ins
 * ```ts
 * import { Fleet, Placer } from "@dormice/cluster/gateway";
 * const fleet = new Fleet();
 * const placer = new Placer({ fleet });
 * // fleet.checkIn(body) for each check-in the service receives, then:
 * const r = placer.place("agent-1");
 * console.log(r.ok ? r.node.endpoint : r.message);
 * fleet.close();
 * ```
 *
 * @module
 */
export {
  type CheckInApply,
  type CheckInOutcome,
  Fleet,
  type FleetNode,
  type FleetOptions,
  type NodeDirectory,
  type NodeSummary,
} from "./fleet/fleet.ts";
export {
  type FindBy,
  type FindConflict,
  Finder,
  type FinderMetrics,
  type FinderOptions,
  type FinderTimers,
  type FindNone,
  type FindOne,
  type FindOptions,
  type FindResult,
  type FindUnsure,
  type FoundSandbox,
  type LookupDigestMode,
  type RecentLookup,
} from "./finder/finder.ts";
export {
  type FilterInput,
  loadScore,
  type PickResult,
  pickTwoChoices,
  type PlacementAsk,
  placementAsk,
  type PlacementExplain,
  type PlacementFilter,
  placementFilters,
  Placer,
  type PlacerLimits,
  type PlacerOptions,
  type Rejection,
  type RejectReason,
  type ScoredNode,
  seededRandom,
  type WarmCandidate,
  type WarmExplain,
  type WarmSample,
} from "./placer/placer.ts";
export { NameQueue } from "../shared/name_queue.ts";
export {
  createGateway,
  type Gateway,
  type GatewayFaces,
  type GatewayOptions,
  type SharedModeOptions,
} from "./app.ts";
export { gatewayEnvVariables } from "./config.ts";
export type { ListenAddress } from "./door.ts";
export {
  type LifecycleEvent,
  SIGNATURE_HEADER,
  signWebhook,
  verifyWebhook,
  type WebhookOptions,
} from "./observe/webhooks.ts";
export type { Clock, TimerHandle, Timers } from "../shared/clock.ts";
export type { Log, LogLevel } from "../shared/log.ts";
export { HttpError } from "../shared/http_error.ts";
export type { FetchHandler } from "../shared/fetch_handler.ts";
export type {
  CheckIn,
  DataDisk,
  HostReading,
  LifecycleEventType,
  NodeLifecycleEvent,
  SandboxState,
  StateCounts,
} from "../shared/schemas.ts";
export type { PoolReport, PoolSpec, VolumeMount } from "../shared/pools.ts";
export type { SandboxSpec } from "../shared/sandbox_spec.ts";
export type { EgressRules } from "../shared/egress_rules.ts";
export { type DigestProbe, LookupDigest, type LookupDigestWire } from "../shared/lookup_digest.ts";
