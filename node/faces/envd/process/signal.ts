/**
 * `process.Process/SendSignal`: SIGTERM or SIGKILL to a running command, as E2B allows.
 *
 * @module
 */
import { z } from "zod";
import { ConnectError } from "../../connect_codec.ts";
import { parseMessage } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { type Processes, selectorSchema } from "./processes.ts";

const sendSignalSchema = z.object({
  process: selectorSchema,
  signal: z.union([z.string(), z.number()]),
});

/**
 * Serves `SendSignal` for one call.
 *
 * @throws {ConnectError} `not_found` for no such running command, `invalid_argument` for a
 * signal other than SIGKILL or SIGTERM.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => sendSignal(processes, call);
 * ```
 */
export async function sendSignal(processes: Processes, call: RpcCall): Promise<unknown> {
  const body = parseMessage(sendSignalSchema, call.message);
  const { handle } = processes.find(call.sandbox, body.process);
  await handle.kill(signalOf(body.signal));
  return {};
}

/**
 * The signal E2B's `Signal` enum names, by name or by number.
 *
 * @throws {ConnectError} `invalid_argument` for any other signal.
 * @example
 * ```ts
 * import { signalOf } from "./signal.ts";
 * signalOf("SIGNAL_SIGTERM"); // "SIGTERM"
 * ```
 */
export function signalOf(signal: string | number): "SIGKILL" | "SIGTERM" {
  if (signal === "SIGNAL_SIGKILL" || signal === 9) return "SIGKILL";
  if (signal === "SIGNAL_SIGTERM" || signal === 15) return "SIGTERM";
  throw new ConnectError(
    "invalid_argument",
    `'signal' must be SIGNAL_SIGKILL or SIGNAL_SIGTERM: received ${JSON.stringify(signal)}`,
  );
}
