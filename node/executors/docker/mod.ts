/**
 * The Docker executor: the executor contract on a local Docker Engine, through `npm:dockerode`.
 * One container per sandbox, isolated by default (no route out, none to another sandbox or to
 * the host, cpu / memory / pids limits, the image's non-root user without capabilities, root
 * with only those sudo and file work need), exec with demultiplexed streams, files by archive
 * put/get.
 *
 * Requires `--allow-env` (or `--allow-env=DOCKER_HOST --ignore-env`: dockerode's dependencies
 * read and list the environment as they load), `--allow-net=unix:<socket> --allow-read=<socket>
 * --allow-write=<socket>`
 * (the socket is `/var/run/docker.sock` by default), and root with `--allow-run=iptables` for
 * the host firewall unless it is turned off (`hostFirewall: false`).
 *
 * @example
 * ```ts
 * import { DockerExecutor, dockerSocketPath, parseTemplates } from "@dormice/cluster/docker";
 *
 * const templates = parseTemplates("base=dormice-base:latest");
 * if (typeof templates === "string") throw new Error(templates);
 * // No engine call yet; DockerExecutor.connect() would ping the engine and check the images.
 * const executor = new DockerExecutor({
 *   nodeId: "node-1",
 *   socketPath: dockerSocketPath(Deno.env), // DOCKER_HOST=unix://... or the default
 *   templates,
 * });
 * await executor.close();
 * ```
 *
 * @module
 */
export {
  type ContainerInspect,
  DEFAULT_DOCKER_SOCKET,
  type DockerEngine,
  dockerSocketPath,
  type EngineContainer,
  type EngineExec,
  type EngineInfo,
  type ImageInspect,
  type StatsSample,
} from "./engine.ts";
export {
  buildCommandOf,
  DEFAULT_TEMPLATES,
  parseTemplates,
  unknownTemplateError,
} from "./templates.ts";
export { DockerExecutor, type DockerExecutorOptions, type DockerLimits } from "./executor.ts";
export type {
  CreateRequest,
  DirWatch,
  ExecExit,
  ExecHandle,
  ExecRequest,
  Executor,
  ExecutorCapabilities,
  ExecutorErrorCode,
  FileEntry,
  FileOptions,
  FileStream,
  FsChange,
  ImageExport,
  PortAddress,
  SandboxLimits,
  SandboxStats,
  SnapshotInfo,
  SnapshotRequest,
  TerminalSize,
  WatchRequest,
  WriteOptions,
} from "../contract.ts";
export { ExecutorError } from "../contract.ts";
export type { ImageSummary } from "./engine.ts";
export type { BuildIo, BuildLogLine, TemplateBuildSpec, TemplateStep } from "../template_build.ts";
export type { IptablesResult, IptablesRunner } from "./_firewall.ts";
export type { VolumeDecl } from "../../config_capabilities.ts";
export type {
  EgressRules,
  EgressTransform,
  SandboxSpec,
  VolumeMount,
} from "../../../shared/mod.ts";
export { EgressCa, type EgressCaFiles, type LeafCertificate } from "./_egress_ca.ts";
export type { Clock } from "../../../shared/clock.ts";
export type { Log, LogLevel } from "../../../shared/log.ts";
