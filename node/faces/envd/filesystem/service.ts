/**
 * `filesystem.Filesystem`: wires the filesystem RPCs (one per file, the two directory ones and
 * the watch ones together) to the sandbox service and the envd's watches.
 *
 * | method | kind | file |
 * |---|---|---|
 * | `Stat` | unary | `stat.ts` |
 * | `ListDir`, `MakeDir` | unary | `dir.ts` |
 * | `Move` | unary | `move.ts` |
 * | `Remove` | unary | `remove.ts` |
 * | `WatchDir` | stream | `watch.ts` |
 * | `CreateWatcher`, `GetWatcherEvents`, `RemoveWatcher` | unary | `watch.ts` |
 *
 * @module
 */
import type { SandboxOps } from "../../../service_contract.ts";
import type { EnvdService } from "../rpc.ts";
import { listDir, makeDir } from "./dir.ts";
import { move } from "./move.ts";
import { remove } from "./remove.ts";
import { stat } from "./stat.ts";
import { createWatcher, getWatcherEvents, removeWatcher, watchDir } from "./watch.ts";
import type { Watchers } from "./watchers.ts";

/**
 * The `filesystem.Filesystem` service over `ops`, its watches kept by `watchers`.
 *
 * @example
 * ```ts ignore
 * mountRpcs(app, core, [filesystemService(core.ops, new Watchers(core.ops))]);
 * ```
 */
export function filesystemService(ops: SandboxOps, watchers: Watchers): EnvdService {
  return {
    name: "filesystem.Filesystem",
    stream: {
      WatchDir: (call, sink) => watchDir(watchers, call, sink),
    },
    unary: {
      Stat: (call) => stat(ops, call),
      ListDir: (call) => listDir(ops, call),
      MakeDir: (call) => makeDir(ops, call),
      Move: (call) => move(ops, call),
      Remove: (call) => remove(ops, call),
      CreateWatcher: (call) => createWatcher(watchers, call),
      GetWatcherEvents: (call) => getWatcherEvents(watchers, call),
      RemoveWatcher: (call) => removeWatcher(watchers, call),
    },
  };
}
