/**
 * The engine socket of one running command, turned into what the contract hands out: stdout and
 * stderr as two readable streams (demultiplexed, with pipe-like backpressure), its stdin, and
 * the moment it ends.
 *
 * @module
 */
import { type ExecHandle, ExecutorError } from "../contract.ts";
import { concat } from "./_tar.ts";
import type { HijackedStream } from "./engine.ts";

/** Stream high-water mark: like a pipe, a reader that falls this far behind stalls the command. */
const STREAM_HIGH_WATER_BYTES = 8 * 1024 * 1024;

/** A command's stdout and stderr, fed by {@link demultiplex} and closed when it ends. */
export interface OutputStreams {
  stdout: ReadableStream<Uint8Array>;
  stderr: ReadableStream<Uint8Array>;
  /** Queues one frame on stdout (0) or stderr (1); a cancelled stream drops it. */
  deliver(which: 0 | 1, frame: Uint8Array): void;
  /** Ends both streams (a cancelled one stays cancelled). */
  close(): void;
}

/**
 * Two readable streams over one engine socket. Backpressure works like a pipe: when either
 * stream's queue reaches the high-water mark the socket is paused, so the command blocks on
 * write; a read (or a cancel, which drops that stream's output from then on) resumes it.
 */
export function outputStreams(stream: HijackedStream): OutputStreams {
  const controllers: (ReadableStreamDefaultController<Uint8Array> | undefined)[] = [];
  const cancelled = [false, false];
  const strategy = { highWaterMark: STREAM_HIGH_WATER_BYTES, size: (c: Uint8Array) => c.length };
  const make = (index: 0 | 1) =>
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
  return {
    stdout: make(0),
    stderr: make(1),
    deliver: (which, frame) => {
      const controller = controllers[which];
      if (!cancelled[which] && controller && frame.length) {
        controller.enqueue(frame);
        if ((controller.desiredSize ?? 1) <= 0) stream.pause();
      }
    },
    close: () => {
      for (let i = 0; i < 2; i++) {
        if (!cancelled[i]) {
          try {
            controllers[i]?.close();
          } catch { /* already closed */ }
        }
      }
    },
  };
}

/**
 * Splits Docker's multiplexed exec output into stdout and stderr frames. Each frame is an
 * 8-byte header, `[stream, 0, 0, 0, size (u32 BE)]`, then `size` bytes; a frame may arrive cut
 * over several chunks, so the rest waits for the next one.
 */
export function demultiplex(
  stream: HijackedStream,
  deliver: (which: 0 | 1, frame: Uint8Array) => void,
): void {
  let pending: Uint8Array = new Uint8Array();
  stream.on("data", (chunk) => {
    pending = pending.length ? concat([pending, chunk]) : new Uint8Array(chunk);
    while (pending.length >= 8) {
      const size = new DataView(pending.buffer, pending.byteOffset + 4, 4).getUint32(0);
      if (pending.length < 8 + size) break;
      const which = pending[0] === 2 ? 1 : 0;
      const frame = pending.slice(8, 8 + size);
      pending = pending.subarray(8 + size);
      deliver(which, frame);
    }
  });
}

/** A terminal's output: the engine sends it raw, as one stream, delivered on stdout. */
export function terminalOutput(
  stream: HijackedStream,
  deliver: (which: 0 | 1, frame: Uint8Array) => void,
): void {
  stream.on("data", (chunk) => deliver(0, new Uint8Array(chunk)));
}

/**
 * Calls `onEnd` once when the engine socket ends, closes or fails; a failure is reported to
 * `onError` first. The socket closing is all the executor learns of a command's end.
 */
export function whenStreamEnds(
  stream: HijackedStream,
  onEnd: () => void,
  onError: (error: Error) => void,
): void {
  let settled = false;
  const finish = () => {
    if (settled) return;
    settled = true;
    onEnd();
  };
  stream.on("end", finish);
  stream.on("close", finish);
  stream.on("error", (error) => {
    onError(error);
    finish();
  });
}

/**
 * A command's stdin over the engine socket. Without `stdin: true` it was closed at start and
 * every write is refused; closing it half-closes the socket, which the command reads as EOF.
 */
export function stdinOf(
  stream: HijackedStream,
  pid: number,
  open: boolean,
  ended: () => boolean,
): Pick<ExecHandle, "writeStdin" | "closeStdin"> {
  let closed = !open;
  if (!open) stream.end();
  return {
    writeStdin: (data: Uint8Array): Promise<void> => {
      if (!open) {
        return Promise.reject(
          new ExecutorError(
            "invalid",
            `Command ${pid} was started without stdin: start it with stdin`,
          ),
        );
      }
      if (ended() || closed) {
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
      if (open && !ended() && !closed) stream.end();
      closed = true;
      return Promise.resolve();
    },
  };
}
