/**
 * `filesystem.Filesystem/ListDir` and `filesystem.Filesystem/MakeDir`.
 *
 * @module
 */
import { z } from "zod";
import type { SandboxOps } from "../../../service_contract.ts";
import { ConnectError } from "../../connect_codec.ts";
import { parseMessage, resolvePath } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { entryJson } from "./entry.ts";

const listDirSchema = z.object({ path: z.string(), depth: z.number().int().min(0).optional() });

/**
 * The most entries one `ListDir` answers: each is an object in one JSON answer built and sent
 * whole, so a listing of a directory of a million files would hold the node's event loop for
 * seconds. Past it the call is refused, naming the cap (it is not cut short silently).
 */
export const LIST_DIR_MAX_ENTRIES = 10_000;
const makeDirSchema = z.object({ path: z.string() });

/**
 * Serves `ListDir` for one call: the entries down to `depth` levels (0 or absent means 1).
 *
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => listDir(ops, call);
 * ```
 */
export async function listDir(ops: SandboxOps, call: RpcCall): Promise<unknown> {
  const body = parseMessage(listDirSchema, call.message);
  const user = call.user();
  const path = resolvePath(body.path, user, "path");
  const depth = body.depth || 1;
  const entries = await ops.listDir({ id: call.sandbox.id }, path, depth, { user });
  if (entries.length > LIST_DIR_MAX_ENTRIES) {
    throw new ConnectError(
      "invalid_argument",
      `'${path}' holds ${entries.length} entries down to depth ${depth}, more than the ` +
        `${LIST_DIR_MAX_ENTRIES.toLocaleString("en-US")} one ListDir answers: list a smaller ` +
        "depth or the subdirectories one by one, or run a command (find, ls) and read its output",
    );
  }
  return { entries: entries.map(entryJson) };
}

/**
 * Serves `MakeDir` for one call: the directory and its parents.
 *
 * @throws {ConnectError} `already_exists` when the directory was there already.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => makeDir(ops, call);
 * ```
 */
export async function makeDir(ops: SandboxOps, call: RpcCall): Promise<unknown> {
  const body = parseMessage(makeDirSchema, call.message);
  const user = call.user();
  const path = resolvePath(body.path, user, "path");
  const made = await ops.makeDir({ id: call.sandbox.id }, path, { user });
  if (!made) {
    throw new ConnectError("already_exists", `Directory '${path}' already exists`);
  }
  return { entry: entryJson(await ops.stat({ id: call.sandbox.id }, path, { user })) };
}
