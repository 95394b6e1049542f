/**
 * Directory watches in Docker sandboxes. Neither image has inotifywait (busybox has no such
 * applet; Debian's minbase lacks inotify-tools), and the engine has no file-event API, so each
 * watch is one long-running bash in the sandbox, as the run-as user: it snapshots the directory
 * with `find` + `stat` every interval and prints what changed between two snapshots, named as
 * inotify would name it. Changes by commands are seen within an interval.
 *
 * A change made by the executor's own file verbs must be seen before the verb answers (envd's
 * inotify queues the event before its HTTP answer, and the SDKs read the events right after a
 * write), so those verbs ask every watch of the sandbox to scan at once and wait for that scan
 * ({@link Watches.changing}). What the verbs create is handed to a user as envd's chown does,
 * which inotify reports as a chmod right after the create: the verbs name those paths, and their
 * events get that chmod.
 *
 * Bounded: a watch is one exec and two snapshots in the sandbox's own memory; it ends when its
 * stdin closes (stopped, or the node gone) or the container goes. How many a sandbox may have
 * is the caller's limit (the envd face allows a few per sandbox).
 *
 * @module
 */
import { posix } from "node:path";
import type { Log } from "../../../shared/log.ts";
import {
  type DirWatch,
  type ExecHandle,
  ExecutorError,
  type FsChange,
  type WatchRequest,
} from "../contract.ts";
import type { Commands } from "./_exec.ts";
import { resolvePath } from "./_sandboxes.ts";

/**
 * The diff of two snapshots (old records, a `//` line, new records), one `E <type> <path>`
 * line per change. A record is `inode/mode/size/uid/gid/mtime/path`. A path gone whose inode
 * came back elsewhere was renamed (what moved below a renamed directory is not reported, as
 * inotify does not); a new regular file with content was also written; a directory's own size
 * and time change with its entries, which inotify does not report as a write.
 */
const DIFF_AWK = String.raw`
function up(p) { sub(/\/[^\/]*$/, "", p); return p }
function under(p, set) { for (p = up(p); p != ""; p = up(p)) if (p in set) return 1; return 0 }
$0 == "//" { part = 1; next }
match($0, /^[0-9]+\/[0-9a-f]+\/[0-9]+\/[0-9]+\/[0-9]+\/[^\/]*\//) {
  p = substr($0, RLENGTH + 1); m = substr($0, 1, RLENGTH - 1)
  if (part) { nm[p] = m; nk[++nn] = p } else { om[p] = m; ok[++on] = p }
}
END {
  for (i = 1; i <= nn; i++) { p = nk[i]; if (!(p in om)) { split(nm[p], f, "/"); born[f[1]] = p } }
  for (i = 1; i <= on; i++) {
    p = ok[i]; if (p in nm) continue
    split(om[p], f, "/")
    if ((f[1] in born) && !(f[1] in taken)) { taken[f[1]] = 1; ren[p] = 1; moved[born[f[1]]] = 1; gone[p] = "rename" }
    else gone[p] = "remove"
  }
  for (i = on; i >= 1; i--) { p = ok[i]; if ((p in gone) && !under(p, ren)) print "E " gone[p] " " p }
  for (i = 1; i <= nn; i++) {
    p = nk[i]; split(nm[p], f, "/")
    if (!(p in om)) {
      if (under(p, moved)) continue
      print "E create " p
      if (!(p in moved) && f[2] ~ /^8/ && f[3] > 0) print "E write " p
      continue
    }
    if (om[p] == nm[p]) continue
    split(om[p], g, "/")
    if (g[2] != f[2] || g[4] != f[4] || g[5] != f[5]) print "E chmod " p
    if (f[2] !~ /^4/ && (g[1] != f[1] || g[3] != f[3] || g[6] != f[6])) print "E write " p
  }
}`;

/**
 * The watcher: `ready` once the first snapshot is taken, then a scan every interval, or at once
 * for a line `s <token>` on stdin, which is answered `T <token>` after that scan's changes (a
 * scan with changes and no token ends with `T -`). Ends at the end of stdin. bash, not sh:
 * busybox's `read -t` says the same for a timeout and for the end of input. Arguments: the
 * directory, the depth (0: no limit), the interval in seconds, the diff program. Exit 2: the
 * directory is missing; 3: not a directory.
 */
const WATCH_SCRIPT = `dir=$1 depth=$2 interval=$3 diff=$4
[ -e "$dir" ] || { echo "no such file or directory" >&2; exit 2; }
[ -d "$dir" ] || { echo "not a directory" >&2; exit 3; }
case "$dir" in */) d=$dir ;; *) d=$dir/ ;; esac
lim=; [ "$depth" = 0 ] || lim="-maxdepth $depth"
snap() { find "$d" -xdev -mindepth 1 $lim -exec stat -c '%i/%f/%s/%u/%g/%y/%n' -- {} + 2>/dev/null; }
old=$(snap)
echo ready
while :; do
  if read -r -t "$interval" line; then tok=\${line#s }
  elif [ $? -gt 128 ]; then tok=-
  else exit 0
  fi
  new=$(snap)
  if [ "$new" != "$old" ]; then
    { printf '%s\\n' "$old"; echo //; printf '%s\\n' "$new"; } | awk "$diff"
    old=$new
    echo "T $tok"
  elif [ "$tok" != - ]; then echo "T $tok"
  fi
done`;

/** The longest line a watcher may print (a path is at most 4096 bytes on Linux). */
const MAX_LINE = 64 * 1024;

/** What {@link Watches} needs. */
export interface WatchesOptions {
  commands: Commands;
  log: Log;
  /** How often a watcher scans for changes made by commands, ms. */
  intervalMs: number;
  /**
   * How long a file verb waits for the watches to see its change, and a watch for its first
   * look, ms (5 s by default: a watcher answers in one scan, a few ms for a small directory).
   */
  settleTimeoutMs?: number;
}

/** One running watcher. */
interface Running {
  handle: ExecHandle;
  /** Changes of the scan being read, delivered at its `T` line. */
  scan: FsChange[];
  /** Scans asked for, by token, resolved at their `T` line. */
  asked: Map<string, () => void>;
  nextToken: number;
  ended: Promise<void>;
}

/** The watches of every sandbox of one executor. */
export class Watches {
  #commands: Commands;
  #log: Log;
  #intervalMs: number;
  #settleTimeoutMs: number;
  #bySandbox = new Map<string, Set<Running>>();
  /** Paths the file verbs are creating and handing over, by sandbox, with how many verbs. */
  #handing = new Map<string, Map<string, number>>();

  constructor(options: WatchesOptions) {
    this.#commands = options.commands;
    this.#log = options.log;
    this.#intervalMs = options.intervalMs;
    this.#settleTimeoutMs = options.settleTimeoutMs ?? 5_000;
  }

  /**
   * Starts a watcher in the sandbox, resolving once its first snapshot is taken.
   *
   * @throws {ExecutorError} `not_found` or `not_dir` for the directory, `timeout` when the first
   * snapshot takes longer than the settle deadline.
   */
  async start(
    id: string,
    runAs: { user: string; home: string },
    request: WatchRequest,
    onChange: (change: FsChange) => void,
  ): Promise<DirWatch> {
    const dir = resolvePath(request.path, runAs.home);
    const handle = await this.#commands.exec(id, {
      cmd: [
        "/bin/bash",
        "-c",
        WATCH_SCRIPT,
        "watch",
        dir,
        request.recursive ? "0" : "1",
        String(this.#intervalMs / 1000),
        DIFF_AWK,
      ],
      user: runAs.user,
      stdin: true,
    });
    const stderr = new Response(handle.stderr).text();
    const lines = readLines(handle.stdout);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const first = await Promise.race([
      lines.next(),
      new Promise<"late">((resolve) => timer = setTimeout(resolve, this.#settleTimeoutMs, "late")),
    ]).finally(() => clearTimeout(timer));
    if (first === "late" || first.done || first.value !== "ready") {
      await handle.kill("SIGKILL").catch(() => {});
      const exit = await handle.exited;
      if (first === "late") {
        throw new ExecutorError(
          "timeout",
          `Watching '${dir}' in sandbox ${id}: the first look took over ${this.#settleTimeoutMs} ms ` +
            `(a very large tree?): watch a smaller directory`,
        );
      }
      const said = (await stderr).trim().split("\n").pop() ?? "";
      if (exit.exitCode === 2) {
        throw new ExecutorError("not_found", `Cannot watch '${dir}': no such directory`);
      }
      if (exit.exitCode === 3) {
        throw new ExecutorError("not_dir", `Cannot watch '${dir}': it is not a directory`);
      }
      throw new ExecutorError(
        "invalid",
        `Cannot watch '${dir}': ${said || `the watcher ended (exit ${exit.exitCode})`}; ` +
          `the image needs bash, find, stat and awk`,
      );
    }
    const running: Running = {
      handle,
      scan: [],
      asked: new Map(),
      nextToken: 1,
      ended: Promise.resolve(),
    };
    let set = this.#bySandbox.get(id);
    if (!set) this.#bySandbox.set(id, set = new Set());
    set.add(running);
    running.ended = (async () => {
      try {
        for await (const line of lines) this.#line(id, running, line, onChange);
      } catch (error) {
        this.#log("warn", "A directory watcher's output failed", {
          id,
          error: error instanceof Error ? error.message : String(error),
        });
      } finally {
        const mine = this.#bySandbox.get(id);
        mine?.delete(running);
        if (mine?.size === 0) this.#bySandbox.delete(id);
        for (const done of running.asked.values()) done();
        running.asked.clear();
        await handle.exited.catch(() => {});
      }
    })();
    let stopping: Promise<void> | undefined;
    const stop = () =>
      stopping ??= (async () => {
        // The end of stdin ends the loop; a frozen or stuck one is killed.
        await handle.closeStdin().catch(() => {});
        let wait: ReturnType<typeof setTimeout> | undefined;
        const quit = await Promise.race([
          running.ended.then(() => true),
          new Promise<false>((resolve) => wait = setTimeout(resolve, 1000, false)),
        ]).finally(() => clearTimeout(wait));
        if (!quit) await handle.kill("SIGKILL").catch(() => {});
        await running.ended;
      })();
    return { ended: running.ended, stop };
  }

  /**
   * Runs a file verb so that every watch of the sandbox has seen its change when it resolves.
   * `created` is the path a verb creates and hands to a user (a written file, a new directory):
   * it and the directories above it, which the verb may create too, get envd's chmod.
   */
  async changing<T>(id: string, created: string | null, op: () => Promise<T>): Promise<T> {
    if (!this.#bySandbox.get(id)?.size) return await op();
    const handedOver = created === null ? [] : lineage(created);
    let handing = this.#handing.get(id);
    if (!handing) this.#handing.set(id, handing = new Map());
    for (const path of handedOver) handing.set(path, (handing.get(path) ?? 0) + 1);
    try {
      const result = await op();
      await Promise.all([...this.#bySandbox.get(id) ?? []].map((w) => this.#scanNow(id, w)));
      return result;
    } finally {
      for (const path of handedOver) {
        const left = (handing.get(path) ?? 1) - 1;
        if (left > 0) handing.set(path, left);
        else handing.delete(path);
      }
      if (handing.size === 0) this.#handing.delete(id);
    }
  }

  /** Asks one watcher to scan at once and waits for that scan, up to the settle deadline. */
  async #scanNow(id: string, running: Running): Promise<void> {
    const token = String(running.nextToken++);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const seen = new Promise<void>((resolve) => {
      running.asked.set(token, resolve);
      timer = setTimeout(() => {
        running.asked.delete(token);
        this.#log("warn", "A directory watcher did not answer a scan in time", { id });
        resolve();
      }, this.#settleTimeoutMs);
    });
    try {
      await running.handle.writeStdin(new TextEncoder().encode(`s ${token}\n`));
      await seen;
    } catch {
      running.asked.delete(token); // the watcher is ending
    } finally {
      clearTimeout(timer);
    }
  }

  /** Handles one line of a watcher: a change of the scan being read, or the end of a scan. */
  #line(id: string, running: Running, line: string, onChange: (change: FsChange) => void): void {
    if (line.startsWith("E ")) {
      const space = line.indexOf(" ", 2);
      const type = line.slice(2, space) as FsChange["type"];
      if (space > 2 && CHANGE_TYPES.has(type)) {
        running.scan.push({ type, path: line.slice(space + 1) });
      }
      return;
    }
    if (!line.startsWith("T ")) return;
    const handing = this.#handing.get(id);
    const chmodded = new Set<string>();
    for (const change of running.scan.splice(0)) {
      if (!handing?.has(change.path)) {
        onChange(change);
        continue;
      }
      // envd creates, then chowns, then writes: the chmod comes after a create, before a write.
      const chmod = () => {
        if (chmodded.has(change.path)) return;
        chmodded.add(change.path);
        onChange({ path: change.path, type: "chmod" });
      };
      if (change.type === "chmod") chmod();
      else if (change.type === "create") onChange(change), chmod();
      else if (change.type === "write") chmod(), onChange(change);
      else onChange(change);
    }
    const token = line.slice(2);
    running.asked.get(token)?.();
    running.asked.delete(token);
  }
}

const CHANGE_TYPES = new Set<string>(["create", "write", "remove", "rename", "chmod"]);

/** A path and every directory above it. */
function lineage(path: string): string[] {
  const out = [path];
  for (let p = path; p !== "/";) out.push(p = posix.dirname(p));
  return out;
}

/** The lines of a stream (without their newline); a line past MAX_LINE is dropped. */
async function* readLines(stream: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  let pending = "";
  let dropping = false;
  for await (const text of stream.pipeThrough(new TextDecoderStream())) {
    pending += text;
    let newline: number;
    while ((newline = pending.indexOf("\n")) !== -1) {
      const line = pending.slice(0, newline);
      pending = pending.slice(newline + 1);
      if (!dropping) yield line;
      dropping = false;
    }
    if (pending.length > MAX_LINE) {
      pending = "";
      dropping = true;
    }
  }
}
