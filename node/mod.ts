/**
 * The node: a standalone sandbox daemon, importable so it runs in-process in tests and
 * embedders. Its folders show its layers: the faces call the sandbox service, the service the
 * ledger and the executor.
 *
 * | where | what |
 * |---|---|
 * | `app.ts` | {@linkcode createNodeApp}: builds the parts below and mounts the faces |
 * | `main.ts` | the daemon: `deno run jsr:@dormice/cluster/node/main` with the variables in {@linkcode nodeEnvVariables} |
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
export { createNodeApp, type NodeApp, type NodeAppConfig, type NodeAppOptions } from "./app.ts";
export type { CheckInOutcome } from "./check_in.ts";
export {
  type CheckInHeader,
  type ExecutorKind,
  loadNodeConfig,
  type LoadNodeConfigOptions,
  type NodeConfig,
  type NodeConfigResult,
  nodeEnvVariables,
  type SandboxDefaults,
} from "./config.ts";
export {
  Ledger,
  type LedgerChange,
  type LedgerOptions,
  type NewSandboxRow,
  type SandboxRowPatch,
  type WarmRow,
} from "./ledger.ts";
export {
  type FakeCall,
  FakeExecutor,
  FakeExecutorHooks,
  type FakeExecutorOptions,
} from "./executors/fake.ts";
export type { FakePortHandler } from "./executors/_fake_ports.ts";
export { SandboxService, type SandboxServiceOptions } from "./service.ts";
export type { DirectCreate } from "./service_options.ts";
export {
  type CreateRequest,
  type DirWatch,
  type ExecExit,
  type ExecHandle,
  type ExecRequest,
  type Executor,
  type ExecutorCapabilities,
  ExecutorError,
  type ExecutorErrorCode,
  executorErrorStatus,
  type FileEntry,
  type FileOptions,
  type FileStream,
  type FsChange,
  type ImageExport,
  type PortAddress,
  type SandboxLimits,
  type SandboxStats,
  type SnapshotInfo,
  type SnapshotRequest,
  type TerminalSize,
  type WatchRequest,
  type WriteOptions,
} from "./executors/contract.ts";
export type { ClaimAsk, WarmPools } from "./pools.ts";
export type { LedgerReserve } from "./ledger_space.ts";
export type { CpuTimes, HostSampler, MemoryReading } from "./host_reading.ts";
export type { VolumeDecl } from "./config_capabilities.ts";
export {
  NodeVolumes,
  type NodeVolumesOptions,
  type VolumeCaps,
  type VolumeWrite,
} from "./volumes.ts";
export {
  type CommandResult,
  type CommandRunner,
  VolumeImages,
  type VolumeImagesOptions,
} from "./volume_images.ts";
export type { MetricsHistory } from "./metrics_history.ts";
export type { SlotFence } from "./slot_fence.ts";
export { NameQueue } from "../shared/name_queue.ts";
export type {
  AcquireRequest,
  AcquireResult,
  DeadlineAction,
  E2bSettings,
  ExecResult,
  ListFilter,
  SandboxOps,
  SandboxRecord,
  SandboxRef,
} from "./service_contract.ts";
export type { Clock, TimerHandle, Timers } from "../shared/clock.ts";
export type { Log, LogLevel } from "../shared/log.ts";
export { HttpError } from "../shared/http_error.ts";
export type { FetchHandler } from "../shared/fetch_handler.ts";
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
} from "../shared/schemas.ts";
export type { SandboxSpec } from "../shared/sandbox_spec.ts";
export type { PoolReport, PoolSpec, PoolStatus, PoolTarget, VolumeMount } from "../shared/pools.ts";
export type { EgressRules } from "../shared/egress_rules.ts";
