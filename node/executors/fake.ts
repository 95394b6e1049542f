/**
 * `FakeExecutor`: sandboxes in memory, for tests and demos, with hooks to park, slow down or fail
 * any call. This file holds each sandbox's state and the verbs on it; its pieces live beside it:
 * the file tree (`_fake_fs.ts`), commands (`_fake_process.ts`, run by the shell in
 * `_fake_shell.ts`), served ports (`_fake_ports.ts`), the hooks (`_fake_hooks.ts`), snapshots and
 * their export (`_fake_snapshots.ts`), template builds (`_fake_template_build.ts`), egress rules
 * (`_fake_egress.ts`) and its options (`_fake_options.ts`).
 *
 * @module
 */
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
  type FileStream,
  type FsChange,
  type ImageExport,
  noEgress,
  type PortAddress,
  readFileStream,
  type SandboxLimits,
  type SandboxStats,
  type SnapshotInfo,
  snapshotNotFound,
  type SnapshotRequest,
  unknownVolume,
  type WatchRequest,
  type WriteOptions,
} from "./contract.ts";
import type { SandboxSpec } from "../../shared/schemas.ts";
import type { EgressRules } from "../../shared/egress_rules.ts";
import type { BuildIo, TemplateBuildSpec } from "./template_build.ts";
import { FakeSnapshots } from "./_fake_snapshots.ts";
import { FakeEgress } from "./_fake_egress.ts";
import { defaultTemplateNames, type FakeExecutorOptions } from "./_fake_options.ts";
import { buildFakeTemplate } from "./_fake_template_build.ts";
import { type FakePortHandler, FakePorts } from "./_fake_ports.ts";
import { FakeFs, fakeHomeOf, fakeUser } from "./_fake_fs.ts";
import { FakeProcess, type ProcessSandbox } from "./_fake_process.ts";
import type { Clock } from "../../shared/clock.ts";
import { systemClock } from "../../shared/clock.ts";
import { unknownTemplateError } from "./docker/templates.ts";
import { metadataUnsupported } from "./docker/_stat.ts";
import { FakeExecutorHooks } from "./_fake_hooks.ts";

export { type FakeCall, FakeExecutorHooks } from "./_fake_hooks.ts";
export type { FakeExecutorOptions } from "./_fake_options.ts";

interface FakeSandbox extends ProcessSandbox {
  id: string;
  processes: Map<number, FakeProcess>;
  /** The stop functions of its directory watches, called when it is destroyed. */
  watches: Set<() => void>;
  nextPid: number;
  destroyed: boolean;
}

/**
 * An executor whose sandboxes live in memory: a file tree per sandbox (home `/home/user`, `/tmp`)
 * and a small command interpreter (`echo`, `cat`, `ls`, `printf`, `sleep` that really waits,
 * `exit N`, `mkdir -p`, `rm`, `touch`, `ln -s`, `mv`, `chmod` (octal), `env`, `export`, quotes,
 * `$VAR`, `>`, `>>`, `>&2`, `2>&1`, `;`, `&&`, `||`, `bash -c` / `sh -c`, `bash` reading lines
 * from stdin; `printf` and `echo -e` escapes are bytes, as in bash). Unknown commands answer
 * `command not found` (127). A `tty` command gets one output stream and `stty size`, without
 * echo or line discipline. `pause()` makes exec and file calls wait until `resume()`, as a
 * frozen container would.
 *
 * @example
 * ```ts
 * import { FakeExecutor } from "@dormice/cluster/node";
 * const executor = new FakeExecutor();
 * await executor.create({ id: "sbx_1", name: "a", template: "base", spec: {}, env: {} });
 * const run = await executor.exec("sbx_1", { cmd: ["/bin/bash", "-l", "-c", "echo hi"] });
 * console.log(await new Response(run.stdout).text()); // "hi\n"
 * await executor.close();
 * ```
 */
export class FakeExecutor implements Executor {
  /** Always `"fake"`. */
  readonly kind: string = "fake";
  /** Test controls: park, slow down, fail and count calls. */
  readonly hooks: FakeExecutorHooks = new FakeExecutorHooks();
  #sandboxes = new Map<string, FakeSandbox>();
  /** Snapshots by id, each with the file tree it keeps; gone when deleted or the executor closes. */
  #snapshots = new FakeSnapshots();
  /** What `archive` kept, by sandbox id: its file tree; gone on restore, destroy or close. */
  #archives = new Map<string, FakeFs>();
  #nodeId: string;
  #ports = new FakePorts();
  #templates: Set<string>;
  #volumes: string[];
  #managedVolumes?: (name: string) => string | undefined;
  #clock: Clock;
  #defaults: SandboxLimits;
  #egress = new FakeEgress();
  /**
   * Replaces a sandbox's recorded egress rules, as the Docker executor's kernel rules would be
   * replaced. Absent when the executor was made with `egressRules: false`.
   */
  readonly setEgressRules?: (id: string, rules: EgressRules) => Promise<void>;

  /** An executor holding no sandboxes yet; `create` refuses a template outside `templates`. */
  constructor(
    {
      templates,
      volumes = [],
      managedVolumes,
      clock = systemClock,
      defaults = {},
      egressRules = true,
      nodeId = "fake",
    }: FakeExecutorOptions = {},
  ) {
    this.#nodeId = nodeId;
    this.#templates = new Set(templates ?? defaultTemplateNames());
    this.#volumes = [...volumes];
    this.#managedVolumes = managedVolumes;
    this.#clock = clock;
    this.#defaults = { cpus: 1, memoryMB: 512, ...defaults };
    if (egressRules) {
      this.setEgressRules = async (id, rules) => {
        await this.hooks.enter("setEgressRules");
        const sandbox = await this.#ready(id);
        if (
          sandbox.request.spec.network !== true && sandbox.request.spec.egressRules === undefined
        ) {
          throw noEgress(id);
        }
        this.#egress.record(id, rules);
      };
    }
  }

  /**
   * The egress rules a sandbox has now, as the executor would enforce them; `undefined` for a
   * sandbox without any (none asked at create and none set since, or destroyed).
   */
  egressRulesOf(id: string): EgressRules | undefined {
    return this.#egress.of(id);
  }

  /** Every rule set a sandbox was given, oldest first: each replaced the one before whole. */
  egressHistoryOf(id: string): EgressRules[] {
    return this.#egress.history(id);
  }

  /** The spec's cpus and memory, else the defaults; `stats()` reports the same. */
  limits(spec: SandboxSpec): SandboxLimits {
    return {
      cpus: spec.cpus ?? this.#defaults.cpus,
      memoryMB: spec.memoryMB ?? this.#defaults.memoryMB,
    };
  }

  /** Its `templates` and `volumes`, and whether it takes egress rules. */
  capabilities(): Promise<ExecutorCapabilities> {
    return Promise.resolve({
      templates: [...this.#templates],
      volumes: [...this.#volumes],
      egressRules: this.setEgressRules !== undefined,
    });
  }

  /**
   * Makes the sandbox's file tree (`/home/user`, `/tmp`, a few system directories). A taken id
   * is `exists`; a template outside `templates` is `invalid`, in the Docker executor's words.
   */
  async create(request: CreateRequest): Promise<void> {
    await this.hooks.enter("create");
    if (this.#sandboxes.has(request.id)) {
      throw new ExecutorError("exists", `A fake sandbox with id '${request.id}' already exists`);
    }
    const snapshot = request.snapshot === undefined
      ? undefined
      : this.#snapshots.get(request.snapshot);
    if (request.snapshot !== undefined && snapshot === undefined) {
      throw snapshotNotFound(request.snapshot);
    }
    if (snapshot === undefined && !this.#templates.has(request.template)) {
      throw unknownTemplateError(request.template, this.#templates);
    }
    this.#build(request, snapshot?.fs.copy(() => this.#clock.now()));
  }

  #build(request: CreateRequest, fs?: FakeFs): void {
    for (const v of request.spec.volumes ?? []) {
      if (!this.#volumes.includes(v.name) && this.#managedVolumes?.(v.name) === undefined) {
        throw unknownVolume(v.name, this.#volumes);
      }
    }
    if (request.spec.egressRules !== undefined) {
      if (this.setEgressRules === undefined) throw egressRulesUnserved();
      this.#egress.record(request.id, request.spec.egressRules);
    }
    this.#sandboxes.set(request.id, {
      id: request.id,
      request: structuredClone(request),
      fs: fs ?? new FakeFs(() => this.#clock.now()),
      paused: false,
      thaw: [],
      processes: new Map(),
      watches: new Set(),
      nextPid: 1,
      destroyed: false,
    });
  }

  /** Removes a sandbox, killing its processes, and what `archive` kept; an unknown id is not an error. */
  async destroy(id: string): Promise<void> {
    await this.hooks.enter("destroy");
    this.#archives.delete(id);
    await this.#remove(id);
  }

  /**
   * Keeps the sandbox's file tree and removes the sandbox (its processes killed, its ports
   * closed); `restore` builds it again from the tree.
   */
  async archive(id: string): Promise<void> {
    await this.hooks.enter("archive");
    const sandbox = this.#get(id);
    this.#archives.set(id, sandbox.fs.copy());
    await this.#remove(id);
  }

  /** Builds an archived sandbox again under its id, with its kept file tree. */
  async restore(request: CreateRequest): Promise<void> {
    await this.hooks.enter("restore");
    const fs = this.#archives.get(request.id);
    if (fs === undefined) {
      throw new ExecutorError(
        "gone",
        `the fake executor keeps no archive of sandbox '${request.id}'`,
      );
    }
    if (this.#sandboxes.has(request.id)) {
      throw new ExecutorError("exists", `A fake sandbox with id '${request.id}' already exists`);
    }
    this.#build(request, fs.copy(() => this.#clock.now()));
    this.#archives.delete(request.id);
  }

  async #remove(id: string): Promise<void> {
    const sandbox = this.#sandboxes.get(id);
    if (!sandbox) return;
    this.#sandboxes.delete(id);
    this.#egress.forget(id);
    sandbox.destroyed = true;
    for (const stop of [...sandbox.watches]) stop();
    await this.#ports.closeSandbox(id);
    for (const p of sandbox.processes.values()) await p.kill("SIGKILL");
    for (const go of sandbox.thaw.splice(0)) go();
  }

  /**
   * Runs `request.cmd` in the fake interpreter. Pids count from 1 in each sandbox; a `cwd` that
   * does not exist is `not_found`.
   */
  async exec(id: string, request: ExecRequest): Promise<ExecHandle> {
    await this.hooks.enter("exec");
    const sandbox = await this.#ready(id);
    if (request.cmd.length === 0) {
      throw new ExecutorError("invalid", "The command is empty: give at least a program name");
    }
    if (request.cwd !== undefined) {
      const cwd = sandbox.fs.resolve(request.cwd);
      if (!sandbox.fs.exists(cwd)) {
        throw new ExecutorError("not_found", `The working directory ${cwd} does not exist`);
      }
    }
    const pid = sandbox.nextPid++;
    const process = new FakeProcess(pid, sandbox, request, () => sandbox.processes.delete(pid));
    sandbox.processes.set(pid, process);
    return process;
  }

  /**
   * Writes a whole file, creating parents; what it creates is owned by the run-as user. A stream
   * is read into memory first (the fake keeps files in memory). `/dev/null` swallows what is
   * written to it, as on Linux, so a test can push gigabytes through a fake node unheld.
   */
  async writeFile(
    id: string,
    path: string,
    data: Uint8Array | FileStream,
    options: WriteOptions = {},
  ): Promise<FileEntry> {
    try {
      await this.hooks.enter("writeFile");
      const { fs, request } = await this.#ready(id);
      const target = resolveFor(fs, path, options);
      // Docker's busybox image has no setfattr to keep metadata with: refused as there.
      if (request.template === "minimal" && Object.keys(options.metadata ?? {}).length) {
        throw metadataUnsupported(target);
      }
      if (target === "/dev/null") {
        if (!(data instanceof Uint8Array)) {
          for await (const _ of data.stream) {
            /* swallowed */
          }
        }
        return {
          name: "null",
          path: target,
          type: "file",
          size: 0,
          mode: 0o666,
          owner: "root",
          group: "root",
          modifiedAt: this.#clock.now(),
        };
      }
      const bytes = data instanceof Uint8Array ? data : await readFileStream(data);
      return fs.write(target, bytes, {
        owner: fakeUser(options.user),
        chowned: true,
        metadata: options.metadata ?? null,
      });
    } finally {
      // A stream the write did not read to its end (a refusal, a failure) is let go of.
      if (!(data instanceof Uint8Array)) await data.stream.cancel().catch(() => {});
    }
  }

  /** A copy of the file's bytes; a directory is `is_dir`. */
  async readFile(id: string, path: string, options: FileOptions = {}): Promise<Uint8Array> {
    await this.hooks.enter("readFile");
    const { fs } = await this.#ready(id);
    return fs.read(resolveFor(fs, path, options));
  }

  /** The entries under `path` down to `depth` levels, sorted by path; a file is `not_dir`. */
  async listDir(
    id: string,
    path: string,
    depth = 1,
    options: FileOptions = {},
  ): Promise<FileEntry[]> {
    await this.hooks.enter("listDir");
    const { fs } = await this.#ready(id);
    return fs.list(resolveFor(fs, path, options), depth);
  }

  /** The entry of `path`: `not_found` when it does not exist, `not_dir` under a file. */
  async stat(id: string, path: string, options: FileOptions = {}): Promise<FileEntry> {
    await this.hooks.enter("stat");
    const { fs } = await this.#ready(id);
    return fs.stat(resolveFor(fs, path, options));
  }

  /** Creates a directory and its parents, owned by the run-as user. */
  async makeDir(id: string, path: string, options: FileOptions = {}): Promise<boolean> {
    await this.hooks.enter("makeDir");
    const { fs } = await this.#ready(id);
    return fs.mkdir(resolveFor(fs, path, options), {
      owner: fakeUser(options.user),
      chowned: true,
    });
  }

  /** Renames a file or a whole tree; `to`'s parent must exist, and `to` must not be a directory. */
  async move(
    id: string,
    from: string,
    to: string,
    options: FileOptions = {},
  ): Promise<FileEntry> {
    await this.hooks.enter("move");
    const { fs } = await this.#ready(id);
    return fs.move(resolveFor(fs, from, options), resolveFor(fs, to, options));
  }

  /** Removes a path (a tree for a directory); a missing one is not an error, as in envd. */
  async remove(id: string, path: string, options: FileOptions = {}): Promise<void> {
    await this.hooks.enter("remove");
    const { fs } = await this.#ready(id);
    try {
      fs.remove(resolveFor(fs, path, options));
    } catch (error) {
      if (!(error instanceof ExecutorError && error.code === "not_found")) throw error;
    }
  }

  /**
   * Watches a directory through the fake file tree's own change feed: every change, by a file
   * verb or a command, is seen the moment it is made. Ends when stopped or the sandbox is
   * destroyed.
   */
  async watch(
    id: string,
    request: WatchRequest,
    onChange: (change: FsChange) => void,
  ): Promise<DirWatch> {
    await this.hooks.enter("watch");
    const sandbox = await this.#ready(id);
    const dir = resolveFor(sandbox.fs, request.path, request);
    const unlisten = sandbox.fs.watch(dir, request.recursive ?? false, onChange);
    let ended!: () => void;
    const done = new Promise<void>((resolve) => ended = resolve);
    const stop = () => {
      unlisten();
      sandbox.watches.delete(stop);
      ended();
    };
    sandbox.watches.add(stop);
    return { ended: done, stop: () => Promise.resolve(stop()) };
  }

  /** Freezes the sandbox: later exec and file calls wait, running commands stop writing. */
  async pause(id: string): Promise<void> {
    await this.hooks.enter("pause");
    this.#get(id).paused = true;
  }

  /** Thaws the sandbox: the exec and file calls waiting on the pause go on. */
  async resume(id: string): Promise<void> {
    await this.hooks.enter("resume");
    const sandbox = this.#get(id);
    sandbox.paused = false;
    for (const go of sandbox.thaw.splice(0)) go();
  }

  /** Made-up but stable resource use (files count as memory and disk). */
  async stats(id: string): Promise<SandboxStats> {
    await this.hooks.enter("stats");
    const sandbox = this.#get(id);
    const bytes = sandbox.fs.bytes();
    const limits = this.limits(sandbox.request.spec);
    return {
      takenAt: this.#clock.now(),
      cpuUsedPct: 0,
      cpuCount: Math.max(1, Math.ceil(limits.cpus)),
      memoryUsedBytes: 8 * 1024 * 1024 + bytes,
      memoryLimitBytes: limits.memoryMB * 1024 * 1024,
      diskUsedBytes: bytes,
    };
  }

  /**
   * Copies the sandbox's file tree as a snapshot (a paused sandbox too: its files are still
   * there to copy). A name the team already uses is `exists`.
   */
  async snapshot(id: string, request: SnapshotRequest): Promise<SnapshotInfo> {
    await this.hooks.enter("snapshot");
    const sandbox = this.#get(id);
    const info: SnapshotInfo = {
      snapshotId: this.#snapshots.idFor(request),
      team: request.team,
      ...(request.name === undefined ? {} : { name: request.name }),
      sandboxId: id,
      template: sandbox.request.template,
      node: this.#nodeId,
      createdAt: this.#clock.now(),
      sizeBytes: sandbox.fs.bytes(),
    };
    this.#snapshots.keep(info, sandbox.fs.copy());
    return { ...info };
  }

  /**
   * Builds a template the way the Docker executor does, on a fake sandbox: `RUN` steps run in
   * the fake shell (a non-zero exit fails the step with its last output lines), a `COPY` needs
   * its uploaded files, `ENV`, `WORKDIR` and `USER` are accepted; the file tree is kept as the
   * snapshot `spec.templateId` of the team, named `spec.name`, replacing one by that id or name.
   */
  async buildTemplate(spec: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
    return await buildFakeTemplate(
      {
        templates: this.#templates,
        nodeId: this.#nodeId,
        snapshots: this.#snapshots,
        now: () => this.#clock.now(),
        create: (request) => this.create(request),
        exec: (id, request) => this.exec(id, request),
        fsOf: (id) => this.#get(id).fs,
        destroy: (id) => this.destroy(id),
      },
      spec,
      io,
    );
  }

  /** Publishes (or unpublishes) a built template of `team`; false when it holds none. */
  async setTemplatePublic(templateId: string, team: string, published: boolean): Promise<boolean> {
    await this.hooks.enter("listSnapshots");
    return this.#snapshots.setPublic(templateId, team, published);
  }

  /** Its snapshots (one team's, with every team's published templates, when `team` is given), oldest first. */
  async listSnapshots(team?: string): Promise<SnapshotInfo[]> {
    await this.hooks.enter("listSnapshots");
    return this.#snapshots.list(team);
  }

  /** Forgets a snapshot; false when it holds none by that id for `team`. */
  async deleteSnapshot(snapshotId: string, team?: string): Promise<boolean> {
    await this.hooks.enter("deleteSnapshot");
    return this.#snapshots.delete(snapshotId, team);
  }

  /**
   * Streams a snapshot it holds as JSON (its description and file tree), for another fake
   * executor's {@linkcode FakeExecutor.importImage}; the digest is the SHA-256 of those bytes.
   */
  async exportImage(name: string, _signal: AbortSignal): Promise<ImageExport> {
    await this.hooks.enter("exportImage");
    return await this.#snapshots.export(name);
  }

  /**
   * Loads a snapshot another fake executor exported, refusing it unless it is `name` with
   * `expected.digest`; it keeps the creation time and origin node it was taken with.
   */
  async importImage(
    name: string,
    body: ReadableStream<Uint8Array>,
    expected: { digest: string },
    _signal: AbortSignal,
  ): Promise<void> {
    await this.hooks.enter("importImage");
    await this.#snapshots.import(name, body, expected, () => this.#clock.now());
  }

  /** Ids of every sandbox it holds, archived ones too: in memory only, so none survive a restart. */
  async list(): Promise<string[]> {
    await this.hooks.enter("list");
    return [...new Set([...this.#sandboxes.keys(), ...this.#archives.keys()])];
  }

  /**
   * Serves `handler` as `port` of sandbox `id` (a test's stand-in for a server started in the
   * sandbox), on a loopback listener the node's port proxy reaches over TCP; closed with the
   * sandbox. An unknown sandbox is `gone`.
   */
  servePort(id: string, port: number, handler: FakePortHandler): Promise<void> {
    this.#get(id);
    return this.#ports.serve(id, port, handler);
  }

  /** Stops serving `port` of sandbox `id`: nothing listens there any more. */
  stopPort(id: string, port: number): Promise<void> {
    return this.#ports.stop(id, port);
  }

  /** The listener `servePort` started, or `null` when nothing serves that port. */
  async portAddress(id: string, port: number): Promise<PortAddress | null> {
    await this.hooks.enter("portAddress");
    this.#get(id);
    return this.#ports.address(id, port);
  }

  /** Kills every process and forgets every sandbox. */
  async close(): Promise<void> {
    this.hooks.clear();
    await this.#ports.closeAll();
    const all = [...this.#sandboxes.values()];
    this.#sandboxes.clear();
    this.#archives.clear();
    for (const sandbox of all) {
      sandbox.destroyed = true;
      for (const stop of [...sandbox.watches]) stop();
      for (const p of sandbox.processes.values()) await p.kill("SIGKILL");
      for (const go of sandbox.thaw.splice(0)) go();
      await Promise.all([...sandbox.processes.values()].map((p) => p.exited));
    }
  }

  #get(id: string): FakeSandbox {
    const sandbox = this.#sandboxes.get(id);
    if (!sandbox) {
      throw new ExecutorError("gone", `the fake executor has no sandbox with id '${id}'`);
    }
    return sandbox;
  }

  /** The sandbox once it is not paused (a frozen container blocks callers, it does not refuse). */
  async #ready(id: string): Promise<FakeSandbox> {
    const sandbox = this.#get(id);
    while (sandbox.paused && !sandbox.destroyed) {
      await new Promise<void>((resolve) => sandbox.thaw.push(resolve));
    }
    if (sandbox.destroyed) {
      throw new ExecutorError("gone", `the sandbox with id '${id}' was destroyed`);
    }
    return sandbox;
  }
}

/** Resolves a file verb's path from the run-as user's home, as envd resolves it. */
function resolveFor(fs: FakeFs, path: string, options: FileOptions): string {
  const home = fakeHomeOf(options.user);
  return fs.resolve(path, home, home);
}
