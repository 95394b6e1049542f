/**
 * The container of each sandbox, as `DockerExecutor` handles it whole: create (the template's
 * image, the isolation settings, the start), destroy, pause, resume, stats and the list for
 * reconciling; and, at boot, which template images and declared volumes are present and whether
 * the engine keeps a disk bound. Commands (`_exec.ts`) and files (`_files.ts`) work inside it.
 *
 * @module
 */
import type { Clock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import {
  type CreateRequest,
  type ExecutorCapabilities,
  ExecutorError,
  type SandboxLimits,
  type SandboxStats,
  unknownVolume,
} from "../contract.ts";
import type { SandboxSpec } from "../../../shared/schemas.ts";
import type { VolumeDecl } from "../../config_capabilities.ts";
import type { Sandboxes } from "./_sandboxes.ts";
import { type CpuSample, usageOf } from "./_stats.ts";
import type { Engine, EngineInfo } from "./engine.ts";
import type { SandboxNetwork } from "./_network.ts";
import { buildCommandOf, unknownTemplateError } from "./templates.ts";
import type { Snapshots } from "./_snapshots.ts";

/**
 * The image label naming a command the node runs in a sandbox (as the image's user, with
 * `/bin/sh -c`) right after its container started; the sandbox is handed out only once that
 * command exited 0. The code interpreter's image starts its server on port 49999 with it.
 */
export const START_LABEL = "dormice.start";

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
export const DEFAULT_LIMITS: DockerLimits = { cpus: 1, memoryMB: 512, pids: 512 };

/** What {@link Containers} works with; `DockerExecutor` builds it from its own options. */
export interface ContainersOptions {
  engine: Engine;
  sandboxes: Sandboxes;
  network: SandboxNetwork;
  /** Written on every container as the `dormice.node` label. */
  nodeId: string;
  /** Written on every container as the `dormice.instance` label; what `list()` selects by. */
  instanceId: string;
  /** Template name to image. */
  templates: Map<string, string>;
  /** Limits for specs that do not set them, defaults filled in. */
  limits: DockerLimits;
  /** Deadline of creating, starting and removing a container, ms. */
  createTimeoutMs: number;
  /** Run containers under docker-init. */
  init: boolean;
  clock: Clock;
  log: Log;
  /** Named volumes a create may mount. */
  volumes: VolumeDecl[];
  /** The node's managed volumes: the host directory of one by its id, or `undefined`. */
  managedVolumes?: (name: string) => string | undefined;
  /** This instance's snapshots, which a create may start from. */
  snapshots: Snapshots;
  /** The resolvers a sandbox with egress asks (`DORMICE_SANDBOX_DNS`); the engine's when empty. */
  dns?: string[];
}

/** The lifecycle of every sandbox's container on this node's engine. */
export class Containers {
  #engine: Engine;
  #sandboxes: Sandboxes;
  #network: SandboxNetwork;
  #nodeId: string;
  #instanceId: string;
  #templates: Map<string, string>;
  #limits: DockerLimits;
  #createTimeoutMs: number;
  #init: boolean;
  #clock: Clock;
  #log: Log;
  #cpu = new Map<string, CpuSample>();
  #volumes: Map<string, VolumeDecl>;
  #managedVolumes?: (name: string) => string | undefined;
  #snapshots: Snapshots;
  #dns: string[];

  constructor(options: ContainersOptions) {
    this.#snapshots = options.snapshots;
    this.#dns = options.dns ?? [];
    this.#engine = options.engine;
    this.#sandboxes = options.sandboxes;
    this.#network = options.network;
    this.#nodeId = options.nodeId;
    this.#instanceId = options.instanceId;
    this.#templates = options.templates;
    this.#limits = options.limits;
    this.#createTimeoutMs = options.createTimeoutMs;
    this.#init = options.init;
    this.#clock = options.clock;
    this.#log = options.log;
    this.#volumes = new Map(options.volumes.map((v) => [v.name, v]));
    this.#managedVolumes = options.managedVolumes;
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
   * Warns (does not refuse) for template images that are not built yet; with a disk bound,
   * probes it on the first image that is.
   *
   * @throws {ExecutorError} `invalid` when the engine cannot keep the disk bound.
   */
  async checkImages(): Promise<void> {
    const built: string[] = [];
    for (const [template, image] of this.#templates) {
      try {
        await this.#engine.call(
          `inspecting image ${image}`,
          (signal) => this.#engine.client.getImage(image).inspect({ abortSignal: signal }),
        );
        built.push(image);
      } catch (error) {
        if (error instanceof ExecutorError && error.code === "not_found") {
          this.#log(
            "warn",
            `Image ${image} of template '${template}' is missing: ${buildHint(image)}`,
            { template, image },
          );
        } else throw error;
      }
    }
    if (this.#limits.diskMB && built.length > 0) await this.#probeDiskBound(built[0]);
  }

  /**
   * Creates (never starts) one container with the disk bound and removes it: the engine refuses
   * a bound its storage driver cannot keep at create, so a node that would build unbounded
   * sandboxes, or none at all, refuses at boot instead.
   *
   * @throws {ExecutorError} `invalid` naming the driver and what to do.
   */
  async #probeDiskBound(image: string): Promise<void> {
    // Two nodes with one id may probe at once: each its own container.
    const name = this.#engine.containerName(`disk-probe-${this.#instanceId}`);
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
   * Creates and starts the container of a sandbox. Returns the command the image asks to run
   * once it started (its `dormice.start` label, run with `/bin/sh -c`), or null. From `image_`
   * when given (a restore), else its template's or snapshot's.
   */
  async create(request: CreateRequest, image_?: string): Promise<string | null> {
    const { id, name, template, spec } = request;
    const image = image_ ??
      (request.snapshot === undefined
        ? this.#templates.get(template)
        : await this.#snapshots.imageFor(request.snapshot));
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
      const managed = this.#managedVolumes?.(v.name);
      const decl = this.#volumes.get(v.name) ??
        (managed === undefined ? undefined : { name: v.name, source: managed, readOnly: false });
      if (decl === undefined) throw unknownVolume(v.name, [...this.#volumes.keys()]);
      // Docker reads a bind source that is not absolute as the name of a Docker volume (and
      // refuses one with a slash), so a managed volume under a relative DORMICE_DATA_DIR, as
      // `deno task fleet` gives its nodes, is bound by its absolute path.
      const source = decl.source.startsWith("/") ? decl.source : Deno.realPathSync(decl.source);
      binds.push(`${source}:${v.mountPath}${decl.readOnly ? ":ro" : ""}`);
    }
    const { cpus, memoryMB } = this.limits(spec);
    const memory = memoryMB * 1024 * 1024;
    const env = { ...spec.env, ...request.env };
    const user: string = imageInfo.Config?.User ?? "";
    const containerName = this.#engine.containerName(id);
    // Address rules judge egress, so a sandbox with rules sits on the egress network.
    const egress = spec.network === true || spec.egressRules !== undefined;
    const networkMode = await this.#network.modeFor(egress);
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
            "dormice.instance": this.#instanceId,
            "dormice.sandbox": id,
            "dormice.name": name,
            "dormice.template": template,
          },
          HostConfig: {
            Init: this.#init,
            // The node's internal network (no route out) or its egress one: on either, no
            // route to another sandbox or to the host, and its ports reachable by the node
            // (see _network.ts).
            NetworkMode: networkMode,
            // The engine's resolver inside the sandbox forwards to these instead of the host's.
            ...(egress && this.#dns.length > 0 ? { Dns: this.#dns } : {}),
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
    return imageInfo.Config?.Labels?.[START_LABEL]?.trim() || null;
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

  /** Pauses the container; one already paused is not an error. */
  async pause(id: string): Promise<void> {
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

  /** The sandboxes of the containers this instance made. */
  async list(): Promise<string[]> {
    return sandboxIds(await this.#listLabelled(`dormice.instance=${this.#instanceId}`));
  }

  /**
   * The sandboxes of containers labelled with this node id and no instance: made by a node
   * before instance labels, this one or another with the same id.
   */
  async legacy(): Promise<string[]> {
    const labelled = await this.#listLabelled(`dormice.node=${this.#nodeId}`);
    return sandboxIds(labelled.filter((c) => c.Labels?.["dormice.instance"] === undefined));
  }

  #listLabelled(label: string): Promise<{ Labels?: Record<string, string> }[]> {
    return this.#engine.call(
      "listing this node's containers",
      (signal) =>
        this.#engine.client.listContainers({
          all: true,
          filters: { label: [label] },
          abortSignal: signal,
        }),
    );
  }
}

function sandboxIds(containers: { Labels?: Record<string, string> }[]): string[] {
  return containers.map((c) => c.Labels?.["dormice.sandbox"]).filter((id): id is string => !!id)
    .sort();
}
