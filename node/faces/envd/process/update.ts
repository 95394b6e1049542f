/**
 * `process.Process/Update`: resizes a running command's terminal (E2B's `pty.resize`).
 *
 * @module
 */
import { z } from "zod";
import { parseMessage } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { type Processes, selectorSchema } from "./processes.ts";
import { ptySchema } from "./start.ts";

const updateSchema = z.object({ process: selectorSchema, pty: ptySchema.optional() });

/**
 * Serves `Update` for one call: with `pty.size`, the command's terminal takes that size (the
 * command gets SIGWINCH); without it, nothing changes, as in envd.
 *
 * @throws {ConnectError} `not_found` for no such running command, `invalid_argument` for a bad
 * size or a command that has no terminal.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => update(processes, call);
 * ```
 */
export async function update(processes: Processes, call: RpcCall): Promise<unknown> {
  const body = parseMessage(updateSchema, call.message);
  const { handle } = processes.find(call.sandbox, body.process);
  if (body.pty) await handle.resize({ cols: body.pty.size.cols, rows: body.pty.size.rows });
  return {};
}
