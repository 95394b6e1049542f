/**
 * `DockerExecutor`: the executor contract on a local Docker Engine, through `npm:dockerode`.
 * One container per sandbox, isolated by default (no network, every capability dropped,
 * `no-new-privileges`, cpu / memory / pids limits, the image's non-root user), exec with
 * demultiplexed streams, files by archive put/get.
 *
 * Requires `--allow-env --allow-net=unix:<socket> --allow-read=<socket> --allow-write=<socket>`
 * (the socket is `/var/run/docker.sock` by default).
 *
 * @module
 */
import Docker from "dockerode";
import { Buffer } from "node:buffer";
import { posix } from "node:path";
import type { Clock } from "../../../shared/clock.ts";
import { systemClock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import { silentLog } from "../../../shared/log.ts";
import {
  type CreateRequest,
  type ExecExit,
  type ExecHandle,
  type ExecRequest,
  type Executor,
  ExecutorError,
  type FileEntry,
  type SandboxStats,
} from "../contract.ts";
import { concat, readTar, writeTar } from "./_tar.ts";

/** The engine socket when `DOCKER_HOST` does not name another one. */
export const DEFAULT_DOCKER_SOCKET: string = "/var/run/docker.sock";

/** The template map when `DORMICE_TEMPLATES` is unset. */
export const DEFAULT_TEMPLATES: string = "base=dormice-base:latest";

/** Where to read how to build the base image; named in every missing-image error. */
const BUILD_HINT = "build it with deploy/images/build-base.sh (or `docker load` it)";

/** Every exec carries this variable, so a kill finds the command and all its descendants. */
const EXEC_TOKEN_VAR = "DORMICE_EXEC_ID";

/** The part of a dockerode `Docker` client this executor uses (dockerode ships no types). */
export interface DockerEngine {
  /** Answers when the engine is up. */
  ping(options: { abortSignal: AbortSignal }): Promise<unknown>;
  /** An image handle. */
  getImage(name: string): { inspect(options: { abortSignal: AbortSignal }): Promise<ImageInspect> };
  /** A container handle by id or name. */
  getContainer(name: string): EngineContainer;
  /** Creates a container. */
  createContainer(options: Record<string, unknown>): Promise<EngineContainer>;
  /** Lists containers. */
  listContainers(options: Record<string, unknown>): Promise<{ Labels?: Record<string, string> }[]>;
}

/** The part of a dockerode container handle this executor uses. */
export interface EngineContainer {
  /** Container details (`size: true` adds `SizeRw`). */
  inspect(options: Record<string, unknown>): Promise<ContainerInspect>;
  /** Starts it. */
  start(options: Record<string, unknown>): Promise<unknown>;
  /** Removes it. */
  remove(options: Record<string, unknown>): Promise<unknown>;
  /** Freezes it. */
  pause(options: Record<string, unknown>): Promise<unknown>;
  /** Thaws it. */
  unpause(options: Record<string, unknown>): Promise<unknown>;
  /** Creates a command. */
  exec(options: Record<string, unknown>): Promise<EngineExec>;
  /** Extracts a tar into a directory. */
  putArchive(tar: Uint8Array, options: Record<string, unknown>): Promise<unknown>;
  /** A tar of one path. */
  getArchive(options: Record<string, unknown>): Promise<AsyncIterable<Uint8Array>>;
  /** One stats sample. */
  stats(options: Record<string, unknown>): Promise<StatsSample>;
}

/** The part of a dockerode exec handle this executor uses. */
export interface EngineExec {
  /** Starts the command; with `hijack` the answer is the raw duplex socket. */
  start(options: Record<string, unknown>): Promise<unknown>;
  /** Running state and exit code. */
  inspect(
    options: Record<string, unknown>,
  ): Promise<{ Running: boolean; ExitCode: number | null; Pid?: number }>;
}

/** The fields of an image inspect this executor reads. */
export interface ImageInspect {
  /** The image's config. */
  Config?: { User?: string; WorkingDir?: string };
}

/** The fields of a container inspect this executor reads. */
export interface ContainerInspect {
  /** The container's config. */
  Config?: { User?: string; WorkingDir?: string };
  /** Run state. */
  State?: { StartedAt?: string };
  /** Limits. */
  HostConfig?: { NanoCpus?: number; Memory?: number };
  /** Bytes in the writable layer (with `size: true`). */
  SizeRw?: number;
}

/** The fields of a stats sample this executor reads. */
export interface StatsSample {
  /** CPU counters, ns. */
  cpu_stats?: {
    cpu_usage?: { total_usage?: number };
    system_cpu_usage?: number;
    online_cpus?: number;
  };
  /** Memory counters, bytes. */
  memory_stats?: {
    usage?: number;
    stats?: { inactive_file?: number; total_inactive_file?: number };
  };
}

/** Node-wide limits for a sandbox whose spec does not say. */
export interface DockerLimits {
  /** Cores (fractions allowed). */
  cpus: number;
  /** Memory, MiB (swap is not granted on top). */
  memoryMB: number;
  /** Processes and threads. */
  pids: number;
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
  /** Run containers under docker-init so orphaned processes are reaped (needs the engine's init). */
  init?: boolean;
  /** Time source for stats timestamps. */
  clock?: Clock;
  /** Structured log. */
  log?: Log;
}

/** Defaults of the limits, chosen for a 2-core worker running a handful of sandboxes. */
const DEFAULT_LIMITS: DockerLimits = { cpus: 1, memoryMB: 512, pids: 512 };

const TEMPLATE_NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/**
 * Parses `DORMICE_TEMPLATES` (`base=dormice-base:latest,python=my-python:3`) into a map, or
 * returns a sentence saying what is wrong. Unset or empty means {@link DEFAULT_TEMPLATES}.
 *
 * @example
 * ```ts
 * const templates = parseTemplates("base=dormice-base:latest");
 * if (typeof templates === "string") throw new Error(templates);
 * ```
 */
export function parseTemplates(value: string | undefined): Map<string, string> | string {
  const text = value?.trim() ? value : DEFAULT_TEMPLATES;
  const map = new Map<string, string>();
  for (const raw of text.split(",")) {
    const item = raw.trim();
    if (!item) continue;
    const eq = item.indexOf("=");
    const name = eq === -1 ? "" : item.slice(0, eq).trim();
    const image = eq === -1 ? "" : item.slice(eq + 1).trim();
    if (!name || !image) {
      return `DORMICE_TEMPLATES='${text}' has '${item}', which is not name=image: write e.g. ` +
        `base=dormice-base:latest,python=my-python:3`;
    }
    if (!TEMPLATE_NAME.test(name)) {
      return `DORMICE_TEMPLATES='${text}' names template '${name}': a template name is 1-64 ` +
        `lowercase letters, digits, '.', '_' or '-', starting with a letter or digit`;
    }
    if (/\s/.test(image)) {
      return `DORMICE_TEMPLATES='${text}' gives template '${name}' the image '${image}', which ` +
        `has a space: write a Docker image reference such as dormice-base:latest`;
    }
    if (map.has(name)) {
      return `DORMICE_TEMPLATES='${text}' names template '${name}' twice: keep one`;
    }
    map.set(name, image);
  }
  if (!map.has("base")) {
    return `DORMICE_TEMPLATES='${text}' has no 'base' template: add base=dormice-base:latest ` +
      `(the image deploy/images/build-base.sh builds)`;
  }
  return map;
}

/**
 * The engine's socket path from `DOCKER_HOST` (`unix://...`), or the default one.
 *
 * @example
 * ```ts ignore
 * import { dockerSocketPath } from "@dormice/cluster/docker";
 * dockerSocketPath(Deno.env); // "/var/run/docker.sock" unless DOCKER_HOST says otherwise
 * ```
 */
export function dockerSocketPath(env: { get(name: string): string | undefined }): string {
  const host = env.get("DOCKER_HOST");
  if (host?.startsWith("unix://")) return host.slice("unix://".length);
  return DEFAULT_DOCKER_SOCKET;
}

/** What the executor remembers of one sandbox's container. */
interface SandboxInfo {
  /** The image's user ("" for root). */
  user: string;
  /** Where relative paths and commands without a cwd start. */
  home: string;
  /** The user's numeric ids for files written by archive, once looked up. */
  ids?: Owner;
}

/** Who owns the files the executor writes: numeric ids for the tar, names for the entry. */
interface Owner {
  uid: number;
  gid: number;
  owner: string;
  group: string;
}

/** The name of the numeric id in a passwd/group file, or the number itself. */
function nameOf(table: string, id: number): string {
  const line = table.split("\n").find((l) => l.split(":")[2] === String(id));
  return line?.split(":")[0] || String(id);
}

/** The home: the image's working directory, else where the base image puts a user's home. */
function homeOf(user: string, workingDir: string | undefined): string {
  if (workingDir) return workingDir;
  return user && user !== "root" ? `/home/${user}` : "/root";
}

/** The last CPU sample of one sandbox, for a delta on the next stats call. */
interface CpuSample {
  cpu: number;
  system: number;
}

/** Result of a helper command. */
interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** A socket-like duplex as dockerode's hijacked exec gives it. */
interface HijackedStream {
  on(event: "data", listener: (chunk: Uint8Array) => void): unknown;
  on(event: "end" | "close", listener: () => void): unknown;
  on(event: "error", listener: (error: Error) => void): unknown;
  write(data: Uint8Array, callback: (error?: Error | null) => void): boolean;
  end(): unknown;
  pause(): unknown;
  resume(): unknown;
  destroy(): unknown;
}

/** A dockerode error: the engine's status and sentence, or a socket error code. */
interface EngineError {
  statusCode?: number;
  code?: string;
  json?: { message?: string } | null;
  message?: string;
}

const SIGNALS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 };

/** Stream high-water mark: like a pipe, a reader that falls this far behind stalls the command. */
const STREAM_HIGH_WATER_BYTES = 8 * 1024 * 1024;

/**
 * Signals the command started with a given token and every descendant that kept its
 * environment. Runs as the command's own user: with every capability dropped, nobody else
 * may read its `/proc/<pid>/environ` or signal it. Arguments: signal name, token.
 */
const KILL_SCRIPT = `sig=$1; tok=$2; self=$$
for d in /proc/[0-9]*; do
  p=\${d#/proc/}
  [ "$p" = "$self" ] && continue
  grep -qxzF "${EXEC_TOKEN_VAR}=$tok" "$d/environ" 2>/dev/null && kill -s "$sig" "$p" 2>/dev/null
done
exit 0`;

/** One `stat` line: mode (hex)/size/mtime/owner/group/path//%N (for the symlink target). */
const STAT_FORMAT = "%f/%s/%Y/%U/%G/%n//%N";

/** Describes one path. Exit 2: missing. */
const STAT_SCRIPT = `[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
exec stat -c '${STAT_FORMAT}' -- "$1"`;

/** Lists a directory down to a depth. Exit 2: missing; 3: not a directory. */
const LIST_SCRIPT = `[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
[ -d "$1" ] || { echo "not a directory" >&2; exit 3; }
case "$1" in */) d=$1 ;; *) d=$1/ ;; esac
find "$d" -mindepth 1 -maxdepth "$2" -exec stat -c '${STAT_FORMAT}' -- {} +`;

/** Creates a directory and parents. Exit 10: it existed; 11: a non-directory is there; 3: a parent is a file. */
const MKDIR_SCRIPT = `[ -d "$1" ] && exit 10
{ [ -e "$1" ] || [ -L "$1" ]; } && { echo "a file exists at that path" >&2; exit 11; }
a=$(dirname -- "$1")
while [ ! -e "$a" ]; do a=$(dirname -- "$a"); done
[ -d "$a" ] || { echo "not a directory: $a" >&2; exit 3; }
exec mkdir -p -- "$1"`;

/**
 * Renames like rename(2) with envd's rules: the target's parent must exist, an existing file is
 * replaced, an existing directory is refused. Exit 2: source missing; 5: target's parent
 * missing; 3: a parent is a file; 11: the target is a directory.
 */
const MOVE_SCRIPT = `[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
t=$(dirname -- "$2")
if [ ! -d "$t" ]; then
  [ -e "$t" ] && { echo "not a directory: $t" >&2; exit 3; }
  echo "no such directory: $t" >&2; exit 5
fi
if [ -d "$2" ] && [ ! -L "$2" ]; then echo "$2 is an existing directory" >&2; exit 11; fi
exec mv -f -- "$1" "$2"`;

/** Removes a path. Exit 2: missing. */
const REMOVE_SCRIPT =
  `[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
exec rm -rf -- "$1"`;

/** Docker's container-name alphabet; anything else in an id becomes '_'. */
function nameSafe(text: string): string {
  return text.replace(/[^a-zA-Z0-9_.-]/g, "_");
}

function engineMessage(error: EngineError): string {
  return (error.json?.message ?? error.message ?? String(error)).trim();
}

/** Resolves a path like envd does: relative to the home, `~` for the home. */
function resolvePath(path: string, home: string, what = "path"): string {
  if (typeof path !== "string" || path === "") {
    throw new ExecutorError("invalid", `The ${what} is empty: give a file path`);
  }
  if (path.includes("\0")) {
    throw new ExecutorError("invalid", `The ${what} has a NUL byte: give a plain file path`);
  }
  const expanded = path === "~" || path.startsWith("~/") ? home + path.slice(1) : path;
  return posix.resolve(home, expanded);
}

/**
 * Parses `stat -c STAT_FORMAT` output into entries. A line that does not start like a record
 * continues the previous path: file names may hold newlines.
 */
function parseStatLines(output: string): FileEntry[] {
  const head = /^([0-9a-f]+)\/(\d+)\/(\d+)\/([^/\n]*)\/([^/\n]*)\/(\/.*)$/;
  const records: string[][] = [];
  for (const line of output.replace(/\n$/, "").split("\n")) {
    const match = head.exec(line);
    if (match) records.push(match.slice(1));
    else if (records.length) records[records.length - 1][5] += "\n" + line;
  }
  return records.map(([modeHex, size, mtime, owner, group, rest]) => {
    const rawMode = parseInt(modeHex, 16);
    const kind = rawMode & 0o170000;
    // rest is "<path>//<%N>": %N repeats the path, or is "'<path>' -> '<target>'" for a link.
    const sep = kind === 0o120000 ? rest.indexOf("//'") : (rest.length - 2) / 2;
    const path = sep === -1 ? rest : rest.slice(0, sep);
    const quoted = sep === -1 ? "" : rest.slice(sep + 2);
    const type = kind === 0o040000 ? "dir" : kind === 0o120000 ? "symlink" : "file";
    const entry: FileEntry = {
      name: posix.basename(path) || "/",
      path,
      type,
      size: type === "dir" ? 0 : Number(size),
      mode: rawMode & 0o7777,
      owner,
      group,
      modifiedAt: Number(mtime) * 1000,
    };
    if (type === "symlink") {
      // %N prints 'path' -> 'target'
      const arrow = quoted.indexOf("' -> '");
      if (arrow !== -1) {
        entry.symlinkTarget = quoted.slice(arrow + 6, quoted.endsWith("'") ? -1 : undefined);
      }
    }
    return entry;
  });
}

/**
 * The executor contract on Docker: one container per sandbox, labelled with this node's id and
 * the ledger id.
 *
 * Killing a command: Docker has no "kill exec" call, so every command carries a unique
 * `DORMICE_EXEC_ID` in its environment and a kill runs a tiny script in the sandbox, as the
 * command's own user, that signals every process whose environment holds that token: the
 * command and all its descendants (a `bash -c` pipeline, a background job), without a pid file
 * and without reaching other commands.
 *
 * @example
 * ```ts
 * import { DockerExecutor } from "@dormice/cluster/docker";
 * const executor = await DockerExecutor.connect({ nodeId: "node-1" });
 * await executor.create({ id: "sb1", name: "demo", template: "base", spec: {}, env: {} });
 * const run = await executor.exec("sb1", { cmd: ["/bin/bash", "-l", "-c", "echo hi"] });
 * console.log(new TextDecoder().decode(await new Response(run.stdout).arrayBuffer()));
 * await executor.destroy("sb1");
 * ```
 */
export class DockerExecutor implements Executor {
  /** Always `"docker"`. */
  readonly kind: string = "docker";
  #docker: DockerEngine;
  #socketPath: string;
  #nodeId: string;
  #templates: Map<string, string>;
  #limits: DockerLimits;
  #callTimeoutMs: number;
  #createTimeoutMs: number;
  #fileTimeoutMs: number;
  #init: boolean;
  #clock: Clock;
  #log: Log;
  #info = new Map<string, SandboxInfo>();
  #cpu = new Map<string, CpuSample>();
  #open = new Set<HijackedStream>();
  /** Commands of each sandbox between their create and their process running. */
  #starting = new Map<string, Set<Promise<ExecHandle>>>();
  /** The pause in flight of each sandbox. */
  #pausing = new Map<string, Promise<void>>();
  #nextPid = 1;
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
      init = true,
      clock = systemClock,
      log = silentLog,
    } = options;
    if (!nodeId) throw new TypeError("Cannot create DockerExecutor as 'nodeId' is empty");
    let map = templates;
    if (!map) {
      const parsed = parseTemplates(undefined);
      if (typeof parsed === "string") throw new TypeError(parsed);
      map = parsed;
    }
    this.#docker = docker;
    this.#socketPath = socketPath;
    this.#nodeId = nodeId;
    this.#templates = map;
    this.#limits = { ...DEFAULT_LIMITS, ...defaults };
    this.#callTimeoutMs = callTimeoutMs;
    this.#createTimeoutMs = createTimeoutMs;
    this.#fileTimeoutMs = fileTimeoutMs;
    this.#init = init;
    this.#clock = clock;
    this.#log = log;
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
   * const executor = await DockerExecutor.connect({ nodeId: "node-1" });
   * ```
   */
  static async connect(options: DockerExecutorOptions): Promise<DockerExecutor> {
    const executor = new DockerExecutor(options);
    await executor.ping();
    for (const [template, image] of executor.#templates) {
      try {
        await executor.#call(
          `inspecting image ${image}`,
          (signal) => executor.#docker.getImage(image).inspect({ abortSignal: signal }),
        );
      } catch (error) {
        if (error instanceof ExecutorError && error.code === "not_found") {
          executor.#log(
            "warn",
            `Image ${image} of template '${template}' is missing: ${BUILD_HINT}`,
            {
              template,
              image,
            },
          );
        } else throw error;
      }
    }
    return executor;
  }

  /**
   * Checks that the engine answers.
   *
   * @throws {ExecutorError} `unavailable` naming the socket and how to start the engine.
   * @example
   * ```ts
   * import { DockerExecutor } from "@dormice/cluster/docker";
   * await new DockerExecutor({ nodeId: "node-1" }).ping();
   * ```
   */
  async ping(): Promise<void> {
    try {
      await this.#call("ping", (signal) => this.#docker.ping({ abortSignal: signal }));
    } catch (error) {
      // A permission refusal is not a down engine: its own sentence says which flags to add.
      if (error instanceof ExecutorError && /may not use the Docker socket/.test(error.message)) {
        throw error;
      }
      const why = error instanceof Error ? error.message : String(error);
      throw new ExecutorError(
        "unavailable",
        `The Docker engine does not answer on ${this.#socketPath} (${why}): start it ` +
          `(\`sudo systemctl start docker\`, or \`sudo dockerd &\`; .ci/docker.sh does both) or ` +
          `run the node with DORMICE_EXECUTOR=fake`,
      );
    }
  }

  #containerName(id: string): string {
    return `dormice-${nameSafe(this.#nodeId)}-${nameSafe(id)}`;
  }

  #container(id: string): EngineContainer {
    return this.#docker.getContainer(this.#containerName(id));
  }

  /** Runs one engine call under its own deadline and turns failures into ExecutorErrors. */
  async #call<T>(
    what: string,
    fn: (signal: AbortSignal) => Promise<T>,
    timeoutMs: number = this.#callTimeoutMs,
  ): Promise<T> {
    const controller = new AbortController();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        // Reject first: aborting settles the call at once with its own, vaguer error.
        reject(
          new ExecutorError(
            "timeout",
            `The Docker engine did not finish ${what} within ${timeoutMs} ms: check it with ` +
              `\`docker info\` (a hung or overloaded engine) and retry`,
          ),
        );
        controller.abort();
      }, timeoutMs);
    });
    const work = fn(controller.signal);
    work.catch(() => {}); // a call that loses the race must not become an unhandled rejection
    try {
      return await Promise.race([work, deadline]);
    } catch (error) {
      throw this.#translate(error, what);
    } finally {
      clearTimeout(timer);
    }
  }

  #translate(error: unknown, what: string): Error {
    if (error instanceof ExecutorError) return error;
    if (error instanceof Deno.errors.NotCapable || error instanceof Deno.errors.PermissionDenied) {
      return new ExecutorError(
        "unavailable",
        `This process may not use the Docker socket ${this.#socketPath} (${error.message}): run ` +
          `it with --allow-net=unix:${this.#socketPath} --allow-read=${this.#socketPath} ` +
          `--allow-write=${this.#socketPath}`,
      );
    }
    const e = (error ?? {}) as EngineError;
    const message = engineMessage(e);
    if (e.statusCode === 404) return new ExecutorError("not_found", message);
    if (e.statusCode === 400) return new ExecutorError("invalid", message);
    if (e.statusCode === 409) {
      if (/is paused/i.test(message)) {
        return new ExecutorError("invalid", `${message}: resume the sandbox first`);
      }
      if (/is not running/i.test(message)) {
        return new ExecutorError("unavailable", `${message}: the sandbox's container stopped`);
      }
      return new ExecutorError("exists", message);
    }
    if (
      e.code &&
      ["ECONNREFUSED", "ENOENT", "EACCES", "ECONNRESET", "EPIPE", "EPERM"].includes(e.code)
    ) {
      return new ExecutorError(
        "unavailable",
        `The Docker engine on ${this.#socketPath} failed ${what} (${e.code}): check that dockerd ` +
          `runs and that this process may use the socket`,
      );
    }
    return new ExecutorError("unavailable", `The Docker engine failed ${what}: ${message}`);
  }

  #notFound(id: string): ExecutorError {
    return new ExecutorError(
      "not_found",
      `Sandbox '${id}' has no container on this node (${this.#containerName(id)}): it was ` +
        `destroyed or never created`,
    );
  }

  /** The remembered facts of a sandbox, from the engine after a restart of the node. */
  async #sandbox(id: string): Promise<SandboxInfo> {
    const known = this.#info.get(id);
    if (known) return known;
    let inspect;
    try {
      inspect = await this.#call(
        `inspecting the container of sandbox ${id}`,
        (signal) => this.#container(id).inspect({ abortSignal: signal }),
      );
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") throw this.#notFound(id);
      throw error;
    }
    const user = inspect.Config?.User ?? "";
    const info = { user, home: homeOf(user, inspect.Config?.WorkingDir) };
    this.#info.set(id, info);
    return info;
  }

  async create(request: CreateRequest): Promise<void> {
    const { id, name, template, spec } = request;
    const image = this.#templates.get(template);
    if (!image) {
      throw new ExecutorError(
        "invalid",
        `Template '${template}' is not known on this node: use one of ` +
          `${[...this.#templates.keys()].join(", ")} (DORMICE_TEMPLATES)`,
      );
    }
    let imageInfo;
    try {
      imageInfo = await this.#call(
        `inspecting image ${image}`,
        (signal) => this.#docker.getImage(image).inspect({ abortSignal: signal }),
      );
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") {
        throw new ExecutorError(
          "unavailable",
          `Image ${image} of template '${template}' is not in the Docker engine: ${BUILD_HINT}`,
        );
      }
      throw error;
    }
    const cpus = spec.cpus ?? this.#limits.cpus;
    const memory = (spec.memoryMB ?? this.#limits.memoryMB) * 1024 * 1024;
    const env = { ...spec.env, ...request.env };
    const user: string = imageInfo.Config?.User ?? "";
    const containerName = this.#containerName(id);
    const container = await this.#call(
      `creating the container of sandbox ${id}`,
      (signal) =>
        this.#docker.createContainer(
          {
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
              NetworkMode: spec.network ? "bridge" : "none",
              // Nothing is added back: commands run as the image's user, and file transfers are
              // done by the engine, outside the container's capability set.
              CapDrop: ["ALL"],
              SecurityOpt: ["no-new-privileges"],
              NanoCpus: Math.round(cpus * 1e9),
              Memory: memory,
              MemorySwap: memory,
              PidsLimit: spec.pids ?? this.#limits.pids,
              RestartPolicy: { Name: "no" },
              LogConfig: { Type: "none", Config: {} },
            },
            abortSignal: signal,
          },
        ),
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
      await this.#call(
        `starting the container of sandbox ${id}`,
        (signal) => container.start({ abortSignal: signal }),
        this.#createTimeoutMs,
      );
    } catch (error) {
      await this.destroy(id).catch(() => {});
      throw error;
    }
    this.#info.set(id, { user, home: homeOf(user, imageInfo.Config?.WorkingDir) });
    this.#log("debug", "Sandbox container started", { id, image, container: containerName });
  }

  async destroy(id: string): Promise<void> {
    this.#info.delete(id);
    this.#cpu.delete(id);
    try {
      // Force removal kills and removes in one call: a sandbox has nothing to flush on stop.
      await this.#call(
        `removing the container of sandbox ${id}`,
        (signal) => this.#container(id).remove({ force: true, v: true, abortSignal: signal }),
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

  async exec(id: string, request: ExecRequest): Promise<ExecHandle> {
    if (!Array.isArray(request.cmd) || request.cmd.length === 0) {
      throw new ExecutorError(
        "invalid",
        "The command is empty: give argv, e.g. ['sh', '-c', 'ls']",
      );
    }
    const info = await this.#sandbox(id);
    // Without a cwd the engine starts in the image's working directory, which is the home.
    const cwd = request.cwd === undefined
      ? undefined
      : resolvePath(request.cwd, info.home, "working directory");
    if (request.cwd !== undefined) {
      // The engine reports a missing cwd only inside the output stream, after start; ask first
      // so the caller gets not_found like every other path error.
      const check = await this.#run(id, ["/bin/sh", "-c", '[ -d "$1" ]', "sh", cwd!]);
      if (check.code !== 0) {
        throw new ExecutorError("not_found", `The working directory ${cwd} does not exist`);
      }
    }
    // The image's user by default; root only when asked for by name, since a user name that the
    // image lacks would fail the exec (E2B always sends one).
    const user = request.user === "root" ? "root" : info.user;
    const token = crypto.randomUUID();
    const env = Object.entries(request.env ?? {}).map(([key, value]) => `${key}=${value}`);
    env.push(`${EXEC_TOKEN_VAR}=${token}`);
    // No exec may start while a pause freezes the sandbox, nor a pause while an exec starts:
    // runc would wait in the frozen cgroup holding the container's lock in the engine (see
    // #started). Nothing awaits between the check and the registration, so neither side misses
    // the other.
    while (this.#pausing.has(id)) await this.#pausing.get(id)!.catch(() => {});
    const starting = this.#start(id, request, env, cwd, user, token);
    let set = this.#starting.get(id);
    if (!set) this.#starting.set(id, set = new Set());
    set.add(starting);
    try {
      return await starting;
    } finally {
      set.delete(starting);
      if (set.size === 0 && this.#starting.get(id) === set) this.#starting.delete(id);
    }
  }

  /** Creates and starts one command, returning once its process runs. */
  async #start(
    id: string,
    request: ExecRequest,
    env: string[],
    cwd: string | undefined,
    user: string,
    token: string,
  ): Promise<ExecHandle> {
    const container = this.#container(id);
    const exec = await this.#call(
      `creating a command in sandbox ${id}`,
      (signal) =>
        container.exec(
          {
            Cmd: request.cmd,
            AttachStdin: request.stdin === true,
            AttachStdout: true,
            AttachStderr: true,
            Tty: false,
            Env: env,
            WorkingDir: cwd,
            User: user,
            abortSignal: signal,
          },
        ),
    ).catch((error) => {
      if (error instanceof ExecutorError && error.code === "not_found") throw this.#notFound(id);
      throw error;
    });
    const stream = await this.#call(
      `starting a command in sandbox ${id}`,
      (signal) =>
        exec.start({ hijack: true, stdin: request.stdin === true, abortSignal: signal }) as Promise<
          unknown
        >,
    ) as HijackedStream;
    // Listen first: a quick command's output and end come while #started() waits.
    const handle = this.#handle(id, exec, stream, token, user, request);
    await this.#started(exec);
    return handle;
  }

  /**
   * Waits until the engine reports the command's process (or its end). The engine answers the
   * start before runc has put the process in the container; a pause in that window (a pause
   * right after a start) leaves runc waiting in a frozen cgroup, holding the container's lock in
   * the engine, so even the unpause hangs.
   */
  async #started(exec: EngineExec): Promise<void> {
    for (let attempt = 0; attempt < 200; attempt++) {
      let info;
      try {
        info = await this.#call(
          "inspecting a starting command",
          (signal) => exec.inspect({ abortSignal: signal }),
        );
      } catch {
        return;
      }
      if ((info.Pid ?? 0) > 0 || (!info.Running && info.ExitCode !== null)) return;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  }

  #handle(
    id: string,
    exec: EngineExec,
    stream: HijackedStream,
    token: string,
    user: string,
    request: ExecRequest,
  ): ExecHandle {
    this.#open.add(stream);
    const pid = this.#nextPid++;
    let ended = false;
    let timedOut = false;
    let sentSignal: string | undefined;
    let stdinClosed = request.stdin !== true;
    const controllers: (ReadableStreamDefaultController<Uint8Array> | undefined)[] = [];
    const cancelled = [false, false];
    const strategy = { highWaterMark: STREAM_HIGH_WATER_BYTES, size: (c: Uint8Array) => c.length };
    const make = (index: number) =>
      new ReadableStream<Uint8Array>({
        start: (controller) => {
          controllers[index] = controller;
        },
        pull: () => {
          stream.resume();
        },
        cancel: () => {
          cancelled[index] = true;
          stream.resume();
        },
      }, strategy);
    const stdout = make(0);
    const stderr = make(1);

    // Docker's multiplexed frames: [stream, 0, 0, 0, size (u32 BE)] then size bytes.
    let pending: Uint8Array = new Uint8Array();
    stream.on("data", (chunk) => {
      pending = pending.length ? concat([pending, chunk]) : new Uint8Array(chunk);
      while (pending.length >= 8) {
        const size = new DataView(pending.buffer, pending.byteOffset + 4, 4).getUint32(0);
        if (pending.length < 8 + size) break;
        const which = pending[0] === 2 ? 1 : 0;
        const frame = pending.slice(8, 8 + size);
        pending = pending.subarray(8 + size);
        const controller = controllers[which];
        if (!cancelled[which] && controller && frame.length) {
          controller.enqueue(frame);
          if ((controller.desiredSize ?? 1) <= 0) stream.pause();
        }
      }
    });

    const exited = new Promise<ExecExit>((resolve) => {
      let settled = false;
      const finish = async () => {
        if (settled) return;
        settled = true;
        ended = true;
        this.#open.delete(stream);
        clearTimeout(timer);
        for (let i = 0; i < 2; i++) {
          if (!cancelled[i]) {
            try {
              controllers[i]?.close();
            } catch { /* already closed */ }
          }
        }
        resolve(await this.#exitOf(exec, timedOut, sentSignal));
      };
      stream.on("end", finish);
      stream.on("close", finish);
      stream.on("error", (error) => {
        this.#log("warn", "A command's stream from the Docker engine failed", {
          id,
          pid,
          error: error.message,
        });
        finish();
      });
    });

    const kill = async (signal: "SIGKILL" | "SIGTERM" | "SIGINT" | "SIGHUP" = "SIGKILL") => {
      if (ended) return;
      sentSignal ??= signal;
      await this.#run(id, ["/bin/sh", "-c", KILL_SCRIPT, "sh", signal.slice(3), token], user);
    };

    const timer = request.timeoutMs !== undefined
      ? setTimeout(() => {
        timedOut = true;
        kill("SIGKILL").catch((error) =>
          this.#log("warn", "Could not kill a command past its timeout", {
            id,
            pid,
            error: error instanceof Error ? error.message : String(error),
          })
        );
      }, request.timeoutMs)
      : undefined;

    if (request.stdin !== true) stream.end();

    return {
      pid,
      stdout,
      stderr,
      exited,
      writeStdin: (data: Uint8Array): Promise<void> => {
        if (request.stdin !== true) {
          return Promise.reject(
            new ExecutorError(
              "invalid",
              `Command ${pid} was started without stdin: start it with stdin`,
            ),
          );
        }
        if (ended || stdinClosed) {
          return Promise.reject(
            new ExecutorError("invalid", `The stdin of command ${pid} is closed (or it has ended)`),
          );
        }
        return new Promise((resolve, reject) =>
          stream.write(
            data,
            (error) =>
              error
                ? reject(
                  new ExecutorError(
                    "unavailable",
                    `Cannot write to command ${pid}: ${error.message}`,
                  ),
                )
                : resolve(),
          )
        );
      },
      closeStdin: (): Promise<void> => {
        if (request.stdin === true && !ended && !stdinClosed) stream.end();
        stdinClosed = true;
        return Promise.resolve();
      },
      kill,
    };
  }

  /** The exit code from exec inspect; the stream can end a moment before the engine records it. */
  async #exitOf(exec: EngineExec, timedOut: boolean, sentSignal?: string): Promise<ExecExit> {
    let exitCode = -1;
    for (let attempt = 0; attempt < 50; attempt++) {
      try {
        const info = await this.#call(
          "inspecting a finished command",
          (signal) => exec.inspect({ abortSignal: signal }),
        );
        if (!info.Running && info.ExitCode !== null && info.ExitCode !== undefined) {
          exitCode = info.ExitCode;
          break;
        }
      } catch {
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const exit: ExecExit = { exitCode };
    const signalled = timedOut ? "SIGKILL" : sentSignal;
    if (signalled && exitCode === 128 + SIGNALS[signalled]) exit.signal = signalled;
    if (timedOut) exit.timedOut = true;
    return exit;
  }

  /** Runs a helper command to its end and collects its output, under the file deadline. */
  async #run(id: string, cmd: string[], user?: string): Promise<RunResult> {
    const info = await this.#sandbox(id);
    const handle = await this.exec(id, {
      cmd,
      user: user ?? (info.user || "root"),
    });
    const collect = async (stream: ReadableStream<Uint8Array>) =>
      new TextDecoder().decode(await new Response(stream).arrayBuffer());
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        handle.kill("SIGKILL").catch(() => {});
        reject(
          new ExecutorError(
            "timeout",
            `A helper command (${cmd[0]}) in sandbox ${id} ran past ${this.#fileTimeoutMs} ms: ` +
              `the sandbox may be overloaded`,
          ),
        );
      }, this.#fileTimeoutMs);
    });
    try {
      const [stdout, stderr, exit] = await Promise.race([
        Promise.all([collect(handle.stdout), collect(handle.stderr), handle.exited]),
        deadline,
      ]);
      return { code: exit.exitCode, stdout, stderr };
    } finally {
      clearTimeout(timer);
    }
  }

  /** Turns a helper script's failure into the contract's error. */
  #fail(result: RunResult, what: string, path: string): ExecutorError {
    const said = result.stderr.trim().split("\n").pop() ?? "";
    if (result.code === 2 || /no such file/i.test(said)) {
      return new ExecutorError("not_found", `Cannot ${what} '${path}': no such file or directory`);
    }
    if (result.code === 3 || /not a directory/i.test(said)) {
      return new ExecutorError(
        "not_dir",
        `Cannot ${what} '${path}': a path component is not a directory`,
      );
    }
    if (result.code === 4) {
      return new ExecutorError("is_dir", `Cannot ${what} '${path}': ${said}`);
    }
    if (result.code === 11 || /exists/i.test(said)) {
      return new ExecutorError(
        "exists",
        `Cannot ${what} '${path}': ${said || "it already exists"}`,
      );
    }
    return new ExecutorError(
      "invalid",
      `Cannot ${what} '${path}': ${said || `exit ${result.code}`}`,
    );
  }

  async writeFile(id: string, path: string, data: Uint8Array): Promise<FileEntry> {
    const target = resolvePath(path, (await this.#sandbox(id)).home);
    if (target === "/") throw new ExecutorError("is_dir", "Cannot write '/': it is a directory");
    const dir = posix.dirname(target);
    const { uid, gid, owner, group } = await this.#ids(id);
    // Whole seconds: what a tar header keeps, so the entry says what stat would.
    const modifiedAt = Math.floor(this.#clock.now() / 1000) * 1000;
    const tar = writeTar([{
      name: posix.basename(target),
      type: "file",
      data,
      mode: 0o644,
      mtimeMs: modifiedAt,
      uid,
      gid,
    }]);
    const put = () =>
      this.#call(
        `writing ${target} in sandbox ${id}`,
        (signal) =>
          // docker-modem sends a Buffer as the body; any other object must be a node stream.
          this.#container(id).putArchive(Buffer.from(tar.buffer, tar.byteOffset, tar.length), {
            path: dir,
            noOverwriteDirNonDir: true,
            abortSignal: signal,
          }),
        this.#fileTimeoutMs,
      );
    try {
      await put();
    } catch (error) {
      if (!(error instanceof ExecutorError)) throw error;
      if (error.code === "not_found") {
        await this.makeDir(id, dir);
        await put().catch((again) => {
          throw this.#fileError(again, id, "write", target);
        });
      } else throw this.#fileError(error, id, "write", target);
    }
    // The archive replaced whatever was there with exactly this header: no stat round trip.
    return {
      name: posix.basename(target),
      path: target,
      type: "file",
      size: data.length,
      mode: 0o644,
      owner,
      group,
      modifiedAt,
    };
  }

  #fileError(error: unknown, id: string, what: string, path: string): unknown {
    if (!(error instanceof ExecutorError)) return error;
    // The engine's 404 for a missing path also says "no such container" in dockerode's wrapper,
    // so the path's own sentence must win before the container one is considered.
    const missingPath = /could not find the file|no such file/i.test(error.message);
    if (!missingPath && /no such container/i.test(error.message)) return this.#notFound(id);
    if (error.code !== "timeout") {
      if (/not a directory/i.test(error.message)) {
        return new ExecutorError(
          "not_dir",
          `Cannot ${what} '${path}': a path component is not a directory`,
        );
      }
      if (/cannot overwrite directory|is a directory/i.test(error.message)) {
        return new ExecutorError("is_dir", `Cannot ${what} '${path}': it is a directory`);
      }
    }
    if (error.code === "not_found") {
      return new ExecutorError("not_found", `Cannot ${what} '${path}': no such file or directory`);
    }
    return error;
  }

  /**
   * The numeric ids of the sandbox's user, from the container's /etc/passwd (read by archive,
   * not exec). The engine extracts archives as root with the header's owner; its own
   * `copyUIDGID` looks the name up on the host on some versions, so it cannot be trusted.
   */
  async #ids(id: string): Promise<Owner> {
    const info = await this.#sandbox(id);
    if (info.ids) return info.ids;
    const [name, group] = info.user.split(":");
    const [passwd, groups] = (await Promise.all(
      ["/etc/passwd", "/etc/group"].map((file) => this.readFile(id, file).catch(() => null)),
    )).map((bytes) => bytes ? new TextDecoder().decode(bytes) : "");
    let uid = 0, gid = 0;
    if (/^\d+$/.test(name ?? "")) {
      uid = Number(name);
      gid = /^\d+$/.test(group ?? "") ? Number(group) : uid;
    } else if (name && name !== "root") {
      const fields = passwd.split("\n").find((l) => l.split(":")[0] === name)?.split(":") ?? [];
      if (fields.length < 4) {
        throw new ExecutorError(
          "invalid",
          `Sandbox '${id}' runs as '${name}', who is not in its /etc/passwd: fix the image`,
        );
      }
      uid = Number(fields[2]);
      gid = Number(fields[3]);
    }
    info.ids = { uid, gid, owner: nameOf(passwd, uid), group: nameOf(groups, gid) };
    return info.ids;
  }

  async readFile(id: string, path: string): Promise<Uint8Array> {
    let target = resolvePath(path, (await this.#sandbox(id)).home);
    // Docker archives a symlink as itself; follow a few hops like a reader would.
    for (let hop = 0; hop < 8; hop++) {
      let tar: Uint8Array;
      try {
        tar = await this.#call(`reading ${target} in sandbox ${id}`, async (signal) => {
          const body = await this.#container(id).getArchive({ path: target, abortSignal: signal });
          const chunks: Uint8Array[] = [];
          for await (const chunk of body as AsyncIterable<Uint8Array>) chunks.push(chunk);
          return concat(chunks);
        }, this.#fileTimeoutMs);
      } catch (error) {
        throw this.#fileError(error, id, "read", path);
      }
      const [entry] = readTar(tar);
      if (!entry) {
        throw new ExecutorError("not_found", `Cannot read '${path}': the engine sent no file`);
      }
      if (entry.type === "dir") {
        throw new ExecutorError("is_dir", `Cannot read '${path}': it is a directory`);
      }
      if (entry.type !== "symlink") return entry.data;
      target = posix.resolve(posix.dirname(target), entry.linkName);
    }
    throw new ExecutorError("invalid", `Cannot read '${path}': too many levels of symbolic links`);
  }

  async listDir(id: string, path: string, depth = 1): Promise<FileEntry[]> {
    const target = resolvePath(path, (await this.#sandbox(id)).home);
    if (!Number.isFinite(depth)) {
      throw new ExecutorError("invalid", `The depth ${depth} is not a number: give 1 or more`);
    }
    // Like the fake, a depth under 1 lists the children; a cap keeps one call bounded.
    const levels = Math.min(64, Math.max(1, Math.floor(depth)));
    const result = await this.#run(id, [
      "/bin/sh",
      "-c",
      LIST_SCRIPT,
      "sh",
      target,
      String(levels),
    ]);
    if (result.code !== 0) throw this.#fail(result, "list", target);
    return parseStatLines(result.stdout).sort((a, b) =>
      a.path < b.path ? -1 : a.path > b.path ? 1 : 0
    );
  }

  async stat(id: string, path: string): Promise<FileEntry> {
    const target = resolvePath(path, (await this.#sandbox(id)).home);
    const result = await this.#run(id, ["/bin/sh", "-c", STAT_SCRIPT, "sh", target]);
    if (result.code !== 0) throw this.#fail(result, "stat", target);
    const [entry] = parseStatLines(result.stdout);
    if (!entry) {
      throw new ExecutorError("not_found", `Cannot stat '${target}': no answer from stat`);
    }
    return entry;
  }

  async makeDir(id: string, path: string): Promise<boolean> {
    const target = resolvePath(path, (await this.#sandbox(id)).home);
    const result = await this.#run(id, ["/bin/sh", "-c", MKDIR_SCRIPT, "sh", target]);
    if (result.code === 10) return false;
    if (result.code !== 0) throw this.#fail(result, "make directory", target);
    return true;
  }

  async move(id: string, from: string, to: string): Promise<FileEntry> {
    const { home } = await this.#sandbox(id);
    const source = resolvePath(from, home, "source path");
    const target = resolvePath(to, home, "target path");
    if (source === "/" || source === target || target.startsWith(source + "/")) {
      throw new ExecutorError("invalid", `Cannot move ${source} into itself (${target})`);
    }
    const result = await this.#run(id, ["/bin/sh", "-c", MOVE_SCRIPT, "sh", source, target]);
    if (result.code === 5) {
      throw new ExecutorError("not_found", `Cannot move to '${target}': its parent does not exist`);
    }
    if (result.code !== 0) throw this.#fail(result, "move", result.code === 2 ? source : target);
    return await this.stat(id, target);
  }

  async remove(id: string, path: string): Promise<void> {
    const target = resolvePath(path, (await this.#sandbox(id)).home);
    if (target === "/") {
      throw new ExecutorError("invalid", "Refusing to remove '/': name a path below it");
    }
    const result = await this.#run(id, ["/bin/sh", "-c", REMOVE_SCRIPT, "sh", target]);
    if (result.code !== 0) throw this.#fail(result, "remove", target);
  }

  pause(id: string): Promise<void> {
    // Commands still starting go first (see exec()); later ones wait for this pause to settle.
    const waits = [...(this.#starting.get(id) ?? [])];
    const run = Promise.allSettled(waits).then(() => this.#pause(id));
    this.#pausing.set(id, run);
    const clear = () => {
      if (this.#pausing.get(id) === run) this.#pausing.delete(id);
    };
    run.then(clear, clear);
    return run;
  }

  async #pause(id: string): Promise<void> {
    try {
      await this.#call(
        `pausing sandbox ${id}`,
        (signal) => this.#container(id).pause({ abortSignal: signal }),
      );
    } catch (error) {
      if (error instanceof ExecutorError) {
        if (error.code === "not_found") throw this.#notFound(id);
        if (/already paused/i.test(error.message)) return;
      }
      throw error;
    }
  }

  async resume(id: string): Promise<void> {
    try {
      await this.#call(
        `resuming sandbox ${id}`,
        (signal) => this.#container(id).unpause({ abortSignal: signal }),
      );
    } catch (error) {
      if (error instanceof ExecutorError) {
        if (error.code === "not_found") throw this.#notFound(id);
        if (/not paused/i.test(error.message)) return;
      }
      throw error;
    }
  }

  async stats(id: string): Promise<SandboxStats> {
    const container = this.#container(id);
    let sample, inspect;
    try {
      [sample, inspect] = await Promise.all([
        this.#call(
          `reading stats of sandbox ${id}`,
          (signal) => container.stats({ stream: false, "one-shot": true, abortSignal: signal }),
        ),
        this.#call(
          `inspecting sandbox ${id}`,
          (signal) => container.inspect({ size: true, abortSignal: signal }),
        ),
      ]);
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") throw this.#notFound(id);
      throw error;
    }
    const takenAt = this.#clock.now();
    const cpu = Number(sample.cpu_stats?.cpu_usage?.total_usage ?? 0);
    const system = Number(sample.cpu_stats?.system_cpu_usage ?? 0);
    const online = Number(sample.cpu_stats?.online_cpus ?? 1) || 1;
    const previous = this.#cpu.get(id);
    let cpuUsedPct = 0;
    if (previous && system > previous.system) {
      cpuUsedPct = ((cpu - previous.cpu) / (system - previous.system)) * online * 100;
    } else {
      // No earlier sample: the average since the container started.
      const started = Date.parse(inspect.State?.StartedAt ?? "");
      const elapsedNs = (Date.now() - started) * 1e6;
      if (elapsedNs > 0) cpuUsedPct = (cpu / elapsedNs) * 100;
    }
    this.#cpu.set(id, { cpu, system });
    const memoryStats = sample.memory_stats ?? {};
    const cache = Number(
      memoryStats.stats?.inactive_file ?? memoryStats.stats?.total_inactive_file ?? 0,
    );
    const nanoCpus = Number(inspect.HostConfig?.NanoCpus ?? 0);
    return {
      takenAt,
      cpuUsedPct: Math.max(0, Math.round(cpuUsedPct * 100) / 100),
      cpuCount: nanoCpus > 0 ? Math.max(1, Math.ceil(nanoCpus / 1e9)) : online,
      memoryUsedBytes: Math.max(0, Number(memoryStats.usage ?? 0) - cache),
      memoryLimitBytes: Number(inspect.HostConfig?.Memory ?? 0),
      diskUsedBytes: Number((inspect as { SizeRw?: number }).SizeRw ?? 0),
    };
  }

  async list(): Promise<string[]> {
    const containers = await this.#call(
      "listing this node's containers",
      (signal) =>
        this.#docker.listContainers(
          {
            all: true,
            filters: { label: [`dormice.node=${this.#nodeId}`] },
            abortSignal: signal,
          },
        ),
    );
    return containers.map((c) => c.Labels?.["dormice.sandbox"]).filter((id): id is string => !!id)
      .sort();
  }

  close(): Promise<void> {
    if (this.#closed) return Promise.resolve();
    this.#closed = true;
    // Commands still streaming hold sockets to the engine; the commands themselves keep running.
    for (const stream of this.#open) stream.destroy();
    this.#open.clear();
    return Promise.resolve();
  }
}
