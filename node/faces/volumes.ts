/**
 * The node's volume routes, for the gateway (fleet token only): the verbs `createVolume`,
 * `destroyVolume`, `volumeUsers`, `exportVolume` and `importVolume` (a move's two ends), and the
 * content API the E2B SDK's `Volume` speaks, under `/volumecontent/{volumeID}`:
 *
 * | route | does |
 * |---|---|
 * | `GET /dir?path=&depth=` | the entries below a directory (depth 1–16, at most 10,000 entries) |
 * | `POST /dir?path=&mode=&force=` | makes a directory (`force`: its parents too, and no error when it exists); mode 0777 unless given |
 * | `GET /path?path=` | one entry's info (a link is described, not followed) |
 * | `PATCH /path?path=` `{uid?,gid?,mode?}` | changes its owner or mode |
 * | `DELETE /path?path=` | removes a file, a link or a directory with what it holds |
 * | `GET /file?path=` | the file's bytes |
 * | `PUT /file?path=&mode=&force=` | writes the body as the file (`force`: makes missing parents); mode 0666 unless given |
 *
 * Every path is a tenant's and is confined to the volume (`volume_paths.ts`). Errors are
 * E2B's `{code:<int>, message}`.
 *
 * @module
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { basename, dirname, join } from "node:path";
import { HttpError } from "../../shared/http_error.ts";
import type { Log } from "../../shared/log.ts";
import { requireFleetBearer, tokenMatcher } from "../../shared/token.ts";
import {
  createVolumeSchema,
  MAX_VOLUME_BYTES,
  volumeIdSchema,
  volumeRefSchema,
} from "../../shared/volumes.ts";
import { describeZodError } from "../../shared/schemas.ts";
import { readJsonObject } from "../../shared/json_body.ts";
import type { NodeVolumes } from "../volumes.ts";
import { exportVolume, importVolume } from "../volume_copy.ts";
import { type ConfinedEntry, type ConfinedRenames, confinedRenames } from "../volume_confined.ts";
import {
  followInside,
  hideNodePaths,
  type Resolved,
  resolveInVolume,
  shownPath,
  splitVolumePath,
} from "../volume_paths.ts";

/** The content API's entry, as the SDK's `VolumeEntryStat`. */
export interface VolumeEntry {
  name: string;
  path: string;
  type: "file" | "directory" | "symlink" | "unknown";
  size: number;
  mode: number;
  uid: number;
  gid: number;
  atime: string;
  mtime: string;
  ctime: string;
  target?: string;
}

const MAX_LIST_ENTRIES = 10_000;

/** The longest path the kernel takes (Linux's `PATH_MAX`), the node's volume root included. */
const PATH_MAX = 4096;

const TOO_LONG = "The path is too long for the node's filesystem: name a shorter one";

/** The cap of a JSON body of these routes (an id, or a uid, gid and mode). */
const MAX_JSON_BYTES = 16 * 1024;

/** The file in a volume root that names it (`volumeRootId`). */
export const VOLUME_ROOT_ID_FILE = ".volume-root-id";

/**
 * The id of the volume root `root`: a random one written once in the root itself
 * ({@linkcode VOLUME_ROOT_ID_FILE}, linked into place whole, so two nodes racing read one). Two nodes
 * answering one id keep their volumes in one place (one data dir, or one network mount, given to
 * two nodes not set as a shared root): a copy "on" one is the other's, and the gateway never
 * drops it as stale.
 */
export async function volumeRootId(root: string): Promise<string> {
  const path = join(root, VOLUME_ROOT_ID_FILE);
  const read = async () => (await Deno.readTextFile(path)).trim();
  try {
    const held = await read();
    if (held !== "") return held;
  } catch (error) {
    if (!(error instanceof Deno.errors.NotFound)) throw error;
  }
  await Deno.mkdir(root, { recursive: true });
  // Written whole beside it, then linked into place (a link fails when the name exists): a node
  // reading it never sees it half-written, and of two racing, one id wins.
  const made = crypto.randomUUID();
  const whole = `${path}.${made}.tmp`;
  await Deno.writeTextFile(whole, made);
  try {
    await Deno.link(whole, path);
    return made;
  } catch (error) {
    if (!(error instanceof Deno.errors.AlreadyExists)) throw error;
    return await read();
  } finally {
    await Deno.remove(whole).catch(() => {});
  }
}

/** Options of {@linkcode createVolumeFace}. */
export interface VolumeFaceOptions {
  /** The fleet token: only the gateway calls these routes. */
  token: string;
  /**
   * This node's id, answered by `/volumeUsers` (`node`) so the gateway can tell which node an
   * endpoint really is before it drops a copy there.
   */
  nodeId?: string;
  /** Called after a volume appears or goes (the check-in advertises the change sooner). */
  changed?: () => void;
  /**
   * The confined renames of uploads and removals (`volume_confined.ts`); by default through
   * `sh` when the node may run it, `null` for in process.
   */
  renames?: ConfinedRenames | null;
  log: Log;
}

/**
 * The volume verbs and content API over `volumes`, as a Hono app mounted at the node's root.
 *
 * @example
 * ```ts ignore
 * hono.route("/", createVolumeFace(volumes, { token, log }));
 * ```
 */
export function createVolumeFace(volumes: NodeVolumes, options: VolumeFaceOptions): Hono {
  const matches = tokenMatcher(options.token);
  const renames = options.renames === undefined ? confinedRenames() : options.renames ?? undefined;
  if (renames === undefined) {
    options.log(
      "warn",
      "volume content writes and removals run in process: a sandbox racing a link into a " +
        "path could redirect them outside its volume",
      { fix: "run the node with --allow-run=sh (GNU mv on PATH)" },
    );
  }
  /** The volume root's own id (`volumeRootId`), read or made at the first `/volumeUsers`. */
  let rootId: Promise<string> | undefined;
  const app = new Hono();
  app.onError((error, c) => {
    if (error instanceof HttpError) {
      return c.json({ ...error.details, code: error.status, message: error.message }, {
        status: error.status as 400,
        headers: error.headers,
      });
    }
    const e = error as Error;
    // A path whose names fit but whose whole, below the node's volume root, does not.
    const tooLong = /\(os error 36\)/.test(e.message);
    // ENOSPC, EDQUOT: the volume's own filesystem is full (its cap kept by the kernel).
    const full = /\(os error (28|122)\)/.test(e.message);
    const status = tooLong
      ? 400
      : full
      ? 507
      : e instanceof Deno.errors.NotFound
      ? 404
      : e instanceof Deno.errors.AlreadyExists
      ? 409
      : e instanceof Deno.errors.PermissionDenied
      ? 403
      : e instanceof Deno.errors.NotADirectory || e instanceof Deno.errors.IsADirectory
      ? 400
      : 500;
    if (status === 500) options.log("error", "volume route failed", { error: e.stack });
    // The node's own paths are not the tenant's business: a volume's shows as its root.
    const message = tooLong
      ? TOO_LONG
      : full
      ? "The volume is full: its cap is reached; remove files or create a new volume"
      : hideNodePaths(e.message, volumes.root);
    return c.json({ code: status, message }, status as 400);
  });
  /**
   * Volume `id`'s uploads directory, made, by its real absolute path: the confined renames run
   * in a shell that first enters the volume's directory, where a path relative to the node's
   * working directory (a relative `DORMICE_DATA_DIR`, as `deno task fleet` gives its nodes)
   * names nothing.
   */
  const uploadsOf = async (id: string) => {
    await Deno.mkdir(volumes.uploadsDir(id), { recursive: true, mode: 0o700 });
    return await Deno.realPath(volumes.uploadsDir(id));
  };
  /** A fresh path on the node's side of volume `id` (its uploads directory). */
  const nodeSide = async (id: string, what: string) =>
    join(await uploadsOf(id), `${what}-${crypto.randomUUID()}`);
  /** Makes directory `name` in the real directory `parent`: on the node's side, renamed in. */
  const makeDir = async (
    id: string,
    parent: string,
    name: string,
    mode: number,
    q?: URLSearchParams,
  ) => {
    if (!renames) {
      const full = join(parent, name);
      await Deno.mkdir(full);
      // Explicitly, past the umask: a sandbox's commands run as any user of its image.
      await Deno.chmod(full, mode);
      if (q) await owner(full, q);
      return;
    }
    const made = await nodeSide(id, "dir");
    try {
      await Deno.mkdir(made);
      await Deno.chmod(made, mode);
      if (q) await owner(made, q);
      await renames.into(parent, name, made);
    } finally {
      await Deno.remove(made).catch(() => {});
    }
  };
  /**
   * Runs `use` on the file `name` of the real directory `parent` through a hard link on the
   * node's side (confined), or on the path itself (in process). A directory is `undefined`.
   */
  const viaLink = async <T>(
    id: string,
    parent: string,
    name: string,
    use: (path: string) => Promise<T>,
  ): Promise<T> => {
    if (!renames) return await use(join(parent, name));
    const linked = await nodeSide(id, "link");
    await renames.linkOut(parent, name, linked);
    try {
      // The link is the entry itself: a link swapped in is a link here, never followed.
      if (!(await Deno.lstat(linked)).isFile) {
        throw new HttpError(409, `Path '${name}' changed while the node used it: retry`);
      }
      return await use(linked);
    } finally {
      await Deno.remove(linked).catch(() => {});
    }
  };
  const gate = (c: Context) =>
    requireFleetBearer(c.req.header("authorization"), matches, "this node's", c.req.path);
  const body = async <T>(c: Context, schema: { safeParse(v: unknown): unknown }): Promise<T> => {
    const { value } = await readJsonObject(c.req.raw, {
      maxBytes: MAX_JSON_BYTES,
      empty: "refuse",
      example: '{"id":"vol-…"}',
    });
    const r = schema.safeParse(value) as { success: boolean; data: T; error: never };
    if (!r.success) throw new HttpError(400, describeZodError(r.error, "the body"));
    return r.data;
  };

  app.post("/createVolume", async (c) => {
    gate(c);
    const b = await body<{ id: string; sizeBytes?: number }>(c, createVolumeSchema);
    const made = await volumes.create(b.id, b.sizeBytes);
    options.changed?.();
    return c.json({ ...made, shared: volumes.shared }, 201);
  });
  app.post("/destroyVolume", async (c) => {
    gate(c);
    const b = await body<{ id: string }>(c, volumeRefSchema);
    const destroyed = await volumes.destroy(b.id);
    if (destroyed) options.changed?.();
    return c.json({ destroyed });
  });
  app.post("/volumeUsers", async (c) => {
    gate(c);
    const b = await body<{ id: string }>(c, volumeRefSchema);
    const root = await (rootId ??= volumeRootId(volumes.root)).catch(() => {
      rootId = undefined;
      return undefined;
    });
    return c.json({
      present: volumes.has(b.id),
      sandboxes: volumes.users(b.id),
      ...(options.nodeId !== undefined ? { node: options.nodeId } : {}),
      ...(root !== undefined ? { root } : {}),
    });
  });
  app.post("/exportVolume", async (c) => {
    gate(c);
    const b = await body<{ id: string }>(c, volumeRefSchema);
    const dir = volumes.requireDataDir(b.id);
    volumes.refuseWhileMounted(b.id, "move");
    return new Response(exportVolume(dir), {
      headers: {
        "content-type": "application/octet-stream",
        "x-dormice-volume-size": String(volumes.sizeBytes(b.id)),
      },
    });
  });
  app.post("/importVolume", async (c) => {
    gate(c);
    const url = new URL(c.req.url);
    const idCheck = volumeIdSchema.safeParse(url.searchParams.get("id"));
    if (!idCheck.success) throw new HttpError(400, describeZodError(idCheck.error, "'id'"));
    const id = idCheck.data;
    const size = Number(url.searchParams.get("sizeBytes") ?? NaN);
    if (!Number.isSafeInteger(size) || size <= 0 || size > MAX_VOLUME_BYTES) {
      throw new HttpError(
        400,
        `'sizeBytes' must be the volume's cap, a positive integer up to ${MAX_VOLUME_BYTES}`,
      );
    }
    if (volumes.has(id)) throw new HttpError(409, `Volume '${id}' is already on this node`);
    if (c.req.raw.body === null) throw new HttpError(400, "The body must be the volume stream");
    const stream = c.req.raw.body;
    const bytes = await volumes.importInto(id, size, (data) => importVolume(stream, data, size));
    options.changed?.();
    return c.json({ id, sizeBytes: size, bytes, shared: volumes.shared }, 201);
  });

  // --- the content API ---
  const target = (c: Context) => {
    gate(c);
    const id = c.req.param("id")!;
    const dir = volumes.dataDir(id);
    if (dir === undefined) {
      throw new HttpError(404, `Volume '${id}' is not on this node`);
    }
    const parts = splitVolumePath(new URL(c.req.url).searchParams.get("path"));
    // Before the disk is touched (a `force` would make parents until the kernel refused).
    if (new TextEncoder().encode(dir + shownPath(parts)).length >= PATH_MAX) {
      throw new HttpError(400, TOO_LONG);
    }
    return { id, dir, parts };
  };
  app.get("/volumecontent/:id/dir", async (c) => {
    const { dir, parts } = target(c);
    const r = await resolveInVolume(dir, parts);
    const real = await followInside(r, parts);
    if (!(await Deno.stat(real)).isDirectory) {
      throw new HttpError(400, `Path '${shownPath(parts)}' is not a directory`);
    }
    const depthText = new URL(c.req.url).searchParams.get("depth");
    const depth = depthText === null ? 1 : Number(depthText);
    if (!Number.isInteger(depth) || depth < 1 || depth > 16) {
      throw new HttpError(400, "'depth' must be an integer from 1 to 16");
    }
    if (renames) {
      const listed = await renames.list(real, shownPath(parts), depth, MAX_LIST_ENTRIES);
      return c.json(listed.map((e) => confinedEntry(e, [...parts, ...e.path.split("/")])));
    }
    const out: VolumeEntry[] = [];
    const walk = async (at: string, shown: string[], left: number): Promise<void> => {
      for await (const e of Deno.readDir(at)) {
        if (out.length >= MAX_LIST_ENTRIES) {
          throw new HttpError(
            400,
            `The listing has over ${MAX_LIST_ENTRIES} entries: list a smaller depth or directory`,
          );
        }
        const path = join(at, e.name);
        const info = await Deno.lstat(path);
        out.push(await entryOf(path, [...shown, e.name], info));
        if (info.isDirectory && left > 1) await walk(path, [...shown, e.name], left - 1);
      }
    };
    await walk(real, parts, depth);
    return c.json(out);
  });
  app.post("/volumecontent/:id/dir", async (c) => {
    const { dir, parts } = target(c);
    const q = new URL(c.req.url).searchParams;
    const force = q.get("force") === "true";
    if (parts.length === 0) throw new HttpError(409, "The volume's root already exists");
    const id = c.req.param("id")!;
    const mkdir = (parent: string, name: string) => makeDir(id, parent, name, 0o777);
    const r = await resolveInVolume(dir, parts, { makeParents: force, mkdir });
    if (r.info !== null) {
      if (force && r.info.isDirectory) return c.json(await entryOf(r.full, parts, r.info), 201);
      throw new HttpError(409, `Path '${shownPath(parts)}' already exists`);
    }
    await makeDir(id, r.parent, r.name!, modeOf(q, 0o777), q);
    return c.json(await entryOf(r.full, parts, await Deno.lstat(r.full)), 201);
  });
  app.get("/volumecontent/:id/path", async (c) => {
    const { dir, parts } = target(c);
    const r = await resolveInVolume(dir, parts);
    if (r.info === null) throw new HttpError(404, `Path '${shownPath(parts)}' not found`);
    if (renames && r.name !== undefined) {
      return c.json(confinedEntry(await renames.stat(r.parent, r.name, shownPath(parts)), parts));
    }
    return c.json(await entryOf(r.full, parts, r.info));
  });
  app.patch("/volumecontent/:id/path", async (c) => {
    const { dir, parts } = target(c);
    const r = await resolveInVolume(dir, parts);
    const real = await followInside(r, parts);
    // A tenant's body: read under a small cap, as the node's other JSON bodies are.
    const { value: b } = await readJsonObject(c.req.raw, {
      maxBytes: MAX_JSON_BYTES,
      empty: "refuse",
      example: '{"mode":420}',
    });
    if (b.mode !== undefined && !Number.isInteger(b.mode)) {
      throw new HttpError(400, "'mode' must be an integer");
    }
    const change = async (path: string) => {
      if (b.mode !== undefined) await Deno.chmod(path, (b.mode as number) & 0o7777);
      if (b.uid !== undefined || b.gid !== undefined) {
        const n = (v: unknown) => Number.isInteger(v) ? v as number : null;
        await Deno.chown(path, n(b.uid), n(b.gid));
      }
    };
    // A file through a hard link on the node's side; a directory from inside it.
    const n = (v: unknown) => Number.isInteger(v) ? v as number : undefined;
    if ((await Deno.lstat(real)).isFile) {
      await viaLink(c.req.param("id")!, dirname(real), basename(real), change);
    } else if (renames) {
      const mode = b.mode === undefined ? undefined : b.mode as number;
      await renames.changeDir(real, shownPath(parts), mode, n(b.uid), n(b.gid));
    } else await change(real);
    return c.json(await entryOf(r.full, parts, await Deno.lstat(r.full)));
  });
  app.delete("/volumecontent/:id/path", async (c) => {
    const { dir, parts } = target(c);
    if (parts.length === 0) {
      throw new HttpError(400, "The volume's root cannot be removed: delete the volume instead");
    }
    const r = await resolveInVolume(dir, parts);
    if (r.info === null) throw new HttpError(404, `Path '${shownPath(parts)}' not found`);
    // Removes a link itself, never what it points at. Confined: first moved out of the volume
    // by its name in its checked directory, then removed where no sandbox reaches.
    if (renames) {
      const id = c.req.param("id")!;
      const trash = await nodeSide(id, "removed");
      await renames.outOf(r.parent, r.name!, trash);
      await Deno.remove(trash, { recursive: true });
    } else await Deno.remove(r.full, { recursive: true });
    volumes.forgetUsage(c.req.param("id")!);
    return new Response(null, { status: 204 });
  });
  app.get("/volumecontent/:id/file", async (c) => {
    const { dir, parts } = target(c);
    const r = await resolveInVolume(dir, parts);
    const real = await followInside(r, parts);
    if (!(await Deno.lstat(real)).isFile) {
      throw new HttpError(400, `Path '${shownPath(parts)}' is not a file`);
    }
    // Opened through a hard link on the node's side, which is unlinked once open.
    const file = await viaLink(
      c.req.param("id")!,
      dirname(real),
      basename(real),
      (path) => Deno.open(path, { read: true }),
    );
    const info = await file.stat();
    if (!info.isFile) {
      file.close();
      throw new HttpError(400, `Path '${shownPath(parts)}' is not a file`);
    }
    return new Response(file.readable, {
      headers: {
        "content-type": "application/octet-stream",
        "content-length": String(info.size),
      },
    });
  });
  app.put("/volumecontent/:id/file", async (c) => {
    const { id, dir, parts } = target(c);
    if (parts.length === 0) throw new HttpError(400, "The volume's root is a directory");
    const q = new URL(c.req.url).searchParams;
    const mkdir = (parent: string, name: string) => makeDir(id, parent, name, 0o777);
    const r = await resolveInVolume(dir, parts, { makeParents: q.get("force") === "true", mkdir });
    if (r.info?.isDirectory) {
      throw new HttpError(400, `Path '${shownPath(parts)}' is a directory`);
    }
    const mode = modeOf(q, 0o666);
    // The body goes to the node's own uploads directory, which no sandbox sees, and the path is
    // resolved again only once it arrived: a sandbox that swaps a directory of the path for a
    // link while the body streams finds it checked at the rename, microseconds later, and
    // nothing is opened, chmodded or chowned through the volume's (swappable) names.
    const write = await volumes.beginWrite(id, r.info?.isFile ? r.info.size : 0);
    let temp: string | undefined;
    let committed = false;
    try {
      temp = join(await uploadsOf(id), crypto.randomUUID());
      const file = await Deno.open(temp, { write: true, createNew: true, mode });
      try {
        if (c.req.raw.body !== null) {
          for await (const chunk of c.req.raw.body) {
            write.add(chunk.length);
            let n = 0;
            while (n < chunk.length) n += await file.write(chunk.subarray(n));
          }
        }
      } finally {
        file.close();
      }
      await Deno.chmod(temp, mode);
      await owner(temp, q);
      const at = await resolveInVolume(dir, parts, {
        makeParents: q.get("force") === "true",
        mkdir,
      });
      if (at.info?.isDirectory) {
        throw new HttpError(400, `Path '${shownPath(parts)}' is a directory`);
      }
      // A rename replaces whatever is in the final place, a link included: never written through.
      if (renames) await renames.into(at.parent, at.name!, temp);
      else await Deno.rename(temp, at.full);
      committed = true;
    } finally {
      write.end(committed);
      if (!committed && temp !== undefined) await Deno.remove(temp).catch(() => {});
    }
    return c.json(await entryOf(r.full, parts, await Deno.lstat(r.full)), 201);
  });
  return app;
}

function modeOf(q: URLSearchParams, fallback: number): number {
  const text = q.get("mode");
  if (text === null) return fallback;
  const mode = Number(text);
  if (!Number.isInteger(mode) || mode < 0 || mode > 0o7777) {
    throw new HttpError(400, `'mode' must be a permission number such as 420 (0644): got ${text}`);
  }
  return mode;
}

async function owner(path: string, q: URLSearchParams): Promise<void> {
  const uid = q.get("uid");
  const gid = q.get("gid");
  if (uid === null && gid === null) return;
  const n = (v: string | null) => v === null ? null : Number(v);
  const [u, g] = [n(uid), n(gid)];
  if ((u !== null && !Number.isInteger(u)) || (g !== null && !Number.isInteger(g))) {
    throw new HttpError(400, "'uid' and 'gid' must be integers");
  }
  await Deno.chown(path, u, g);
}

/** A confined listing's entry as the content API shows it. */
function confinedEntry(e: ConfinedEntry, parts: readonly string[]): VolumeEntry {
  const iso = (seconds: number) => new Date(Math.round(seconds * 1000)).toISOString();
  return {
    name: parts.length === 0 ? "/" : parts[parts.length - 1],
    path: shownPath(parts),
    type: e.type,
    size: e.size,
    mode: e.mode & 0o7777,
    uid: e.uid,
    gid: e.gid,
    atime: iso(e.atime),
    mtime: iso(e.mtime),
    ctime: iso(e.ctime),
    ...(e.target === undefined ? {} : { target: e.target }),
  };
}

async function entryOf(
  full: string,
  parts: readonly string[],
  info: Deno.FileInfo,
): Promise<VolumeEntry> {
  const iso = (d: Date | null) => (d ?? new Date(0)).toISOString();
  const entry: VolumeEntry = {
    name: parts.length === 0 ? "/" : parts[parts.length - 1],
    path: shownPath(parts),
    type: info.isSymlink
      ? "symlink"
      : info.isDirectory
      ? "directory"
      : info.isFile
      ? "file"
      : "unknown",
    size: info.size,
    mode: (info.mode ?? 0) & 0o7777,
    uid: info.uid ?? 0,
    gid: info.gid ?? 0,
    atime: iso(info.atime),
    mtime: iso(info.mtime),
    ctime: iso(info.ctime ?? info.mtime),
  };
  if (info.isSymlink) entry.target = await Deno.readLink(full);
  return entry;
}

export type { Resolved };
