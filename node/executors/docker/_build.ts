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
 * The image a build starts from is found (or pulled) by `_build_base.ts`, E2B's default user is
 * added to it by `_build_user.ts`, and each step runs in its build container by `_build_steps.ts`.
 *
 * @module
 */
import type { Clock } from "../../../shared/clock.ts";
import type { Log } from "../../../shared/log.ts";
import { ExecutorError, type SnapshotInfo } from "../contract.ts";
import {
  type BuildIo,
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
import {
  BUILD_CACHE_REPOSITORY,
  BuildSteps,
  KEPT_CACHE_IMAGES,
  resolvePath,
  sha256,
  type StepState,
} from "./_build_steps.ts";
import { DefaultUsers } from "./_build_user.ts";

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

/** Builds templates on the engine (see the module's description). */
export class DockerTemplateBuilder {
  #o: DockerTemplateBuilderOptions;
  /** The builds running now, whose build containers a sweep leaves alone. */
  #running = new Set<string>();
  /** Runs the steps in build containers. */
  #steps: BuildSteps;
  /** Gives base images E2B's default user. */
  #users: DefaultUsers;

  constructor(options: DockerTemplateBuilderOptions) {
    this.#o = options;
    this.#steps = new BuildSteps(options);
    this.#users = new DefaultUsers(options, this.#steps);
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
      const provisioned = await this.#users.provision(spec, baseId, io);
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
      await this.#steps.inContainer(spec, image, state, name, io, async (id) => {
        if (type === "RUN") await this.#steps.run(id, step, state, name, io);
        else await this.#steps.copy(id, step, state, name, io);
        await this.#steps.commit(id, cached.split(":")[1], BUILD_CACHE_REPOSITORY, [
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
    await this.#steps.inContainer(spec, image, state, "finalize", io, async (id) => {
      await this.#steps.commit(
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
    await this.#steps.inContainer(spec, ref, state, "publish", io, async (id) => {
      await this.#steps.commit(id, templateId, ref.split(":")[0], [
        `LABEL dormice.template.public=${published ? '"true"' : '""'}`,
        `WORKDIR ${state.workdir}`,
        `USER ${state.user}`,
      ]);
    }, false);
    return true;
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
