/**
 * The fake executor's template builds, done the way the Docker executor does them but on a fake
 * sandbox: `RUN` steps run in the fake shell, and the file tree left is kept as the template's
 * snapshot.
 *
 * @module
 */
import type { CreateRequest, ExecHandle, ExecRequest, SnapshotInfo } from "./contract.ts";
import { type BuildIo, TemplateBuildError, type TemplateBuildSpec } from "./template_build.ts";
import type { FakeFs } from "./_fake_fs.ts";
import type { FakeSnapshots } from "./_fake_snapshots.ts";
import { unknownTemplateError } from "./docker/templates.ts";

/** What a fake template build works with: its executor's verbs and state. */
export interface FakeBuildHost {
  /** The templates a build may start from. */
  templates: Set<string>;
  /** The node id the result records as its origin. */
  nodeId: string;
  /** The executor's snapshots, where the result is kept. */
  snapshots: FakeSnapshots;
  /** Stamps the result's creation time. */
  now(): number;
  create(request: CreateRequest): Promise<void>;
  exec(id: string, request: ExecRequest): Promise<ExecHandle>;
  /** The file tree of a sandbox it holds. */
  fsOf(id: string): FakeFs;
  destroy(id: string): Promise<void>;
}

/**
 * Builds a template on a fake sandbox: `RUN` steps run in the fake shell (a non-zero exit fails
 * the step with its last output lines), a `COPY` needs its uploaded files, `ENV`, `WORKDIR` and
 * `USER` are accepted; the file tree is kept as the snapshot `spec.templateId` of the team, named
 * `spec.name`, replacing one by that id or name.
 */
export async function buildFakeTemplate(
  host: FakeBuildHost,
  spec: TemplateBuildSpec,
  io: BuildIo,
): Promise<SnapshotInfo> {
  const base = spec.fromSnapshot ?? spec.fromTemplate ??
    (spec.fromImage === undefined || spec.fromImage === "e2bdev/base" ? "base" : undefined);
  if (base === undefined) {
    throw new TemplateBuildError(
      "base",
      `fromImage('${spec.fromImage}') could not be pulled: the fake executor pulls no image. ` +
        "Use fromTemplate('base')",
    );
  }
  if (spec.fromSnapshot !== undefined && !host.snapshots.get(spec.fromSnapshot)) {
    // As the Docker executor says it: the base template was deleted before the build held it.
    throw new TemplateBuildError(
      "base",
      `fromTemplate('${spec.fromSnapshotName ?? spec.fromSnapshot}'): that template was deleted ` +
        "before this build could start from it: build it again, then this template",
    );
  }
  if (spec.fromSnapshot === undefined && !host.templates.has(base)) {
    throw new TemplateBuildError("base", unknownTemplateError(base, host.templates).message);
  }
  io.log("info", `[base] FROM ${base}`, "base");
  const id = `build-${spec.buildId}`;
  await host.create({
    id,
    name: id,
    template: spec.fromSnapshot === undefined ? base : "base",
    ...(spec.fromSnapshot === undefined ? {} : { snapshot: spec.fromSnapshot }),
    spec: {},
    env: {},
  });
  try {
    for (const [index, step] of spec.steps.entries()) {
      io.signal.throwIfAborted();
      const name = String(index + 1);
      io.log("info", `[${name}] ${step.type} ${step.args.join(" ")}`, name);
      if (step.type === "COPY" && !(step.filesHash && io.contextFile(step.filesHash))) {
        throw new TemplateBuildError(name, `Step ${name} (COPY) has no uploaded files`);
      }
      if (step.type !== "RUN") continue;
      const handle = await host.exec(id, { cmd: ["/bin/sh", "-c", step.args[0] ?? ""] });
      const [out, err, exit] = await Promise.all([
        new Response(handle.stdout).text(),
        new Response(handle.stderr).text(),
        handle.exited,
      ]);
      const lines = (out + err).split("\n").filter((l) => l !== "");
      for (const line of lines) io.log("info", line, name);
      if (exit.exitCode !== 0) {
        const tail = lines.slice(-20);
        throw new TemplateBuildError(
          name,
          `Step ${name} failed: '${step.args[0]}' exited with code ${exit.exitCode}` +
            (tail.length > 0 ? `; its last output:\n${tail.join("\n")}` : ""),
          tail,
        );
      }
    }
    const fs = host.fsOf(id);
    host.snapshots.dropNamed(spec.team, spec.name);
    const info: SnapshotInfo = {
      snapshotId: spec.templateId,
      team: spec.team,
      name: spec.name,
      sandboxId: "",
      template: base,
      node: host.nodeId,
      createdAt: host.now(),
      sizeBytes: fs.bytes(),
    };
    host.snapshots.keep(info, fs.copy());
    io.log("info", `[finalize] template '${spec.name}' is ${spec.templateId}`, "finalize");
    return { ...info };
  } finally {
    await host.destroy(id);
  }
}
