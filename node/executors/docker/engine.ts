/**
 * Engine access for the Docker executor: the part of dockerode's client it uses (dockerode ships
 * no types), and {@link Engine}, the one door every engine call goes through so that each gets
 * its own deadline and every failure becomes an `ExecutorError` an operator can act on.
 *
 * @module
 */
import type { Readable } from "node:stream";
import { ExecutorError } from "../contract.ts";

/** The engine socket when `DOCKER_HOST` does not name another one. */
export const DEFAULT_DOCKER_SOCKET: string = "/var/run/docker.sock";

/**
 * The engine's socket path from `DOCKER_HOST` (`unix://...`), or the default one. A `tcp://`
 * host is not followed: the executor only speaks to a local socket.
 *
 * @example
 * ```ts
 * import { dockerSocketPath } from "@dormice/cluster/docker";
 * const env = new Map([["DOCKER_HOST", "unix:///run/user/1000/docker.sock"]]);
 * console.log(dockerSocketPath(env)); // "/run/user/1000/docker.sock"; pass Deno.env in a server
 * ```
 */
export function dockerSocketPath(env: { get(name: string): string | undefined }): string {
  const host = env.get("DOCKER_HOST");
  if (host?.startsWith("unix://")) return host.slice("unix://".length);
  return DEFAULT_DOCKER_SOCKET;
}

/**
 * The part of a dockerode `Docker` client this executor uses. Every method takes an
 * `abortSignal`, which the executor fires when the call's deadline passes.
 */
export interface DockerEngine {
  /** Resolves when the engine answers at all. */
  ping(options: { abortSignal: AbortSignal }): Promise<unknown>;
  /** A handle on an image by reference; `inspect` is a 404 when the image is not built. */
  getImage(name: string): {
    inspect(options: { abortSignal: AbortSignal }): Promise<ImageInspect>;
    /** Untags and removes the image (`force: true` untags one a container still uses). */
    remove?(options: Record<string, unknown>): Promise<unknown>;
  };
  /** Images matching `filters`, with their tags and labels (snapshots are listed by it). */
  listImages?(options: Record<string, unknown>): Promise<ImageSummary[]>;
  /** A handle on a container by id or name; makes no engine call by itself. */
  getContainer(name: string): EngineContainer;
  /** A handle on a named volume; `inspect` is a 404 when the engine has none by that name. */
  getVolume?(name: string): { inspect(options: { abortSignal: AbortSignal }): Promise<unknown> };
  /** Creates (does not start) a container; a 409 when the name is taken. */
  createContainer(options: Record<string, unknown>): Promise<EngineContainer>;
  /** Containers matching `filters` (`all: true` includes stopped ones). */
  listContainers(options: Record<string, unknown>): Promise<{ Labels?: Record<string, string> }[]>;
  /** Creates a network; a 409 when the name is taken. */
  createNetwork(options: Record<string, unknown>): Promise<unknown>;
  /** A handle on a network by name; `inspect` is a 404 when it does not exist. */
  getNetwork(name: string): {
    inspect(options: Record<string, unknown>): Promise<unknown>;
    remove(options: Record<string, unknown>): Promise<unknown>;
  };
  /** The engine's own description (`docker info`): its storage driver among the rest. */
  info(options: { abortSignal: AbortSignal }): Promise<EngineInfo>;
}

/** The fields of an image list entry this executor reads. */
export interface ImageSummary {
  /** The image's id (`sha256:…`). */
  Id?: string;
  /** `repo:tag` names; none for an image untagged since. */
  RepoTags?: string[] | null;
  /** The image's labels. */
  Labels?: Record<string, string> | null;
  /** When it was made, seconds since the epoch. */
  Created?: number;
}

/** The fields of `docker info` this executor reads. */
export interface EngineInfo {
  /** The storage driver, e.g. `overlay2`. */
  Driver?: string;
  /** The driver's facts as pairs, e.g. `["Backing Filesystem", "extfs"]`. */
  DriverStatus?: [string, string][];
}

/** The part of a dockerode container handle this executor uses. */
export interface EngineContainer {
  /** Container details (`size: true` adds `SizeRw`). */
  inspect(options: Record<string, unknown>): Promise<ContainerInspect>;
  /** Runs the container's entrypoint. */
  start(options: Record<string, unknown>): Promise<unknown>;
  /** Deletes the container; `force: true` kills it first, `v: true` drops its anonymous volumes. */
  remove(options: Record<string, unknown>): Promise<unknown>;
  /** Freezes every process in the container's cgroup. */
  pause(options: Record<string, unknown>): Promise<unknown>;
  /** Thaws a paused container. */
  unpause(options: Record<string, unknown>): Promise<unknown>;
  /** Registers a command to run in the container; nothing runs until its `start`. */
  exec(options: Record<string, unknown>): Promise<EngineExec>;
  /**
   * Extracts a tar into a directory of the container, as root, keeping the headers' owners. The
   * tar is a Buffer, or a node stream sent as it is read (chunked).
   */
  putArchive(tar: Uint8Array | Readable, options: Record<string, unknown>): Promise<unknown>;
  /** A tar of one path (a symlink comes as itself, not its target). */
  getArchive(options: Record<string, unknown>): Promise<AsyncIterable<Uint8Array>>;
  /** One stats sample (`stream: false`). */
  stats(options: Record<string, unknown>): Promise<StatsSample>;
  /** Commits the container's file system to an image (`repo`, `tag`, `changes`, `pause`). */
  commit?(options: Record<string, unknown>): Promise<unknown>;
}

/** The part of a dockerode exec handle this executor uses. */
export interface EngineExec {
  /** Starts the command; with `hijack` the answer is the raw duplex socket. */
  start(options: Record<string, unknown>): Promise<unknown>;
  /** Running state, exit code (null until the engine records it) and the process id. */
  inspect(
    options: Record<string, unknown>,
  ): Promise<{ Running: boolean; ExitCode: number | null; Pid?: number }>;
  /** Sets the size of the command's terminal (`h` rows, `w` columns); only while it runs. */
  resize(options: Record<string, unknown>): Promise<unknown>;
}

/** The fields of an image inspect this executor reads. */
export interface ImageInspect {
  /** The image's id (`sha256:…`). */
  Id?: string;
  /**
   * The image's user and working directory, which become the sandbox's user and home, and its
   * labels (a snapshot's say whose it is).
   */
  Config?: { User?: string; WorkingDir?: string; Labels?: Record<string, string> | null };
}

/** The fields of a container inspect this executor reads. */
export interface ContainerInspect {
  /** The user, working directory and labels the container was created with. */
  Config?: { User?: string; WorkingDir?: string; Labels?: Record<string, string> };
  /** When the container started (RFC 3339), for a first CPU reading. */
  State?: { StartedAt?: string };
  /** The cpu (in billionths of a core) and memory (bytes) limits the container runs under. */
  HostConfig?: { NanoCpus?: number; Memory?: number };
  /** The container's address on each network it is attached to. */
  NetworkSettings?: { Networks?: Record<string, { IPAddress?: string; Gateway?: string }> };
  /** Bytes in the writable layer (with `size: true`). */
  SizeRw?: number;
}

/** The fields of a stats sample this executor reads. */
export interface StatsSample {
  /** Cumulative CPU time of the container and of the host, ns, and the host's online cores. */
  cpu_stats?: {
    cpu_usage?: { total_usage?: number };
    system_cpu_usage?: number;
    online_cpus?: number;
  };
  /** Memory in use, bytes, and the page cache the kernel may reclaim (cgroup v2 / v1 names). */
  memory_stats?: {
    usage?: number;
    stats?: { inactive_file?: number; total_inactive_file?: number };
  };
}

/**
 * The duplex socket dockerode hands back for a hijacked exec start: the command's multiplexed
 * output comes in, its stdin goes out.
 */
export interface HijackedStream {
  on(event: "data", listener: (chunk: Uint8Array) => void): unknown;
  on(event: "end" | "close", listener: () => void): unknown;
  on(event: "error", listener: (error: Error) => void): unknown;
  write(data: Uint8Array, callback: (error?: Error | null) => void): boolean;
  end(): unknown;
  pause(): unknown;
  resume(): unknown;
  destroy(): unknown;
}

/** A dockerode error: the engine's HTTP status and sentence, or a socket error code. */
interface EngineError {
  statusCode?: number;
  code?: string;
  json?: { message?: string } | null;
  message?: string;
}

/** What {@link Engine} needs to reach the engine and name things in its sentences. */
export interface EngineOptions {
  /** The dockerode client. */
  client: DockerEngine;
  /** The socket the client uses, named in every sentence about a down or refused engine. */
  socketPath: string;
  /** This node's id, part of every container name so two nodes can share one engine. */
  nodeId: string;
  /** The deadline of a call that does not bring its own, ms. */
  callTimeoutMs: number;
}

/** Docker's container-name alphabet; anything else in an id becomes '_'. */
export function nameSafe(text: string): string {
  return text.replace(/[^a-zA-Z0-9_.-]/g, "_");
}

/**
 * The executor's handle on the engine. Every call to the engine goes through {@link Engine.call}
 * (or {@link Engine.callContainer}), which bounds it by a deadline and turns whatever dockerode
 * throws into an `ExecutorError`: a 404 is `not_found` (`gone` for the sandbox's own container), a 400 `invalid`, a 409 `exists` (or
 * `invalid` / `unavailable` for a paused or stopped container), a socket fault or anything else
 * `unavailable` naming the socket, a passed deadline `timeout`.
 *
 * @example
 * ```ts
 * import { ExecutorError } from "../contract.ts";
 * const client = {
 *   ping: () => Promise.reject(Object.assign(new Error("connect ENOENT"), { code: "ENOENT" })),
 * } as unknown as DockerEngine;
 * const engine = new Engine({ client, socketPath: "/run/docker.sock", nodeId: "n1", callTimeoutMs: 1000 });
 * const error = await engine.call("ping", (signal) => client.ping({ abortSignal: signal }))
 *   .catch((error: ExecutorError) => error);
 * console.log(error instanceof ExecutorError && error.code); // "unavailable", naming /run/docker.sock
 * ```
 */
export class Engine {
  /** The dockerode client; call it only inside {@link Engine.call}, which gives the deadline. */
  readonly client: DockerEngine;
  /** The engine's socket, for sentences. */
  readonly socketPath: string;
  readonly #nodeId: string;
  readonly #callTimeoutMs: number;

  /** Keeps the client and the names; makes no engine call. */
  constructor(options: EngineOptions) {
    this.client = options.client;
    this.socketPath = options.socketPath;
    this.#nodeId = options.nodeId;
    this.#callTimeoutMs = options.callTimeoutMs;
  }

  /** The container name of a sandbox on this node: `dormice-<node>-<sandbox id>`. */
  containerName(id: string): string {
    return `dormice-${nameSafe(this.#nodeId)}-${nameSafe(id)}`;
  }

  /** The handle on a sandbox's container (no engine call until a method of it is called). */
  container(id: string): EngineContainer {
    return this.client.getContainer(this.containerName(id));
  }

  /**
   * Runs one engine call under its own deadline and turns failures into `ExecutorError`s.
   * `what` completes "The Docker engine did not finish …" and "… failed …".
   *
   * @throws {ExecutorError} `timeout` past the deadline; the translated code otherwise.
   */
  async call<T>(
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
    // A call that throws at once (an engine client lacking the method) must still lose the race
    // cleanly, never leave the deadline's rejection unhandled.
    const work = Promise.resolve().then(() => fn(controller.signal));
    work.catch(() => {}); // a call that loses the race must not become an unhandled rejection
    try {
      return await Promise.race([work, deadline]);
    } catch (error) {
      throw this.#translate(error, what);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * {@link Engine.call} on a sandbox's container, for calls where a 404 can only mean that the
   * container is gone: that 404 becomes {@link Engine.notFound}'s sentence. (File transfers are
   * not such calls: their 404 may be a missing path.)
   *
   * @throws {ExecutorError} `gone` naming the sandbox and its container; as `call` otherwise.
   */
  async callContainer<T>(
    id: string,
    what: string,
    fn: (container: EngineContainer, signal: AbortSignal) => Promise<T>,
    timeoutMs: number = this.#callTimeoutMs,
  ): Promise<T> {
    const container = this.container(id);
    try {
      return await this.call(what, (signal) => fn(container, signal), timeoutMs);
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") throw this.notFound(id);
      throw error;
    }
  }

  /** The error for a sandbox whose container this engine does not have. */
  notFound(id: string): ExecutorError {
    return new ExecutorError(
      "gone",
      `the Docker engine on ${this.socketPath} has no container ${this.containerName(id)} for ` +
        `sandbox '${id}' (removed outside the node, e.g. by docker rm, or never created)`,
    );
  }

  #translate(error: unknown, what: string): Error {
    if (error instanceof ExecutorError) return error;
    if (error instanceof Deno.errors.NotCapable || error instanceof Deno.errors.PermissionDenied) {
      return new ExecutorError(
        "unavailable",
        `This process may not use the Docker socket ${this.socketPath} (${error.message}): run ` +
          `it with --allow-net=unix:${this.socketPath} --allow-read=${this.socketPath} ` +
          `--allow-write=${this.socketPath}`,
      );
    }
    const e = (error ?? {}) as EngineError;
    const message = (e.json?.message ?? e.message ?? String(e)).trim();
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
        `The Docker engine on ${this.socketPath} failed ${what} (${e.code}): check that dockerd ` +
          `runs and that this process may use the socket`,
      );
    }
    return new ExecutorError("unavailable", `The Docker engine failed ${what}: ${message}`);
  }
}
