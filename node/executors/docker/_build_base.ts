/**
 * The image a Docker template build starts from: a snapshot of the team, a template of the node
 * (`DORMICE_TEMPLATES`, E2B's default image standing for `base`), or an image the engine holds
 * or pulls from its registry.
 *
 * @module
 */
import { ExecutorError } from "../contract.ts";
import { type BuildIo, TemplateBuildError, type TemplateBuildSpec } from "../template_build.ts";
import { snapshotImage } from "./_snapshots.ts";
import type { Engine } from "./engine.ts";

/** E2B's default base image, served by the node's `base` template. */
const E2B_DEFAULT_IMAGE = "e2bdev/base";

/** What finding a build's base image works with. */
export interface BaseImageOptions {
  engine: Engine;
  /** Template name → image (`DORMICE_TEMPLATES`). */
  templates: Map<string, string>;
  /** Deadline of one pull, ms. */
  commitTimeoutMs: number;
}

/** The image the build starts from; an image the engine lacks is pulled. */
export async function baseImage(
  o: BaseImageOptions,
  spec: TemplateBuildSpec,
  io: BuildIo,
): Promise<string> {
  if (spec.fromSnapshot) return snapshotImage(spec.fromSnapshot);
  const template = spec.fromTemplate ??
    (spec.fromImage === undefined || spec.fromImage === E2B_DEFAULT_IMAGE ? "base" : undefined);
  if (template !== undefined) {
    const image = o.templates.get(template);
    if (!image) {
      throw new TemplateBuildError(
        "base",
        `fromTemplate('${template}') names no template of this node: use one of ` +
          `${[...o.templates.keys()].join(", ")}, or a template your team built`,
      );
    }
    io.log("info", `[base] FROM template ${template} (${image})`, "base");
    return image;
  }
  const image = spec.fromImage!;
  if (await imageExists(o.engine, image)) {
    io.log("info", `[base] FROM ${image} (present on this node)`, "base");
    return image;
  }
  io.log("info", `[base] pulling ${image} from ${registryOf(image)}`, "base");
  await pull(o, image, io);
  return image;
}

/** Pulls `image`; a failure is the base step's error naming the image and the registry. */
async function pull(o: BaseImageOptions, image: string, io: BuildIo): Promise<void> {
  const client = o.engine.client as unknown as {
    pull?(ref: string, options: Record<string, unknown>): Promise<AsyncIterable<Uint8Array>>;
  };
  const fail = (why: string) =>
    new TemplateBuildError(
      "base",
      `fromImage('${image}') could not be pulled from ${registryOf(image)}: ${why}. Use an ` +
        `image this node's engine holds or can reach, or fromTemplate('base')`,
    );
  if (typeof client.pull !== "function") throw fail("this engine client cannot pull");
  let said = "";
  try {
    const stream = await o.engine.call(
      `pulling ${image}`,
      (signal) => client.pull!(image, { abortSignal: signal }),
      o.commitTimeoutMs,
    );
    for await (const chunk of stream) {
      said += new TextDecoder().decode(chunk);
      if (said.length > 65536) said = said.slice(-8192);
    }
  } catch (error) {
    throw fail(error instanceof Error ? error.message : String(error));
  }
  const failed = said.split("\n").map((l) => {
    try {
      return (JSON.parse(l) as { error?: string }).error;
    } catch {
      return undefined;
    }
  }).find((e) => e);
  if (failed) throw fail(failed);
  if (!(await imageExists(o.engine, image))) {
    throw fail("the engine does not hold it after the pull");
  }
  io.log("info", `[base] pulled ${image}`, "base");
}

/** Whether the engine holds image `ref`. */
export async function imageExists(engine: Engine, ref: string): Promise<boolean> {
  try {
    await engine.call(
      `inspecting image ${ref}`,
      (signal) => engine.client.getImage(ref).inspect({ abortSignal: signal }),
    );
    return true;
  } catch (error) {
    if (error instanceof ExecutorError && error.code === "not_found") return false;
    throw error;
  }
}

/** The registry an image reference is pulled from. */
export function registryOf(image: string): string {
  const first = image.split("/")[0];
  if (
    image.includes("/") && (first.includes(".") || first.includes(":") || first === "localhost")
  ) {
    return first;
  }
  return "registry-1.docker.io (Docker Hub)";
}
