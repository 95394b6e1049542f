/**
 * The gateway library: the pieces that turn N nodes into one fleet behind one door, as plain
 * classes an embedder can host in its own service.
 *
 * - {@linkcode Fleet} (`fleet/fleet.ts`): the nodes that checked in, their readings, who is up;
 * - {@linkcode Finder} (`finder/finder.ts`): which node holds a sandbox (a bounded cache, then one
 *   lookup round; asking one node is `finder/lookup_client.ts`, its per-node limit
 *   {@linkcode KeyedLimiter});
 * - {@linkcode Placer} (`placer/placer.ts`): which node takes a new sandbox (filters with named
 *   reasons, then {@linkcode loadScore});
 * - {@linkcode LruCache}: the bounded cache behind the Finder;
 * - {@linkcode NameQueue}: per-name slots, so twenty acquires of one name build one sandbox; behind
 *   the {@linkcode Slots} interface as {@linkcode LocalSlots}, or {@linkcode EtcdSlots} when
 *   several gateways share one fleet (`routing/slots.ts`, over the etcd client `etcd/client.ts`;
 *   the Fleet is kept in step through etcd by {@linkcode FleetSync});
 * - {@linkcode GatewayRouting} (`routing/routing.ts`): the routing rules every face shares (locate,
 *   stream, create, destroy, fan out), over {@linkcode forward} and {@linkcode capture}
 *   (`routing/forward.ts`); a create's placement and bookkeeping is `routing/create.ts`, the errors
 *   the rules answer with `routing/answers.ts`;
 * - the door (`door.ts`): the hop marker that refuses loops ({@linkcode doorAnswer}) and paths
 *   with dot segments, checked before any face;
 * - {@linkcode createGateway} (`app.ts`): builds those, mounts every face (the native face,
 *   `faces/native.ts`, at the root; the E2B faces, {@linkcode mountE2b} in `faces/e2b/e2b.ts`;
 *   the operator's view; the ports with a sandbox domain) unless its `faces` option leaves one
 *   out, and sweeps for down nodes until `close()`; who may call what is `keys/auth.ts`.
 *   `config.ts` reads the environment and `main.ts` is the daemon;
 * - the operator's view (`faces/operator.ts`): {@linkcode GatewayMetrics} behind `GET /metrics`,
 *   the fleet page under `/ui` (`faces/ui/`, with the recent {@linkcode PlacementLog}), and the
 *   lifecycle webhooks ({@linkcode LifecycleEvents} into a {@linkcode WebhookSender}, signed as
 *   {@linkcode verifyWebhook} checks).
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
export { LruCache, type LruCacheOptions } from "../shared/lru.ts";
export { NameQueue } from "../shared/name_queue.ts";
export * from "./config.ts";
export * from "./routing/forward.ts";
export {
  type BytesAnswer,
  createH1Client,
  type H1Client,
  type H1ClientOptions,
} from "../shared/http1/mod.ts";
export {
  type BytesLaneOptions,
  createBytesLane,
  type GatewayBytesLane,
  type LaneVerb,
} from "./faces/bytes_lane.ts";
export {
  buildGateway,
  type BuiltGateway,
  createGateway,
  type Gateway,
  type GatewayBuildOptions,
  type GatewayFaces,
  type GatewayOptions,
  type GatewayParts,
} from "./app.ts";
export {
  type DestroyOptions,
  type FanOutAnswer,
  GatewayRouting,
  type GatewayRoutingOptions,
  type StreamOptions,
} from "./routing/routing.ts";
export { type CapturedAnswer, type CreateOptions } from "./routing/create.ts";
export { clientGone } from "./routing/answers.ts";
export {
  createE2bFaces,
  type E2bFaces,
  type E2bFacesOptions,
  mountE2b,
  SANDBOX_NAME_HEADER,
  UNREACHABLE_COUNT_HEADER,
  UNREACHABLE_HEADER,
} from "./faces/e2b/e2b.ts";
export { KeyedLimiter } from "./finder/node_limit.ts";
export {
  API_KEY_PATTERN,
  type ApiKeyInfo,
  ApiKeys,
  type ApiKeysOptions,
  type CreateApiKeyInput,
  hashApiKey,
  type MintedApiKey,
} from "./keys/keys.ts";
export { type Admission, TeamLimits, type TeamLimitsOptions } from "./keys/team_limits.ts";
export {
  type Caller,
  type CallerCheck,
  callerCheck,
  fleetOnlyVerbs,
  OPERATOR,
  scopeOf,
  teamOf,
} from "./keys/auth.ts";
export {
  faceOfPath,
  type ForwardFace,
  GatewayMetrics,
  type GatewayMetricsOptions,
} from "./observe/metrics.ts";
export {
  PlacementLog,
  type PlacementLogOptions,
  type PlacementRecord,
} from "./placer/placement_log.ts";
export { LifecycleEvents, type LifecycleEventsOptions } from "./observe/lifecycle.ts";
export {
  type LifecycleEvent,
  SIGNATURE_HEADER,
  signWebhook,
  verifyWebhook,
  type WebhookOptions,
  WebhookSender,
  type WebhookSenderOptions,
} from "./observe/webhooks.ts";
export { mountOperatorView } from "./faces/operator.ts";
export { type FleetPageOptions, mountFleetPage } from "./faces/ui/app.ts";
export { UiSessions, type UiSessionsOptions } from "./faces/ui/session.ts";
export { type RoutingObserver } from "./routing/routing.ts";
export {
  doorAnswer,
  HOP_HEADER,
  isOwnAddress,
  type ListenAddress,
  markerNames,
  newGatewayInstanceId,
  nextHop,
  pathRefusal,
} from "./door.ts";
export {
  EtcdClient,
  type EtcdClientOptions,
  type EtcdCompare,
  type EtcdKv,
  type EtcdOp,
  EtcdRequestError,
  type EtcdTxnResult,
  EtcdUnavailableError,
} from "./etcd/client.ts";
export { EtcdSession, type EtcdSessionOptions } from "./etcd/session.ts";
export { etcdHttpError } from "./etcd/answers.ts";
export {
  EtcdSlots,
  type EtcdSlotsOptions,
  LocalSlots,
  type SlotHold,
  type Slots,
} from "./routing/slots.ts";
export {
  EtcdTeamLedger,
  type EtcdTeamLedgerOptions,
  type LedgerEntry,
  type LedgerVerdict,
  type RateBucket,
  type TeamLedger,
  type TeamRecord,
} from "./keys/team_ledger.ts";
export { FleetSync, type FleetSyncOptions } from "./fleet/sync.ts";
export { type SharedMode, type SharedModeOptions } from "./app.ts";
export { KeySync, type KeySyncOptions } from "./keys/sync.ts";
export type { Clock, TimerHandle, Timers } from "../shared/clock.ts";
export type { Log, LogLevel } from "../shared/log.ts";
export { HttpError } from "../shared/http_error.ts";
export type {
  CheckIn,
  DataDisk,
  HostReading,
  LifecycleEventType,
  NodeLifecycleEvent,
  SandboxSpec,
  SandboxState,
  StateCounts,
} from "../shared/schemas.ts";
export type { PoolReport, PoolSpec, VolumeMount } from "../shared/pools.ts";
export type { EgressRules } from "../shared/egress_rules.ts";
export { type DigestProbe, LookupDigest, type LookupDigestWire } from "../shared/lookup_digest.ts";
export type { CheckInApply } from "./fleet/fleet.ts";
export type { RecordCount } from "./keys/team_limits.ts";
export type { Json } from "./etcd/client.ts";
export {
  type BytesLane,
  type Cancel,
  type LaneExchange,
  type RawHead,
  RequestHead,
} from "../shared/http1/mod.ts";
export type { BodyCapOptions } from "../shared/json_body.ts";
export type { BearerBytesCheck } from "./keys/auth.ts";
export type { ApiKeyRecord } from "./keys/keys.ts";
export { AccessTokens } from "../shared/access_tokens.ts";
