/**
 * Paths inside a volume, given by a tenant (the content API's `path` query): every one is
 * resolved against the volume's real directory and refused when it would leave it. `..` is a
 * 400 before the disk is touched; a symbolic link (a sandbox that mounts the volume can make
 * any) is followed only when its real target is inside the volume, otherwise a 403. Writes go
 * to a temporary file renamed over the final name, so a link in the final place is replaced,
 * never written through.
 *
 * What this does not close by itself: a sandbox that swaps a checked directory for a link
 * between the check and the use. The content API makes its reads, writes, removals and changes
 * of a file or directory, and its listings and stats, from inside the checked directory
 * (`volume_confined.ts`), where a swap is seen rather than followed.
 *
 * @module
 */
import { join, sep } from "node:path";
import { HttpError } from "../shared/http_error.ts";

/** The longest name of one file or directory, in bytes (Linux's `NAME_MAX`). */
const MAX_NAME_BYTES = 255;

/** A tenant's path split into its names; `/`, `` and `.` are the volume's root. */
export function splitVolumePath(path: string | null): string[] {
  if (path === null) {
    throw new HttpError(
      400,
      "The query parameter 'path' is required: name a path inside the volume",
    );
  }
  if (path.includes("\0") || path.length > 4096) {
    throw new HttpError(
      400,
      "The path has a NUL byte or is over 4096 characters: name a real path",
    );
  }
  const parts = path.split("/").filter((s) => s !== "" && s !== ".");
  const long = parts.find((s) => new TextEncoder().encode(s).length > MAX_NAME_BYTES);
  if (long !== undefined) {
    throw new HttpError(
      400,
      `The name '${long.slice(0, 40)}…' is over ${MAX_NAME_BYTES} bytes, the longest a file ` +
        "name may be: name a shorter one",
    );
  }
  if (parts.includes("..")) {
    throw new HttpError(
      400,
      `Path '${path.slice(0, 200)}' leaves the volume ('..' is refused): name a path inside it`,
    );
  }
  return parts;
}

/** The path as the content API shows it: `/` and the names. */
export function shownPath(parts: readonly string[]): string {
  return "/" + parts.join("/");
}

/** Whether `real` is `root` or below it. */
export function isInside(root: string, real: string): boolean {
  return real === root || real.startsWith(root.endsWith(sep) ? root : root + sep);
}

/** Where one tenant path lands on disk. */
export interface Resolved {
  /** The volume's real directory. */
  root: string;
  /** The real directory that holds the final name (inside `root`). */
  parent: string;
  /** The final name (`undefined` for the root itself). */
  name: string | undefined;
  /** `join(parent, name)`, not following a link in the final place. */
  full: string;
  /** The final place's own info (a link is not followed), or `null` when nothing is there. */
  info: Deno.FileInfo | null;
}

function escape(parts: readonly string[], what: string): HttpError {
  return new HttpError(
    403,
    `Path '${shownPath(parts).slice(0, 200)}' ${what} outside the volume: links may point only ` +
      "inside it",
  );
}

/**
 * Resolves the directory part of `parts` to its real place and checks it is inside `dataDir`.
 *
 * @throws {HttpError} 403 when a link leads out, 404 when a directory is missing (unless
 *   `makeParents`, which makes them).
 */
export async function resolveInVolume(
  dataDir: string,
  parts: readonly string[],
  options: {
    makeParents?: boolean;
    /** Makes the missing directory `name` in the real directory `parent` (mode 0777). */
    mkdir?: (parent: string, name: string) => Promise<void>;
  } = {},
): Promise<Resolved> {
  const root = await Deno.realPath(dataDir);
  if (parts.length === 0) {
    return { root, parent: root, name: undefined, full: root, info: await Deno.lstat(root) };
  }
  let parent = root;
  for (let i = 0; i < parts.length - 1; i++) {
    const next = join(parent, parts[i]);
    let info: Deno.FileInfo;
    try {
      info = await Deno.lstat(next);
    } catch (error) {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
      if (!options.makeParents) {
        throw new HttpError(404, `Path '${shownPath(parts.slice(0, i + 1))}' not found`);
      }
      if (options.mkdir) await options.mkdir(parent, parts[i]);
      else {
        await Deno.mkdir(next);
        // Past the umask: a sandbox's commands run as any user of its image.
        await Deno.chmod(next, 0o777);
      }
      info = await Deno.lstat(next);
    }
    if (info.isSymlink) {
      let real: string;
      try {
        real = await Deno.realPath(next);
      } catch {
        throw escape(parts.slice(0, i + 1), "is a link that leads nowhere or");
      }
      if (!isInside(root, real)) throw escape(parts.slice(0, i + 1), "is a link that leads");
      info = await Deno.stat(real);
      parent = real;
    } else parent = next;
    if (!info.isDirectory) {
      throw new HttpError(400, `Path '${shownPath(parts.slice(0, i + 1))}' is not a directory`);
    }
  }
  const name = parts[parts.length - 1];
  const full = join(parent, name);
  let info: Deno.FileInfo | null = null;
  try {
    info = await Deno.lstat(full);
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  return { root, parent, name, full, info };
}

/**
 * The real place of the final name, following a link only when it stays inside the volume.
 *
 * @throws {HttpError} 404 when nothing is there, 403 when a link leads out or nowhere.
 */
export async function followInside(r: Resolved, parts: readonly string[]): Promise<string> {
  if (r.info === null) throw new HttpError(404, `Path '${shownPath(parts)}' not found`);
  if (!r.info.isSymlink) return r.full;
  let real: string;
  try {
    real = await Deno.realPath(r.full);
  } catch {
    throw escape(parts, "is a link that leads nowhere or");
  }
  if (!isInside(r.root, real)) throw escape(parts, "is a link that leads");
  return real;
}

/**
 * `message` (a file system error's) with a volume's paths shown as its tenant names them
 * (`/notes/a`) and any other path under the node's volume root as `<volume root>`: where the
 * node keeps its files is not a tenant's business.
 */
export function hideNodePaths(message: string, root: string): string {
  let out = message;
  for (const r of new Set([realPathOr(root), root])) {
    const escaped = r.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    out = out
      .replace(
        new RegExp(`${escaped}/vol-[a-z0-9]{20}/data(/[^']*)?`, "g"),
        (_m, rest: string | undefined) => rest ?? "/",
      )
      .replaceAll(r, "<volume root>");
  }
  return out;
}

function realPathOr(path: string): string {
  try {
    return Deno.realPathSync(path);
  } catch {
    return path;
  }
}
