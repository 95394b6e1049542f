/**
 * The node: a standalone sandbox daemon, importable so it runs in-process in tests and
 * embedders. Its folders show its layers: the faces call the sandbox service, the service the
 * ledger and the executor.
 *
 * | where | what |
 * |---|---|
 * | `app.ts` | {@linkcode createNodeApp}: builds the parts below and mounts the faces |
 * | `faces/native.ts` | the native verbs, `POST /<verb>`, errors `{message}` |
 * | `faces/e2b_api.ts` | the E2B control plane under `/e2b/api`, errors `{code:<int>, message}` (create options and the metrics wire in `e2b_create_options.ts`, `e2b_metrics.ts`) |
 * | `faces/envd/` | envd under `/e2b/envd` (one file per Connect RPC), the signed `/files` door |
 * | `faces/connect_codec.ts` | the Connect JSON codec (envd tokens and signed URLs are `shared/access_tokens.ts`, which the gateway checks too) |
 * | `service.ts` | {@linkcode SandboxService}: every verb of one sandbox inside its name's slot |
 * | `ledger.ts` | {@linkcode Ledger}: one SQLite row per sandbox, one daemon per file |
 * | `ledger_space.ts`, `ledger_upkeep.ts` | the ledger on a full disk (its 507, its reserve); the idle clock's batched flush |
 * | `executors/` | the {@linkcode Executor} contract with {@linkcode executorErrorStatus}, the fake, Docker (`@dormice/cluster/docker`) |
 * | `check_in.ts`, `deadline_scanner.ts`, `host_reading.ts` | the loops: check-in, E2B deadlines, host numbers |
 * | `metrics.ts`, `executors/instrumented.ts` | {@linkcode NodeMetrics} behind `GET /metrics`; every executor call timed |
 * | `lifecycle_outbox.ts` | {@linkcode LifecycleOutbox}: the scanner's kills and pauses, carried by the next check-in |
 * | `metrics_history.ts`, `metrics_sampler.ts` | each sandbox's recent samples for E2B's metrics, taken every 5 s |
 *
 * @example A node in memory, served by any `fetch` handler host
 * ```ts
 * import { createNodeApp, FakeExecutor, Ledger } from "@dormice/cluster/node";
 * const config = {
 *   apiToken: "x".repeat(32),
 *   dataDir: ".",
 *   nodeId: "node-1",
 *   nodeEndpoint: "http://127.0.0.1:3676",
 *   gatewayEndpoint: null,
 *   checkInIntervalSeconds: 15,
 *   scanIntervalSeconds: 60,
 * };
 * const node = createNodeApp({
 *   config,
 *   executor: new FakeExecutor(),
 *   ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: config.nodeEndpoint }),
 * });
 * const res = await node.fetch(new Request("http://node/healthz"));
 * console.log(await res.json()); // { ok: true, nodeId: "node-1", build: "..." }
 * await node.close();
 * ```
 *
 * @module
 */
export {
  createNodeApp,
  type NodeApp,
  type NodeAppConfig,
  type NodeAppOptions,
  nodeBuild,
} from "./app.ts";
export {
  type CheckInHeader,
  type ExecutorKind,
  isLoopbackOrigin,
  loadNodeConfig,
  type LoadNodeConfigOptions,
  type NodeConfig,
  type NodeConfigResult,
  nodeEnvVariables,
  parseCheckInHeader,
  parseGatewayEndpoint,
} from "./config.ts";
export {
  Ledger,
  type LedgerChange,
  type LedgerOptions,
  newSandboxId,
  type NewSandboxRow,
  type SandboxRowPatch,
  type WarmRow,
} from "./ledger.ts";
export { isDiskFull, LedgerFullError, LedgerReserve } from "./ledger_space.ts";
export { LedgerUpkeep, type LedgerUpkeepOptions } from "./ledger_upkeep.ts";
export {
  type FakeCall,
  FakeExecutor,
  FakeExecutorHooks,
  type FakeExecutorOptions,
} from "./executors/fake.ts";
export { SandboxService, type SandboxServiceOptions } from "./service.ts";
export { SlotFence, type SlotFenceOptions } from "./slot_fence.ts";
export {
  type CpuTimes,
  HostReader,
  type HostReaderOptions,
  type HostSampler,
  type MemoryReading,
  sumCpuTimes,
  systemSampler,
} from "./host_reading.ts";
export {
  CheckInLoop,
  type CheckInOptions,
  type CheckInOutcome,
  describeFetchFailure,
  lookupDigestOf,
} from "./check_in.ts";
export { MetricsHistory, type MetricsHistoryOptions } from "./metrics_history.ts";
export { MetricsSampler, type MetricsSamplerOptions } from "./metrics_sampler.ts";
export {
  DeadlineScanner,
  type DeadlineScannerOptions,
  type ScanResult,
} from "./deadline_scanner.ts";
export {
  createNativeFace,
  nativeErrorResponse,
  type NativeFaceOptions,
  nativeNotFound,
  nativeVerbs,
  publicSandbox,
} from "./faces/native.ts";
export {
  type CreateRequest,
  type DirWatch,
  egressRulesUnserved,
  type ExecExit,
  type ExecHandle,
  type ExecRequest,
  type Executor,
  type ExecutorCapabilities,
  ExecutorError,
  type ExecutorErrorCode,
  executorErrorStatus,
  executorErrorToHttp,
  type FileEntry,
  type FileOptions,
  type FileStream,
  fileStreamLengthError,
  type FsChange,
  type ImageExport,
  newSnapshotId,
  noEgress,
  type PortAddress,
  readFileStream,
  type SandboxLimits,
  type SandboxStats,
  SNAPSHOT_ID_PATTERN,
  type SnapshotInfo,
  snapshotNameTaken,
  snapshotNotFound,
  type SnapshotRequest,
  type TerminalSize,
  unknownVolume,
  type WatchRequest,
  type WriteOptions,
} from "./executors/contract.ts";
export { type ClaimAsk, WarmPools, type WarmPoolsOptions } from "./pools.ts";
export { formatPools, parsePools, parseVolumes, type VolumeDecl } from "./config_capabilities.ts";
export type {
  AcquireRequest,
  AcquireResult,
  DeadlineAction,
  ExecResult,
  ListFilter,
  SandboxOps,
  SandboxRecord,
  SandboxRef,
} from "./service_contract.ts";
export { createE2bApi, type E2bApiOptions } from "./faces/e2b_api.ts";
export {
  createEnvd,
  type EnvdOptions,
  handleSignedFiles,
  UploadSlots,
  type UploadSlotsOptions,
  UploadStaging,
  type UploadStagingOptions,
} from "./faces/envd/mod.ts";
export { AccessTokens } from "../shared/access_tokens.ts";
export { type ExecutorOutcome, NodeMetrics, type NodeMetricsOptions } from "./metrics.ts";
export { instrumentExecutor } from "./executors/instrumented.ts";
export { LifecycleOutbox, type LifecycleOutboxOptions, scannerEvent } from "./lifecycle_outbox.ts";
export type { Clock, TimerHandle, Timers } from "../shared/clock.ts";
export type { Log, LogLevel } from "../shared/log.ts";
export { HttpError } from "../shared/http_error.ts";
export type {
  CheckIn,
  DataDisk,
  HostReading,
  LifecycleEventType,
  LookupAnswer,
  LookupRequest,
  NodeLifecycleEvent,
  Sandbox,
  SandboxSpec,
  SandboxState,
  StateCounts,
} from "../shared/schemas.ts";
export type { PoolReport, PoolSpec, PoolStatus, PoolTarget, VolumeMount } from "../shared/pools.ts";
export type { LookupDigestWire } from "../shared/lookup_digest.ts";
export type { EgressRules } from "../shared/egress_rules.ts";
export { NameQueue } from "../shared/name_queue.ts";
export type { E2bSettings } from "./service_contract.ts";
export type { FakePortHandler } from "./executors/_fake_ports.ts";
export type { NodeSnapshots } from "./snapshots.ts";
export type { SandboxDefaults } from "./config.ts";
export type { StagedUpload } from "./faces/envd/staging.ts";
