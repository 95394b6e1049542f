/**
 * The sandbox service's running commands (private): each tracked by sandbox and pid until it
 * ends and told when its sandbox is being destroyed, and the buffered run `execCommand` answers
 * from, with its bounded wait after a timeout's kill.
 *
 * @module
 */
import type { ExecExit, ExecHandle, ExecRequest } from "./executors/contract.ts";

/** A running command, with what the service must know about how it ends. */
interface Tracked {
  handle: ExecHandle;
  request: ExecRequest;
  /** Started with `startCommand` (envd lists it); `execCommand`'s own are not listed. */
  listed: boolean;
  /** Set when its sandbox is being destroyed: resolves whether the destroy went through. */
  destroyed?: Promise<boolean>;
}

/**
 * The running commands of every sandbox, by sandbox id then pid; an entry leaves when its
 * command ends, a sandbox's entries when it is destroyed.
 */
export class RunningCommands {
  #bySandbox = new Map<string, Map<number, Tracked>>();

  /**
   * Tracks a command just started until it ends. The handle given out reports
   * `sandboxDestroyed` on its exit when a destroy ended it, and only once the destroy is over,
   * so whoever reads that exit finds the sandbox gone.
   */
  track(sandboxId: string, started: ExecHandle, request: ExecRequest, listed: boolean): ExecHandle {
    const tracked: Tracked = { handle: started, request, listed };
    let running = this.#bySandbox.get(sandboxId);
    if (!running) this.#bySandbox.set(sandboxId, running = new Map());
    running.set(started.pid, tracked);
    const forget = () => {
      const map = this.#bySandbox.get(sandboxId);
      if (map?.get(started.pid) === tracked) map.delete(started.pid);
      if (map?.size === 0) this.#bySandbox.delete(sandboxId);
    };
    const exited = started.exited.then(async (exit): Promise<ExecExit> => {
      forget();
      return tracked.destroyed && await tracked.destroyed
        ? { ...exit, sandboxDestroyed: true }
        : exit;
    }, async (error) => {
      forget();
      // An end the executor lost while the sandbox was being destroyed was lost to the destroy
      // (Docker: the exec vanished with its container before its exit code was read).
      if (tracked.destroyed && await tracked.destroyed) {
        return { exitCode: -1, sandboxDestroyed: true };
      }
      throw error;
    });
    const handle: ExecHandle = {
      pid: started.pid,
      stdout: started.stdout,
      stderr: started.stderr,
      exited,
      writeStdin: (data) => started.writeStdin(data),
      closeStdin: () => started.closeStdin(),
      kill: (signal) => started.kill(signal),
      resize: (size) => started.resize(size),
    };
    tracked.handle = handle;
    return handle;
  }

  /** The listed (`startCommand`) commands of a sandbox, by pid. */
  listed(sandboxId: string): Map<number, { handle: ExecHandle; request: ExecRequest }> {
    const listed = new Map<number, { handle: ExecHandle; request: ExecRequest }>();
    for (const [pid, t] of this.#bySandbox.get(sandboxId) ?? []) {
      if (t.listed) listed.set(pid, { handle: t.handle, request: t.request });
    }
    return listed;
  }

  /**
   * Tells a sandbox's commands that a destroy began, before it kills them; call the returned
   * function with whether the destroy went through, once it is over.
   */
  destroying(sandboxId: string): (destroyed: boolean) => void {
    let settle!: (destroyed: boolean) => void;
    const destroyed = new Promise<boolean>((resolve) => settle = resolve);
    for (const tracked of this.#bySandbox.get(sandboxId)?.values() ?? []) {
      tracked.destroyed = destroyed;
    }
    return (done) => {
      settle(done);
      if (done) this.#bySandbox.delete(sandboxId);
    };
  }
}

/** One stream of a buffered run. */
export interface Collected {
  /** The bytes kept, decoded as UTF-8. */
  text: string;
  /** True when the stream went past the cap and the rest was dropped. */
  truncated: boolean;
}

/**
 * Reads a command's output and end. Past `timeoutMs` (when the executor kills the command), the
 * output gets `killGraceMs` more to end; after that the streams are cancelled and the exit is
 * -1 with `timedOut`, since a process that escaped the kill may hold them open for its life.
 */
export async function runToEnd(
  handle: ExecHandle,
  { maxOutputBytes, timeoutMs, killGraceMs }: {
    maxOutputBytes: number;
    timeoutMs?: number;
    killGraceMs: number;
  },
): Promise<{ out: Collected; err: Collected; exit: ExecExit }> {
  const stop = new AbortController();
  let grace: ReturnType<typeof setTimeout> | undefined;
  const timer = timeoutMs === undefined ? undefined : setTimeout(() => {
    grace = setTimeout(() => stop.abort(), killGraceMs);
  }, timeoutMs);
  try {
    const [out, err, exit] = await Promise.all([
      collect(handle.stdout, maxOutputBytes, stop.signal),
      collect(handle.stderr, maxOutputBytes, stop.signal),
      Promise.race([
        handle.exited,
        untilAborted(stop.signal).then((): ExecExit => ({ exitCode: -1, timedOut: true })),
      ]),
    ]);
    return { out, err, exit };
  } finally {
    clearTimeout(timer);
    clearTimeout(grace);
  }
}

/**
 * Reads a stream to its end (or until `stop` aborts, cancelling it), keeping at most `cap`
 * bytes, and decodes them as UTF-8: a byte sequence that is not UTF-8 becomes U+FFFD, as
 * `TextDecoder` does (JSON strings cannot carry raw bytes).
 */
async function collect(
  stream: ReadableStream<Uint8Array>,
  cap: number,
  stop: AbortSignal,
): Promise<{ text: string; truncated: boolean }> {
  const chunks: Uint8Array[] = [];
  let kept = 0;
  let truncated = false;
  const reader = stream.getReader();
  const onStop = () => void reader.cancel().catch(() => {});
  stop.addEventListener("abort", onStop, { once: true });
  try {
    // Keep draining past the cap: a command blocked on a full pipe would never exit.
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      const chunk = r.value;
      if (kept >= cap) {
        truncated ||= chunk.length > 0;
        continue;
      }
      const take = chunk.subarray(0, cap - kept);
      if (take.length < chunk.length) truncated = true;
      chunks.push(take);
      kept += take.length;
    }
  } finally {
    stop.removeEventListener("abort", onStop);
    reader.releaseLock();
  }
  const all = new Uint8Array(kept);
  let at = 0;
  for (const c of chunks) all.set(c, at), at += c.length;
  return { text: new TextDecoder().decode(all), truncated };
}

/** Resolves once `signal` aborts (never, when it never does). */
function untilAborted(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  );
}
