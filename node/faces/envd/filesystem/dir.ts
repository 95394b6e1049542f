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
  const entries = await ops.listDir({ id: call.sandbox.id }, path, body.depth || 1, { user });
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
