/**
 * The in-memory file tree of one fake sandbox (private to `FakeExecutor`).
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { posix } from "node:path";
import type { ExecutorError as ExecutorErrorType, FileEntry, FsChange } from "./contract.ts";
import { ExecutorError } from "./contract.ts";

type FsNode =
  | { type: "dir"; mode: number; modifiedAt: number; owner: string }
  | {
    type: "file";
    data: Uint8Array;
    mode: number;
    modifiedAt: number;
    owner: string;
    /** A kernel file: stat says size 0 whatever it holds, as /proc's do. */
    virtual?: boolean;
    /** Its `user.e2b.*` extended attributes (see `FileEntry.metadata`). */
    metadata?: Record<string, string>;
  }
  | { type: "symlink"; target: string; mode: number; modifiedAt: number; owner: string };

/** The size stat gives a directory on ext4, which envd reports as it is. */
const DIR_SIZE = 4096;

/** Symlink hops a lookup follows before it gives up, as Linux does (ELOOP). */
const MAX_HOPS = 40;

/** The home directory of every fake sandbox. */
export const fakeHome = "/home/user";

/**
 * Who a run-as user is in a fake sandbox, mapped as the Docker executor maps it: `root`, else
 * the sandbox's own user `user`.
 */
export function fakeUser(user: string | undefined): "root" | "user" {
  return user === "root" ? "root" : "user";
}

/** The home of a run-as user: where its relative paths start. */
export function fakeHomeOf(user: string | undefined): string {
  return fakeUser(user) === "root" ? "/root" : fakeHome;
}

/** Directories every fake sandbox starts with, and who owns them. */
const BOOT_DIRS: [string, string][] = [
  ["/", "root"],
  ["/home", "root"],
  [fakeHome, "user"],
  ["/tmp", "root"],
  ["/root", "root"],
  ["/usr", "root"],
  ["/usr/bin", "root"],
  ["/etc", "root"],
  ["/opt", "root"],
  ["/proc", "root"],
];

/** What `/proc/version` says in a fake sandbox. */
const FAKE_KERNEL_VERSION = "Linux version 6.1.0-dormice-fake (fake executor) #1 SMP\n";

/** How a write or a mkdir was made, for what a watch of it reports. */
export interface MakeOptions {
  /** Who owns what is created. */
  owner?: string;
  /**
   * Made as envd makes it: as root, then handed to `owner` with chown, which a watch sees as a
   * chmod right after the create (a command creating its own file makes no such event).
   */
  chowned?: boolean;
}

/**
 * A flat map of absolute paths to nodes; small and obviously correct beats fast here. Every
 * change is told to the listeners at once, as inotify would see it.
 */
export class FakeFs {
  #nodes = new Map<string, FsNode>();
  #now: () => number;
  #listeners = new Set<(change: FsChange) => void>();

  constructor(now: () => number) {
    this.#now = now;
    for (const [dir, owner] of BOOT_DIRS) {
      this.#nodes.set(dir, { type: "dir", mode: 0o755, modifiedAt: now(), owner });
    }
    this.#nodes.set("/proc/version", {
      type: "file",
      data: new TextEncoder().encode(FAKE_KERNEL_VERSION),
      mode: 0o444,
      modifiedAt: now(),
      owner: "root",
      virtual: true,
    });
  }

  /**
   * An independent copy of the tree (no listeners): what a snapshot keeps and what each sandbox
   * started from it begins with, so a write in one is never seen in another.
   */
  copy(now: () => number = this.#now): FakeFs {
    const copy = new FakeFs(now);
    copy.#nodes = new Map([...this.#nodes].map(([path, node]) => [path, structuredClone(node)]));
    return copy;
  }

  /**
   * The tree as JSON bytes (file contents in base64): what the fake executor streams when it
   * exports a snapshot to another node. {@linkcode FakeFs.fromBytes} reads it back.
   */
  toBytes(): Uint8Array {
    const entries = [...this.#nodes].map(([path, node]) =>
      node.type === "file"
        ? [path, { ...node, data: Buffer.from(node.data).toString("base64") }]
        : [path, node]
    );
    return new TextEncoder().encode(JSON.stringify(entries));
  }

  /**
   * A tree read from {@linkcode FakeFs.toBytes}'s bytes.
   *
   * @throws {ExecutorError} `invalid` when the bytes are not such a tree.
   */
  static fromBytes(bytes: Uint8Array, now: () => number): FakeFs {
    const fs = new FakeFs(now);
    try {
      const entries = JSON.parse(new TextDecoder().decode(bytes)) as [string, FsNode][];
      fs.#nodes = new Map(entries.map(([path, node]) => [
        path,
        node.type === "file"
          ? { ...node, data: new Uint8Array(Buffer.from(node.data as unknown as string, "base64")) }
          : node,
      ]));
    } catch (error) {
      throw new ExecutorError(
        "invalid",
        `What arrived is not a fake executor's file tree (${(error as Error).message})`,
      );
    }
    return fs;
  }

  /**
   * Calls `listener` for every change to the entries of directory `dir` (anywhere below it
   * when `recursive`) from now on; the returned function stops that.
   */
  watch(dir: string, recursive: boolean, listener: (change: FsChange) => void): () => void {
    if (this.stat(dir).type !== "dir") {
      throw new ExecutorError("not_dir", `Cannot watch '${dir}': it is not a directory`);
    }
    const below = dir === "/" ? "/" : dir + "/";
    const filtered = (change: FsChange) => {
      if (!change.path.startsWith(below)) return;
      if (recursive || posix.dirname(change.path) === dir) listener(change);
    };
    this.#listeners.add(filtered);
    return () => this.#listeners.delete(filtered);
  }

  /** Resolves `path` against `cwd` (relative paths are relative to the home, as envd does). */
  resolve(path: string, cwd = fakeHome, home = fakeHome): string {
    if (path === "") throw new ExecutorError("invalid", "The path is empty: give a file path");
    if (path.includes("\0")) {
      throw new ExecutorError("invalid", "The path contains a NUL byte: give a plain file path");
    }
    const expanded = path === "~" || path.startsWith("~/") ? home + path.slice(1) : path;
    return posix.resolve(cwd, expanded);
  }

  /** Total bytes of every file. */
  bytes(): number {
    let n = 0;
    for (const node of this.#nodes.values()) if (node.type === "file") n += node.data.length;
    return n;
  }

  /** Whether `path` exists. */
  exists(path: string): boolean {
    return this.#nodes.has(path);
  }

  /** Reads a whole file, through symlinks. */
  read(path: string): Uint8Array {
    const node = this.#node(this.#follow(path).path);
    if (node.type === "dir") {
      throw new ExecutorError("is_dir", `${path} is a directory: read a file`);
    }
    if (node.type === "symlink") {
      throw new ExecutorError("invalid", `${path}: too many levels of symbolic links`);
    }
    return node.data.slice();
  }

  /** Creates a symlink at `path` to `target` (kept as given, relative or not). */
  symlink(target: string, path: string, owner = "user"): void {
    this.#parent(path, false);
    if (this.#nodes.has(path)) throw new ExecutorError("exists", `${path} already exists`);
    this.#nodes.set(path, { type: "symlink", target, mode: 0o777, modifiedAt: this.#now(), owner });
    this.#emit(path, "create");
  }

  /**
   * Writes (or appends to) a file; creates parent directories when `parents` is set. A new file
   * and new parents are owned by `owner`; an existing file keeps its owner and mode. `metadata`
   * undefined keeps the file's (a command writing in place); null or a record replaces it, as
   * the Docker executor's archive replaces the file.
   */
  write(
    path: string,
    data: Uint8Array,
    { append = false, parents = true, owner = "user", chowned = false, metadata }:
      & { append?: boolean; parents?: boolean; metadata?: Record<string, string> | null }
      & MakeOptions = {},
  ): FileEntry {
    // A write through a symlink writes what it leads to, as open(2) does.
    if (this.#nodes.get(path)?.type === "symlink") path = this.#follow(path).path;
    this.#parent(path, parents, { owner, chowned });
    const existing = this.#nodes.get(path);
    if (existing?.type === "dir") {
      throw new ExecutorError("is_dir", `${path} is a directory: write to a file path inside it`);
    }
    const old = append && existing?.type === "file" ? existing.data : new Uint8Array();
    const kept = metadata === undefined && existing?.type === "file"
      ? existing.metadata
      : metadata ?? undefined;
    const joined = new Uint8Array(old.length + data.length);
    joined.set(old);
    joined.set(data, old.length);
    this.#nodes.set(path, {
      type: "file",
      data: joined,
      mode: existing?.mode ?? 0o644,
      modifiedAt: this.#now(),
      owner: existing?.owner ?? owner,
      ...(kept && Object.keys(kept).length ? { metadata: { ...kept } } : {}),
    });
    // inotify's view: open(O_CREAT) creates, envd's chown is an attribute change, each write (and
    // a truncation) modifies; touching an existing file changes only its times.
    if (!existing) this.#emit(path, "create");
    if (chowned) this.#emit(path, "chmod");
    if (data.length > 0 || (existing && !append)) this.#emit(path, "write");
    else if (existing && !chowned) this.#emit(path, "chmod");
    return this.stat(path);
  }

  /** Creates a directory (and its parents, owned by `owner` too); false when it already existed. */
  mkdir(path: string, { parents = true, owner = "user", chowned = false }: {
    parents?: boolean;
  } & MakeOptions = {}): boolean {
    const existing = this.#nodes.get(path);
    if (existing?.type === "dir") return false;
    if (existing) {
      throw new ExecutorError("exists", `${path} exists and is a file: pick another path`);
    }
    this.#parent(path, parents, { owner, chowned });
    this.#nodes.set(path, { type: "dir", mode: 0o755, modifiedAt: this.#now(), owner });
    this.#emit(path, "create");
    if (chowned) this.#emit(path, "chmod");
    return true;
  }

  /** Sets the permission bits of a path (through a symlink, as chmod(2) does). */
  chmod(path: string, mode: number): void {
    const target = this.#follow(path).path;
    const node = this.#node(target);
    node.mode = mode & 0o7777;
    this.#emit(target, "chmod");
  }

  /** Describes one path; a symlink is described itself, with where it leads. */
  stat(path: string): FileEntry {
    const node = this.#node(path);
    const entry: FileEntry = {
      name: path === "/" ? "/" : posix.basename(path),
      path,
      type: node.type,
      size: node.type === "file"
        ? (node.virtual ? 0 : node.data.length)
        : node.type === "dir"
        ? DIR_SIZE
        : new TextEncoder().encode(node.target).length,
      mode: node.mode,
      owner: node.owner,
      group: node.owner,
      modifiedAt: node.modifiedAt,
    };
    if (node.type === "file" && node.metadata) entry.metadata = { ...node.metadata };
    if (node.type === "symlink") {
      const end = this.#follow(path);
      entry.symlinkTarget = end.path;
      if (end.node && end.node.type !== "symlink") {
        entry.targetType = end.node.type;
        entry.targetMode = end.node.mode;
      }
    }
    return entry;
  }

  /** Where `path` leads through symlinks (the node there, if any), at most MAX_HOPS hops. */
  #follow(path: string): { path: string; node?: FsNode } {
    let at = path;
    for (let hop = 0; hop <= MAX_HOPS; hop++) {
      const node = this.#nodes.get(at);
      if (node?.type !== "symlink") return { path: at, node };
      at = posix.resolve(posix.dirname(at), node.target);
    }
    return { path: at, node: this.#nodes.get(at) };
  }

  /** Lists a directory down to `depth` levels, sorted by path. */
  list(path: string, depth = 1): FileEntry[] {
    const node = this.#node(path);
    if (node.type !== "dir") {
      throw new ExecutorError("not_dir", `${path} is a file, not a directory: list its parent`);
    }
    const prefix = path === "/" ? "/" : path + "/";
    const out: FileEntry[] = [];
    for (const key of this.#nodes.keys()) {
      if (key === path || !key.startsWith(prefix)) continue;
      const levels = key.slice(prefix.length).split("/").length;
      if (levels <= Math.max(1, depth)) out.push(this.stat(key));
    }
    return out.sort((a, b) => a.path < b.path ? -1 : 1);
  }

  /** Renames a file or a whole tree. */
  move(from: string, to: string): FileEntry {
    this.#node(from);
    if (from === "/" || to === from || to.startsWith(from + "/")) {
      throw new ExecutorError("invalid", `Cannot move ${from} into itself (${to})`);
    }
    if (this.#nodes.get(to)?.type === "dir") {
      throw new ExecutorError("exists", `${to} is an existing directory: remove it first`);
    }
    this.#parent(to, false);
    const moves: [string, FsNode][] = [];
    for (const [key, node] of this.#nodes) {
      if (key === from || key.startsWith(from + "/")) moves.push([key, node]);
    }
    for (const [key] of moves) this.#nodes.delete(key);
    for (const [key, node] of moves) this.#nodes.set(to + key.slice(from.length), node);
    // rename(2) moves the entry; what is below it moves along unseen.
    this.#emit(from, "rename");
    this.#emit(to, "create");
    return this.stat(to);
  }

  /** Removes a file or a directory tree. */
  remove(path: string, recursive = true): void {
    const node = this.#node(path);
    if (path === "/") throw new ExecutorError("invalid", "Refusing to remove / in a sandbox");
    const children = [...this.#nodes.keys()].filter((k) => k.startsWith(path + "/"));
    if (node.type === "dir" && children.length > 0 && !recursive) {
      throw new ExecutorError("invalid", `${path} is a directory that is not empty`);
    }
    // Deepest first, as rm -r unlinks them.
    for (const key of children.sort().reverse()) {
      this.#nodes.delete(key);
      this.#emit(key, "remove");
    }
    this.#nodes.delete(path);
    this.#emit(path, "remove");
  }

  #emit(path: string, type: FsChange["type"]): void {
    for (const listener of this.#listeners) listener({ path, type });
  }

  #node(path: string): FsNode {
    const node = this.#nodes.get(path);
    if (node) return node;
    this.#parent(path, false);
    throw new ExecutorError("not_found", `${path} does not exist`);
  }

  /** Checks (or creates, as `made` says) the parent chain of `path`. */
  #parent(path: string, create: boolean, made: MakeOptions = {}): void {
    const parent = posix.dirname(path);
    if (parent === path) return;
    const node = this.#nodes.get(parent);
    if (node?.type === "dir") return;
    if (node) {
      throw new ExecutorError("not_dir", `${parent} is a file, so ${path} cannot be under it`);
    }
    if (!create) throw new ExecutorError("not_found", `${parent} does not exist (for ${path})`);
    this.#parent(parent, true, made);
    const owner = made.owner ?? "user";
    this.#nodes.set(parent, { type: "dir", mode: 0o755, modifiedAt: this.#now(), owner });
    this.#emit(parent, "create");
    if (made.chowned) this.#emit(parent, "chmod");
  }
}

/** The shell wording of an executor error code (`cat: x: No such file or directory`). */
export function shellWording(error: ExecutorErrorType): string {
  switch (error.code) {
    case "not_found":
      return "No such file or directory";
    case "is_dir":
      return "Is a directory";
    case "not_dir":
      return "Not a directory";
    case "exists":
      return "File exists";
    default:
      return error.message;
  }
}
