/**
 * `DockerExecutor`: the executor contract on a local Docker Engine. It owns the lifecycle of
 * each sandbox's container (create, destroy, pause, resume, stats, the list for reconciling)
 * and composes the pieces that do the rest: {@link Engine} (every engine call, with its
 * deadline and error translation), `Commands` (exec), `Files` (the file verbs; `_stat.ts`
 * describes paths) and `Watches` (directory watches, `_watch.ts`).
 *
 * @module
 */
import Docker from "dockerode";
import type { Clock } from "../../../shared/clock.ts";
import { systemClock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import { silentLog } from "../../../shared/log.ts";
import {
  type CreateRequest,
  type DirWatch,
  type ExecHandle,
  type ExecRequest,
  type Executor,
  type ExecutorCapabilities,
  ExecutorError,
  type FileEntry,
  type FileOptions,
  type FsChange,
  type PortAddress,
  type SandboxLimits,
  type SandboxStats,
  unknownVolume,
  type WatchRequest,
  type WriteOptions,
} from "../contract.ts";
import type { SandboxSpec } from "../../../shared/schemas.ts";
import type { VolumeDecl } from "../../config_capabilities.ts";
import { Commands } from "./_exec.ts";
import { Files } from "./_files.ts";
import { Watches } from "./_watch.ts";
import { resolvePath, Sandboxes } from "./_sandboxes.ts";
import { type CpuSample, usageOf } from "./_stats.ts";
import {
  DEFAULT_DOCKER_SOCKET,
  type DockerEngine,
  Engine,
  type EngineInfo,
  nameSafe,
} from "./engine.ts";
import { SandboxNetwork } from "./_network.ts";
import { buildCommandOf, parseTemplates, unknownTemplateError } from "./templates.ts";

/** How to get a missing image; named in every missing-image error. */
function buildHint(image: string): string {
  const command = buildCommandOf(image);
  return command
    ? `build it with ${command.join(" ")} (or \`docker load\` it)`
    : "`docker pull` or `docker load` it, or point the template at another image";
}

/** Node-wide limits for a sandbox whose spec does not say. */
export interface DockerLimits {
  /** Cores (fractions allowed). */
  cpus: number;
  /** Memory, MiB (swap is not granted on top). */
  memoryMB: number;
  /** Processes and threads. */
  pids: number;
  /**
   * Bound of the container's writable layer, MiB (`--storage-opt size=`), so one sandbox
   * cannot fill the engine's disk; unbounded when absent. Only some storage drivers can bound
   * it (overlay2 on xfs mounted with `pquota`, btrfs, zfs, ...): `connect()` refuses a bound
   * the engine cannot keep, rather than build sandboxes that ignore it.
   */
  diskMB?: number;
}

/** Options for {@link DockerExecutor}. */
export interface DockerExecutorOptions {
  /** This node's id, written on every container as the `dormice.node` label. */
  nodeId: string;
  /** The engine client (a dockerode `Docker`); one on `socketPath` by default. */
  docker?: DockerEngine;
  /** The engine socket (for the client and for error sentences). */
  socketPath?: string;
  /** Template name to image; `parseTemplates(DEFAULT_TEMPLATES)` by default. */
  templates?: Map<string, string>;
  /** Limits for specs that do not set them. */
  defaults?: Partial<DockerLimits>;
  /** Deadline of one ordinary engine call, ms (inspect, exec create, pause, ...). */
  callTimeoutMs?: number;
  /** Deadline of creating and starting a container, ms (the engine may be busy unpacking). */
  createTimeoutMs?: number;
  /** Deadline of a file transfer or a helper command (stat, list, mkdir, ...), ms. */
  fileTimeoutMs?: number;
  /**
   * How often a directory watch looks for changes made by commands, ms (250 by default: a
   * `find` + `stat` of the directory each time, in the sandbox's own CPU share). Changes made
   * through the file verbs are seen before the verb answers, whatever this is.
   */
  watchIntervalMs?: number;
  /** Run containers under docker-init so orphaned processes are reaped (needs the engine's init). */
  init?: boolean;
  /** Time source for stats timestamps and written files' times. */
  clock?: Clock;
  /** Where the executor logs a missing image, a failed stream or a kill that did not land. */
  log?: Log;
  /** Named volumes a create may mount (`DORMICE_VOLUMES`). */
  volumes?: VolumeDecl[];
}

/**
 * What root may do in a sandbox: own and write any file (CHOWN, DAC_OVERRIDE, FOWNER, FSETID),
 * signal any process (KILL), switch users as sudo does (SETUID, SETGID, and AUDIT_WRITE, without
 * which sudo fails to log), and bind a port under 1024 (NET_BIND_SERVICE).
 */
const ROOT_CAPABILITIES = [
  "CHOWN",
  "DAC_OVERRIDE",
  "FOWNER",
  "FSETID",
  "KILL",
  "SETUID",
  "SETGID",
  "AUDIT_WRITE",
  "NET_BIND_SERVICE",
];

/** Defaults of the limits, chosen for a 2-core worker running a handful of sandboxes. */
const DEFAULT_LIMITS: DockerLimits = { cpus: 1, memoryMB: 512, pids: 512 };

/**
 * The executor contract on Docker: one container per sandbox, labelled with this node's id and
 * the ledger id, isolated by default (no network, cpu / memory / pids limits, the image's
 * non-root user without capabilities; root keeps only what it needs to act as root on files,
 * processes and sudo). Commands run by exec with demultiplexed streams; a kill reaches the
 * command and every descendant, and no other command, through a token in their environment.
 * Files travel by archive put/get.
 *
 * Requires `--allow-env --allow-net=unix:<socket> --allow-read=<socket> --allow-write=<socket>`
 * (the socket is `/var/run/docker.sock` by default).
 *
 * @example
 * ```ts
 * import { DockerExecutor } from "@dormice/cluster/docker";
 *
 * // Building the executor makes no engine call (connect() pings first); its methods do.
 * const executor = new DockerExecutor({ nodeId: "node-1" });
 *
 * // One sandbox's life. It needs a running engine and the base image, so this example only
 * // defines it.
 * async function hello(): Promise<string> {
 *   await executor.create({ id: "sb1", name: "demo", template: "base", spec: {}, env: {} });
 *   try {
 *     const run = await executor.exec("sb1", { cmd: ["/bin/bash", "-l", "-c", "echo hi"] });
 *     return await new Response(run.stdout).text(); // "hi\n"
 *   } finally {
 *     await executor.destroy("sb1");
 *   }
 * }
 * ```
 */
export class DockerExecutor implements Executor {
  /** Always `"docker"`. */
  readonly kind: string = "docker";
  #engine: Engine;
  #sandboxes: Sandboxes;
  #network: SandboxNetwork;
  #commands: Commands;
  #files: Files;
  #watches: Watches;
  #nodeId: string;
  #templates: Map<string, string>;
  #limits: DockerLimits;
  #createTimeoutMs: number;
  #init: boolean;
  #clock: Clock;
  #log: Log;
  #cpu = new Map<string, CpuSample>();
  #volumes: Map<string, VolumeDecl>;
  #closed = false;

  /** Builds the executor without touching the engine; {@link DockerExecutor.connect} pings first. */
  constructor(options: DockerExecutorOptions) {
    const {
      nodeId,
      socketPath = DEFAULT_DOCKER_SOCKET,
      docker = new Docker({ socketPath }) as DockerEngine,
      templates,
      defaults = {},
      callTimeoutMs = 10_000,
      createTimeoutMs = 60_000,
      fileTimeoutMs = 60_000,
      watchIntervalMs = 250,
      init = true,
      clock = systemClock,
      log = silentLog,
      volumes = [],
    } = options;
    if (!nodeId) throw new TypeError("Cannot create DockerExecutor as 'nodeId' is empty");
    let map = templates;
    if (!map) {
      const parsed = parseTemplates(undefined);
      if (typeof parsed === "string") throw new TypeError(parsed);
      map = parsed;
    }
    this.#engine = new Engine({ client: docker, socketPath, nodeId, callTimeoutMs });
    this.#sandboxes = new Sandboxes(this.#engine);
    this.#network = new SandboxNetwork(this.#engine, nameSafe(nodeId));
    this.#commands = new Commands({
      engine: this.#engine,
      sandboxes: this.#sandboxes,
      log,
      helperTimeoutMs: fileTimeoutMs,
    });
    this.#files = new Files({
      engine: this.#engine,
      sandboxes: this.#sandboxes,
      commands: this.#commands,
      clock,
      transferTimeoutMs: fileTimeoutMs,
    });
    this.#watches = new Watches({ commands: this.#commands, log, intervalMs: watchIntervalMs });
    this.#nodeId = nodeId;
    this.#templates = map;
    this.#limits = { ...DEFAULT_LIMITS, ...defaults };
    this.#createTimeoutMs = createTimeoutMs;
    this.#init = init;
    this.#clock = clock;
    this.#log = log;
    this.#volumes = new Map(volumes.map((v) => [v.name, v]));
  }

  /**
   * The templates whose images the engine holds, and the declared volumes that are present (a
   * host directory that exists, a Docker volume the engine has): a writable volume declared on
   * several nodes but present on one is advertised, and so served, by that one only.
   */
  async capabilities(): Promise<ExecutorCapabilities> {
    const templates = await Promise.all(
      [...this.#templates].map(async ([template, image]) => {
        try {
          await this.#engine.call(
            `inspecting image ${image}`,
            (signal) => this.#engine.client.getImage(image).inspect({ abortSignal: signal }),
          );
          return template;
        } catch (error) {
          if (error instanceof ExecutorError && error.code === "not_found") return undefined;
          throw error;
        }
      }),
    );
    const volumes = await Promise.all([...this.#volumes.values()].map(async (v) => {
      if (v.source.startsWith("/")) {
        try {
          return (await Deno.stat(v.source)).isDirectory ? v.name : undefined;
        } catch (error) {
          // A node not allowed to read the path cannot tell: the engine will, at create.
          return error instanceof Deno.errors.NotCapable ? v.name : undefined;
        }
      }
      const client = this.#engine.client;
      if (client.getVolume === undefined) return v.name;
      try {
        await this.#engine.call(
          `inspecting volume ${v.source}`,
          (signal) => client.getVolume!(v.source).inspect({ abortSignal: signal }),
        );
        return v.name;
      } catch (error) {
        if (error instanceof ExecutorError && error.code === "not_found") return undefined;
        throw error;
      }
    }));
    return {
      templates: templates.filter((t): t is string => t !== undefined),
      volumes: volumes.filter((v): v is string => v !== undefined),
    };
  }

  /**
   * Pings the engine and builds the executor; refuses with a sentence naming the socket and how
   * to start the engine when it does not answer. Warns (does not refuse) for template images
   * that are not built yet.
   *
   * @throws {ExecutorError} `unavailable` when the engine does not answer.
   * @example
   * ```ts
   * import { DockerExecutor } from "@dormice/cluster/docker";
   * import { ExecutorError } from "@dormice/cluster/node";
   *
   * try {
   *   const executor = await DockerExecutor.connect({ nodeId: "node-1" });
   *   await executor.close();
   * } catch (error) {
   *   // No engine on the socket: the message names it and how to start dockerd.
   *   if (!(error instanceof ExecutorError) || error.code !== "unavailable") throw error;
   *   console.log(error.message);
   * }
   * ```
   */
  static async connect(options: DockerExecutorOptions): Promise<DockerExecutor> {
    const executor = new DockerExecutor(options);
    await executor.ping();
    const built: string[] = [];
    for (const [template, image] of executor.#templates) {
      try {
        await executor.#engine.call(
          `inspecting image ${image}`,
          (signal) => executor.#engine.client.getImage(image).inspect({ abortSignal: signal }),
        );
        built.push(image);
      } catch (error) {
        if (error instanceof ExecutorError && error.code === "not_found") {
          executor.#log(
            "warn",
            `Image ${image} of template '${template}' is missing: ${buildHint(image)}`,
            { template, image },
          );
        } else throw error;
      }
    }
    if (executor.#limits.diskMB && built.length > 0) await executor.#probeDiskBound(built[0]);
    return executor;
  }

  /**
   * Creates (never starts) one container with the disk bound and removes it: the engine refuses
   * a bound its storage driver cannot keep at create, so a node that would build unbounded
   * sandboxes, or none at all, refuses at boot instead.
   *
   * @throws {ExecutorError} `invalid` naming the driver and what to do.
   */
  async #probeDiskBound(image: string): Promise<void> {
    const name = this.#engine.containerName("disk-probe");
    const remove = () =>
      this.#engine.call(
        "removing the disk probe container",
        (signal) =>
          this.#engine.client.getContainer(name).remove({ force: true, abortSignal: signal }),
      ).catch(() => {});
    await remove(); // one left by a node that died mid-probe
    try {
      await this.#engine.call(
        "creating the disk probe container",
        (signal) =>
          this.#engine.client.createContainer({
            name,
            Image: image,
            Entrypoint: ["true"],
            HostConfig: {
              NetworkMode: "none",
              StorageOpt: { size: `${this.#limits.diskMB}M` },
            },
            abortSignal: signal,
          }),
        this.#createTimeoutMs,
      );
    } catch (error) {
      if (!(error instanceof ExecutorError) || error.code === "timeout") throw error;
      const info = await this.#engine.call(
        "reading the engine's storage driver",
        (signal) => this.#engine.client.info({ abortSignal: signal }),
      ).catch(() => ({} as EngineInfo));
      const backing = info.DriverStatus?.find(([key]) => key === "Backing Filesystem")?.[1];
      const driver = `${info.Driver ?? "unknown"}${backing ? ` on ${backing}` : ""}`;
      throw new ExecutorError(
        "invalid",
        `A disk bound of ${this.#limits.diskMB} MiB per sandbox (DORMICE_SANDBOX_DISK_MB) needs ` +
          `a storage driver that bounds a container's writable layer, and this engine's ` +
          `(${driver}) refuses it: ${error.message}. Unset DORMICE_SANDBOX_DISK_MB, or give ` +
          "the engine such a driver: overlay2 with /var/lib/docker on xfs mounted with " +
          "pquota, or btrfs (the README's Docker section says more)",
      );
    } finally {
      await remove();
    }
  }

  /**
   * Checks that the engine answers.
   *
   * @throws {ExecutorError} `unavailable` naming the socket and how to start the engine.
   * @example
   * ```ts
   * import { DockerExecutor } from "@dormice/cluster/docker";
   * import { ExecutorError } from "@dormice/cluster/node";
   *
   * const executor = new DockerExecutor({ nodeId: "node-1" });
   * const up = await executor.ping().then(() => true, (error) => {
   *   if (error instanceof ExecutorError && error.code === "unavailable") return false;
   *   throw error;
   * });
   * console.log(up ? "the engine answers" : "no engine on /var/run/docker.sock");
   * ```
   */
  async ping(): Promise<void> {
    try {
      await this.#engine.call(
        "ping",
        (signal) => this.#engine.client.ping({ abortSignal: signal }),
      );
    } catch (error) {
      // A permission refusal is not a down engine: its own sentence says which flags to add.
      if (error instanceof ExecutorError && /may not use the Docker socket/.test(error.message)) {
        throw error;
      }
      const why = error instanceof Error ? error.message : String(error);
      throw new ExecutorError(
        "unavailable",
        `The Docker engine does not answer on ${this.#engine.socketPath} (${why}): start it ` +
          `(\`sudo systemctl start docker\`, or \`sudo dockerd &\`; .ci/docker.sh does both) or ` +
          `run the node with DORMICE_EXECUTOR=fake`,
      );
    }
  }

  async create(request: CreateRequest): Promise<void> {
    const { id, name, template, spec } = request;
    const image = this.#templates.get(template);
    if (!image) throw unknownTemplateError(template, this.#templates.keys());
    let imageInfo;
    try {
      imageInfo = await this.#engine.call(
        `inspecting image ${image}`,
        (signal) => this.#engine.client.getImage(image).inspect({ abortSignal: signal }),
      );
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") {
        throw new ExecutorError(
          "unavailable",
          `Image ${image} of template '${template}' is not in the Docker engine: ${
            buildHint(image)
          }`,
        );
      }
      throw error;
    }
    const binds: string[] = [];
    for (const v of spec.volumes ?? []) {
      const decl = this.#volumes.get(v.name);
      if (decl === undefined) throw unknownVolume(v.name, [...this.#volumes.keys()]);
      binds.push(`${decl.source}:${v.mountPath}${decl.readOnly ? ":ro" : ""}`);
    }
    const { cpus, memoryMB } = this.limits(spec);
    const memory = memoryMB * 1024 * 1024;
    const env = { ...spec.env, ...request.env };
    const user: string = imageInfo.Config?.User ?? "";
    const containerName = this.#engine.containerName(id);
    const networkMode = await this.#network.modeFor(spec.network === true);
    const container = await this.#engine.call(
      `creating the container of sandbox ${id}`,
      (signal) =>
        this.#engine.client.createContainer({
          name: containerName,
          Image: image,
          // The container only holds the sandbox open; commands come by exec. Overriding the
          // entrypoint keeps an image's own server or shell from taking PID 1's place.
          Entrypoint: ["sleep"],
          Cmd: ["2147483647"],
          Env: Object.entries(env).map(([key, value]) => `${key}=${value}`),
          Labels: {
            "dormice.node": this.#nodeId,
            "dormice.sandbox": id,
            "dormice.name": name,
            "dormice.template": template,
          },
          HostConfig: {
            Init: this.#init,
            // Without egress the container sits on the node's internal network only: no route
            // out, and its ports still reachable by the node (see _network.ts).
            NetworkMode: networkMode,
            // Commands run as the image's user, who holds no capability whatever this says. Root
            // (a command asked to run as root, or `sudo`, which E2B's users may use without a
            // password) gets the part of Docker's default set that lets root act as root on
            // files and processes, and no more (no raw sockets, mknod, chroot or ptrace).
            // no-new-privileges is off because it would stop sudo's setuid.
            CapDrop: ["ALL"],
            CapAdd: ROOT_CAPABILITIES,
            NanoCpus: Math.round(cpus * 1e9),
            Memory: memory,
            MemorySwap: memory,
            PidsLimit: spec.pids ?? this.#limits.pids,
            ...(this.#limits.diskMB ? { StorageOpt: { size: `${this.#limits.diskMB}M` } } : {}),
            ...(binds.length > 0 ? { Binds: binds } : {}),
            RestartPolicy: { Name: "no" },
            LogConfig: { Type: "none", Config: {} },
          },
          abortSignal: signal,
        }),
      this.#createTimeoutMs,
    ).catch((error) => {
      if (error instanceof ExecutorError && error.code === "exists") {
        throw new ExecutorError(
          "exists",
          `Sandbox '${id}' already has a container on this engine (${containerName}): destroy it first`,
        );
      }
      throw error;
    });
    try {
      await this.#engine.call(
        `starting the container of sandbox ${id}`,
        (signal) => container.start({ abortSignal: signal }),
        this.#createTimeoutMs,
      );
    } catch (error) {
      await this.destroy(id).catch(() => {});
      throw error;
    }
    this.#sandboxes.remember(id, user, imageInfo.Config?.WorkingDir);
    this.#log("debug", "Sandbox container started", { id, image, container: containerName });
  }

  /** The spec's cpus and memory, else this node's defaults (`DORMICE_SANDBOX_CPUS`, ...). */
  limits(spec: SandboxSpec): SandboxLimits {
    return {
      cpus: spec.cpus ?? this.#limits.cpus,
      memoryMB: spec.memoryMB ?? this.#limits.memoryMB,
    };
  }

  async destroy(id: string): Promise<void> {
    this.#sandboxes.forget(id);
    this.#network.forget(id);
    this.#cpu.delete(id);
    try {
      // Force removal kills and removes in one call: a sandbox has nothing to flush on stop.
      await this.#engine.call(
        `removing the container of sandbox ${id}`,
        (signal) =>
          this.#engine.container(id).remove({ force: true, v: true, abortSignal: signal }),
        this.#createTimeoutMs,
      );
    } catch (error) {
      if (error instanceof ExecutorError) {
        if (error.code === "not_found") return;
        if (error.code === "exists" && /already in progress/i.test(error.message)) return;
      }
      throw error;
    }
  }

  exec(id: string, request: ExecRequest): Promise<ExecHandle> {
    return this.#commands.exec(id, request);
  }

  async writeFile(
    id: string,
    path: string,
    data: Uint8Array,
    options: WriteOptions = {},
  ): Promise<FileEntry> {
    const target = resolvePath(path, (await this.#files.runAs(id, options)).home);
    return await this.#watches.changing(
      id,
      target,
      () => this.#files.writeFile(id, path, data, options),
    );
  }

  readFile(id: string, path: string, options: FileOptions = {}): Promise<Uint8Array> {
    return this.#files.readFile(id, path, options);
  }

  listDir(id: string, path: string, depth = 1, options: FileOptions = {}): Promise<FileEntry[]> {
    return this.#files.listDir(id, path, depth, options);
  }

  stat(id: string, path: string, options: FileOptions = {}): Promise<FileEntry> {
    return this.#files.stat(id, path, options);
  }

  async makeDir(id: string, path: string, options: FileOptions = {}): Promise<boolean> {
    const target = resolvePath(path, (await this.#files.runAs(id, options)).home);
    return await this.#watches.changing(id, target, () => this.#files.makeDir(id, path, options));
  }

  move(id: string, from: string, to: string, options: FileOptions = {}): Promise<FileEntry> {
    return this.#watches.changing(id, null, () => this.#files.move(id, from, to, options));
  }

  remove(id: string, path: string, options: FileOptions = {}): Promise<void> {
    return this.#watches.changing(id, null, () => this.#files.remove(id, path, options));
  }

  /**
   * Watches a directory with one long-running exec in the sandbox (see `_watch.ts`): changes
   * made by commands are seen within `watchIntervalMs`, those made by the file verbs before the
   * verb answers. The watch ends with its container.
   */
  async watch(
    id: string,
    request: WatchRequest,
    onChange: (change: FsChange) => void,
  ): Promise<DirWatch> {
    return await this.#watches.start(id, await this.#files.runAs(id, request), request, onChange);
  }

  pause(id: string): Promise<void> {
    // Commands still starting go first; later ones wait for this pause to settle.
    return this.#commands.pauseBetweenStarts(id, async () => {
      try {
        await this.#engine.callContainer(
          id,
          `pausing sandbox ${id}`,
          (container, signal) => container.pause({ abortSignal: signal }),
        );
      } catch (error) {
        if (error instanceof ExecutorError && /already paused/i.test(error.message)) return;
        throw error;
      }
    });
  }

  async resume(id: string): Promise<void> {
    try {
      await this.#engine.callContainer(
        id,
        `resuming sandbox ${id}`,
        (container, signal) => container.unpause({ abortSignal: signal }),
      );
    } catch (error) {
      if (error instanceof ExecutorError && /not paused/i.test(error.message)) return;
      throw error;
    }
  }

  async stats(id: string): Promise<SandboxStats> {
    const [sample, inspect] = await Promise.all([
      this.#engine.callContainer(
        id,
        `reading stats of sandbox ${id}`,
        (container, signal) =>
          container.stats({ stream: false, "one-shot": true, abortSignal: signal }),
      ),
      this.#engine.callContainer(
        id,
        `inspecting sandbox ${id}`,
        (container, signal) => container.inspect({ size: true, abortSignal: signal }),
      ),
    ]);
    const previous = this.#cpu.get(id);
    const { stats, cpu } = usageOf(sample, inspect, previous, this.#clock.now());
    this.#cpu.set(id, cpu);
    return stats;
  }

  /**
   * The container's address on its network: the internal one, or `bridge` for a sandbox with
   * egress. Whether anything listens there is for the connection to find out.
   */
  portAddress(id: string, port: number): Promise<PortAddress | null> {
    return this.#network.address(id, port);
  }

  async list(): Promise<string[]> {
    const containers = await this.#engine.call(
      "listing this node's containers",
      (signal) =>
        this.#engine.client.listContainers({
          all: true,
          filters: { label: [`dormice.node=${this.#nodeId}`] },
          abortSignal: signal,
        }),
    );
    return containers.map((c) => c.Labels?.["dormice.sandbox"]).filter((id): id is string => !!id)
      .sort();
  }

  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    this.#commands.close();
    return this.#network.release();
  }
}
