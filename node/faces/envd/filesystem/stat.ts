/**
 * `filesystem.Filesystem/Stat`: one path's entry.
 *
 * @module
 */
import { z } from "zod";
import type { SandboxOps } from "../../../service_contract.ts";
import { parseMessage, resolvePath } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { entryJson } from "./entry.ts";

const statSchema = z.object({ path: z.string() });

/**
 * Serves `Stat` for one call.
 *
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => stat(ops, call);
 * ```
 */
export async function stat(ops: SandboxOps, call: RpcCall): Promise<unknown> {
  const body = parseMessage(statSchema, call.message);
  const user = call.user();
  const entry = await ops.stat({ id: call.sandbox.id }, resolvePath(body.path, user, "path"), {
    user,
  });
  return { entry: entryJson(entry) };
}
