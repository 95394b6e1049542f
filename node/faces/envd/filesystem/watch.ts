/**
 * Directory watches: `filesystem.Filesystem/WatchDir` streams changes while its client stays;
 * `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher` keep one for polling. Both see only
 * changes made through envd (uploads, MakeDir, Move, Remove), not writes by commands inside
 * the sandbox.
 *
 * @module
 */
import { z } from "zod";
import type { SandboxOps, SandboxRecord } from "../../../service_contract.ts";
import { ConnectError, type StreamSink } from "../../connect_codec.ts";
import { parseMessage, resolvePath } from "../request.ts";
import { type RpcCall, startKeepalive, untilAborted } from "../rpc.ts";
import type { Watchers } from "./watchers.ts";

const watchSchema = z.object({
  path: z.string(),
  recursive: z.boolean().optional(),
  includeEntry: z.boolean().optional(),
  allowNetworkMounts: z.boolean().optional(),
});
const watcherIdSchema = z.object({ watcherId: z.string().min(1) });

/**
 * Serves `WatchDir` for one call: the start event, then one event per change until the client
 * leaves.
 *
 * @throws {ConnectError} `invalid_argument` when the path is not a directory.
 * @example
 * ```ts ignore
 * const rpc: StreamRpc = (call, sink) => watchDir(ops, watchers, call, sink);
 * ```
 */
export async function watchDir(
  ops: SandboxOps,
  watchers: Watchers,
  call: RpcCall,
  sink: StreamSink,
): Promise<void> {
  const body = parseMessage(watchSchema, call.message);
  const user = call.user();
  const path = resolvePath(body.path, user, "path");
  await requireDir(ops, call.sandbox, path, user);
  sink.send({ start: {} });
  const unwatch = watchers.add({
    sandboxId: call.sandbox.id,
    path,
    recursive: body.recursive ?? false,
    deliver: (event) => sink.send({ filesystem: event }),
  });
  const stopKeepalive = startKeepalive(sink, call.keepaliveMs(), { keepalive: {} });
  try {
    await untilAborted(sink.signal);
  } finally {
    unwatch();
    stopKeepalive();
  }
}

/**
 * Serves `CreateWatcher` for one call: answers the `watcherId` to poll.
 *
 * @throws {ConnectError} `invalid_argument` when the path is not a directory.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => createWatcher(ops, watchers, call);
 * ```
 */
export async function createWatcher(
  ops: SandboxOps,
  watchers: Watchers,
  call: RpcCall,
): Promise<unknown> {
  const body = parseMessage(watchSchema, call.message);
  const user = call.user();
  const path = resolvePath(body.path, user, "path");
  await requireDir(ops, call.sandbox, path, user);
  const watcherId = watchers.createPolled({
    sandboxId: call.sandbox.id,
    path,
    recursive: body.recursive ?? false,
  });
  return { watcherId };
}

/**
 * Serves `GetWatcherEvents` for one call: the changes since the last poll.
 *
 * @throws {ConnectError} `not_found` for an id this sandbox has no watcher of.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => getWatcherEvents(watchers, call);
 * ```
 */
export function getWatcherEvents(watchers: Watchers, call: RpcCall): Promise<unknown> {
  const body = parseMessage(watcherIdSchema, call.message);
  const events = watchers.takePolled(call.sandbox.id, body.watcherId);
  if (!events) throw noWatcher(body.watcherId);
  return Promise.resolve({ events });
}

/**
 * Serves `RemoveWatcher` for one call.
 *
 * @throws {ConnectError} `not_found` for an id this sandbox has no watcher of.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => removeWatcher(watchers, call);
 * ```
 */
export function removeWatcher(watchers: Watchers, call: RpcCall): Promise<unknown> {
  const body = parseMessage(watcherIdSchema, call.message);
  if (!watchers.removePolled(call.sandbox.id, body.watcherId)) throw noWatcher(body.watcherId);
  return Promise.resolve({});
}

async function requireDir(
  ops: SandboxOps,
  sandbox: SandboxRecord,
  path: string,
  user: string,
): Promise<void> {
  const entry = await ops.stat({ id: sandbox.id }, path, { user });
  if (entry.type !== "dir") {
    throw new ConnectError("invalid_argument", `'${path}' is not a directory: watch a directory`);
  }
}

function noWatcher(watcherId: string): ConnectError {
  return new ConnectError("not_found", `No watcher '${watcherId}': create one first`);
}
