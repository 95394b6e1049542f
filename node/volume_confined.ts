/**
 * The content API's renames into and out of a volume, made where a sandbox's links cannot
 * redirect them. Every path call in Deno walks its path again from `/`, so a sandbox that
 * swaps a directory of a checked path for a link between the check and the call sends the call
 * wherever the link points (measured 2026-12-07: one upload in 34,000 landed outside the volume
 * with a sandbox flipping the link in a loop). Deno has no `openat2(RESOLVE_BENEATH)`, so the
 * step is run by a shell that first enters the checked directory (`cd -P`), then asks the
 * kernel where it is (`pwd -P`: the directory itself, not a path walked again) and refuses
 * unless it is the checked one; the rename then names only the final entry, relative to that
 * directory, and the node's own side (`<root>/<id>/uploads`, out of every sandbox's sight).
 * A sandbox may still move the directory meanwhile, but only within the volume.
 *
 * Reads and mode or owner changes of a file go through a hard link made the same way (`ln -P`,
 * which links a link itself), a directory's mode or owner is changed from inside it (`.`), and
 * new directories are made on the node's side and renamed in.
 *
 * `mv -T` replaces, never follows, a link in the final place. Needs `--allow-run=sh` and GNU
 * `mv`; without the permission {@linkcode confinedRenames} answers `undefined` and the caller
 * renames in process (the race above stays open; the node logs so at start).
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";

/** What the check answers when the directory was not the checked one. */
const MOVED = 91;

/** How long one rename may take, its shell's start included. */
const TIMEOUT_MS = 30_000;

const SCRIPT = `cd -P -- "$1" || exit 90
[ "$(pwd -P)" = "$1" ] || exit ${MOVED}
case "$2" in
  in) exec mv -T -- "$3" "./$4" ;;
  out) exec mv -T -- "./$3" "$4" ;;
  link) exec ln -P -- "./$3" "$4" ;;
  list) exec find . -mindepth 1 -maxdepth "$3" -printf "$FORMAT" ;;
  stat) exec find "./$3" -maxdepth 0 -printf "$FORMAT" ;;
  chmod) exec chmod -- "$3" . ;;
  chown) exec chown -- "$3" . ;;
esac
exit 92`;

/** One entry as `find -printf` describes it: ten NUL-ended fields. */
const FORMAT = "%y\\0%s\\0%m\\0%U\\0%G\\0%A@\\0%T@\\0%C@\\0%l\\0%P\\0";

/** An entry listed from inside its checked directory (a link described, not followed). */
export interface ConfinedEntry {
  /** Its path below the listed directory, `/`-separated (`""` for an entry asked by name). */
  path: string;
  type: "file" | "directory" | "symlink" | "unknown";
  size: number;
  /** Permission bits, set-id and sticky bits included. */
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  atime: number;
  mtime: number;
  ctime: number;
  /** A link's target. */
  target?: string;
}

/** Renames that name a volume's entry relative to its checked directory. */
export interface ConfinedRenames {
  /** Moves `from` (a node-side path) to the entry `name` of the real directory `dir`. */
  into(dir: string, name: string, from: string): Promise<void>;
  /** Moves the entry `name` of the real directory `dir` to `to` (a node-side path). */
  outOf(dir: string, name: string, to: string): Promise<void>;
  /**
   * Hard-links the entry `name` of the real directory `dir` (itself, a link not followed) at
   * `to` (a node-side path): the same file, reached where no sandbox can swap a directory.
   */
  linkOut(dir: string, name: string, to: string): Promise<void>;
  /**
   * Changes the mode, and the owner when `uid` or `gid` is given, of the real directory `dir`
   * itself, from inside it (`.`: no path is walked again).
   */
  changeDir(dir: string, shown: string, mode?: number, uid?: number, gid?: number): Promise<void>;
  /**
   * The entries below the real directory `dir`, `depth` levels deep, listed from inside it
   * (`find -P`, which neither follows links nor walks a path again).
   *
   * @throws {HttpError} 400 past `max` entries.
   */
  list(dir: string, shown: string, depth: number, max: number): Promise<ConfinedEntry[]>;
  /** The entry `name` of the real directory `dir`, described from inside it. */
  stat(dir: string, name: string, shown: string): Promise<ConfinedEntry>;
}

/**
 * The renames through `sh`, or `undefined` when this process may not run it.
 *
 * @example
 * ```ts ignore
 * const renames = confinedRenames();
 * await renames?.into("/srv/volumes/vol-…/data/notes", "a.txt", "/srv/volumes/vol-…/uploads/1");
 * ```
 */
export function confinedRenames(): ConfinedRenames | undefined {
  if (Deno.permissions.querySync({ name: "run", command: "sh" }).state !== "granted") {
    return undefined;
  }
  const run = async (
    dir: string,
    way: "in" | "out" | "link" | "chmod" | "chown",
    a: string,
    b: string,
    shown: string,
  ) => {
    const out = await new Deno.Command("sh", {
      args: ["-c", SCRIPT, "sh", dir, way, a, b],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
      signal: AbortSignal.timeout(TIMEOUT_MS),
    }).output();
    if (out.code === 0) return;
    if (out.code === MOVED || out.code === 90) {
      throw new HttpError(
        409,
        `A directory of path '${shown}' was moved or replaced while the node used it (a ` +
          "sandbox that mounts the volume changed it): retry once it is still",
      );
    }
    const why = new TextDecoder().decode(out.stderr).trim().slice(0, 300);
    if (/No such file/.test(why)) throw new HttpError(404, `Path '${shown}' not found`);
    if (/not allowed for directory/.test(why)) {
      throw new HttpError(400, `Path '${shown}' is a directory`);
    }
    if (/Is a directory|Not a directory|Directory not empty|File exists|non-directory/.test(why)) {
      throw new HttpError(409, `Path '${shown}' changed type while the node used it: retry`);
    }
    throw new Error(`The node's ${way} of '${shown}' failed (exit ${out.code}): ${why}`);
  };
  const find = async (
    dir: string,
    way: "list" | "stat",
    arg: string,
    shown: string,
    max: number,
  ): Promise<ConfinedEntry[]> => {
    const child = new Deno.Command("sh", {
      args: ["-c", SCRIPT, "sh", dir, way, arg],
      env: { FORMAT },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(TIMEOUT_MS),
    }).spawn();
    const stderr = new Response(child.stderr).text();
    const fields: string[] = [];
    const out: ConfinedEntry[] = [];
    let rest = new Uint8Array(0);
    const decoder = new TextDecoder();
    let over = false;
    for await (const chunk of child.stdout) {
      const buf = new Uint8Array(rest.length + chunk.length);
      buf.set(rest);
      buf.set(chunk, rest.length);
      let start = 0;
      for (let i = 0; i < buf.length; i++) {
        if (buf[i] !== 0) continue;
        fields.push(decoder.decode(buf.subarray(start, i)));
        start = i + 1;
        if (fields.length === 10) out.push(entryOf(fields.splice(0, 10)));
      }
      rest = buf.slice(start);
      if (out.length > max || rest.length > 64 * 1024) {
        over = true;
        try {
          child.kill("SIGKILL");
        } catch { /* it ended on its own meanwhile */ }
        break;
      }
    }
    const status = await child.status;
    const why = (await stderr).trim().slice(0, 300);
    if (over) {
      throw new HttpError(
        400,
        `The listing has over ${max} entries: list a smaller depth or directory`,
      );
    }
    if (status.code === MOVED || status.code === 90) {
      throw new HttpError(
        409,
        `A directory of path '${shown}' was moved or replaced while the node used it (a ` +
          "sandbox that mounts the volume changed it): retry once it is still",
      );
    }
    if (/No such file/.test(why)) throw new HttpError(404, `Path '${shown}' not found`);
    if (status.code !== 0) {
      throw new Error(`The node's ${way} of '${shown}' failed (exit ${status.code}): ${why}`);
    }
    return out;
  };
  return {
    list: (dir, shown, depth, max) => find(dir, "list", String(depth), shown, max),
    stat: async (dir, name, shown) => {
      const [entry] = await find(dir, "stat", name, shown, 1);
      if (entry === undefined) throw new HttpError(404, `Path '${shown}' not found`);
      return entry;
    },
    into: (dir, name, from) => run(dir, "in", from, name, name),
    outOf: (dir, name, to) => run(dir, "out", name, to, name),
    linkOut: (dir, name, to) => run(dir, "link", name, to, name),
    changeDir: async (dir, shown, mode, uid, gid) => {
      if (mode !== undefined) await run(dir, "chmod", (mode & 0o7777).toString(8), "", shown);
      if (uid !== undefined || gid !== undefined) {
        const spec = gid === undefined ? `${uid}` : `${uid ?? ""}:${gid}`;
        await run(dir, "chown", spec, "", shown);
      }
    },
  };
}

function entryOf(f: string[]): ConfinedEntry {
  const type = f[0] === "f"
    ? "file"
    : f[0] === "d"
    ? "directory"
    : f[0] === "l"
    ? "symlink"
    : "unknown";
  return {
    path: f[9],
    type,
    size: Number(f[1]),
    mode: parseInt(f[2], 8),
    uid: Number(f[3]),
    gid: Number(f[4]),
    atime: Number(f[5]),
    mtime: Number(f[6]),
    ctime: Number(f[7]),
    ...(type === "symlink" ? { target: f[8] } : {}),
  };
}
