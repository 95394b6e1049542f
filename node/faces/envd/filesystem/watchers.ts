/**
 * The directory watches of one envd: streamed ones (`WatchDir`) and polled ones
 * (`CreateWatcher`), and the `publish` that uploads and filesystem RPCs report their changes
 * to. Only changes made through envd are seen, not writes by commands inside the sandbox.
 *
 * @module
 */
import { posix } from "node:path";

/** One change, as `WatchDir` and `GetWatcherEvents` report it (a name relative to the watch). */
export interface FsEvent {
  /** The changed path, relative to the watched directory. */
  name: string;
  /** What happened to it. */
  type: "EVENT_TYPE_CREATE" | "EVENT_TYPE_WRITE" | "EVENT_TYPE_REMOVE" | "EVENT_TYPE_RENAME";
}

/** One directory watch. */
export interface Watcher {
  /** The sandbox whose changes it sees. */
  sandboxId: string;
  /** The watched directory, absolute. */
  path: string;
  /** Whether changes below the directory's children count too. */
  recursive: boolean;
  /** Called once per change; must not throw. */
  deliver: (event: FsEvent) => void;
}

/** Events a polled watcher keeps for its next poll: one nobody polls cannot grow without limit. */
const POLLED_EVENTS_CAP = 10_000;

/**
 * The watches of one envd. A streamed watch lives as long as its stream; a polled one until
 * `RemoveWatcher`.
 *
 * @example
 * ```ts
 * import { Watchers } from "./watchers.ts";
 * const watchers = new Watchers();
 * const id = watchers.createPolled({ sandboxId: "s", path: "/tmp", recursive: false });
 * watchers.publish("s", "/tmp/a.txt", "EVENT_TYPE_WRITE");
 * watchers.takePolled("s", id); // [{ name: "a.txt", type: "EVENT_TYPE_WRITE" }]
 * ```
 */
export class Watchers {
  #live = new Set<Watcher>();
  #polled = new Map<string, { sandboxId: string; events: FsEvent[]; watcher: Watcher }>();

  /** Adds a streamed watch; the returned function removes it (call it when the stream ends). */
  add(watcher: Watcher): () => void {
    this.#live.add(watcher);
    return () => this.#live.delete(watcher);
  }

  /** Starts a polled watch and answers its id for `takePolled` and `removePolled`. */
  createPolled(watch: Omit<Watcher, "deliver">): string {
    const watcherId = crypto.randomUUID();
    const events: FsEvent[] = [];
    const watcher: Watcher = {
      ...watch,
      deliver: (event) => {
        if (events.length < POLLED_EVENTS_CAP) events.push(event);
      },
    };
    this.#live.add(watcher);
    this.#polled.set(watcherId, { sandboxId: watch.sandboxId, events, watcher });
    return watcherId;
  }

  /** The events a polled watch gathered since the last call; `undefined` for another sandbox's id. */
  takePolled(sandboxId: string, watcherId: string): FsEvent[] | undefined {
    const entry = this.#polled.get(watcherId);
    if (!entry || entry.sandboxId !== sandboxId) return undefined;
    return entry.events.splice(0);
  }

  /** Ends a polled watch; false when this sandbox has no watch of that id. */
  removePolled(sandboxId: string, watcherId: string): boolean {
    const entry = this.#polled.get(watcherId);
    if (!entry || entry.sandboxId !== sandboxId) return false;
    this.#live.delete(entry.watcher);
    this.#polled.delete(watcherId);
    return true;
  }

  /** Tells every watch of `sandboxId` that covers `path` what happened to it. */
  publish(sandboxId: string, path: string, type: FsEvent["type"]): void {
    for (const w of this.#live) {
      if (w.sandboxId !== sandboxId) continue;
      const parent = posix.dirname(path);
      const inside = parent === w.path ||
        (w.recursive && path.startsWith(w.path === "/" ? "/" : w.path + "/"));
      if (inside) w.deliver({ name: posix.relative(w.path, path), type });
    }
  }
}
