/**
 * `filesystem.Filesystem/Move`: renames a path (watches see a rename and a create).
 *
 * @module
 */
import { z } from "zod";
import type { SandboxOps } from "../../../service_contract.ts";
import { parseMessage, resolvePath } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { entryJson } from "./entry.ts";

const moveSchema = z.object({ source: z.string(), destination: z.string() });

/**
 * Serves `Move` for one call.
 *
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => move(ops, call);
 * ```
 */
export async function move(ops: SandboxOps, call: RpcCall): Promise<unknown> {
  const body = parseMessage(moveSchema, call.message);
  const user = call.user();
  const from = resolvePath(body.source, user, "source");
  const to = resolvePath(body.destination, user, "destination");
  const entry = await ops.move({ id: call.sandbox.id }, from, to, { user });
  return { entry: entryJson(entry) };
}
