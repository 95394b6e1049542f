/**
 * What the Docker executor knows of each sandbox's container (its user and home, the user's
 * numeric ids) and how a sandbox path is resolved against that home.
 *
 * @module
 */
import { posix } from "node:path";
import { ExecutorError } from "../contract.ts";
import type { Engine } from "./engine.ts";

/** What the executor remembers of one sandbox's container. */
export interface SandboxInfo {
  /** The image's user ("" for root). */
  user: string;
  /** Where relative paths and commands without a cwd start. */
  home: string;
  /** The user's numeric ids for files written by archive, once looked up. */
  ids?: Owner;
}

/** Who owns the files the executor writes: numeric ids for the tar, names for the entry. */
export interface Owner {
  uid: number;
  gid: number;
  owner: string;
  group: string;
}

/** The home: the image's working directory, else where the base image puts a user's home. */
function homeOf(user: string, workingDir: string | undefined): string {
  if (workingDir) return workingDir;
  return user && user !== "root" ? `/home/${user}` : "/root";
}

/**
 * Resolves a path like envd does: relative to the home, `~` for the home.
 *
 * @throws {ExecutorError} `invalid` for an empty path or one with a NUL byte.
 */
export function resolvePath(path: string, home: string, what = "path"): string {
  if (typeof path !== "string" || path === "") {
    throw new ExecutorError("invalid", `The ${what} is empty: give a file path`);
  }
  if (path.includes("\0")) {
    throw new ExecutorError("invalid", `The ${what} has a NUL byte: give a plain file path`);
  }
  const expanded = path === "~" || path.startsWith("~/") ? home + path.slice(1) : path;
  return posix.resolve(home, expanded);
}

/**
 * The facts of every sandbox this executor touched. A sandbox created before the node restarted
 * is looked up by container inspect on first use; an entry lives until the sandbox is destroyed.
 */
export class Sandboxes {
  #engine: Engine;
  #known = new Map<string, SandboxInfo>();

  constructor(engine: Engine) {
    this.#engine = engine;
  }

  /**
   * The facts of one sandbox, from memory or from the engine.
   *
   * @throws {ExecutorError} `gone` when the sandbox has no container.
   */
  async get(id: string): Promise<SandboxInfo> {
    const known = this.#known.get(id);
    if (known) return known;
    const inspect = await this.#engine.callContainer(
      id,
      `inspecting the container of sandbox ${id}`,
      (container, signal) => container.inspect({ abortSignal: signal }),
    );
    return this.remember(id, inspect.Config?.User ?? "", inspect.Config?.WorkingDir);
  }

  /** Records a sandbox's user and home from its image's (or container's) config. */
  remember(id: string, user: string, workingDir: string | undefined): SandboxInfo {
    const info = { user, home: homeOf(user, workingDir) };
    this.#known.set(id, info);
    return info;
  }

  /** Drops a destroyed sandbox. */
  forget(id: string): void {
    this.#known.delete(id);
  }
}
