/**
 * `@dormice/cluster`: one door (the gateway) in front of many independent sandbox daemons (the
 * nodes), so that clients create and drive sandboxes with the official `e2b` SDK or the Dormice
 * native verbs and never learn which machine runs them.
 *
 * Embedders import the routing pieces and host them in their own service:
 * - {@linkcode Fleet}: the nodes that checked in, their readings, who is up or down;
 * - {@linkcode Finder}: which node holds a sandbox (a bounded cache, then one lookup round);
 * - {@linkcode Placer}: which node takes a new sandbox (filters with named reasons, then a score);
 * - {@linkcode NameQueue}: per-name slots, so twenty acquires of one name build one sandbox;
 * - {@linkcode createGateway}: the whole gateway as a `fetch(Request)` handler.
 *
 * The node side (`createNodeApp`, `SandboxService`, the executors) lives at
 * `@dormice/cluster/node`; the wire's types at `@dormice/cluster/shared`; the daemons run from
 * `@dormice/cluster/gateway/main` and `@dormice/cluster/node/main`.
 *
 * @example Where should a new sandbox go?
 * ```ts
 * import { Fleet, Placer } from "@dormice/cluster";
 * const fleet = new Fleet();
 * const placer = new Placer({ fleet });
 * const choice = placer.pick();
 * console.log(choice.ok ? choice.node.id : choice.message);
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
} from "./gateway/fleet/fleet.ts";
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
} from "./gateway/finder/finder.ts";
export {
  type PickResult,
  type PlacementAsk,
  type PlacementExplain,
  Placer,
  type PlacerLimits,
  type PlacerOptions,
  type Rejection,
  type RejectReason,
  type ScoredNode,
  type WarmExplain,
  type WarmSample,
} from "./gateway/placer/placer.ts";
export {
  createGateway,
  type Gateway,
  type GatewayFaces,
  type GatewayOptions,
  type SharedModeOptions,
} from "./gateway/app.ts";
export type { ListenAddress } from "./gateway/door.ts";
export type { WebhookOptions } from "./gateway/observe/webhooks.ts";
export { NameQueue } from "./shared/name_queue.ts";
export type {
  CheckIn,
  DataDisk,
  HostReading,
  LifecycleEventType,
  NodeLifecycleEvent,
  SandboxState,
  StateCounts,
} from "./shared/schemas.ts";
export type { PoolReport, PoolSpec } from "./shared/pools.ts";
export { type DigestProbe, LookupDigest, type LookupDigestWire } from "./shared/lookup_digest.ts";
export type { Clock, TimerHandle, Timers } from "./shared/clock.ts";
export type { Log, LogLevel } from "./shared/log.ts";
export { HttpError } from "./shared/http_error.ts";
export type { FetchHandler } from "./shared/fetch_handler.ts";
