/**
 * How the Docker executor describes paths: the `stat` and `list` scripts it runs in a sandbox
 * and the parser of their output into the contract's entries, as envd describes them (sizes as
 * stat says, directories included; owner names, numeric when the image has none; a symlink's
 * absolute target and what is there). The scripts use only what busybox and coreutils share.
 *
 * @module
 */
import { posix } from "node:path";
import type { FileEntry } from "../contract.ts";

/**
 * One `stat` line: mode (hex)/size/uid/gid/owner/group/mtime (s)/mtime (with its fraction)/path.
 * The path is last and starts with '/', so nothing it holds can shift the other fields.
 */
const STAT_FORMAT = "%f/%s/%u/%g/%U/%G/%Y/%y/%n";

/**
 * Prints one line per symlink: `@<target mode (hex), or - when broken>\t<resolved target>\t
 * <raw target>\t<link>`. Every hop is followed (readlink -f); a target whose directories are
 * missing resolves to nothing, so the raw one comes too.
 */
const LINK_FUNCTION = `link() {
  printf '@%s\\t%s\\t%s\\t%s\\n' "$(stat -L -c %f -- "$1" 2>/dev/null || echo -)" \\
    "$(readlink -f -- "$1" 2>/dev/null)" "$(readlink -- "$1")" "$1"
}`;

/** Describes one path, a symlink itself. Exit 2: missing. */
export const STAT_SCRIPT = `${LINK_FUNCTION}
[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
stat -c '${STAT_FORMAT}' -- "$1" || exit 1
if [ -L "$1" ]; then link "$1"; fi
exit 0`;

/**
 * Lists a directory down to a depth. Exit 2: missing; 3: not a directory. Entries the user may
 * not see below the directory are left out, as a listing by that user would.
 */
export const LIST_SCRIPT = `${LINK_FUNCTION}
[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
[ -d "$1" ] || { echo "not a directory" >&2; exit 3; }
case "$1" in */) d=$1 ;; *) d=$1/ ;; esac
find "$d" -mindepth 1 -maxdepth "$2" -exec stat -c '${STAT_FORMAT}' -- {} + 2>/dev/null
find "$d" -mindepth 1 -maxdepth "$2" -type l 2>/dev/null | while IFS= read -r l; do link "$l"; done
exit 0`;

const RECORD = /^([0-9a-f]+)\/(\d+)\/(\d+)\/(\d+)\/([^/\n]*)\/([^/\n]*)\/(\d+)\/([^/\n]*)\/(\/.*)$/;

/** The kind of a raw `st_mode`. */
function kindOf(rawMode: number): FileEntry["type"] | "other" {
  switch (rawMode & 0o170000) {
    case 0o040000:
      return "dir";
    case 0o120000:
      return "symlink";
    case 0o100000:
      return "file";
    default:
      return "other";
  }
}

/** Milliseconds from `%Y` (whole seconds, any time zone) and the fraction `%y` prints. */
function mtimeMs(seconds: string, human: string): number {
  const fraction = /\.(\d+)/.exec(human)?.[1] ?? "";
  return Number(seconds) * 1000 + Math.floor(Number(`0.${fraction || "0"}`) * 1000);
}

/**
 * Parses the scripts' output into entries, in the order the records came. A line that is no
 * record continues the previous path: file names may hold newlines. A device, fifo or socket is
 * described as a file, which is what reading it gives.
 *
 * @example
 * ```ts ignore
 * parseStatLines("81a4/5/1000/1000/user/user/1700000000/2023-11-14 22:13:20.5 +0000//tmp/a\n");
 * // [{ name: "a", path: "/tmp/a", type: "file", size: 5, mode: 0o644, owner: "user", ... }]
 * ```
 */
export function parseStatLines(output: string): FileEntry[] {
  const entries: FileEntry[] = [];
  const links = new Map<string, { mode: string; resolved: string; raw: string }>();
  for (const line of output.replace(/\n$/, "").split("\n")) {
    if (line.startsWith("@")) {
      const [mode, resolved, raw, ...rest] = line.slice(1).split("\t");
      if (rest.length) links.set(rest.join("\t"), { mode, resolved, raw: raw ?? "" });
      continue;
    }
    const m = RECORD.exec(line);
    if (!m) {
      const last = entries.at(-1);
      if (last) {
        last.path += "\n" + line;
        last.name = posix.basename(last.path);
      }
      continue;
    }
    const [, modeHex, size, uid, gid, owner, group, seconds, human, path] = m;
    const rawMode = parseInt(modeHex, 16);
    const kind = kindOf(rawMode);
    entries.push({
      name: posix.basename(path) || "/",
      path,
      type: kind === "other" ? "file" : kind,
      size: Number(size),
      mode: rawMode & 0o7777,
      // Names come from the image's /etc/passwd; an id it lacks is shown as the number, as envd.
      owner: owner && owner !== "UNKNOWN" ? owner : uid,
      group: group && group !== "UNKNOWN" ? group : gid,
      modifiedAt: mtimeMs(seconds, human),
    });
  }
  for (const entry of entries) {
    if (entry.type !== "symlink") continue;
    const link = links.get(entry.path);
    if (!link) continue;
    entry.symlinkTarget = link.resolved ||
      posix.resolve(posix.dirname(entry.path), link.raw || ".");
    if (link.mode !== "-") {
      const targetMode = parseInt(link.mode, 16);
      const kind = kindOf(targetMode);
      entry.targetType = kind === "dir" ? "dir" : "file";
      entry.targetMode = targetMode & 0o7777;
    }
  }
  return entries;
}
