/**
 * A file-system entry in envd's protobuf JSON: enum names for the type, the size as a string
 * (an int64), permissions as `ls` prints them.
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
  const type = e.type === "dir"
    ? "FILE_TYPE_DIRECTORY"
    : e.type === "symlink"
    ? "FILE_TYPE_SYMLINK"
    : "FILE_TYPE_FILE";
  return {
    name: e.name,
    type,
    path: e.path,
    size: String(e.size),
    mode: e.mode & 0o7777,
    permissions: permissionString(e),
    owner: e.owner,
    group: e.group,
    modifiedTime: new Date(e.modifiedAt).toISOString(),
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: e.symlinkTarget } : {}),
  };
}

function permissionString(e: FileEntry): string {
  const kind = e.type === "dir" ? "d" : e.type === "symlink" ? "L" : "-";
  const bits = "rwxrwxrwx";
  let out = kind;
  for (let i = 0; i < 9; i++) out += e.mode & (1 << (8 - i)) ? bits[i] : "-";
  return out;
}
