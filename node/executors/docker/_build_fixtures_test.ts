/**
 * What the Docker template build suites share: a build's io that keeps its log lines, a files
 * hash of the run's own, a packed build context, a command's output in a sandbox, and the
 * removal of what an executor instance left on the engine.
 *
 * @module
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import type { DockerExecutor } from "./executor.ts";
import { DEFAULT_DOCKER_SOCKET } from "./engine.ts";
import type { BuildIo } from "../template_build.ts";

/** A short random tag that keeps one run's names apart from another's. */
export function runTag(): string {
  return Math.random().toString(36).slice(2, 8);
}

/**
 * A build's io that pushes each log line onto `lines` (and hands it to `onLine`), with the
 * context archive of `contexts[hash]` for a COPY's files hash.
 */
export function collectingIo(
  lines: string[],
  contexts: Record<string, string> = {},
  onLine: (line: string) => void = () => {},
): BuildIo {
  return {
    log: (_level, message) => {
      lines.push(message);
      onLine(message);
    },
    contextFile: (hash) => contexts[hash],
    signal: new AbortController().signal,
  };
}

/**
 * A files hash of this run's own: a step cache image another run left on the engine must not
 * answer for steps that carry it.
 */
export function runFilesHash(): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(32)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
}

/** Packs `entry` of the folder `from` as the gzipped tar `archive`, as the SDK uploads files. */
export async function packContext(from: string, entry: string, archive: string): Promise<void> {
  const packed = await new Deno.Command("tar", { args: ["czf", archive, "-C", from, entry] })
    .output();
  assert.ok(packed.success, `packing ${from}/${entry}`);
}

/** What `cmd` prints on stdout in sandbox `id`, once it exits. */
export async function execOutput(
  executor: DockerExecutor,
  id: string,
  cmd: string[],
): Promise<string> {
  const handle = await executor.exec(id, { cmd });
  const [out] = await Promise.all([new Response(handle.stdout).text(), handle.exited]);
  return out;
}

/**
 * Removes every container and image labelled with `instanceId` (images newest first: a step
 * cache image is the parent of the next step's), ignoring what is already gone.
 */
export async function removeInstanceLeftovers(instanceId: string): Promise<void> {
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  const filters = { label: [`dormice.instance=${instanceId}`] };
  for (const c of await docker.listContainers({ all: true, filters })) {
    await docker.getContainer(c.Id).remove({ force: true }).catch(() => {});
  }
  const images = await docker.listImages({ all: true, filters });
  for (
    const image of images.sort((x: { Created: number }, y: { Created: number }) =>
      y.Created - x.Created
    )
  ) {
    await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
  }
}
