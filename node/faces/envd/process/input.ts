/**
 * `process.Process/SendInput` and `process.Process/CloseStdin`: a running command's input,
 * `input.stdin` for a command started with `stdin: true`, `input.pty` for one started on a
 * terminal (E2B's PTY: what is typed into it).
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { z } from "zod";
import { ConnectError } from "../../connect_codec.ts";
import { parseMessage } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { type Processes, selectorSchema } from "./processes.ts";

const sendInputSchema = z.object({
  process: selectorSchema,
  input: z.object({ stdin: z.string().optional(), pty: z.string().optional() }),
});

const closeStdinSchema = z.object({ process: selectorSchema });

/**
 * Serves `SendInput` for one call: writes the base64 `input.stdin` to the command's stdin, or
 * the base64 `input.pty` to its terminal.
 *
 * @throws {ConnectError} `not_found` for no such running command, `invalid_argument` for input
 * of the other kind than the command takes (envd refuses it too), or for neither.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => sendInput(processes, call);
 * ```
 */
export async function sendInput(processes: Processes, call: RpcCall): Promise<unknown> {
  const body = parseMessage(sendInputSchema, call.message);
  const { pid, handle, request } = processes.find(call.sandbox, body.process);
  const onTerminal = request.tty !== undefined;
  const data = onTerminal ? body.input.pty : body.input.stdin;
  if (data === undefined) {
    throw new ConnectError(
      "invalid_argument",
      onTerminal
        ? `Process ${pid} runs on a terminal: send its input as 'input.pty'`
        : `Process ${pid} has no terminal: send its input as 'input.stdin'`,
    );
  }
  await handle.writeStdin(new Uint8Array(Buffer.from(data, "base64")));
  return {};
}

/**
 * Serves `CloseStdin` for one call.
 *
 * @throws {ConnectError} `not_found` when no running command matches the selector.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => closeStdin(processes, call);
 * ```
 */
export async function closeStdin(processes: Processes, call: RpcCall): Promise<unknown> {
  const body = parseMessage(closeStdinSchema, call.message);
  await processes.find(call.sandbox, body.process).handle.closeStdin();
  return {};
}
