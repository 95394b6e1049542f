/**
 * The shell scripts behind the Docker executor's file verbs that change or read a path (plan a
 * directory, move, remove, read what the archive API cannot see), and {@link scriptError},
 * which turns their exit codes, and `_stat.ts`'s, into the contract's errors. Each script is
 * POSIX `sh` that busybox runs, takes its paths as arguments (never spliced into the text), and
 * documents the exit codes it uses.
 *
 * @module
 */
import { ExecutorError } from "../contract.ts";
import type { HelperResult } from "./_exec.ts";

/**
 * Plans a directory's creation: prints the nearest existing ancestor, which the new directories
 * go under by archive. Exit 10: it existed; 11: a non-directory is there; 3: an ancestor is a
 * file; 13: the user cannot search the ancestor, so "missing" below it could be a lie (an
 * archive put over a hidden directory would hand it to this user).
 */
export const MKDIR_PLAN_SCRIPT = `[ -d "$1" ] && exit 10
{ [ -e "$1" ] || [ -L "$1" ]; } && { echo "a file exists at that path" >&2; exit 11; }
a=$(dirname -- "$1")
while [ ! -e "$a" ] && [ ! -L "$a" ]; do a=$(dirname -- "$a"); done
[ -d "$a" ] || { echo "not a directory: $a" >&2; exit 3; }
[ -x "$a" ] || { echo "Permission denied: $a" >&2; exit 13; }
printf '%s' "$a"`;

/**
 * Renames like rename(2) with envd's rules: the target's parent must exist, an existing file is
 * replaced, an existing directory is refused. Exit 2: source missing; 5: target's parent
 * missing; 3: a parent is a file; 11: the target is a directory.
 */
export const MOVE_SCRIPT =
  `[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory" >&2; exit 2; }
t=$(dirname -- "$2")
if [ ! -d "$t" ]; then
  [ -e "$t" ] && { echo "not a directory: $t" >&2; exit 3; }
  echo "no such directory: $t" >&2; exit 5
fi
if [ -d "$2" ] && [ ! -L "$2" ]; then echo "$2 is an existing directory" >&2; exit 11; fi
exec mv -f -- "$1" "$2"`;

/**
 * Removes a path; a missing one is not an error (envd's `RemoveAll`), unless its parent is a
 * file. Exit 3: the parent is not a directory.
 */
export const REMOVE_SCRIPT = `if [ ! -e "$1" ] && [ ! -L "$1" ]; then
  p=$(dirname -- "$1")
  if [ -e "$p" ] && [ ! -d "$p" ]; then echo "not a directory: $p" >&2; exit 3; fi
  exit 0
fi
exec rm -rf -- "$1"`;

/**
 * Reads a file the engine's archive cannot see, to its end or to a byte limit. Exit 2: missing;
 * 4: a directory.
 */
export const READ_SCRIPT = `[ -e "$1" ] || { echo "no such file or directory" >&2; exit 2; }
[ -d "$1" ] && { echo "it is a directory" >&2; exit 4; }
exec head -c "$2" -- "$1"`;

/** Turns a helper script's failure into the contract's error. */
export function scriptError(result: HelperResult, what: string, path: string): ExecutorError {
  const said = result.stderr.trim().split("\n").pop() ?? "";
  if (result.code === 2 || /no such file/i.test(said)) {
    return new ExecutorError("not_found", `Cannot ${what} '${path}': no such file or directory`);
  }
  if (result.code === 3 || /not a directory/i.test(said)) {
    return new ExecutorError(
      "not_dir",
      `Cannot ${what} '${path}': a path component is not a directory`,
    );
  }
  if (result.code === 4) {
    return new ExecutorError("is_dir", `Cannot ${what} '${path}': ${said}`);
  }
  if (result.code === 13 || /permission denied/i.test(said)) {
    return new ExecutorError(
      "invalid",
      `Cannot ${what} '${path}' as this user: permission denied (${said}); ask for user root`,
    );
  }
  if (result.code === 11 || /exists/i.test(said)) {
    return new ExecutorError(
      "exists",
      `Cannot ${what} '${path}': ${said || "it already exists"}`,
    );
  }
  return new ExecutorError(
    "invalid",
    `Cannot ${what} '${path}': ${said || `exit ${result.code}`}`,
  );
}
