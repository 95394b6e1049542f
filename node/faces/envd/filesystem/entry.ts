/**
 * A file-system entry in envd's protobuf JSON: enum names for the type, the size as a string
 * (an int64), permissions as Go's `FileMode.String()` prints them (envd is Go), and for a
 * symlink what envd reports: the type and permission bits of what it leads to, and its absolute
 * target.
 *
 * @module
 */
import type { FileEntry } from "../../../executors/contract.ts";

/**
 * An executor's `FileEntry` as envd's `EntryInfo`.
 *
 * @example
 * ```ts
 * import { entryJson } from "./entry.ts";
 * const e = entryJson({
 *   name: "a", path: "/tmp/a", type: "file", size: 5, mode: 0o644,
 *   owner: "user", group: "user", modifiedAt: 0,
 * });
 * e.permissions; // "-rw-r--r--"
 * ```
 */
export function entryJson(e: FileEntry): Record<string, unknown> {
  // envd stats a link's target for its type and mode; a broken link has neither.
  const kind = e.type === "symlink" ? e.targetType : e.type;
  const mode = e.type === "symlink" ? e.targetMode ?? 0 : e.mode;
  const type = kind === "dir"
    ? "FILE_TYPE_DIRECTORY"
    : kind === "file"
    ? "FILE_TYPE_FILE"
    : "FILE_TYPE_UNSPECIFIED";
  return {
    name: e.name,
    type,
    path: e.path,
    size: String(e.size),
    mode: mode & 0o777,
    permissions: permissionString(e),
    owner: e.owner,
    group: e.group,
    modifiedTime: new Date(e.modifiedAt).toISOString(),
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: e.symlinkTarget } : {}),
    ...(e.metadata ? { metadata: e.metadata } : {}),
  };
}

/**
 * Go's `FileMode.String()` of the entry itself: a letter for each special bit Go knows (`d`,
 * `L`, `u`, `g`, `t`, in Go's order), `-` when there is none, then `rwx` three times.
 */
function permissionString(e: FileEntry): string {
  let special = "";
  if (e.type === "dir") special += "d";
  if (e.type === "symlink") special += "L";
  if (e.mode & 0o4000) special += "u";
  if (e.mode & 0o2000) special += "g";
  if (e.mode & 0o1000) special += "t";
  const bits = "rwxrwxrwx";
  let out = special || "-";
  for (let i = 0; i < 9; i++) out += e.mode & (1 << (8 - i)) ? bits[i] : "-";
  return out;
}
