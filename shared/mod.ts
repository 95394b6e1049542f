/**
 * What the gateway and the nodes both speak, for code on either side of the wire: the types of
 * the wire bodies (a node's check-in and its readings, a sandbox, the lookup round, lifecycle
 * events, pools, volumes and egress rules), the per-name queue, the fleet token's bearer check,
 * the log, the injectable clock with timers, the error carrying an HTTP status, the `fetch`
 * handler shape every `fetch` option takes, the single-writer database lock and the guarded
 * HTTP/1.1 listener both daemons serve with.
 *
 * The Zod schemas the daemons validate with are not exported: {@linkcode HttpError}s name what is
 * wrong instead (`Fleet.checkIn` checks a body built in code the way the check-in route does), and
 * the package's signatures never ask for a Zod, Hono or prom-client type.
 *
 * @example Check a node's bearer token in a host service
 * ```ts
 * import { bearerToken, tokensEqual } from "@dormice/cluster/shared";
 * const token = "t".repeat(32);
 * const given = bearerToken(`Bearer ${token}`);
 * console.log(given !== undefined && tokensEqual(given, token)); // true
 * ```
 *
 * @module
 */
export type {
  CheckIn,
  DataDisk,
  HostReading,
  LifecycleEventType,
  LookupAnswer,
  LookupRequest,
  NodeLifecycleEvent,
  Sandbox,
  SandboxState,
  StateCounts,
} from "./schemas.ts";
export type { SandboxSpec } from "./sandbox_spec.ts";
export type { EgressRules, EgressTransform } from "./egress_rules.ts";
export type { PoolReport, PoolSpec, PoolStatus, PoolTarget, VolumeMount } from "./pools.ts";
export {
  type DigestProbe,
  idDigestKey,
  LookupDigest,
  type LookupDigestWire,
  nameDigestKey,
} from "./lookup_digest.ts";
export { NameQueue } from "./name_queue.ts";
export { bearerToken, tokensEqual } from "./token.ts";
export { DatabaseLockedError, openExclusiveDatabase } from "./lock.ts";
export { createLog, type Log, type LogLevel, silentLog } from "./log.ts";
export { HttpError } from "./http_error.ts";
export type { FetchHandler } from "./fetch_handler.ts";
export {
  type Clock,
  FakeClock,
  systemClock,
  systemTimers,
  type TimerHandle,
  type Timers,
} from "./clock.ts";
export { type GuardedServeOptions, type GuardedServer, serveGuarded } from "./http1/mod.ts";
