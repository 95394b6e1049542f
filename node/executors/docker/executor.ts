/**
 * `DockerExecutor`: the executor contract on a local Docker Engine. It holds no sandbox logic of
 * its own: it builds and composes the pieces that do the work, {@link Engine} (every engine call,
 * with its deadline and error translation), `Containers` (each sandbox's container: create,
 * destroy, pause, resume, stats, the list for reconciling; `_containers.ts`), `Commands` (exec,
 * `_exec.ts`), `Files` (the file verbs, `_files.ts`; `_stat.ts` describes paths), `Watches`
 * (directory watches, `_watch.ts`), `SandboxSetup` (a new container's egress and start command,
 * `_sandbox_setup.ts`), `Snapshots` (`_snapshots.ts`), `ImageMoves` (image and archive export,
 * import, push and pull, `_image_moves.ts`) and the template builder (`_build.ts`), and it tells
 * the watches of every change a file verb makes. Its options and their defaults: `_options.ts`.
 *
 * @module
 */
import Docker from "dockerode";
import { systemClock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import { silentLog } from "../../../shared/log.ts";
import {
  type CreateRequest,
  type DirWatch,
  egressRulesUnserved,
  type ExecHandle,
  type ExecRequest,
  type Executor,
  type ExecutorCapabilities,
  ExecutorError,
  type FileEntry,
  type FileOptions,
  type FsChange,
  type ImageExport,
  type PortAddress,
  type SandboxLimits,
  type SandboxStats,
  type SnapshotInfo,
  type SnapshotRequest,
  type WatchRequest,
  type WriteOptions,
} from "../contract.ts";
import type { SandboxSpec } from "../../../shared/schemas.ts";
import { Commands } from "./_exec.ts";
import { Files } from "./_files.ts";
import { Watches } from "./_watch.ts";
import { resolvePath, Sandboxes } from "./_sandboxes.ts";
import { Containers, DEFAULT_LIMITS } from "./_containers.ts";
import { DEFAULT_DOCKER_SOCKET, type DockerEngine, Engine, nameSafe } from "./engine.ts";
import { SandboxNetwork } from "./_network.ts";
import { HostFirewall } from "./_firewall.ts";
import { EgressFirewall } from "./_egress.ts";
import type { EgressRules } from "../../../shared/egress_rules.ts";
import { EgressProxy } from "./_egress_proxy.ts";
import { SandboxSetup } from "./_sandbox_setup.ts";
import { defaultTemplates } from "./templates.ts";
import { Snapshots } from "./_snapshots.ts";
import { DockerTemplateBuilder } from "./_build.ts";
import type { BuildIo, TemplateBuildSpec } from "../template_build.ts";
import { ImageMoves } from "./_image_moves.ts";
import { type DockerExecutorOptions, randomInstanceId } from "./_options.ts";

export type { DockerLimits } from "./_containers.ts";
export type { DockerExecutorOptions } from "./_options.ts";

/**
 * The executor contract on Docker: one container per sandbox, labelled with this node's id, its
 * instance id and the ledger id, isolated by default (no route out, no route to another sandbox
 * or to the host, cpu / memory / pids limits, the image's non-root user without capabilities;
 * root keeps only what it needs to act as root on files, processes and sudo). Commands run by
 * exec with demultiplexed streams; a kill reaches the command and every descendant, and no other
 * command, through a token in their environment. Files travel by archive put/get.
 *
 * Requires `--allow-env` (or `--allow-env=DOCKER_HOST --ignore-env`: dockerode's dependencies
 * read and list the environment as they load), `--allow-net=unix:<socket> --allow-read=<socket>
 * --allow-write=<socket>`
 * (the socket is `/var/run/docker.sock` by default), and `--allow-run=iptables` with root unless
 * `hostFirewall` is false.
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
  #network: SandboxNetwork;
  #containers: Containers;
  #commands: Commands;
  #files: Files;
  #watches: Watches;
  #egress: EgressFirewall | null;
  #proxy: EgressProxy | null;
  #log: Log;
  #snapshots: Snapshots;
  #builder: DockerTemplateBuilder;
  #setup: SandboxSetup;
  #images: ImageMoves;
  #closed = false;
  /**
   * Replaces a sandbox's egress address rules in the kernel at once (see `_egress.ts`), the
   * sandbox and its processes running on. Present when the host firewall is on (iptables).
   */
  readonly setEgressRules?: (id: string, rules: EgressRules, team?: string) => Promise<void>;
  /** The `dormice.instance` label of every container it makes, and what it lists by. */
  readonly instanceId: string;

  /** Builds the executor without touching the engine; {@link DockerExecutor.connect} pings first. */
  constructor(options: DockerExecutorOptions) {
    const {
      nodeId,
      instanceId = randomInstanceId(),
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
      managedVolumes,
      hostFirewall = true,
      runIptables,
      egressCa = null,
      egressExtraCa = [],
      egressHosts = new Map(),
      sandboxDns = [],
    } = options;
    if (!nodeId) throw new TypeError("Cannot create DockerExecutor as 'nodeId' is empty");
    if (!/^[a-z0-9]{1,32}$/.test(instanceId)) {
      throw new TypeError(
        `Cannot create DockerExecutor as 'instanceId' is not 1-32 lowercase letters or digits: received '${instanceId}'`,
      );
    }
    this.instanceId = instanceId;
    const map = templates ?? defaultTemplates();
    this.#engine = new Engine({ client: docker, socketPath, nodeId, callTimeoutMs });
    this.#log = log;
    // The same iptables the host firewall needs; with it off the node enforces no rules.
    this.#egress = hostFirewall ? new EgressFirewall({ instanceId, run: runIptables }) : null;
    if (this.#egress !== null) {
      this.setEgressRules = (id, rules, team) => this.#setup.applyEgress(id, rules, team);
    }
    this.#proxy = this.#egress !== null && egressCa !== null
      ? new EgressProxy({ ca: egressCa, extraCaCerts: egressExtraCa, hosts: egressHosts, log })
      : null;
    const sandboxes = new Sandboxes(this.#engine);
    // Per instance, like the labels: a node leaving must not pull the network from under
    // another node with the same id (it is removed once nothing sits on it).
    this.#network = new SandboxNetwork({
      engine: this.#engine,
      nodeName: `${nameSafe(nodeId)}-${instanceId}`,
      firewall: hostFirewall ? new HostFirewall({ run: runIptables }) : null,
      egress: this.#egress,
      log,
    });
    this.#commands = new Commands({
      engine: this.#engine,
      sandboxes,
      log,
      helperTimeoutMs: fileTimeoutMs,
    });
    this.#setup = new SandboxSetup({
      commands: this.#commands,
      network: this.#network,
      egress: this.#egress,
      proxy: this.#proxy,
      egressCa,
      startTimeoutMs: createTimeoutMs,
    });
    this.#files = new Files({
      engine: this.#engine,
      sandboxes,
      commands: this.#commands,
      clock,
      transferTimeoutMs: fileTimeoutMs,
    });
    this.#watches = new Watches({ commands: this.#commands, log, intervalMs: watchIntervalMs });
    this.#snapshots = new Snapshots({
      engine: this.#engine,
      nodeId,
      instanceId,
      clock,
      commitTimeoutMs: createTimeoutMs,
    });
    this.#images = new ImageMoves({ engine: this.#engine, snapshots: this.#snapshots });
    this.#containers = new Containers({
      snapshots: this.#snapshots,
      engine: this.#engine,
      sandboxes,
      network: this.#network,
      nodeId,
      instanceId,
      templates: map,
      limits: { ...DEFAULT_LIMITS, ...defaults },
      createTimeoutMs,
      init,
      clock,
      log,
      volumes,
      managedVolumes,
      dns: sandboxDns,
    });
    this.#builder = new DockerTemplateBuilder({
      engine: this.#engine,
      sandboxes,
      commands: this.#commands,
      templates: map,
      nodeId,
      instanceId,
      clock,
      log,
      commitTimeoutMs: createTimeoutMs,
      networkMode: () => this.#network.modeFor(true),
    });
  }

  /**
   * Builds a template from E2B's steps into a snapshot image of this node (see `_build.ts`).
   *
   * @throws {TemplateBuildError} naming the step that failed.
   */
  buildTemplate(spec: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
    return this.#builder.build(spec, io);
  }

  /** Publishes or unpublishes a built template (see `_build.ts`). */
  setTemplatePublic(templateId: string, team: string, published: boolean): Promise<boolean> {
    return this.#builder.setPublic(templateId, team, published);
  }

  /**
   * The templates whose images the engine holds, and the declared volumes that are present (a
   * host directory that exists, a Docker volume the engine has): a writable volume declared on
   * several nodes but present on one is advertised, and so served, by that one only.
   */
  async capabilities(): Promise<ExecutorCapabilities> {
    return { ...await this.#containers.capabilities(), egressRules: this.#egress !== null };
  }

  /**
   * Pings the engine and builds the executor; refuses with a sentence naming the socket and how
   * to start the engine when it does not answer, and with one naming iptables and
   * `DORMICE_SANDBOX_HOST_FIREWALL` when the host firewall is on and cannot be managed. Warns
   * (does not refuse) for template images that are not built yet.
   *
   * @throws {ExecutorError} `unavailable` when the engine does not answer or the firewall
   * cannot be managed.
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
    await executor.#containers.checkImages();
    // Images of snapshots deleted while in use, left by a previous process of this instance.
    await executor.#snapshots.sweep(true).catch(() => {});
    // At boot rather than at the first create: a node that cannot keep sandboxes off the host
    // must not start serving (fail closed), and its sentence belongs in the boot log.
    await executor.#network.checkFirewall();
    return executor;
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

  /**
   * Builds the container; with `spec.egressRules`, also its kernel rules before it resolves
   * (nothing of the caller's runs in the sandbox before then), and a sandbox whose rules cannot
   * be written is removed again: it never runs without the rules it asked for. Then the image's
   * start command (its `dormice.start` label): a sandbox whose server did not come up is not
   * handed out.
   */
  async create(request: CreateRequest): Promise<void> {
    if (request.spec.egressRules !== undefined && this.#egress === null) {
      throw egressRulesUnserved();
    }
    const start = await this.#containers.create(request);
    await this.#setup.ready(request, start, () => this.destroy(request.id));
  }

  /** The spec's cpus and memory, else this node's defaults (`DORMICE_SANDBOX_CPUS`, ...). */
  limits(spec: SandboxSpec): SandboxLimits {
    return this.#containers.limits(spec);
  }

  /**
   * Removes the container, then its egress rules (after: a running sandbox is never without
   * them). Rules left by a failed removal are logged, not thrown: the container is gone, and
   * they can only refuse (see `_egress.ts`).
   */
  async destroy(id: string): Promise<void> {
    await this.#containers.destroy(id);
    await this.#egress?.remove(id).catch((error) =>
      this.#log("warn", "Could not remove a destroyed sandbox's egress rules", { id, error })
    );
    await this.#setup.forgetEgress(id).catch((error) =>
      this.#log("warn", "Could not remove a closed egress proxy port's rule", { id, error })
    );
    // What a filesystem pause kept of it goes too.
    const kept = await this.#snapshots.archiveOf(id);
    if (kept !== undefined) await this.#snapshots.delete(kept, undefined, true);
    // A deleted snapshot this sandbox ran from may be free now; a failed sweep waits for the next.
    if (this.#snapshots.orphaned > 0) await this.#snapshots.sweep().catch(() => {});
  }

  /**
   * Commits the container to a local image labelled as the sandbox's archive (no snapshot: no
   * team lists it), then removes the container, then its egress rules: they match its address,
   * which the engine may give the next sandbox made. `restore()` writes them again for the new
   * container's address. Rules left by a failed removal are logged, as at `destroy()`.
   */
  async archive(id: string): Promise<void> {
    await this.#snapshots.take(id, { team: "" }, true);
    await this.#containers.destroy(id);
    await this.#egress?.remove(id).catch((error) =>
      this.#log("warn", "Could not remove an archived sandbox's egress rules", { id, error })
    );
    await this.#setup.forgetEgress(id).catch((error) =>
      this.#log("warn", "Could not remove a closed egress proxy port's rule", { id, error })
    );
  }

  /** A container again under the sandbox's id from its archive image, which is then untagged. */
  async restore(request: CreateRequest): Promise<void> {
    const kept = await this.#snapshots.archiveOf(request.id);
    if (kept === undefined) {
      throw new ExecutorError(
        "gone",
        `No archive of sandbox ${request.id} on this node: it was never paused to disk here, ` +
          `or its image was removed`,
      );
    }
    if (request.spec.egressRules !== undefined && this.#egress === null) {
      throw egressRulesUnserved();
    }
    const start = await this.#containers.create(request, await this.#snapshots.archiveRef(kept));
    // Its rules and its start command again, as at create; a failure removes the container and
    // keeps the archive, so the sandbox can be resumed once the cause is gone.
    await this.#setup.ready(request, start, async () => {
      await this.#containers.destroy(request.id);
      await this.#egress?.remove(request.id);
      await this.#setup.forgetEgress(request.id);
    });
    // In use by the new container: untagged now, removed with the container (the orphan sweep).
    // The sandbox runs either way: an archive left tagged is removed by its destroy.
    await this.#snapshots.delete(kept, undefined, true).catch(() => {});
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
    return this.#commands.pauseBetweenStarts(id, () => this.#containers.pause(id));
  }

  resume(id: string): Promise<void> {
    return this.#containers.resume(id);
  }

  stats(id: string): Promise<SandboxStats> {
    return this.#containers.stats(id);
  }

  /**
   * Commits the sandbox's container to a local image `dormice-snapshot:<id>` labelled with this
   * node instance, the team, the name, the sandbox and the time. The engine pauses the
   * container for the commit and thaws it after (a paused sandbox stays paused). Memory and
   * processes are not captured.
   */
  snapshot(id: string, request: SnapshotRequest): Promise<SnapshotInfo> {
    return this.#snapshots.take(id, request);
  }

  /** This node instance's snapshot images, one team's when `team` is given. */
  listSnapshots(team?: string): Promise<SnapshotInfo[]> {
    return this.#snapshots.list(team);
  }

  /** Untags a snapshot's image (freed once no sandbox uses it); false when not held. */
  deleteSnapshot(snapshotId: string, team?: string): Promise<boolean> {
    return this.#snapshots.delete(snapshotId, team);
  }

  /**
   * `docker save` of a snapshot (by image id, so the receiver gets no tag of this node's) or
   * of an image by name (with its tags); the digest is the image id.
   */
  exportImage(name: string, signal: AbortSignal): Promise<ImageExport> {
    return this.#images.exportImage(name, signal);
  }

  /**
   * `docker load` of what another node's `exportImage` sent (skipped when this engine already
   * has that image id: two nodes on one engine), refused unless the engine then holds
   * `expected.digest`, and for a snapshot one labelled as that snapshot, which becomes this
   * instance's (a copy with this instance's label, sharing its layers).
   */
  importImage(
    name: string,
    body: ReadableStream<Uint8Array>,
    expected: { digest: string },
    signal: AbortSignal,
  ): Promise<void> {
    return this.#images.importImage(name, body, expected, signal);
  }

  /** Tags the image for `registry`, pushes it, and drops that tag again. */
  pushImage(name: string, registry: string, signal: AbortSignal): Promise<void> {
    return this.#images.pushImage(name, registry, signal);
  }

  /**
   * Pushes what `archive` kept of sandbox `sandboxId` to `registry` as
   * `<registry>/dormice-archive:<sandbox id>`, with `record` (the sandbox's ledger row, JSON) in
   * its `dormice.archive.record` label, so another node can resume it.
   */
  pushArchive(
    sandboxId: string,
    record: string,
    registry: string,
    signal: AbortSignal,
  ): Promise<void> {
    return this.#images.pushArchive(sandboxId, record, registry, signal);
  }

  /**
   * Pulls another node's archive of sandbox `sandboxId` from `registry` and keeps it as this
   * node's archive of it (so `restore` starts it); the record it was pushed with.
   *
   * @throws {ExecutorError} `not_found` when the registry has none.
   */
  pullArchive(sandboxId: string, registry: string, signal: AbortSignal): Promise<string> {
    return this.#images.pullArchive(sandboxId, registry, signal);
  }

  /** Pulls the image from `registry`; a snapshot becomes this instance's as a load's does. */
  pullImage(name: string, registry: string, signal: AbortSignal): Promise<void> {
    return this.#images.pullImage(name, registry, signal);
  }
  /**
   * The container's address on its network: the node's internal one, or its egress one for a
   * sandbox with egress. Whether anything listens there is for the connection to find out.
   */
  portAddress(id: string, port: number): Promise<PortAddress | null> {
    return this.#network.address(id, port);
  }

  /** The sandboxes of this instance's containers, and those paused to disk (their archives). */
  async list(): Promise<string[]> {
    const [running, archived] = await Promise.all([
      this.#containers.list(),
      this.#snapshots.archived(),
    ]);
    return [...new Set([...running, ...archived])].sort();
  }

  /**
   * Removes this instance's sandbox networks and their host firewall rules where no container is
   * left on them, whether or not this executor made them: the cleanup after a node that was
   * killed before it could close (the engine has address pools for about thirty networks).
   *
   * @throws {ExecutorError} when the engine or iptables fails.
   */
  removeNetworks(): Promise<void> {
    return this.#network.removeAll();
  }

  /** Containers labelled with this node's id but no instance: made before instance labels. */
  legacy(): Promise<string[]> {
    return this.#containers.legacy();
  }

  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    this.#commands.close();
    this.#images.close();
    const proxy = this.#proxy?.close();
    return Promise.all([proxy, this.#network.release()]).then(() => {});
  }
}
