/**
 * The commands envd started or attached to, each with the hub that fans its output out to
 * every stream following it, and the one lookup of a running command by pid or by tag that
 * every `process.Process` RPC naming a process goes through.
 *
 * Output is pumped from the executor into the hub for as long as the command runs, and each
 * `Start`/`Connect` stream is a subscriber: a client that hangs up stops its own stream at
 * once, while the command keeps running with its output drained (E2B's background commands
 * must survive their client, and an undrained pipe would stall or SIGPIPE the command).
 *
 * How a stream ends follows envd: the end event once the command ended; `deadline_exceeded`
 * for the `Start` stream whose own deadline killed the command; the executor's error when the
 * command's end was lost (say the engine went away); and no end at all, the connection
 * dropped, when the sandbox was destroyed under the command, as when envd's machine dies with
 * its sandbox.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { z } from "zod";
import type { Log } from "../../../../shared/log.ts";
import type { ExecExit, ExecHandle, ExecRequest } from "../../../executors/contract.ts";
import type { SandboxOps, SandboxRecord } from "../../../service_contract.ts";
import { ConnectError, StreamCut, type StreamSink } from "../../connect_codec.ts";
import type { ConnectCode } from "../../../../shared/connect_codes.ts";
import { toConnect } from "../dialects.ts";
import { startKeepalive, untilAborted } from "../rpc.ts";

/** How an RPC names a process: E2B's `ProcessSelector`. */
export type Selector = { pid: number } | { tag: string };

/** The schema of a `ProcessSelector` field. */
export const selectorSchema: z.ZodType<Selector> = z.union([
  z.object({ pid: z.number().int().nonnegative() }),
  z.object({ tag: z.string().min(1) }),
], { error: "needs 'pid' or 'tag'" });

/** One running command's output, fanned out to every stream attached to it. */
export interface ProcessHub {
  /** The sandbox the command runs in: pids are unique per sandbox only. */
  readonly sandboxId: string;
  /** The command's pid in its sandbox. */
  readonly pid: number;
  /** The tag `Start` gave it, if any. */
  readonly tag?: string;
  /** Whether it runs on a terminal: its output is then `pty` data, not stdout. */
  readonly tty: boolean;
  /** Called with every output event; a subscriber is one following stream. */
  readonly subscribers: Set<(message: unknown) => void>;
  /** The end event once the command ended and its output was drained. */
  end?: unknown;
  /**
   * Why the command's end is not known (its executor lost it, e.g. the engine went away): the
   * streams following it end with this Connect error instead of an end event.
   */
  failure?: { code: ConnectCode; message: string };
  /** How the command ended, once it did (`timedOut`, `sandboxDestroyed`). */
  exit?: ExecExit;
  /** Resolves once the command ended and its output was drained; never rejects. */
  done: Promise<void>;
}

/** A running command as the sandbox service tracks it. */
export interface RunningCommand {
  /** Its pid in its sandbox. */
  pid: number;
  /** Its streams, stdin and kill. */
  handle: ExecHandle;
  /** What was started. */
  request: ExecRequest;
}

/**
 * The process table of one envd: hubs by sandbox and pid, opened when a command starts or a
 * client first connects to a command that has none, dropped when the command ends.
 *
 * @example
 * ```ts ignore
 * const processes = new Processes(ops, log);
 * const handle = await ops.startCommand({ id: sandbox.id }, { cmd: ["sleep", "1"] });
 * const hub = processes.open(sandbox.id, handle, { tag: "job-1" });
 * processes.find(sandbox, { tag: "job-1" }).pid === hub.pid; // true
 * ```
 */
export class Processes {
  #ops: SandboxOps;
  #log: Log;
  #hubs = new Map<string, ProcessHub>();

  /** A table over `ops`, logging output streams that fail to `log`. */
  constructor(ops: SandboxOps, log: Log) {
    this.#ops = ops;
    this.#log = log;
  }

  /**
   * The running command `selector` names (for input, signals, closing stdin).
   *
   * @throws {ConnectError} `not_found` when no running command of this sandbox matches.
   */
  find(sandbox: SandboxRecord, selector: Selector): RunningCommand {
    const { command } = this.#lookup(sandbox, selector);
    if (!command) throw notFound(sandbox, selector);
    return command;
  }

  /**
   * The hub of the command `selector` names, opened now when nobody followed it yet. A hub
   * outlives its command's entry in the service while it drains the last output, so a client
   * connecting in that moment still gets the rest and the end.
   *
   * @throws {ConnectError} `not_found` when the command has neither a hub nor a running entry.
   */
  attach(sandbox: SandboxRecord, selector: Selector): ProcessHub {
    const { pid, command } = this.#lookup(sandbox, selector);
    const hub = pid === undefined ? undefined : this.#hubs.get(hubKey(sandbox.id, pid));
    if (hub) return hub;
    if (!command) throw notFound(sandbox, selector);
    return this.open(sandbox.id, command.handle, { tty: command.request.tty !== undefined });
  }

  /**
   * The one pid-or-tag lookup: a pid is taken as given; a tag names the most recently started
   * command of this sandbox with that tag that is still running.
   */
  #lookup(sandbox: SandboxRecord, selector: Selector): { pid?: number; command?: RunningCommand } {
    const running = this.#ops.commands({ id: sandbox.id });
    let pid: number | undefined;
    if ("pid" in selector) pid = selector.pid;
    else {
      for (const hub of this.#hubs.values()) {
        // The sandbox first: another sandbox's pid may well name a process here too.
        if (hub.sandboxId === sandbox.id && hub.tag === selector.tag && running.has(hub.pid)) {
          pid = hub.pid;
        }
      }
    }
    const entry = pid === undefined ? undefined : running.get(pid);
    return { pid, command: pid === undefined || !entry ? undefined : { pid, ...entry } };
  }

  /** The tag of a command of this sandbox, if `Start` gave it one. */
  tagOf(sandboxId: string, pid: number): string | undefined {
    return this.#hubs.get(hubKey(sandboxId, pid))?.tag;
  }

  /**
   * Opens the hub of a command just started, and starts pumping its output. Subscribe (with
   * {@linkcode follow}) in the same turn, before any `await`: output that arrives before the
   * first subscriber is broadcast to nobody.
   */
  open(
    sandboxId: string,
    handle: ExecHandle,
    { tag, tty = false }: { tag?: string; tty?: boolean } = {},
  ): ProcessHub {
    const hub: ProcessHub = {
      sandboxId,
      pid: handle.pid,
      tag,
      tty,
      subscribers: new Set(),
      done: Promise.resolve(),
    };
    const broadcast = (message: unknown) => {
      for (const s of hub.subscribers) s(message);
    };
    const pump = async (
      stream: ReadableStream<Uint8Array>,
      field: "stdout" | "stderr" | "pty",
    ) => {
      const reader = stream.getReader();
      try {
        while (true) {
          const { done, value } = await reader.read();
          if (done) break;
          if (value.length) {
            broadcast({
              event: { data: { [field]: Buffer.from(value).toString("base64") } },
            });
          }
        }
      } catch (error) {
        this.#log("warn", "command output stream failed", { sandboxId, pid: handle.pid, error });
      } finally {
        reader.releaseLock();
      }
    };
    this.#hubs.set(hubKey(sandboxId, handle.pid), hub);
    hub.done = (async () => {
      await Promise.all([
        pump(handle.stdout, tty ? "pty" : "stdout"),
        pump(handle.stderr, "stderr"),
      ]);
      try {
        hub.exit = await handle.exited;
        hub.end = { event: { end: endEvent(hub.exit) } };
      } catch (error) {
        // Never let this promise reject: nobody may be awaiting it, and the node must not crash.
        // An end event would claim an exit that nobody saw; follow() sends the error instead.
        this.#log("warn", "command end could not be read", { sandboxId, error });
        hub.failure = toConnect(this.#log, error);
      }
      this.#hubs.delete(hubKey(sandboxId, handle.pid));
    })();
    return hub;
  }
}

/**
 * Streams a hub's events to one client until the command ends or the client leaves: the start
 * event first, then every output event, keepalives every `keepaliveMs`, and the end event. With
 * `ownDeadlineMs` (the `Start` stream whose deadline was the command's timeout), a command its
 * timeout killed ends the stream with `deadline_exceeded` instead of an end event.
 *
 * @throws {ConnectError} when the command's end is not known (the hub's `failure`): the stream
 * then ends with that error rather than an end event; `deadline_exceeded` as above.
 * @throws {StreamCut} when the sandbox was destroyed under the command: no end is sent.
 * @example
 * ```ts ignore
 * await follow(processes.open(sandbox.id, handle), sink, { keepaliveMs: call.keepaliveMs() });
 * ```
 */
export async function follow(
  hub: ProcessHub,
  sink: StreamSink,
  { keepaliveMs, ownDeadlineMs }: { keepaliveMs?: number; ownDeadlineMs?: number } = {},
): Promise<void> {
  sink.send({ event: { start: { pid: hub.pid } } });
  if (!hub.end && !hub.failure) {
    const subscriber = (message: unknown) => sink.send(message);
    hub.subscribers.add(subscriber);
    const stopKeepalive = startKeepalive(sink, keepaliveMs, { event: { keepalive: {} } });
    try {
      await Promise.race([hub.done, untilAborted(sink.signal)]);
    } finally {
      hub.subscribers.delete(subscriber);
      stopKeepalive();
    }
    if (sink.signal.aborted) return;
  }
  if (hub.failure) throw new ConnectError(hub.failure.code, hub.failure.message);
  if (hub.exit?.sandboxDestroyed) {
    throw new StreamCut(
      `Sandbox '${hub.sandboxId}' was destroyed while process ${hub.pid} ran: stream cut`,
    );
  }
  if (ownDeadlineMs !== undefined && hub.exit?.timedOut) {
    throw new ConnectError(
      "deadline_exceeded",
      `The command ran past its timeout of ${ownDeadlineMs} ms (Connect-Timeout-Ms) ` +
        "and was killed",
    );
  }
  sink.send(hub.end);
}

/**
 * The end event of a command, as envd words it. A command that failed (a non-zero exit or a
 * signal) also carries `error`, the same words as `status`: envd sends Go's `cmd.Wait()` error
 * there, and the SDK makes it the message of its `CommandExitError`, which is empty without it.
 *
 * @example
 * ```ts
 * import { endEvent } from "./processes.ts";
 * endEvent({ exitCode: 0 }); // { exitCode: 0, exited: true, status: "exit status 0" }
 * endEvent({ exitCode: 2 }); // { ..., status: "exit status 2", error: "exit status 2" }
 * ```
 */
export function endEvent(
  exit: ExecExit,
): { exitCode: number; exited: boolean; status: string; error?: string } {
  if (exit.signal) {
    // envd reports what Go's ProcessState says for a signalled process: code -1.
    const names: Record<string, string> = {
      SIGKILL: "killed",
      SIGTERM: "terminated",
      SIGINT: "interrupt",
      SIGHUP: "hangup",
    };
    const status = `signal: ${names[exit.signal] ?? exit.signal.toLowerCase()}`;
    return { exitCode: -1, exited: false, status, error: status };
  }
  const status = `exit status ${exit.exitCode}`;
  if (exit.exitCode === 0) return { exitCode: 0, exited: true, status };
  return { exitCode: exit.exitCode, exited: true, status, error: status };
}

function hubKey(sandboxId: string, pid: number): string {
  return `${sandboxId}\u0000${pid}`;
}

function notFound(sandbox: SandboxRecord, selector: Selector): ConnectError {
  const which = "pid" in selector ? `with pid ${selector.pid}` : `tagged '${selector.tag}'`;
  return new ConnectError(
    "not_found",
    `No running process ${which} in sandbox '${sandbox.id}': list them with Process/List`,
  );
}
