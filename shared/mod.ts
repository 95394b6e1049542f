/**
 * Pieces shared by the gateway and the nodes: the wire schemas both ends validate with, the
 * per-name queue, constant-time token comparison, envd access tokens and signed URLs, the
 * single-writer lock, logging, bounded shutdown and an injectable clock with timers.
 *
 * @example Validate a check-in body
 * ```ts
 * import { checkInSchema, describeZodError } from "@dormice/cluster/shared";
 * const r = checkInSchema.safeParse({ nodeId: "a" });
 * if (!r.success) console.log(describeZodError(r.error));
 * ```
 *
 * @module
 */
export * from "./schemas.ts";
export * from "./egress_rules.ts";
export * from "./lookup_digest.ts";
export { NameQueue } from "./name_queue.ts";
export { bearerToken, tokenMatcher, tokensEqual } from "./token.ts";
export { DatabaseLockedError, openExclusiveDatabase } from "./lock.ts";
export {
  ChangeLog,
  createLog,
  type Log,
  type LogLevel,
  parseLogLevel,
  redact,
  silentLog,
} from "./log.ts";
export { HttpError, messageResponse } from "./http_error.ts";
export { describeFetchFailure } from "./fetch_failure.ts";
export { asFetch, type FetchHandler } from "./fetch_handler.ts";
export { StreamCut } from "./stream_cut.ts";
export { LoopBudget, type LoopBudgetOptions, yieldToLoop } from "./event_loop.ts";
export { boundedShutdown, type Closable, onTerminationSignals } from "./shutdown.ts";
export {
  type Clock,
  FakeClock,
  systemClock,
  systemTimers,
  type TimerHandle,
  type Timers,
} from "./clock.ts";
export * from "./native_schemas.ts";
export * from "./list_cursor.ts";
export { type UnbuiltE2bRoute, unbuiltE2bRoute, unbuiltE2bRoutes } from "./e2b_unbuilt.ts";
export { MAX_METRICS_IDS, parseSandboxIds } from "./e2b_metrics_ids.ts";
export * from "./connect_codes.ts";
export * from "./json_body.ts";
export { randomSandboxName } from "./random_name.ts";
export { e2bApiKey, e2bKeyAuth } from "./e2b_auth.ts";
export {
  AccessTokens,
  type EnvdCredentials,
  envdCredentialsRefusal,
  envdRefusal,
  envdRequestAuthorized,
  fileSignature,
  type FileSignatureInput,
  isExpired,
  parseSignedFileUrl,
  SignatureLocator,
  signatureMatches,
  SIGNED_URL_EXPIRED,
  type SignedFileRequest,
} from "./access_tokens.ts";
export {
  type GuardedServeOptions,
  type GuardedServer,
  parseWebSocketSwitch,
  serveGuarded,
} from "./http1/mod.ts";
export {
  type BytesLane,
  type H1ServeOptions,
  HeadError,
  type LaneExchange,
  type Progress,
  RequestHead,
  sentUrl,
  serveH1,
} from "./http1/mod.ts";
export {
  DEFAULT_TEAM,
  splitTeamScopedName,
  TEAM_HEADER,
  teamOfRequest,
  teamSchema,
  teamScopedName,
} from "./teams.ts";
export {
  compareDigests,
  configDigest,
  type DigestComparison,
  type FleetInvariants,
  secretIdentity,
} from "./config_digest.ts";
export {
  MAX_POOL_WARM,
  MAX_POOLS,
  poolKey,
  type PoolReport,
  poolReportSchema,
  type PoolSpec,
  poolSpecSchema,
  type PoolStatus,
  type PoolTarget,
  poolTargetSchema,
  poolTargetsSchema,
  setPoolsSchema,
  type VolumeMount,
  volumeMountSchema,
} from "./pools.ts";
export { cameDirect, HOP_MARKER_HEADER, SLOT_TOKEN_HEADER, slotTokenOf } from "./slot_token.ts";
export { BASE64_SLICE_CHARS, decodeBase64InSlices, isStandardBase64 } from "./base64.ts";
export { JSON_ITEMS_PER_SLICE, jsonArrayResponse } from "./json_stream.ts";
