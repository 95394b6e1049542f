/**
 * E2B's default user on Docker template builds (`_build.ts`): the base step's part of E2B's
 * provisioning, a base image without the user `user` getting it once, committed to a step
 * cache image keyed by the base's id.
 *
 * @module
 */
import type { BuildIo, TemplateBuildSpec } from "../template_build.ts";
import { imageExists } from "./_build_base.ts";
import {
  BUILD_CACHE_REPOSITORY,
  type BuildSteps,
  type BuildStepsOptions,
  KEPT_CACHE_IMAGES,
  sha256,
  type StepState,
} from "./_build_steps.ts";

/** E2B's default user, which every template has (its builder adds it where the base lacks it). */
const DEFAULT_USER = "user";
/**
 * Adds user `$1` as E2B's builder provisions it: `useradd` (Debian and the like), busybox's
 * `adduser -D` (Alpine), or the passwd and group lines written by hand (an image with neither).
 * uid 1000 when free, home `/home/$1`, bash where the image has it, no password (where the image
 * has `/etc/shadow`), and a
 * `NOPASSWD` line in `/etc/sudoers` where the image has sudo.
 */
const ADD_DEFAULT_USER = [
  "set -e",
  'u="$1"; home="/home/$u"',
  "shell=/bin/sh; [ -x /bin/bash ] && shell=/bin/bash",
  'uid=1000; while grep -q "^[^:]*:[^:]*:$uid:" /etc/passwd; do uid=$((uid + 1)); done',
  'if grep -q "^$u:" /etc/group 2>/dev/null; then group="$u"; else group=""; fi',
  "if command -v useradd >/dev/null 2>&1; then",
  '  useradd -m -d "$home" -u "$uid" -s "$shell" ${group:+-g "$group"} "$u"',
  "elif command -v adduser >/dev/null 2>&1; then",
  '  adduser -D -h "$home" -u "$uid" -s "$shell" ${group:+-G "$group"} "$u"',
  "else",
  '  if [ -z "$group" ]; then',
  '    gid="$uid"; while grep -q "^[^:]*:[^:]*:$gid:" /etc/group 2>/dev/null; do gid=$((gid + 1)); done',
  '    echo "$u:x:$gid:" >>/etc/group',
  '  else gid="$(sed -n "s/^$u:[^:]*:\\([0-9]*\\):.*/\\1/p" /etc/group)"; fi',
  '  echo "$u:x:$uid:$gid::$home:$shell" >>/etc/passwd',
  '  [ ! -f /etc/shadow ] || echo "$u::19000:0:99999:7:::" >>/etc/shadow',
  '  mkdir -p "$home"; [ ! -d /etc/skel ] || cp -a /etc/skel/. "$home"/',
  '  chown -R "$uid:$gid" "$home"',
  "fi",
  'mkdir -p "$home"; chown "$u" "$home"',
  // No password in /etc/shadow; an image without one keeps the passwd file's 'x' (an empty field
  // there makes some static libcs find no such user).
  '[ ! -f /etc/shadow ] || passwd -d "$u" >/dev/null 2>&1 || true',
  'if [ -f /etc/sudoers ] && ! grep -q "^$u " /etc/sudoers; then',
  '  echo "$u ALL=(ALL:ALL) NOPASSWD: ALL" >>/etc/sudoers',
  "fi",
  'echo "added user $u: $(id "$u" 2>/dev/null || grep "^$u:" /etc/passwd)"',
].join("\n");

/** Gives base images E2B's default user (see the module's description). */
export class DefaultUsers {
  #o: BuildStepsOptions & { nodeId: string };
  #steps: BuildSteps;
  /** Base image ids found to have the default user (at most {@link KEPT_CACHE_IMAGES}). */
  #hasDefaultUser = new Set<string>();

  constructor(options: BuildStepsOptions & { nodeId: string }, steps: BuildSteps) {
    this.#o = options;
    this.#steps = steps;
  }

  /**
   * The base step's part of E2B's provisioning: a base image without the user `user` gets it (uid
   * 1000 where free, home `/home/user`, no password, `NOPASSWD` sudo where the image has sudo),
   * committed once to a step cache image keyed by the base's id. Its ref, or undefined when the
   * base has the user (remembered, so the next build of that base starts no container) or
   * cannot be checked (no shell: the build goes on without it, as before).
   */
  async provision(
    spec: TemplateBuildSpec,
    baseId: string,
    io: BuildIo,
  ): Promise<string | undefined> {
    if (this.#hasDefaultUser.has(baseId)) return undefined;
    const key = (await sha256(`default user\n${baseId}`)).slice(0, 40);
    const cached = `${BUILD_CACHE_REPOSITORY}:${key}`;
    const what = `adding the default user '${DEFAULT_USER}'`;
    if (await imageExists(this.#o.engine, cached)) {
      io.log("info", `[base] CACHED ${what}`, "base");
      return cached;
    }
    // Run from "/": the engine would make a missing working directory (/home/user) as root.
    const state: StepState = { env: {}, workdir: "/", user: "root" };
    let outcome = "unknown" as "has" | "added" | "unknown";
    await this.#steps.inContainer(spec, baseId, state, "base", io, async (id) => {
      this.#o.sandboxes.remember(id, "root", "/");
      const check = await this.#o.commands.run(
        id,
        [
          "/bin/sh",
          "-c",
          'id -u "$1" >/dev/null 2>&1 || grep -q "^$1:" /etc/passwd',
          "sh",
          DEFAULT_USER,
        ],
        "root",
      ).catch(() => ({ code: -1 }));
      if (check.code === 0) {
        outcome = "has";
        return;
      }
      if (check.code !== 1) {
        io.log(
          "warn",
          `[base] could not check for the default user '${DEFAULT_USER}' (no shell?); building without adding it`,
          "base",
        );
        return;
      }
      io.log("info", `[base] ${what}: the image has none`, "base");
      await this.#steps.exec(
        id,
        ["/bin/sh", "-c", ADD_DEFAULT_USER, "sh", DEFAULT_USER],
        "root",
        state,
        "base",
        io,
      );
      await this.#steps.commit(id, key, BUILD_CACHE_REPOSITORY, [
        `LABEL dormice.instance=${JSON.stringify(this.#o.instanceId)}`,
        `LABEL dormice.node=${JSON.stringify(this.#o.nodeId)}`,
        `LABEL dormice.build.cache=${JSON.stringify(key)}`,
      ]);
      outcome = "added";
    });
    if (outcome === "has") {
      this.#hasDefaultUser.add(baseId);
      // Bounded: the oldest base forgotten first (its next build checks it once more).
      if (this.#hasDefaultUser.size > KEPT_CACHE_IMAGES) {
        this.#hasDefaultUser.delete(this.#hasDefaultUser.values().next().value!);
      }
    }
    return outcome === "added" ? cached : undefined;
  }
}
