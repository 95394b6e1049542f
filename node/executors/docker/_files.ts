/**
 * The file verbs of the Docker executor. Whole files travel by the engine's archive API (a tar
 * in, a tar out), which needs no shell in the image and keeps bytes exact; everything that asks
 * the file system a question (stat, list, move, remove) runs a small POSIX shell script in the
 * sandbox as the run-as user (`_file_scripts.ts`, `_stat.ts`), whose exit codes map to the
 * contract's error codes.
 *
 * The run-as user is mapped as commands map it: `root`, else the image's user. What envd
 * creates (a written file, a new directory) it creates as root and hands to the user, so it
 * works wherever root could write: here new files and directories go in by archive, made by the
 * engine with the user's numeric ids in the tar headers, one round trip and no chown in the
 * sandbox. Questions, renames and removals run as the user, with the kernel's answer for that
 * user (envd, as root, would answer for root).
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { posix } from "node:path";
import { Readable } from "node:stream";
import type { Clock } from "../../../shared/clock.ts";
import {
  ExecutorError,
  type FileEntry,
  type FileOptions,
  type FileStream,
  fileStreamLengthError,
  type WriteOptions,
} from "../contract.ts";
import {
  concat,
  readFirstTarEntry,
  TAR_END,
  type TarEntry,
  tarHeader,
  tarPadding,
  writeTar,
} from "./_tar.ts";
import type { Commands, HelperResult } from "./_exec.ts";
import { type Owner, resolvePath, type Sandboxes } from "./_sandboxes.ts";
import {
  LIST_SCRIPT,
  metadataUnsupported,
  parseStatLines,
  SET_XATTRS_SCRIPT,
  STAT_SCRIPT,
} from "./_stat.ts";
import type { Engine } from "./engine.ts";
import {
  MKDIR_PLAN_SCRIPT,
  MOVE_SCRIPT,
  READ_SCRIPT,
  REMOVE_SCRIPT,
  scriptError,
} from "./_file_scripts.ts";

/** The most a command read returns (a virtual file's content is small; a device's endless). */
const COMMAND_READ_LIMIT = 16 * 1024 * 1024;

/** The name of the numeric id in a passwd/group file, or the number itself. */
function nameOf(table: string, id: number): string {
  const line = table.split("\n").find((l) => l.split(":")[2] === String(id));
  return line?.split(":")[0] || String(id);
}

/**
 * A one-file archive around a stream: the header, the stream's chunks as they are read, the
 * padding and the end blocks. A stream that delivers another length than it announced would
 * make a corrupt archive, so it throws instead, and `onFailure` aborts the put; `failure()` is
 * what the stream itself threw, if it did.
 */
function streamedTar(
  header: Uint8Array,
  data: FileStream,
  onFailure: (error: unknown) => void,
): { chunks: AsyncGenerator<Buffer>; failure(): unknown } {
  let failed: unknown;
  async function* chunks(): AsyncGenerator<Buffer> {
    yield bytesOf(header);
    let sent = 0;
    try {
      for await (const chunk of data.stream) {
        sent += chunk.length;
        if (sent > data.size) throw fileStreamLengthError(data.size, sent, "at least");
        yield bytesOf(chunk);
      }
      if (sent !== data.size) throw fileStreamLengthError(data.size, sent, "only");
    } catch (error) {
      failed = error;
      onFailure(error);
      throw error;
    }
    yield bytesOf(tarPadding(data.size));
    yield bytesOf(TAR_END);
  }
  return { chunks: chunks(), failure: () => failed };
}

/** A Buffer over the same bytes, which docker-modem sends as they are. */
function bytesOf(chunk: Uint8Array): Buffer {
  return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length);
}

/** What {@link Files} needs. */
export interface FilesOptions {
  engine: Engine;
  sandboxes: Sandboxes;
  /** Runs the helper scripts. */
  commands: Commands;
  /** Stamps written files. */
  clock: Clock;
  /** The deadline of one archive transfer, ms. */
  transferTimeoutMs: number;
}

/** The contract's file verbs on Docker sandboxes. */
export class Files {
  #engine: Engine;
  #sandboxes: Sandboxes;
  #commands: Commands;
  #clock: Clock;
  #transferTimeoutMs: number;

  constructor(options: FilesOptions) {
    this.#engine = options.engine;
    this.#sandboxes = options.sandboxes;
    this.#commands = options.commands;
    this.#clock = options.clock;
    this.#transferTimeoutMs = options.transferTimeoutMs;
  }

  /**
   * The contract's `writeFile`: one archive put (owned by the run-as user, as envd hands its
   * writes over), a `makeDir` and a second put when the parent is missing. A stream is sent as
   * it is read, inside a tar built around it (its size goes in the header), so the node holds a
   * chunk of it at a time; it can be sent only once, so an empty archive put first finds out
   * whether the parent exists. Metadata is set after the put by `setfattr` as the run-as user
   * (the file is theirs); an image without it is asked first, so the refusal writes nothing.
   */
  async writeFile(
    id: string,
    path: string,
    data: Uint8Array | FileStream,
    options: WriteOptions = {},
  ): Promise<FileEntry> {
    try {
      const runAs = await this.runAs(id, options);
      const target = resolvePath(path, runAs.home);
      if (target === "/") throw new ExecutorError("is_dir", "Cannot write '/': it is a directory");
      const metadata = Object.entries(options.metadata ?? {});
      if (metadata.length) {
        const probe = await this.#script(id, runAs, SET_XATTRS_SCRIPT, target);
        if (probe.code === 127) throw metadataUnsupported(target);
      }
      const dir = posix.dirname(target);
      const { uid, gid, owner, group } = await this.#owner(id, runAs.user);
      // Whole seconds: what a tar header keeps, so the entry says what stat would.
      const modifiedAt = Math.floor(this.#clock.now() / 1000) * 1000;
      const entry = {
        name: posix.basename(target),
        type: "file" as const,
        mode: 0o644,
        mtimeMs: modifiedAt,
        uid,
        gid,
      };
      const put = (body: Buffer | Readable, cut?: AbortSignal) =>
        this.#engine.call(
          `writing ${target} in sandbox ${id}`,
          (signal) =>
            // docker-modem sends a Buffer as the body; any other object must be a node stream.
            this.#engine.container(id).putArchive(body, {
              path: dir,
              noOverwriteDirNonDir: true,
              abortSignal: cut ? AbortSignal.any([signal, cut]) : signal,
            }),
          this.#transferTimeoutMs,
        );
      if (data instanceof Uint8Array) {
        const tar = bytesOf(writeTar([{ ...entry, data }]));
        try {
          await put(tar);
        } catch (error) {
          if (!(error instanceof ExecutorError)) throw error;
          if (error.code !== "not_found") throw this.#archiveError(error, id, "write", target);
          await this.makeDir(id, dir, options);
          await put(tar).catch((again) => {
            throw this.#archiveError(again, id, "write", target);
          });
        }
      } else {
        // docker-modem answers a failing body by destroying its request, which Deno's node:http
        // (2.9.6) does not turn into an error: the put would hang to its deadline. Aborting does.
        const cut = new AbortController();
        const tar = streamedTar(tarHeader(entry, data.size), data, (e) => cut.abort(e));
        try {
          // The engine answers 404 for an extraction point that does not exist.
          await put(bytesOf(TAR_END)).catch(async (error) => {
            if (!(error instanceof ExecutorError) || error.code !== "not_found") throw error;
            await this.makeDir(id, dir, options);
          });
          const body = Readable.from(tar.chunks);
          try {
            await put(body, cut.signal);
          } finally {
            // Ends the generator (and with it the caller's stream) when the put stopped early.
            body.destroy();
          }
        } catch (error) {
          // The caller's stream failing aborts the put; its own error says why, not the engine's.
          throw tar.failure() ?? this.#archiveError(error, id, "write", target);
        }
      }
      if (metadata.length) {
        const hex = (value: string) =>
          Array.from(new TextEncoder().encode(value), (b) => b.toString(16).padStart(2, "0"))
            .join("");
        const args = metadata.flatMap(([key, value]) => [key, hex(value)]);
        const set = await this.#script(id, runAs, SET_XATTRS_SCRIPT, target, ...args);
        if (set.code !== 0) throw scriptError(set, "set metadata on", target);
      }
      // The archive replaced whatever was there with exactly this header: no stat round trip.
      return {
        name: posix.basename(target),
        path: target,
        type: "file",
        size: data instanceof Uint8Array ? data.length : data.size,
        mode: 0o644,
        owner,
        group,
        modifiedAt,
        ...(metadata.length ? { metadata: Object.fromEntries(metadata) } : {}),
      };
    } finally {
      if (!(data instanceof Uint8Array)) await data.stream.cancel().catch(() => {});
    }
  }

  /**
   * The contract's `readFile`: one archive get per symlink hop, at most eight hops. What the
   * archive cannot see (the container's own mounts: /proc, /sys, /dev) is read by a command.
   */
  async readFile(id: string, path: string, options: FileOptions = {}): Promise<Uint8Array> {
    const runAs = await this.runAs(id, options);
    let target = resolvePath(path, runAs.home);
    // Docker archives a symlink as itself; follow a few hops like a reader would.
    for (let hop = 0; hop < 8; hop++) {
      let entry: TarEntry | undefined;
      try {
        entry = await this.#engine.call(`reading ${target} in sandbox ${id}`, async (signal) => {
          const body = await this.#engine.container(id).getArchive({
            path: target,
            abortSignal: signal,
          });
          // Only the first entry: a directory's archive is its whole tree, never fetched.
          return await readFirstTarEntry(body as AsyncIterable<Uint8Array>);
        }, this.#transferTimeoutMs);
      } catch (error) {
        const failure = this.#archiveError(error, id, "read", path);
        if (failure instanceof ExecutorError && failure.code === "not_found") {
          return await this.#readByCommand(id, runAs, target, path);
        }
        throw failure;
      }
      if (!entry) {
        throw new ExecutorError("not_found", `Cannot read '${path}': the engine sent no file`);
      }
      if (entry.type === "dir") {
        throw new ExecutorError("is_dir", `Cannot read '${path}': it is a directory`);
      }
      if (entry.type !== "symlink") return entry.data;
      target = posix.resolve(posix.dirname(target), entry.linkName);
    }
    throw new ExecutorError("invalid", `Cannot read '${path}': too many levels of symbolic links`);
  }

  /** The contract's `listDir`, sorted by path; the depth is capped at 64 levels. */
  async listDir(
    id: string,
    path: string,
    depth = 1,
    options: FileOptions = {},
  ): Promise<FileEntry[]> {
    const runAs = await this.runAs(id, options);
    const target = resolvePath(path, runAs.home);
    if (!Number.isFinite(depth)) {
      throw new ExecutorError("invalid", `The depth ${depth} is not a number: give 1 or more`);
    }
    // Like the fake, a depth under 1 lists the children; a cap keeps one call bounded.
    const levels = Math.min(64, Math.max(1, Math.floor(depth)));
    const result = await this.#script(id, runAs, LIST_SCRIPT, target, String(levels));
    if (result.code !== 0) throw scriptError(result, "list", target);
    return parseStatLines(result.stdout).sort((a, b) =>
      a.path < b.path ? -1 : a.path > b.path ? 1 : 0
    );
  }

  /** The contract's `stat`; a symlink is described itself, with its target. */
  async stat(id: string, path: string, options: FileOptions = {}): Promise<FileEntry> {
    const runAs = await this.runAs(id, options);
    const target = resolvePath(path, runAs.home);
    const result = await this.#script(id, runAs, STAT_SCRIPT, target);
    if (result.code !== 0) throw scriptError(result, "stat", target);
    const [entry] = parseStatLines(result.stdout);
    if (!entry) {
      throw new ExecutorError("not_found", `Cannot stat '${target}': no answer from stat`);
    }
    return entry;
  }

  /**
   * The contract's `makeDir`: the missing directories go in by one archive put under their
   * nearest existing ancestor, owned by the run-as user (see the module doc).
   */
  async makeDir(id: string, path: string, options: FileOptions = {}): Promise<boolean> {
    const runAs = await this.runAs(id, options);
    const target = resolvePath(path, runAs.home);
    const plan = await this.#script(id, runAs, MKDIR_PLAN_SCRIPT, target);
    if (plan.code === 10) return false;
    if (plan.code !== 0) throw scriptError(plan, "make directory", target);
    const base = plan.stdout;
    const missing = posix.relative(base, target).split("/");
    const { uid, gid } = await this.#owner(id, runAs.user);
    const mtimeMs = this.#clock.now();
    const tar = writeTar(missing.map((_, i) => ({
      name: missing.slice(0, i + 1).join("/"),
      type: "dir" as const,
      mode: 0o755,
      mtimeMs,
      uid,
      gid,
    })));
    await this.#engine.call(
      `making directory ${target} in sandbox ${id}`,
      (signal) =>
        this.#engine.container(id).putArchive(
          Buffer.from(tar.buffer, tar.byteOffset, tar.length),
          { path: base, noOverwriteDirNonDir: true, abortSignal: signal },
        ),
      this.#transferTimeoutMs,
    ).catch((error) => {
      throw this.#archiveError(error, id, "make directory", target);
    });
    return true;
  }

  /** The contract's `move`, with envd's rules (see the script). */
  async move(
    id: string,
    from: string,
    to: string,
    options: FileOptions = {},
  ): Promise<FileEntry> {
    const runAs = await this.runAs(id, options);
    const source = resolvePath(from, runAs.home, "source path");
    const target = resolvePath(to, runAs.home, "target path");
    if (source === "/" || source === target || target.startsWith(source + "/")) {
      throw new ExecutorError("invalid", `Cannot move ${source} into itself (${target})`);
    }
    const result = await this.#script(id, runAs, MOVE_SCRIPT, source, target);
    if (result.code === 5) {
      throw new ExecutorError("not_found", `Cannot move to '${target}': its parent does not exist`);
    }
    if (result.code !== 0) throw scriptError(result, "move", result.code === 2 ? source : target);
    return await this.stat(id, target, options);
  }

  /** The contract's `remove`; '/' is refused, a missing path is not an error. */
  async remove(id: string, path: string, options: FileOptions = {}): Promise<void> {
    const runAs = await this.runAs(id, options);
    const target = resolvePath(path, runAs.home);
    if (target === "/") {
      throw new ExecutorError("invalid", "Refusing to remove '/': name a path below it");
    }
    const result = await this.#script(id, runAs, REMOVE_SCRIPT, target);
    if (result.code !== 0) throw scriptError(result, "remove", target);
  }

  /**
   * Reads a file by running `head` in the sandbox, for a file the engine's archive does not
   * see: a virtual file says size 0 and has content, so it is read to its end (up to
   * {@link COMMAND_READ_LIMIT}; /dev/zero has no end), never by its size.
   */
  async #readByCommand(
    id: string,
    runAs: RunAs,
    target: string,
    asked: string,
  ): Promise<Uint8Array> {
    const handle = await this.#commands.exec(id, {
      cmd: ["/bin/sh", "-c", READ_SCRIPT, "sh", target, String(COMMAND_READ_LIMIT + 1)],
      user: runAs.user,
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const deadline = new Promise<"late">((resolve) => {
      timer = setTimeout(() => resolve("late"), this.#transferTimeoutMs);
    });
    const chunks: Uint8Array[] = [];
    let size = 0;
    const output = (async () => {
      for await (const chunk of handle.stdout) {
        chunks.push(chunk);
        size += chunk.length;
        if (size > COMMAND_READ_LIMIT) return "long" as const;
      }
      return "done" as const;
    })();
    const stderr = new Response(handle.stderr).text();
    try {
      const outcome = await Promise.race([output, deadline]);
      if (outcome !== "done") {
        await handle.kill("SIGKILL").catch(() => {});
        if (outcome === "late") {
          throw new ExecutorError(
            "timeout",
            `Reading '${asked}' in sandbox ${id} ran past ${this.#transferTimeoutMs} ms`,
          );
        }
        throw new ExecutorError(
          "invalid",
          `Cannot read '${asked}': it is longer than ${COMMAND_READ_LIMIT} bytes and has no ` +
            `size to go by (a device or a virtual file): read a part with a command, e.g. head -c`,
        );
      }
      const exit = await handle.exited;
      if (exit.exitCode !== 0) {
        throw scriptError({ code: exit.exitCode, stdout: "", stderr: await stderr }, "read", asked);
      }
      return concat(chunks);
    } finally {
      clearTimeout(timer);
    }
  }

  /** Runs one of the scripts above with `/bin/sh` as the run-as user. */
  #script(id: string, runAs: RunAs, script: string, ...args: string[]): Promise<HelperResult> {
    return this.#commands.run(id, ["/bin/sh", "-c", script, "sh", ...args], runAs.user);
  }

  /**
   * Who a file call runs as, mapped as commands map it: root only when asked for by name (a
   * name the image lacks would fail every exec, and E2B always sends one), else the image's
   * user; and that user's home.
   */
  async runAs(id: string, options: FileOptions): Promise<RunAs> {
    const info = await this.#sandboxes.get(id);
    if (options.user !== "root" || !info.user || info.user === "root") {
      return { user: info.user || "root", home: info.home };
    }
    return { user: "root", home: "/root" };
  }

  /** Turns an archive transfer's failure into the contract's error for that path. */
  #archiveError(error: unknown, id: string, what: string, path: string): unknown {
    if (!(error instanceof ExecutorError)) return error;
    // The engine's 404 for a missing path also says "no such container" in dockerode's wrapper,
    // so the path's own sentence must win before the container one is considered.
    const missingPath = /could not find the file|no such file/i.test(error.message);
    if (!missingPath && /no such container/i.test(error.message)) {
      return this.#engine.notFound(id);
    }
    if (error.code !== "timeout") {
      if (/not a directory/i.test(error.message)) {
        return new ExecutorError(
          "not_dir",
          `Cannot ${what} '${path}': a path component is not a directory`,
        );
      }
      if (/cannot overwrite directory|is a directory/i.test(error.message)) {
        return new ExecutorError("is_dir", `Cannot ${what} '${path}': it is a directory`);
      }
    }
    if (error.code === "not_found") {
      return new ExecutorError("not_found", `Cannot ${what} '${path}': no such file or directory`);
    }
    return error;
  }

  /**
   * The numeric ids and names of a run-as user, the image's from the container's /etc/passwd
   * (read by archive, not exec). The engine extracts archives as root with the header's owner;
   * its own `copyUIDGID` looks the name up on the host on some versions, so it cannot be
   * trusted.
   */
  async #owner(id: string, user: string): Promise<Owner> {
    const info = await this.#sandboxes.get(id);
    if (user === "root") return ROOT;
    if (info.ids) return info.ids;
    const [name, group] = info.user.split(":");
    // Only a missing file is an empty table: a lost container or a down engine is the answer.
    const table = (file: string) =>
      this.readFile(id, file).catch((error) => {
        if (error instanceof ExecutorError && error.code === "not_found") return null;
        throw error;
      });
    const [passwd, groups] = (await Promise.all(["/etc/passwd", "/etc/group"].map(table)))
      .map((bytes) => bytes ? new TextDecoder().decode(bytes) : "");
    let uid = 0, gid = 0;
    if (/^\d+$/.test(name ?? "")) {
      uid = Number(name);
      gid = /^\d+$/.test(group ?? "") ? Number(group) : uid;
    } else if (name && name !== "root") {
      const fields = passwd.split("\n").find((l) => l.split(":")[0] === name)?.split(":") ?? [];
      if (fields.length < 4) {
        throw new ExecutorError(
          "invalid",
          `Sandbox '${id}' runs as '${name}', who is not in its /etc/passwd: fix the image`,
        );
      }
      uid = Number(fields[2]);
      gid = Number(fields[3]);
    }
    info.ids = { uid, gid, owner: nameOf(passwd, uid), group: nameOf(groups, gid) };
    return info.ids;
  }
}

/** Who a file call runs as (a user name for exec) and where its relative paths start. */
export interface RunAs {
  user: string;
  home: string;
}

/** The owner of what root creates. */
const ROOT: Owner = { uid: 0, gid: 0, owner: "root", group: "root" };
