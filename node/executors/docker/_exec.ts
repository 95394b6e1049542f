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
import {
  type ExecExit,
  type ExecHandle,
  type ExecRequest,
  ExecutorError,
  type TerminalSize,
} from "../contract.ts";
import {
  demultiplex,
  outputStreams,
  stdinOf,
  terminalOutput,
  whenStreamEnds,
} from "./_exec_streams.ts";
import { resolvePath, type Sandboxes } from "./_sandboxes.ts";
import type { Engine, EngineExec, HijackedStream } from "./engine.ts";

/** Every exec carries this variable, so a kill finds the command and all its descendants. */
const EXEC_TOKEN_VAR = "DORMICE_EXEC_ID";

type Signal = "SIGKILL" | "SIGTERM" | "SIGINT" | "SIGHUP";

const SIGNALS: Record<Signal, number> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 };

/**
 * How long the engine may take to record an exit code after a command's socket closed, ms.
 * Measured over the Docker contract suite: the first inspect after the socket closed had the
 * code for every command, within 9 ms; two seconds leave room for a loaded engine. Past it, a
 * command the engine still says runs has lost its socket.
 */
const EXIT_RECORD_MS = 2_000;

/**
 * Signals the command started with a given token and every descendant that kept its
 * environment. Runs as the command's own user: without CAP_SYS_PTRACE nobody else may read
 * its `/proc/<pid>/environ`, not even root. Arguments: signal name, token.
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
   * Runs a helper command to its end and collects its output, under the helper deadline (or
   * `timeoutMs`).
   *
   * @throws {ExecutorError} `timeout` past the deadline (the command is then killed).
   */
  async run(id: string, cmd: string[], user?: string, timeoutMs?: number): Promise<HelperResult> {
    const limitMs = timeoutMs ?? this.#helperTimeoutMs;
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
            `A helper command (${cmd[0]}) in sandbox ${id} ran past ${limitMs} ` +
              `ms: the sandbox may be overloaded`,
          ),
        );
      }, limitMs);
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
    const tty = request.tty !== undefined;
    // A terminal's input is always open: it is how a pty session is typed into.
    const withStdin = request.stdin === true || tty;
    const exec = await this.#engine.callContainer(
      id,
      `creating a command in sandbox ${id}`,
      (container, signal) =>
        container.exec({
          Cmd: request.cmd,
          AttachStdin: withStdin,
          AttachStdout: true,
          AttachStderr: true,
          Tty: tty,
          Env: env,
          WorkingDir: cwd,
          User: user,
          abortSignal: signal,
        }),
    );
    const stream = await this.#engine.call(
      `starting a command in sandbox ${id}`,
      (signal) =>
        exec.start({
          hijack: true,
          stdin: withStdin,
          Tty: tty,
          abortSignal: signal,
        }),
    ) as HijackedStream;
    // Listen first: a quick command's output and end come while #started() waits.
    const handle = this.#attach(id, exec, stream, token, user, request);
    await this.#started(exec);
    // The engine (API 1.41) sizes an exec's terminal only once it runs; until then it is 0x0.
    if (request.tty) await handle.resize(request.tty);
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
    // A terminal's output is one raw stream; without one the engine multiplexes two.
    if (request.tty) terminalOutput(stream, output.deliver);
    else demultiplex(stream, output.deliver);

    const signalAll = (signal: Signal) =>
      this.run(id, ["/bin/sh", "-c", KILL_SCRIPT, "sh", signal.slice(3), token], user);
    const kill = async (signal: Signal = "SIGKILL") => {
      if (ending.ended) return;
      ending.sentSignal ??= signal;
      await signalAll(signal);
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

    const exited = new Promise<ExecExit>((resolve, reject) => {
      whenStreamEnds(stream, () => {
        ending.ended = true;
        this.#open.delete(stream);
        clearTimeout(timer);
        output.close();
        this.#exitOf(exec, { ...ending }, { id, pid, signalAll }).then(resolve, reject);
      }, (error) =>
        this.#log("warn", "A command's stream from the Docker engine failed", {
          id,
          pid,
          error: error.message,
        }));
    });

    // A caller that only reads the output must not turn a lost engine into an unhandled rejection.
    exited.catch(() => {});
    const stdin = stdinOf(
      stream,
      pid,
      request.stdin === true || request.tty !== undefined,
      () => ending.ended,
    );
    const resize = async (size: TerminalSize) => {
      if (!request.tty) {
        throw new ExecutorError(
          "invalid",
          `Command ${pid} has no terminal to resize: start it with a tty`,
        );
      }
      if (ending.ended) return;
      await this.#engine.call(
        `resizing the terminal of a command in sandbox ${id}`,
        (signal) => exec.resize({ h: size.rows, w: size.cols, abortSignal: signal }),
      ).catch((error) => {
        // The command may have ended between the check and the call: not an error then.
        if (!ending.ended) throw error;
      });
    };
    return { pid, stdout: output.stdout, stderr: output.stderr, exited, ...stdin, kill, resize };
  }

  /**
   * How a command ended, once its engine socket closed. The socket closing is all the executor
   * learns, and it closes for two reasons: the command ended (the engine then records its exit
   * code, a moment after the socket may close), or the socket was lost (the engine restarted,
   * died or dropped the connection) while the command still runs. Telling them apart:
   *
   * - the engine records an exit code: the command ended, with that code;
   * - the engine does not answer: it is lost; the command may still be running, and the error
   *   says so (nothing can stop it without the engine);
   * - the engine says the command still runs: only its socket was lost; the command is killed
   *   (its output cannot reach anyone any more) and the error says so.
   *
   * A command whose exit the engine never records after it stopped running keeps the
   * contract's unknown code, -1.
   *
   * @throws {ExecutorError} `unavailable` naming the engine in the two lost cases.
   */
  async #exitOf(
    exec: EngineExec,
    ending: Ending,
    command: { id: string; pid: number; signalAll: (signal: Signal) => Promise<HelperResult> },
  ): Promise<ExecExit> {
    const { id, pid } = command;
    const what = `command ${pid} in sandbox ${id}`;
    const socket = this.#engine.socketPath;
    let exitCode = await this.#recordedExit(exec, EXIT_RECORD_MS);
    if (exitCode === "unreachable") {
      throw new ExecutorError(
        "unavailable",
        `Lost the Docker engine on ${socket} while ${what} ran: it may still be running ` +
          "there, with its output lost; check the engine with `docker info` before running it " +
          "again",
      );
    }
    if (exitCode === "running") {
      const killed = await command.signalAll("SIGKILL").then(() => true, () => false);
      // A command that ended by itself just then keeps its own exit code.
      exitCode = killed ? await this.#recordedExit(exec, EXIT_RECORD_MS) : "running";
      if (typeof exitCode !== "number" || exitCode === 128 + SIGNALS.SIGKILL) {
        throw new ExecutorError(
          "unavailable",
          `The Docker engine on ${socket} dropped the output stream of ${what} while it still ` +
            (killed
              ? "ran: it was killed, since its output could reach nobody; run it again"
              : "ran, and the command could not be killed: it may still be running"),
        );
      }
    }
    const exit: ExecExit = { exitCode };
    const signalled = ending.timedOut ? "SIGKILL" : ending.sentSignal;
    if (signalled && exitCode === 128 + SIGNALS[signalled]) exit.signal = signalled;
    if (ending.timedOut) exit.timedOut = true;
    return exit;
  }

  /**
   * Polls exec inspect for up to `ms` until the engine records the exit code. Answers the code,
   * `"running"` when the engine still says the command runs, `"unreachable"` when its last
   * answer in the window was a failure, or -1 when the command stopped without a recorded code.
   * A failed inspect is asked again: the connection that broke the stream may have broken the
   * client's pooled ones too, while a new one reaches the engine at once.
   */
  async #recordedExit(
    exec: EngineExec,
    ms: number,
  ): Promise<number | "running" | "unreachable"> {
    const until = Date.now() + ms;
    let last: "running" | "stopped" | "unreachable" = "unreachable";
    for (;;) {
      try {
        const info = await this.#engine.call(
          "inspecting a finished command",
          (signal) => exec.inspect({ abortSignal: signal }),
        );
        if (!info.Running && info.ExitCode !== null && info.ExitCode !== undefined) {
          return info.ExitCode;
        }
        last = info.Running ? "running" : "stopped";
      } catch {
        last = "unreachable";
      }
      if (Date.now() >= until) return last === "stopped" ? -1 : last;
      await new Promise((resolve) => setTimeout(resolve, last === "unreachable" ? 100 : 20));
    }
  }
}
