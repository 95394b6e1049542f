/**
 * Directory watches: `filesystem.Filesystem/WatchDir` streams changes while its client stays;
 * `CreateWatcher`, `GetWatcherEvents` and `RemoveWatcher` keep one for polling. Both see every
 * change in the sandbox, by envd or by its commands (see `watchers.ts`).
 *
 * @module
 */
import { z } from "zod";
import { ConnectError, type StreamSink } from "../../connect_codec.ts";
import { parseMessage, resolvePath } from "../request.ts";
import { type RpcCall, startKeepalive, untilAborted } from "../rpc.ts";
import type { FsEvent, Watchers, WatchSpec } from "./watchers.ts";

const watchSchema = z.object({
  path: z.string(),
  recursive: z.boolean().optional(),
  includeEntry: z.boolean().optional(),
  allowNetworkMounts: z.boolean().optional(),
});
const watcherIdSchema = z.object({ watcherId: z.string().min(1) });

/**
 * Serves `WatchDir` for one call: the start event once the watch sees changes, then one event
 * per change until the client leaves; a sandbox that goes ends the stream with `unavailable`.
 *
 * @throws {ConnectError} `not_found` for a missing directory, `invalid_argument` for a file,
 * `resource_exhausted` when the sandbox has its most watches.
 * @example
 * ```ts ignore
 * const rpc: StreamRpc = (call, sink) => watchDir(watchers, call, sink);
 * ```
 */
export async function watchDir(
  watchers: Watchers,
  call: RpcCall,
  sink: StreamSink,
): Promise<void> {
  const spec = specOf(call);
  // The SDK needs the start event first: anything seen before it is sent waits.
  let early: FsEvent[] | null = [];
  const watch = await watchers.open(spec, (event) => {
    if (early) early.push(event);
    else sink.send({ filesystem: event });
  });
  const stopKeepalive = startKeepalive(sink, call.keepaliveMs(), { keepalive: {} });
  try {
    sink.send({ start: {} });
    for (const event of early) sink.send({ filesystem: event });
    early = null;
    const ended = await Promise.race([
      untilAborted(sink.signal).then(() => false),
      watch.ended.then(() => true),
    ]);
    if (ended && !sink.signal.aborted) {
      throw new ConnectError(
        "unavailable",
        `Sandbox '${spec.sandboxId}' is gone, and its watch of '${spec.path}' with it`,
      );
    }
  } finally {
    stopKeepalive();
    await watch.stop();
  }
}

/**
 * Serves `CreateWatcher` for one call: answers the `watcherId` to poll.
 *
 * @throws {ConnectError} as {@linkcode watchDir} does.
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => createWatcher(watchers, call);
 * ```
 */
export async function createWatcher(watchers: Watchers, call: RpcCall): Promise<unknown> {
  return { watcherId: await watchers.createPolled(specOf(call)) };
}

/**
 * Serves `GetWatcherEvents` for one call: the changes since the last poll.
 *
 * @throws {ConnectError} `not_found` for an id this sandbox has no watcher of (or no longer: a
 * watcher ends with its sandbox).
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
export async function removeWatcher(watchers: Watchers, call: RpcCall): Promise<unknown> {
  const body = parseMessage(watcherIdSchema, call.message);
  if (!(await watchers.removePolled(call.sandbox.id, body.watcherId))) {
    throw noWatcher(body.watcherId);
  }
  return {};
}

/** What a watch request asks for, its path resolved as envd resolves it. */
function specOf(call: RpcCall): WatchSpec {
  const body = parseMessage(watchSchema, call.message);
  const user = call.user();
  return {
    sandboxId: call.sandbox.id,
    path: resolvePath(body.path, user, "path"),
    recursive: body.recursive ?? false,
    includeEntry: body.includeEntry ?? false,
    user,
  };
}

function noWatcher(watcherId: string): ConnectError {
  return new ConnectError("not_found", `No watcher '${watcherId}': create one first`);
}
