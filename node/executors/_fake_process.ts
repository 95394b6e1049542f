/**
 * The processes of `FakeExecutor`'s sandboxes: `FakeProcess` runs one command in the fake shell
 * (`_fake_shell.ts`) with its stdin, output streams, terminal size, kill and timeout, and waits
 * while its sandbox is paused.
 *
 * @module
 */
import {
  type CreateRequest,
  type ExecExit,
  type ExecHandle,
  type ExecRequest,
  ExecutorError,
  type TerminalSize,
} from "./contract.ts";
import { type FakeFs, fakeHome } from "./_fake_fs.ts";
import { Killed, runCommand } from "./_fake_shell.ts";

const signalNumbers = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 } as const;
type Signal = keyof typeof signalNumbers;

/** What a process reads of its sandbox: its env, its file tree, and whether it is paused. */
export interface ProcessSandbox {
  request: CreateRequest;
  fs: FakeFs;
  paused: boolean;
  /** Resolvers of everything waiting for a resume (or a destroy). */
  thaw: (() => void)[];
}

/**
 * One command in a fake sandbox: the interpreter runs it against the sandbox's file tree, its
 * output goes to two streams (one with a terminal), and a kill or `timeoutMs` ends it.
 */
export class FakeProcess implements ExecHandle {
  readonly pid: number;
  readonly stdout: ReadableStream<Uint8Array>;
  readonly stderr: ReadableStream<Uint8Array>;
  readonly exited: Promise<ExecExit>;
  readonly abort: AbortController = new AbortController();
  #stdin: Uint8Array[] = [];
  #stdinOpen: boolean;
  #stdinEnabled: boolean;
  #stdinWaiter: (() => void) | null = null;
  #killedBy: Signal | null = null;
  #timedOut = false;
  #ended = false;
  /** The terminal's size, or null without one. */
  #tty: TerminalSize | null;

  constructor(
    pid: number,
    sandbox: ProcessSandbox,
    request: ExecRequest,
    onEnd: () => void,
  ) {
    this.pid = pid;
    const [stdout, out] = outputStream();
    const [stderr, err] = outputStream();
    this.stdout = stdout;
    this.stderr = stderr;
    this.#tty = request.tty ? { ...request.tty } : null;
    // A terminal is one stream: what the command writes to stderr shows on it too. There is no
    // line discipline (no echo of input, no \r before \n): a plain stream stands in for it.
    const controllers = { 1: out, 2: this.#tty ? out : err };
    this.#stdinEnabled = request.stdin === true || this.#tty !== null;
    this.#stdinOpen = this.#stdinEnabled;
    const vars = new Map<string, string>([
      ["HOME", fakeHome],
      ["PATH", "/usr/local/bin:/usr/bin:/bin"],
      ["USER", request.user ?? "user"],
      ["PWD", request.cwd ?? fakeHome],
      ...Object.entries(sandbox.request.env),
      ...Object.entries(request.env ?? {}),
    ]);
    const timer = request.timeoutMs !== undefined
      ? setTimeout(() => {
        this.#timedOut = true;
        void this.kill("SIGKILL");
      }, request.timeoutMs)
      : undefined;
    const gate = (): Promise<void> =>
      sandbox.paused && !this.abort.signal.aborted
        ? new Promise<void>((resolve) => {
          sandbox.thaw.push(resolve);
          this.abort.signal.addEventListener("abort", () => resolve(), { once: true });
        })
        : Promise.resolve();
    const cwd = sandbox.fs.resolve(request.cwd ?? fakeHome);
    this.exited = (async (): Promise<ExecExit> => {
      let exitCode = 0;
      try {
        exitCode = await runCommand(request.cmd, {
          fs: sandbox.fs,
          user: request.user ?? "user",
          signal: this.abort.signal,
          gate,
          write: (fd, data) => {
            if (this.abort.signal.aborted) return Promise.reject(new Killed());
            controllers[fd].enqueue(data);
            return Promise.resolve();
          },
          readStdin: () => this.#readStdin(),
          tty: () => this.#tty,
        }, { cwd, vars });
      } catch (e) {
        if (!(e instanceof Killed)) {
          // A bug in the interpreter must still end the process visibly, not hang it.
          const text = `fake executor: ${(e as Error)?.message ?? e}\n`;
          if (!this.abort.signal.aborted) {
            controllers[2].enqueue(new TextEncoder().encode(text));
          }
          exitCode = 1;
        }
      }
      clearTimeout(timer);
      this.#ended = true;
      this.#stdinOpen = false;
      out.close();
      err.close();
      onEnd();
      if (this.#killedBy) {
        return {
          exitCode: 128 + signalNumbers[this.#killedBy],
          signal: this.#killedBy,
          ...(this.#timedOut ? { timedOut: true } : {}),
        };
      }
      return { exitCode };
    })();
  }

  #readStdin(): Promise<Uint8Array | null> {
    if (this.#stdin.length > 0) return Promise.resolve(this.#stdin.shift()!);
    if (!this.#stdinOpen) return Promise.resolve(null);
    if (this.abort.signal.aborted) return Promise.reject(new Killed());
    return new Promise((resolve, reject) => {
      const onAbort = () => reject(new Killed());
      this.abort.signal.addEventListener("abort", onAbort, { once: true });
      this.#stdinWaiter = () => {
        this.abort.signal.removeEventListener("abort", onAbort);
        this.#stdinWaiter = null;
        resolve(this.#readStdin());
      };
    });
  }

  writeStdin(data: Uint8Array): Promise<void> {
    if (!this.#stdinEnabled) {
      return Promise.reject(
        new ExecutorError(
          "invalid",
          `Process ${this.pid} was started without stdin: start it with stdin enabled`,
        ),
      );
    }
    if (!this.#stdinOpen) {
      return Promise.reject(
        new ExecutorError(
          "invalid",
          `The stdin of process ${this.pid} is closed (or it has ended)`,
        ),
      );
    }
    this.#stdin.push(data.slice());
    this.#stdinWaiter?.();
    return Promise.resolve();
  }

  closeStdin(): Promise<void> {
    this.#stdinOpen = false;
    this.#stdinWaiter?.();
    return Promise.resolve();
  }

  resize(size: TerminalSize): Promise<void> {
    if (!this.#tty) {
      return Promise.reject(
        new ExecutorError(
          "invalid",
          `Process ${this.pid} has no terminal to resize: start it with a tty`,
        ),
      );
    }
    if (!this.#ended) this.#tty = { cols: size.cols, rows: size.rows };
    return Promise.resolve();
  }

  kill(signal: Signal = "SIGKILL"): Promise<void> {
    if (this.#ended || this.abort.signal.aborted) return Promise.resolve();
    // Every signal ends a fake process: the interpreter has no handlers to catch them.
    this.#killedBy = signal;
    this.abort.abort();
    return Promise.resolve();
  }
}

/** One output stream of a fake process, and the end it writes to. */
interface OutputEnd {
  enqueue(data: Uint8Array): void;
  close(): void;
}

/**
 * A process's output stream. A reader that cancels it drops what comes after, as a closed pipe
 * would, without failing the process (Docker's streams do the same).
 */
function outputStream(): [ReadableStream<Uint8Array>, OutputEnd] {
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let open = true;
  const stream = new ReadableStream<Uint8Array>({
    start: (c) => void (controller = c),
    cancel: () => void (open = false),
  });
  return [stream, {
    enqueue: (data) => {
      if (open) controller.enqueue(data);
    },
    close: () => {
      if (open) controller.close();
      open = false;
    },
  }];
}
