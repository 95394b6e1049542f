/**
 * Commands in a Docker sandbox: create and start an exec, wait until its process runs, kill it
 * through its per-exec token, read its exit code. The engine socket's plumbing (demultiplexing,
 * backpressure, stdin) is in `_exec_streams.ts`.
 *
 * Killing a command: Docker has no "kill exec" call, so every command carries a unique
 * `DORMICE_EXEC_ID` in its environment and a kill runs a tiny script in the sandbox, as the
 * command's own user, that signals every process whose environment holds that token: the
 * command and all its descendants (a `bash -c` pipeline, a background job), without a pid file
 * and without reaching other commands.
 *
 * @module
 */
import type { Log } from "../../../shared/log.ts";
import { type ExecExit, type ExecHandle, type ExecRequest, ExecutorError } from "../contract.ts";
import { demultiplex, outputStreams, stdinOf, whenStreamEnds } from "./_exec_streams.ts";
import { resolvePath, type Sandboxes } from "./_sandboxes.ts";
import type { Engine, EngineExec, HijackedStream } from "./engine.ts";

/** Every exec carries this variable, so a kill finds the command and all its descendants. */
const EXEC_TOKEN_VAR = "DORMICE_EXEC_ID";

type Signal = "SIGKILL" | "SIGTERM" | "SIGINT" | "SIGHUP";

const SIGNALS: Record<Signal, number> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 };

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

/** A helper command's exit code and whole output. */
export interface HelperResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** What {@link Commands} needs. */
export interface CommandsOptions {
  engine: Engine;
  sandboxes: Sandboxes;
  log: Log;
  /** The deadline of a helper command (stat, list, mkdir, a kill, ...), ms. */
  helperTimeoutMs: number;
}

/** How one command was asked to end, read when its exit code is known. */
interface Ending {
  ended: boolean;
  timedOut: boolean;
  sentSignal?: Signal;
}

/**
 * Runs commands in sandboxes and keeps what must outlive one call: the engine sockets of
 * commands still streaming (closed by {@link Commands.close}), the commands still starting in
 * each sandbox and the pause in flight of each, which must not overlap (see
 * {@link Commands.pauseBetweenStarts}).
 */
export class Commands {
  #engine: Engine;
  #sandboxes: Sandboxes;
  #log: Log;
  #helperTimeoutMs: number;
  #open = new Set<HijackedStream>();
  /** Commands of each sandbox between their create and their process running. */
  #starting = new Map<string, Set<Promise<ExecHandle>>>();
  /** The pause in flight of each sandbox. */
  #pausing = new Map<string, Promise<void>>();
  #nextPid = 1;

  constructor(options: CommandsOptions) {
    this.#engine = options.engine;
    this.#sandboxes = options.sandboxes;
    this.#log = options.log;
    this.#helperTimeoutMs = options.helperTimeoutMs;
  }

  /** The contract's `exec`: resolves once the command's process runs. */
  async exec(id: string, request: ExecRequest): Promise<ExecHandle> {
    if (!Array.isArray(request.cmd) || request.cmd.length === 0) {
      throw new ExecutorError(
        "invalid",
        "The command is empty: give argv, e.g. ['sh', '-c', 'ls']",
      );
    }
    const info = await this.#sandboxes.get(id);
    // Without a cwd the engine starts in the image's working directory, which is the home.
    const cwd = request.cwd === undefined
      ? undefined
      : resolvePath(request.cwd, info.home, "working directory");
    if (request.cwd !== undefined) {
      // The engine reports a missing cwd only inside the output stream, after start; ask first
      // so the caller gets not_found like every other path error.
      const check = await this.run(id, ["/bin/sh", "-c", '[ -d "$1" ]', "sh", cwd!]);
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

  /**
   * Runs `pause` once the commands still starting in the sandbox have their processes, and
   * holds new starts until it settles (see {@link Commands.exec}).
   */
  pauseBetweenStarts(id: string, pause: () => Promise<void>): Promise<void> {
    const waits = [...(this.#starting.get(id) ?? [])];
    const run = Promise.allSettled(waits).then(pause);
    this.#pausing.set(id, run);
    const clear = () => {
      if (this.#pausing.get(id) === run) this.#pausing.delete(id);
    };
    run.then(clear, clear);
    return run;
  }

  /**
   * Runs a helper command to its end and collects its output, under the helper deadline.
   *
   * @throws {ExecutorError} `timeout` past the deadline (the command is then killed).
   */
  async run(id: string, cmd: string[], user?: string): Promise<HelperResult> {
    const info = await this.#sandboxes.get(id);
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
            `A helper command (${cmd[0]}) in sandbox ${id} ran past ${this.#helperTimeoutMs} ` +
              `ms: the sandbox may be overloaded`,
          ),
        );
      }, this.#helperTimeoutMs);
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

  /** Drops the engine sockets of commands still streaming; the commands themselves keep running. */
  close(): void {
    for (const stream of this.#open) stream.destroy();
    this.#open.clear();
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
    const exec = await this.#engine.callContainer(
      id,
      `creating a command in sandbox ${id}`,
      (container, signal) =>
        container.exec({
          Cmd: request.cmd,
          AttachStdin: request.stdin === true,
          AttachStdout: true,
          AttachStderr: true,
          Tty: false,
          Env: env,
          WorkingDir: cwd,
          User: user,
          abortSignal: signal,
        }),
    );
    const stream = await this.#engine.call(
      `starting a command in sandbox ${id}`,
      (signal) => exec.start({ hijack: true, stdin: request.stdin === true, abortSignal: signal }),
    ) as HijackedStream;
    // Listen first: a quick command's output and end come while #started() waits.
    const handle = this.#attach(id, exec, stream, token, user, request);
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
        info = await this.#engine.call(
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

  /** The handle of a started command: its streams, its end, its stdin, its kill and timeout. */
  #attach(
    id: string,
    exec: EngineExec,
    stream: HijackedStream,
    token: string,
    user: string,
    request: ExecRequest,
  ): ExecHandle {
    this.#open.add(stream);
    const pid = this.#nextPid++;
    const ending: Ending = { ended: false, timedOut: false };
    const output = outputStreams(stream);
    demultiplex(stream, output.deliver);

    const kill = async (signal: Signal = "SIGKILL") => {
      if (ending.ended) return;
      ending.sentSignal ??= signal;
      await this.run(id, ["/bin/sh", "-c", KILL_SCRIPT, "sh", signal.slice(3), token], user);
    };
    const timer = request.timeoutMs === undefined ? undefined : setTimeout(() => {
      ending.timedOut = true;
      kill("SIGKILL").catch((error) =>
        this.#log("warn", "Could not kill a command past its timeout", {
          id,
          pid,
          error: error instanceof Error ? error.message : String(error),
        })
      );
    }, request.timeoutMs);

    const exited = new Promise<ExecExit>((resolve) => {
      whenStreamEnds(stream, async () => {
        ending.ended = true;
        this.#open.delete(stream);
        clearTimeout(timer);
        output.close();
        resolve(await this.#exitOf(exec, { ...ending }));
      }, (error) =>
        this.#log("warn", "A command's stream from the Docker engine failed", {
          id,
          pid,
          error: error.message,
        }));
    });

    const stdin = stdinOf(stream, pid, request.stdin === true, () => ending.ended);
    return { pid, stdout: output.stdout, stderr: output.stderr, exited, ...stdin, kill };
  }

  /** The exit code from exec inspect; the stream can end a moment before the engine records it. */
  async #exitOf(exec: EngineExec, ending: Ending): Promise<ExecExit> {
    let exitCode = -1;
    for (let attempt = 0; attempt < 50; attempt++) {
      try {
        const info = await this.#engine.call(
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
    const signalled = ending.timedOut ? "SIGKILL" : ending.sentSignal;
    if (signalled && exitCode === 128 + SIGNALS[signalled]) exit.signal = signalled;
    if (ending.timedOut) exit.timedOut = true;
    return exit;
  }
}
