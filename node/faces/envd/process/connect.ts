/**
 * `process.Process/Connect`: follows a running command's output from now on, by pid or tag.
 *
 * @module
 */
import { z } from "zod";
import type { StreamSink } from "../../connect_codec.ts";
import { parseMessage } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { follow, type Processes, selectorSchema } from "./processes.ts";

const connectSchema = z.object({ process: selectorSchema });

/**
 * Serves `Connect` for one call.
 *
 * @throws {ConnectError} `not_found` when no running command matches the selector.
 * @example
 * ```ts ignore
 * const rpc: StreamRpc = (call, sink) => connect(processes, call, sink);
 * ```
 */
export async function connect(
  processes: Processes,
  call: RpcCall,
  sink: StreamSink,
): Promise<void> {
  const body = parseMessage(connectSchema, call.message);
  await follow(processes.attach(call.sandbox, body.process), sink, {
    keepaliveMs: call.keepaliveMs(),
  });
}
