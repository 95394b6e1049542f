/**
 * `process.Process/SendInput` and `process.Process/CloseStdin`: a running command's stdin
 * (it must have been started with `stdin: true`). No pty input: this node has no pty sessions.
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
 * Serves `SendInput` for one call: writes the base64 `input.stdin` to the command's stdin.
 *
 * @throws {ConnectError} `not_found` for no such running command, `unimplemented` for pty input.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => sendInput(processes, call);
 * ```
 */
export async function sendInput(processes: Processes, call: RpcCall): Promise<unknown> {
  const body = parseMessage(sendInputSchema, call.message);
  const { handle } = processes.find(call.sandbox, body.process);
  if (body.input.stdin === undefined) {
    throw new ConnectError(
      "unimplemented",
      "Only 'input.stdin' is supported: this node has no pty sessions",
    );
  }
  await handle.writeStdin(new Uint8Array(Buffer.from(body.input.stdin, "base64")));
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
