/**
 * Template builds on the Docker engine. Each step that changes files (`RUN`, `COPY`) runs in a
 * build container started from the image so far and is committed to a cache image
 * `dormice-build-cache:<hash>`, where the hash covers the base image and every step up to this
 * one (as E2B's builder keys its layers): a rebuild whose first steps did not change starts
 * from the cached image of the last unchanged one. `ENV`, `WORKDIR` and `USER` only change what
 * later steps run with and what the result's config says. The result is committed once more as
 * the snapshot image of the template's id (`dormice-snapshot:<template id>`), labelled as a
 * snapshot of the building team named after the template, with the start and ready commands in
 * its `dormice.start` label: a local image of this node, which the check-in advertises, creates
 * by name find, and the node-to-node image movement can carry like any snapshot.
 *
 * Build containers sit on the node's egress network, as a sandbox with network access does (a
 * package install reaches whatever the node lets sandboxes reach), carry the labels `dormice.instance` and `dormice.build` (never
 * `dormice.sandbox`: they are no sandbox) and are removed after each step.
 * The image a build starts from is found (or pulled) by `_build_base.ts`.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { Clock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import { ExecutorError, type SnapshotInfo } from "../contract.ts";
import {
  type BuildIo,
  readLines,
  shellQuote,
  startScript,
  TemplateBuildError,
  type TemplateBuildSpec,
  type TemplateStep,
} from "../template_build.ts";
import type { Commands } from "./_exec.ts";
import type { Sandboxes } from "./_sandboxes.ts";
import { dropHealedCopy, snapshotImage } from "./_snapshots.ts";
import type { Engine } from "./engine.ts";
import { START_LABEL } from "./_containers.ts";
import { baseImage, imageExists } from "./_build_base.ts";

/** The repository of the per-step cache images; the tag is the step's hash. */
export const BUILD_CACHE_REPOSITORY = "dormice-build-cache";
/** How many step cache images a node keeps (the least recently made go first). */
export const KEPT_CACHE_IMAGES = 200;
/** How many output lines of a failing step travel with its error. */
const TAIL_LINES = 20;
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
/** Where a `COPY` step's context is unpacked inside the build container. */
const CONTEXT_DIR = "/tmp/.dormice-build-context";

/** What {@link DockerTemplateBuilder} works with. */
export interface DockerTemplateBuilderOptions {
  engine: Engine;
  sandboxes: Sandboxes;
  commands: Commands;
  /** Template name → image (`DORMICE_TEMPLATES`). */
  templates: Map<string, string>;
  nodeId: string;
  instanceId: string;
  clock: Clock;
  log: Log;
  /** Deadline of one commit or pull, ms. */
  commitTimeoutMs: number;
  /** The network a build container joins (the node's egress network). */
  networkMode: () => Promise<string>;
}

/** The state the steps so far left: what the next one runs with. */
interface StepState {
  env: Record<string, string>;
  workdir: string;
  user: string;
}

/** Builds templates on the engine (see the module's description). */
export class DockerTemplateBuilder {
  #o: DockerTemplateBuilderOptions;
  /** The builds running now, whose build containers a sweep leaves alone. */
  #running = new Set<string>();
  /** Base image ids found to have the default user (at most {@link KEPT_CACHE_IMAGES}). */
  #hasDefaultUser = new Set<string>();

  constructor(options: DockerTemplateBuilderOptions) {
    this.#o = options;
  }

  /** Runs `spec`'s steps and keeps the result as the snapshot `spec.templateId`. */
  async build(spec: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
    this.#running.add(spec.buildId);
    try {
      await this.#sweep().catch((error) =>
        this.#o.log("warn", "Could not remove build containers left by a stopped node", { error })
      );
      return await this.#build(spec, io);
    } finally {
      this.#running.delete(spec.buildId);
    }
  }

  /**
   * Removes build containers of this instance that no running build owns: those a node
   * stopped mid-step left behind.
   */
  async #sweep(): Promise<void> {
    const left = await this.#o.engine.call(
      "listing this node's build containers",
      (signal) =>
        this.#o.engine.client.listContainers({
          all: true,
          filters: { label: [`dormice.instance=${this.#o.instanceId}`, "dormice.build"] },
          abortSignal: signal,
        }),
    ) as { Id?: string; Labels?: Record<string, string> }[];
    for (const c of left) {
      const build = c.Labels?.["dormice.build"];
      if (!c.Id || build === undefined || this.#running.has(build)) continue;
      await this.#o.engine.call(
        `removing a left build container ${c.Id.slice(0, 12)}`,
        (signal) =>
          this.#o.engine.client.getContainer(c.Id!).remove({ force: true, abortSignal: signal }),
      ).catch(() => {});
    }
  }

  async #build(spec: TemplateBuildSpec, io: BuildIo): Promise<SnapshotInfo> {
    const base = await baseImage(this.#o, spec, io);
    const inspect = await this.#o.engine.call(
      `inspecting base image ${base}`,
      (signal) => this.#o.engine.client.getImage(base).inspect({ abortSignal: signal }),
    ).catch((error) => {
      if (spec.fromSnapshot && error instanceof ExecutorError && error.code === "not_found") {
        throw missingBase(spec);
      }
      throw error;
    });
    const config = (inspect as { Config?: { User?: string; WorkingDir?: string } }).Config;
    const state: StepState = {
      env: {},
      workdir: config?.WorkingDir || "/",
      user: config?.User || "root",
    };
    // The base as it is now, by its id: a template deleted (untagged) or rebuilt under this id
    // while the build runs leaves this build on the image it started from, never another.
    const baseId = inspect.Id ?? base;
    let image = baseId;
    // The team is part of every step's key: a step cache image is never another team's (a COPY
    // step's key holds the files' hash, which its uploader names and nobody checks).
    let hash = await sha256(`base\n${JSON.stringify(spec.team)}\n${inspect.Id ?? base}`);
    // E2B's default user, added where the base lacks it (a team's template has it already).
    if (!spec.fromSnapshot) {
      const provisioned = await this.#defaultUser(spec, baseId, io);
      if (provisioned !== undefined) {
        image = provisioned;
        hash = await sha256(`${hash}\ndefault user`);
      }
    }
    let rebuilt = spec.force;
    for (const [index, step] of spec.steps.entries()) {
      io.signal.throwIfAborted();
      const name = String(index + 1);
      hash = await sha256(`${hash}\n${JSON.stringify([step.type, step.args, step.filesHash])}`);
      const type = step.type.toUpperCase();
      if (type === "ENV") {
        for (let i = 0; i + 1 < step.args.length; i += 2) {
          state.env[step.args[i]] = step.args[i + 1];
        }
        io.log("info", `[${name}] ENV ${step.args.join(" ")}`, name);
        continue;
      }
      if (type === "WORKDIR") {
        state.workdir = resolvePath(state.workdir, step.args[0] ?? "/");
        io.log("info", `[${name}] WORKDIR ${state.workdir}`, name);
        continue;
      }
      if (type === "USER") {
        state.user = step.args[0] || "root";
        io.log("info", `[${name}] USER ${state.user}`, name);
        continue;
      }
      if (type !== "RUN" && type !== "COPY") {
        throw new TemplateBuildError(
          name,
          `Step ${name} has type '${step.type}', which this fleet does not build: use runCmd, ` +
            `copy, setEnvs, setWorkdir or setUser`,
        );
      }
      rebuilt ||= step.force === true;
      const cached = `${BUILD_CACHE_REPOSITORY}:${hash.slice(0, 40)}`;
      if (!rebuilt && await imageExists(this.#o.engine, cached)) {
        io.log("info", `[${name}] CACHED ${describe(step)}`, name);
        image = cached;
        continue;
      }
      rebuilt = true;
      io.log("info", `[${name}] ${describe(step)}`, name);
      await this.#inContainer(spec, image, state, name, io, async (id) => {
        if (type === "RUN") await this.#run(id, step, state, name, io);
        else await this.#copy(id, step, state, name, io);
        await this.#commit(id, cached.split(":")[1], BUILD_CACHE_REPOSITORY, [
          `LABEL dormice.instance=${JSON.stringify(this.#o.instanceId)}`,
          `LABEL dormice.node=${JSON.stringify(this.#o.nodeId)}`,
          `LABEL dormice.build.cache=${JSON.stringify(hash)}`,
        ]);
      }).catch(async (error) => {
        // The base template deleted before a container held its image: the engine freed it.
        if (image === baseId && spec.fromSnapshot && !(await imageExists(this.#o.engine, baseId))) {
          throw missingBase(spec);
        }
        throw error;
      });
      image = cached;
    }
    io.signal.throwIfAborted();
    io.log("info", "[finalize] keeping the template's image", "finalize");
    const createdAt = this.#o.clock.now();
    const info: SnapshotInfo = {
      snapshotId: spec.templateId,
      team: spec.team,
      name: spec.name,
      sandboxId: "",
      template: spec.fromTemplate ?? spec.fromSnapshot ?? spec.fromImage ?? "base",
      node: this.#o.nodeId,
      createdAt,
      sizeBytes: 0,
    };
    const labels: Record<string, string> = {
      // The labels of a snapshot image (see _snapshots.ts), so the template is one.
      "dormice.instance": this.#o.instanceId,
      "dormice.node": this.#o.nodeId,
      "dormice.snapshot": info.snapshotId,
      "dormice.snapshot.team": info.team,
      "dormice.snapshot.name": spec.name,
      "dormice.snapshot.sandbox": "",
      "dormice.snapshot.template": info.template,
      "dormice.snapshot.created": String(createdAt),
      "dormice.snapshot.bytes": "0",
      "dormice.snapshot.archive": "",
      "dormice.template.build": spec.buildId,
      // A rebuild keeps what its team published.
      "dormice.template.public": await this.#labelOf(spec.templateId, "dormice.template.public"),
      [START_LABEL]: startScript(spec.startCmd, spec.readyCmd),
    };
    const changes = [
      ...Object.entries(labels).map(([k, v]) => `LABEL ${k}=${JSON.stringify(v)}`),
      ...Object.entries(state.env).map(([k, v]) => `ENV ${k}=${JSON.stringify(v)}`),
      `WORKDIR ${state.workdir}`,
      `USER ${state.user}`,
    ];
    await this.#inContainer(spec, image, state, "finalize", io, async (id) => {
      await this.#commit(
        id,
        spec.templateId,
        snapshotImage(spec.templateId).split(":")[0],
        changes,
      );
    }, false);
    // A copy of an earlier build this node healed is older than this one now.
    await dropHealedCopy(this.#o.engine, spec.templateId, this.#o.instanceId);
    io.log("info", `[finalize] template '${spec.name}' is ${spec.templateId}`, "finalize");
    await this.#prune().catch((error) =>
      this.#o.log("warn", "Could not prune the template build cache", { error })
    );
    return info;
  }

  /**
   * Publishes or unpublishes template `templateId` of `team`: its image is committed again with
   * the `dormice.template.public` label (a sandbox running from the old one keeps it until it
   * ends; the node's snapshot sweep frees it then). False when this instance holds no template
   * of `team` by that id.
   */
  async setPublic(templateId: string, team: string, published: boolean): Promise<boolean> {
    const ref = snapshotImage(templateId);
    let labels: Record<string, string>;
    let config: { Labels?: Record<string, string>; WorkingDir?: string; User?: string } | undefined;
    try {
      const inspect = await this.#o.engine.call(
        `inspecting template image ${ref}`,
        (signal) => this.#o.engine.client.getImage(ref).inspect({ abortSignal: signal }),
      );
      config = (inspect as { Config?: typeof config }).Config;
      labels = config?.Labels ?? {};
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") return false;
      throw error;
    }
    if (
      labels["dormice.instance"] !== this.#o.instanceId ||
      labels["dormice.snapshot.team"] !== team || !labels["dormice.template.build"]
    ) return false;
    if ((labels["dormice.template.public"] === "true") === published) return true;
    const spec = { buildId: `publish-${templateId}` } as TemplateBuildSpec;
    const io: BuildIo = {
      log: () => {},
      contextFile: () => undefined,
      signal: new AbortController().signal,
    };
    const state: StepState = {
      env: {},
      workdir: config?.WorkingDir || "/",
      user: config?.User || "root",
    };
    await this.#inContainer(spec, ref, state, "publish", io, async (id) => {
      await this.#commit(id, templateId, ref.split(":")[0], [
        `LABEL dormice.template.public=${published ? '"true"' : '""'}`,
        `WORKDIR ${state.workdir}`,
        `USER ${state.user}`,
      ]);
    }, false);
    return true;
  }

  /**
   * The base step's part of E2B's provisioning: a base image without the user `user` gets it (uid
   * 1000 where free, home `/home/user`, no password, `NOPASSWD` sudo where the image has sudo),
   * committed once to a step cache image keyed by the base's id. Its ref, or undefined when the
   * base has the user (remembered, so the next build of that base starts no container) or
   * cannot be checked (no shell: the build goes on without it, as before).
   */
  async #defaultUser(spec: TemplateBuildSpec, baseId: string, io: BuildIo) {
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
    await this.#inContainer(spec, baseId, state, "base", io, async (id) => {
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
      await this.#exec(
        id,
        ["/bin/sh", "-c", ADD_DEFAULT_USER, "sh", DEFAULT_USER],
        "root",
        state,
        "base",
        io,
      );
      await this.#commit(id, key, BUILD_CACHE_REPOSITORY, [
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

  /** Label `name` of image `snapshotImage(templateId)`, or `""`. */
  async #labelOf(templateId: string, name: string): Promise<string> {
    try {
      const inspect = await this.#o.engine.call(
        `inspecting template image ${templateId}`,
        (signal) =>
          this.#o.engine.client.getImage(snapshotImage(templateId)).inspect({
            abortSignal: signal,
          }),
      );
      return (inspect as { Config?: { Labels?: Record<string, string> } }).Config?.Labels?.[name] ??
        "";
    } catch {
      return "";
    }
  }

  /** Runs `fn` in a fresh build container of `image`, removed after. */
  async #inContainer(
    spec: TemplateBuildSpec,
    image: string,
    state: StepState,
    step: string,
    io: BuildIo,
    fn: (id: string) => Promise<void>,
    start = true,
  ): Promise<void> {
    const id = `build-${spec.buildId.slice(0, 8)}-${step}-${crypto.randomUUID().slice(0, 6)}`;
    const engine = this.#o.engine;
    try {
      const networkMode = await this.#o.networkMode();
      const container = await engine.call(
        `creating build container ${id}`,
        (signal) =>
          engine.client.createContainer({
            name: engine.containerName(id),
            Image: image,
            Entrypoint: ["sleep"],
            Cmd: ["2147483647"],
            Env: Object.entries(state.env).map(([k, v]) => `${k}=${v}`),
            WorkingDir: state.workdir,
            Labels: { "dormice.instance": this.#o.instanceId, "dormice.build": spec.buildId },
            HostConfig: {
              NetworkMode: networkMode,
              ...(spec.cpus ? { NanoCpus: Math.round(spec.cpus * 1e9) } : {}),
              ...(spec.memoryMB
                ? { Memory: spec.memoryMB * 1048576, MemorySwap: spec.memoryMB * 1048576 }
                : {}),
              PidsLimit: 4096,
              RestartPolicy: { Name: "no" },
              LogConfig: { Type: "none", Config: {} },
            },
            abortSignal: signal,
          }),
      );
      if (start) {
        await engine.call(
          `starting build container ${id}`,
          (s) => container.start({ abortSignal: s }),
        );
      }
      const abort = () => engine.container(id).remove({ force: true }).catch(() => {});
      io.signal.addEventListener("abort", abort, { once: true });
      try {
        await fn(id);
      } finally {
        io.signal.removeEventListener("abort", abort);
      }
    } catch (error) {
      if (error instanceof TemplateBuildError) throw error;
      if (io.signal.aborted) throw io.signal.reason;
      throw new TemplateBuildError(
        step,
        `Step ${step} failed on the engine: ${error instanceof Error ? error.message : error}`,
      );
    } finally {
      this.#o.sandboxes.forget(id);
      await engine.call(
        `removing build container ${id}`,
        (signal) => engine.container(id).remove({ force: true, abortSignal: signal }),
      ).catch(() => {});
    }
  }

  /** A `RUN` step: its command through `/bin/sh -c` as its user, output to the log. */
  async #run(id: string, step: TemplateStep, state: StepState, name: string, io: BuildIo) {
    const user = step.args[1] || state.user;
    const cmd = step.args[0] ?? "";
    if (user !== "root") {
      // A user the image lacks fails the engine's exec with no word of the user, so ask first;
      // the error says it in E2B's words (its builder's envd answers so), then what to do.
      this.#o.sandboxes.remember(id, "root", state.workdir);
      const known = await this.#o.commands.run(
        id,
        ["/bin/sh", "-c", 'id -u "$1" >/dev/null 2>&1', "sh", user],
        "root",
      );
      // 1 is id's "no such user"; anything else (no `id` in the image: 127) leaves it to the run.
      if (known.code === 1) {
        throw new TemplateBuildError(
          name,
          `failed to run command '${cmd.slice(0, 200)}': command failed: unauthenticated: ` +
            `invalid username: '${user}': the image has no such user: create it in an ` +
            `earlier step (runCmd('useradd -m ${user}', { user: 'root' })) or run as one it has`,
        );
      }
    }
    await this.#exec(id, ["/bin/sh", "-c", cmd], user, state, name, io);
  }

  /** A `COPY` step: the uploaded context unpacked, then copied to its destination. */
  async #copy(id: string, step: TemplateStep, state: StepState, name: string, io: BuildIo) {
    const [src = "", dest = "", owner = "", mode = ""] = step.args;
    const path = step.filesHash ? io.contextFile(step.filesHash) : undefined;
    if (!path) {
      throw new TemplateBuildError(
        name,
        `Step ${name} (COPY ${src}) has no uploaded files (hash ${step.filesHash}): build ` +
          `again, and the SDK uploads them`,
      );
    }
    const dir = `${CONTEXT_DIR}/${step.filesHash}`;
    await this.#exec(id, ["mkdir", "-p", dir], "root", state, name, io);
    const bytes = await Deno.readFile(path);
    await this.#o.engine.call(
      `unpacking the files of step ${name}`,
      (signal) =>
        this.#o.engine.container(id).putArchive(
          Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length),
          { path: dir, abortSignal: signal },
        ),
      this.#o.commitTimeoutMs,
    );
    const script = [
      "set -e",
      `cd ${shellQuote(dir)}`,
      `dest=${shellQuote(resolvePath(state.workdir, dest))}`,
      `set -- ${
        src.split(/\s+/).map((s) => s.replace(/[^A-Za-z0-9_.*?\[\]\/-]/g, "\\$&")).join(" ")
      }`,
      'many=$#; targets=""',
      "for f; do",
      // A symlink is copied as the link it is, whether or not its target is in the files.
      '  [ -e "$f" ] || [ -L "$f" ] || { echo "COPY: $f is not in the uploaded files" >&2; exit 1; }',
      '  if [ -d "$f" ]; then mkdir -p "$dest"; cp -a "$f"/. "$dest"/; t="$dest"',
      '  else case "$dest" in */) mkdir -p "$dest"; cp -a "$f" "$dest"; t="$dest$(basename "$f")";;',
      '    *) if [ "$many" -gt 1 ] || [ -d "$dest" ]; then mkdir -p "$dest"; cp -a "$f" "$dest/";',
      '         t="$dest/$(basename "$f")"; else mkdir -p "$(dirname "$dest")"; cp -a "$f" "$dest";',
      '         t="$dest"; fi;; esac; fi',
      '  targets="$targets $t"',
      "done",
      `owner=${shellQuote(owner || state.user)}`,
      'chown -hR "$owner" $targets 2>/dev/null || chown -hR "$owner:" $targets',
      // The mode is the files': a directory keeps its own, or a 0644 would lock it; a symlink
      // has none (chmod would change its target, or fail on a dangling one).
      ...(mode
        ? [
          `for t in $targets; do if [ -L "$t" ]; then :; elif [ -d "$t" ]; then find "$t" -type f -exec chmod ${
            shellQuote(mode)
          } {} \\; ; else chmod ${shellQuote(mode)} "$t"; fi; done`,
        ]
        : []),
      `rm -rf ${shellQuote(dir)}`,
      'echo "copied to$targets"',
    ].join("\n");
    await this.#exec(id, ["/bin/sh", "-c", script], "root", state, name, io);
  }

  /** Runs `cmd` as `user` in the build container, each output line logged; non-zero fails. */
  async #exec(
    id: string,
    cmd: string[],
    user: string,
    state: StepState,
    name: string,
    io: BuildIo,
  ): Promise<void> {
    this.#o.sandboxes.remember(id, user, state.workdir);
    const handle = await this.#o.commands.exec(id, { cmd, user, cwd: state.workdir });
    const abort = () => handle.kill("SIGKILL").catch(() => {});
    io.signal.addEventListener("abort", abort, { once: true });
    const tail: string[] = [];
    const pump = async (stream: ReadableStream<Uint8Array>, level: "info" | "warn") => {
      await readLines(stream, (line) => {
        io.log(level, line, name);
        tail.push(line);
        if (tail.length > TAIL_LINES) tail.shift();
      });
    };
    try {
      const [, , exit] = await Promise.all([
        pump(handle.stdout, "info"),
        pump(handle.stderr, "warn"),
        handle.exited,
      ]);
      if (exit.exitCode !== 0) {
        const what = cmd[0] === "/bin/sh" && cmd.length === 3 ? cmd[2] : cmd.join(" ");
        throw new TemplateBuildError(
          name,
          `Step ${name} failed: '${what.slice(0, 200)}' exited with code ${exit.exitCode}` +
            (tail.length > 0 ? `; its last output:\n${tail.join("\n")}` : ""),
          tail,
        );
      }
    } finally {
      io.signal.removeEventListener("abort", abort);
    }
  }

  /** Commits build container `id` to `repo:tag` with Dockerfile `changes`. */
  async #commit(id: string, tag: string, repo: string, changes: string[]): Promise<void> {
    await this.#o.engine.call(
      `committing build container ${id} to ${repo}:${tag}`,
      (signal) => {
        const container = this.#o.engine.container(id);
        if (!container.commit) throw new TypeError("The engine client cannot commit containers");
        return container.commit({ repo, tag, pause: false, changes, abortSignal: signal });
      },
      this.#o.commitTimeoutMs,
    );
  }

  /**
   * Removes this instance's step cache images beyond the newest {@linkcode KEPT_CACHE_IMAGES}
   * (an image a later one is built on stays while that one does: the engine refuses it).
   */
  async #prune(): Promise<void> {
    const client = this.#o.engine.client;
    if (!client.listImages) return;
    const images = await this.#o.engine.call(
      "listing the template build cache",
      (signal) =>
        client.listImages!({
          filters: { label: [`dormice.instance=${this.#o.instanceId}`, "dormice.build.cache"] },
          abortSignal: signal,
        }),
    );
    const old = images.sort((a, b) => (b.Created ?? 0) - (a.Created ?? 0))
      .slice(KEPT_CACHE_IMAGES);
    for (const image of old) {
      for (const tag of image.RepoTags ?? []) {
        await this.#o.engine.call(
          `removing cache image ${tag}`,
          (signal) => client.getImage(tag).remove!({ abortSignal: signal }),
        ).catch(() => {});
      }
    }
  }
}

/** A step as its log line says it. */
function describe(step: TemplateStep): string {
  const type = step.type.toUpperCase();
  if (type === "RUN") return `RUN ${step.args[0]}${step.args[1] ? ` (as ${step.args[1]})` : ""}`;
  return `${type} ${step.args.filter((a) => a !== "").join(" ")}`;
}

/** `path` against `cwd`, as `cd` would take it. */
function resolvePath(cwd: string, path: string): string {
  if (path.startsWith("/")) return path;
  return `${cwd.replace(/\/$/, "")}/${path}`;
}

async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The base step's error for a build whose base template (another of the team's) was deleted
 * before the build held its image.
 */
function missingBase(spec: TemplateBuildSpec): TemplateBuildError {
  const named = spec.fromSnapshotName === undefined
    ? `'${spec.fromSnapshot}'`
    : `'${spec.fromSnapshotName}' (${spec.fromSnapshot})`;
  return new TemplateBuildError(
    "base",
    `fromTemplate(${named}): that template was deleted before this build could start from it: ` +
      "build it again, then this template",
  );
}
