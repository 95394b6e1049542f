/**
 * How the Docker executor describes paths: the `stat` and `list` scripts it runs in a sandbox
 * and the parser of their output into the contract's entries, as envd describes them (sizes as
 * stat says, directories included; owner names, numeric when the image has none; a symlink's
 * absolute target and what is there). The scripts use only what busybox and coreutils share,
 * and `getfattr` (Debian's `attr`) for the file metadata when the image has it.
 *
 * @module
 */
import { posix } from "node:path";
import { ExecutorError, type FileEntry } from "../contract.ts";

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

/**
 * The line after which the output is `getfattr --dump` of the `user.e2b.*` attributes (values
 * in hex, so no value can end a line). \001 is in no name a test or an SDK makes.
 */
const XATTR_MARK = "\u0001xattrs";

/**
 * Dumps the metadata of the paths it is given, one `getfattr` for all of them; nothing on an
 * image without it (busybox has none), whose entries then carry no metadata.
 */
const XATTR_FUNCTION = `xattrs() {
  command -v getfattr >/dev/null 2>&1 || return 0
  printf '\\001xattrs\\n'
  getfattr -h -d -e hex -m '^user\\.e2b\\.' --absolute-names -- "$@" 2>/dev/null
}`;

/** Describes one path, a symlink itself. Exit 2: missing. */
export const STAT_SCRIPT = `${LINK_FUNCTION}
${XATTR_FUNCTION}
[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
stat -c '${STAT_FORMAT}' -- "$1" || exit 1
if [ -L "$1" ]; then link "$1"; fi
xattrs "$1"
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
if command -v getfattr >/dev/null 2>&1; then
  printf '\\001xattrs\\n'
  find "$d" -mindepth 1 -maxdepth "$2" -type f -exec getfattr -h -d -e hex -m '^user\\.e2b\\.' \\
    --absolute-names -- {} + 2>/dev/null
fi
exit 0`;

/**
 * Sets a file's metadata: `$1` the path, then key and hex value pairs. Exit 127: the image has
 * no `setfattr`; run with only the path, it just asks that.
 */
export const SET_XATTRS_SCRIPT = `command -v setfattr >/dev/null 2>&1 || exit 127
f=$1
shift
while [ $# -ge 2 ]; do
  setfattr -h -n "user.e2b.$1" -v "0x$2" -- "$f" || exit 1
  shift 2
done
exit 0`;

/**
 * The refusal of a write with metadata on an image without `setfattr` (the `minimal` one), in
 * one sentence for both executors.
 */
export function metadataUnsupported(path: string): ExecutorError {
  return new ExecutorError(
    "invalid",
    `Cannot keep metadata on '${path}': this sandbox's image has no setfattr (Debian's attr ` +
      `package); use the base template, or write without metadata`,
  );
}

/** Undoes getfattr's quoting of a path: a backslash, a newline (any byte under 0x21) as `\ooo`. */
function unquoteAttrPath(quoted: string): string {
  const raw = new TextEncoder().encode(quoted);
  const bytes: number[] = [];
  const octal = (b: number | undefined) => b !== undefined && b >= 0x30 && b <= 0x37;
  for (let i = 0; i < raw.length; i++) {
    if (raw[i] === 0x5c && octal(raw[i + 1]) && octal(raw[i + 2]) && octal(raw[i + 3])) {
      bytes.push(parseInt(String.fromCharCode(raw[i + 1], raw[i + 2], raw[i + 3]), 8));
      i += 3;
    } else bytes.push(raw[i]);
  }
  return new TextDecoder().decode(new Uint8Array(bytes));
}

/** Reads `getfattr --dump -e hex` output into each path's metadata. */
function parseXattrs(dump: string): Map<string, Record<string, string>> {
  const byPath = new Map<string, Record<string, string>>();
  let current: Record<string, string> | undefined;
  for (const line of dump.split("\n")) {
    if (line.startsWith("# file: ")) {
      current = {};
      byPath.set(unquoteAttrPath(line.slice("# file: ".length)), current);
      continue;
    }
    const m = /^user\.e2b\.([^=]+)(?:=0x([0-9a-fA-F]*))?$/.exec(line);
    if (!m || !current) continue;
    const hex = m[2] ?? "";
    const bytes = new Uint8Array(hex.length / 2);
    for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
    current[m[1]] = new TextDecoder().decode(bytes);
  }
  return byPath;
}

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
  // The xattr section starts at the mark's line (the first one when a listing is empty).
  const at = output.startsWith(`${XATTR_MARK}\n`)
    ? 0
    : (output.indexOf(`\n${XATTR_MARK}\n`) + 1 || -1);
  const metadata = parseXattrs(at < 0 ? "" : output.slice(at + XATTR_MARK.length + 1));
  if (at >= 0) output = output.slice(0, at);
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
    const found = metadata.get(entry.path);
    if (found && Object.keys(found).length) entry.metadata = found;
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
