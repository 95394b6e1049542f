/**
 * The step runner of Docker template builds (`_build.ts`): a build container started from the
 * image so far (on the node's egress network, labelled `dormice.instance` and `dormice.build`,
 * removed after), a `RUN` or `COPY` step run in it with its output logged, and the container
 * committed to a step cache image `dormice-build-cache:<hash>`.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import {
  type BuildIo,
  readLines,
  shellQuote,
  TemplateBuildError,
  type TemplateBuildSpec,
  type TemplateStep,
} from "../template_build.ts";
import type { Commands } from "./_exec.ts";
import type { Sandboxes } from "./_sandboxes.ts";
import type { Engine } from "./engine.ts";

/** The repository of the per-step cache images; the tag is the step's hash. */
export const BUILD_CACHE_REPOSITORY = "dormice-build-cache";
/** How many step cache images a node keeps (the least recently made go first). */
export const KEPT_CACHE_IMAGES = 200;
/** How many output lines of a failing step travel with its error. */
const TAIL_LINES = 20;
/** Where a `COPY` step's context is unpacked inside the build container. */
const CONTEXT_DIR = "/tmp/.dormice-build-context";

/** The state the steps so far left: what the next one runs with. */
export interface StepState {
  env: Record<string, string>;
  workdir: string;
  user: string;
}

/** What {@link BuildSteps} works with (the builder's options hold it). */
export interface BuildStepsOptions {
  engine: Engine;
  sandboxes: Sandboxes;
  commands: Commands;
  instanceId: string;
  /** Deadline of one commit, ms. */
  commitTimeoutMs: number;
  /** The network a build container joins (the node's egress network). */
  networkMode: () => Promise<string>;
}

/** Runs build steps in build containers and commits them (see the module's description). */
export class BuildSteps {
  #o: BuildStepsOptions;

  constructor(options: BuildStepsOptions) {
    this.#o = options;
  }

  /** Runs `fn` in a fresh build container of `image`, removed after. */
  async inContainer(
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
  async run(id: string, step: TemplateStep, state: StepState, name: string, io: BuildIo) {
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
    await this.exec(id, ["/bin/sh", "-c", cmd], user, state, name, io);
  }

  /** A `COPY` step: the uploaded context unpacked, then copied to its destination. */
  async copy(id: string, step: TemplateStep, state: StepState, name: string, io: BuildIo) {
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
    await this.exec(id, ["mkdir", "-p", dir], "root", state, name, io);
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
    await this.exec(id, ["/bin/sh", "-c", script], "root", state, name, io);
  }

  /** Runs `cmd` as `user` in the build container, each output line logged; non-zero fails. */
  async exec(
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
  async commit(id: string, tag: string, repo: string, changes: string[]): Promise<void> {
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
}

/** `path` against `cwd`, as `cd` would take it. */
export function resolvePath(cwd: string, path: string): string {
  if (path.startsWith("/")) return path;
  return `${cwd.replace(/\/$/, "")}/${path}`;
}

/** The SHA-256 of `text`, in hex. */
export async function sha256(text: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}
