/**
 * `filesystem.Filesystem/Remove`: a file or a whole directory tree; a missing path is not an
 * error (envd's `RemoveAll`).
 *
 * @module
 */
import { z } from "zod";
import type { SandboxOps } from "../../../service_contract.ts";
import { parseMessage, resolvePath } from "../request.ts";
import type { RpcCall } from "../rpc.ts";

const removeSchema = z.object({ path: z.string() });

/**
 * Serves `Remove` for one call.
 *
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => remove(ops, call);
 * ```
 */
export async function remove(ops: SandboxOps, call: RpcCall): Promise<unknown> {
  const body = parseMessage(removeSchema, call.message);
  const user = call.user();
  const path = resolvePath(body.path, user, "path");
  await ops.remove({ id: call.sandbox.id }, path, { user });
  return {};
}
