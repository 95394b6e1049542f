/**
 * The directory watches of one envd face: streamed ones (`WatchDir`) and polled ones
 * (`CreateWatcher`). Each is a watch of the sandbox's executor, so it sees every change, by
 * whoever made it: uploads through either `/files` door, the filesystem RPCs, commands.
 *
 * Bounded: at most `maxPerSandbox` watches per sandbox (each costs the executor a process in
 * the sandbox on Docker); a polled watch keeps at most 10,000 events for its next poll; a watch
 * ends with its stream, its `RemoveWatcher`, or its sandbox, and is forgotten then.
 *
 * @module
 */
import { posix } from "node:path";
import type { DirWatch, FsChange } from "../../../executors/contract.ts";
import type { SandboxOps } from "../../../service_contract.ts";
import { ConnectError } from "../../connect_codec.ts";
import { entryJson } from "./entry.ts";

/** One change, as `WatchDir` and `GetWatcherEvents` report it. */
export interface FsEvent {
  /** The changed path, relative to the watched directory. */
  name: string;
  /** What happened to it. */
  type:
    | "EVENT_TYPE_CREATE"
    | "EVENT_TYPE_WRITE"
    | "EVENT_TYPE_REMOVE"
    | "EVENT_TYPE_RENAME"
    | "EVENT_TYPE_CHMOD";
  /** The entry now at that path, when the watch asked for entries and it is still there. */
  entry?: Record<string, unknown>;
}

/** What one watch watches, and for whom. */
export interface WatchSpec {
  /** The sandbox whose changes it sees. */
  sandboxId: string;
  /** The watched directory, absolute. */
  path: string;
  /** Whether changes below the directory's children count too. */
  recursive: boolean;
  /** Whether each event carries the entry at its path (envd's `include_entry`). */
  includeEntry: boolean;
  /** The run-as user the directory is watched (and entries described) as. */
  user: string;
}

/** Options of {@linkcode Watchers}. */
export interface WatchersOptions {
  /** Watches one sandbox may have at once, streamed and polled together (16 by default). */
  maxPerSandbox?: number;
}

/** Events a polled watch keeps for its next poll: one nobody polls cannot grow without limit. */
const POLLED_EVENTS_CAP = 10_000;

/** Events waiting for their entry's stat; past this, events go on without an entry. */
const PENDING_ENTRIES_CAP = 1_000;

const EVENT_TYPES: Record<FsChange["type"], FsEvent["type"]> = {
  create: "EVENT_TYPE_CREATE",
  write: "EVENT_TYPE_WRITE",
  remove: "EVENT_TYPE_REMOVE",
  rename: "EVENT_TYPE_RENAME",
  chmod: "EVENT_TYPE_CHMOD",
};

/**
 * The watches of one envd face.
 *
 * @example
 * ```ts ignore
 * const watchers = new Watchers(ops);
 * const id = await watchers.createPolled({
 *   sandboxId: "sbx_1", path: "/tmp", recursive: false, includeEntry: false, user: "user",
 * });
 * watchers.takePolled("sbx_1", id); // the events since the last poll
 * ```
 */
export class Watchers {
  #ops: SandboxOps;
  #maxPerSandbox: number;
  /** Watches of each sandbox, running or starting. */
  #counts = new Map<string, number>();
  #polled = new Map<string, { sandboxId: string; events: FsEvent[]; watch: DirWatch }>();

  constructor(ops: SandboxOps, { maxPerSandbox = 16 }: WatchersOptions = {}) {
    if (!Number.isInteger(maxPerSandbox) || maxPerSandbox < 1) {
      throw new RangeError(
        `Cannot create Watchers as 'maxPerSandbox' must be a positive integer: received ${maxPerSandbox}`,
      );
    }
    this.#ops = ops;
    this.#maxPerSandbox = maxPerSandbox;
  }

  /**
   * Starts a watch whose events go to `deliver`, in order; resolves once it sees changes.
   *
   * @throws {ConnectError} `resource_exhausted` when the sandbox has its most watches.
   */
  async open(spec: WatchSpec, deliver: (event: FsEvent) => void): Promise<DirWatch> {
    const count = this.#counts.get(spec.sandboxId) ?? 0;
    if (count >= this.#maxPerSandbox) {
      throw new ConnectError(
        "resource_exhausted",
        `Sandbox '${spec.sandboxId}' already has ${count} directory watches, the most it may ` +
          `have: stop one (WatchHandle.stop(), RemoveWatcher) before starting another`,
      );
    }
    this.#counts.set(spec.sandboxId, count + 1);
    const release = () => {
      const left = (this.#counts.get(spec.sandboxId) ?? 1) - 1;
      if (left > 0) this.#counts.set(spec.sandboxId, left);
      else this.#counts.delete(spec.sandboxId);
    };
    let watch: DirWatch;
    try {
      watch = await this.#ops.watch(
        { id: spec.sandboxId },
        { path: spec.path, recursive: spec.recursive, user: spec.user },
        this.#translator(spec, deliver),
      );
    } catch (error) {
      release();
      throw error;
    }
    watch.ended.then(release, release);
    return watch;
  }

  /** Starts a polled watch and answers its id for `takePolled` and `removePolled`. */
  async createPolled(spec: WatchSpec): Promise<string> {
    const events: FsEvent[] = [];
    const watch = await this.open(spec, (event) => {
      if (events.length < POLLED_EVENTS_CAP) events.push(event);
    });
    const watcherId = `w${crypto.randomUUID()}`;
    this.#polled.set(watcherId, { sandboxId: spec.sandboxId, events, watch });
    // A watch that ended with its sandbox is forgotten: its id then reads as unknown.
    const forget = () => this.#polled.delete(watcherId);
    watch.ended.then(forget, forget);
    return watcherId;
  }

  /** The events a polled watch gathered since the last call; `undefined` for another sandbox's id. */
  takePolled(sandboxId: string, watcherId: string): FsEvent[] | undefined {
    const entry = this.#polled.get(watcherId);
    if (!entry || entry.sandboxId !== sandboxId) return undefined;
    return entry.events.splice(0);
  }

  /** Ends a polled watch; false when this sandbox has no watch of that id. */
  async removePolled(sandboxId: string, watcherId: string): Promise<boolean> {
    const entry = this.#polled.get(watcherId);
    if (!entry || entry.sandboxId !== sandboxId) return false;
    this.#polled.delete(watcherId);
    await entry.watch.stop();
    return true;
  }

  /**
   * The executor's changes as envd's events. Without entries they go on at once (a client
   * polling right after a write must see them); with entries each waits for its stat, in order.
   */
  #translator(spec: WatchSpec, deliver: (event: FsEvent) => void): (change: FsChange) => void {
    let chain = Promise.resolve();
    let pending = 0;
    return (change) => {
      const event: FsEvent = {
        name: posix.relative(spec.path, change.path),
        type: EVENT_TYPES[change.type],
      };
      const gone = change.type === "remove" || change.type === "rename";
      if (!spec.includeEntry) return deliver(event);
      const withEntry = !gone && pending < PENDING_ENTRIES_CAP;
      pending++;
      chain = chain.then(async () => {
        if (withEntry) {
          try {
            const entry = await this.#ops.stat({ id: spec.sandboxId }, change.path, {
              user: spec.user,
            });
            event.entry = entryJson(entry);
          } catch {
            // Gone again already: envd sends no entry for a path it cannot stat either.
          }
        }
        pending--;
        deliver(event);
      });
    };
  }
}
