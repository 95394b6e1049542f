/**
 * Images moved between this engine and elsewhere: a snapshot or template image saved for
 * another node and loaded from one (a heal), pushed to and pulled from an OCI registry, and a
 * sandbox's archive pushed and pulled so another node can resume it. A snapshot that arrives
 * becomes this node instance's (`_snapshots.ts`). `DockerExecutor` delegates its image verbs
 * here.
 *
 * @module
 */
import {
  ExecutorError,
  type ImageExport,
  SNAPSHOT_ID_PATTERN,
  snapshotNotFound,
} from "../contract.ts";
import type { Engine } from "./engine.ts";
import { EngineHttp } from "./_images.ts";
import { SNAPSHOT_REPOSITORY, type Snapshots } from "./_snapshots.ts";

/** What {@link ImageMoves} works with. */
export interface ImageMovesOptions {
  /** The engine (its socket is the one the image HTTP client speaks to). */
  engine: Engine;
  /** This node instance's snapshots, which an image that arrives joins. */
  snapshots: Snapshots;
}

/** The executor's image verbs: export, import, push and pull of images and archives. */
export class ImageMoves {
  #engine: Engine;
  #snapshots: Snapshots;
  /** The engine's HTTP API for image moves (save, load, push, pull); made at first use. */
  #httpClient: EngineHttp | undefined;

  /** Makes no engine call. */
  constructor(options: ImageMovesOptions) {
    this.#engine = options.engine;
    this.#snapshots = options.snapshots;
  }

  get #http(): EngineHttp {
    return this.#httpClient ??= new EngineHttp(this.#engine.socketPath);
  }

  /**
   * The engine reference of `name`: a snapshot id's image on this instance, or `name` itself
   * (an image the engine holds by name, a template's).
   */
  async #refOf(name: string): Promise<string> {
    if (!SNAPSHOT_ID_PATTERN.test(name)) return name;
    const ref = await this.#snapshots.refOf(name);
    if (ref === undefined) throw snapshotNotFound(name);
    return ref;
  }

  /**
   * `docker save` of a snapshot (by image id, so the receiver gets no tag of this node's) or
   * of an image by name (with its tags); the digest is the image id.
   */
  async exportImage(name: string, signal: AbortSignal): Promise<ImageExport> {
    const ref = await this.#refOf(name);
    const image = await this.#http.inspect(ref, signal);
    if (image === undefined) {
      throw new ExecutorError("not_found", `The Docker engine holds no image '${name}'`);
    }
    const body = await this.#http.save(SNAPSHOT_ID_PATTERN.test(name) ? image.id : ref, signal);
    return { digest: image.id, body };
  }

  /**
   * `docker load` of what another node's `exportImage` sent (skipped when this engine already
   * has that image id: two nodes on one engine), refused unless the engine then holds
   * `expected.digest`, and for a snapshot one labelled as that snapshot, which becomes this
   * instance's (a copy with this instance's label, sharing its layers).
   */
  async importImage(
    name: string,
    body: ReadableStream<Uint8Array>,
    expected: { digest: string },
    signal: AbortSignal,
  ): Promise<void> {
    if (!/^sha256:[0-9a-f]{64}$/.test(expected.digest)) {
      await body.cancel().catch(() => {});
      throw new ExecutorError("invalid", `'${expected.digest}' is no Docker image id`);
    }
    if ((await this.#http.inspect(expected.digest, signal)) === undefined) {
      await this.#http.load(body, signal);
    } else await body.cancel().catch(() => {});
    const loaded = await this.#http.inspect(expected.digest, signal);
    if (loaded === undefined) {
      throw new ExecutorError(
        "invalid",
        `What arrived for '${name}' is not image ${expected.digest}: it was cut or changed on ` +
          "the way",
      );
    }
    if (!SNAPSHOT_ID_PATTERN.test(name)) return;
    await this.#adopt(name, expected.digest, loaded.labels);
  }

  async #adopt(name: string, image: string, labels: Record<string, string>): Promise<void> {
    if (labels["dormice.snapshot"] !== name) {
      throw new ExecutorError(
        "invalid",
        `The image that arrived is snapshot '${labels["dormice.snapshot"] ?? "none"}', not ` +
          `'${name}': nothing was kept`,
      );
    }
    // Held already, unless what this instance holds is an older build (the name was taken
    // again, or the template built again, on another node): the arrival replaces it then.
    const held = await this.#snapshots.get(name);
    const arrived = Number(labels["dormice.snapshot.created"] ?? "0");
    if (held !== undefined && held.createdAt >= arrived) return;
    await this.#snapshots.adopt(name, image, this.#http);
  }

  /** The registry reference of a snapshot: `<registry>/dormice-snapshot:<snapshot id>`. */
  #remote(name: string, registry: string): { repo: string; tag: string } {
    return SNAPSHOT_ID_PATTERN.test(name)
      ? { repo: `${registry}/${SNAPSHOT_REPOSITORY}`, tag: name }
      : { repo: `${registry}/${name.split(":")[0]}`, tag: name.split(":")[1] ?? "latest" };
  }

  /** Tags the image for `registry`, pushes it, and drops that tag again. */
  async pushImage(name: string, registry: string, signal: AbortSignal): Promise<void> {
    const ref = await this.#refOf(name);
    const { repo, tag } = this.#remote(name, registry);
    await this.#http.tag(ref, repo, tag, signal);
    try {
      await this.#http.push(repo, tag, signal);
    } finally {
      await this.#http.untag(`${repo}:${tag}`).catch(() => {});
    }
  }

  /**
   * Pushes what `archive` kept of sandbox `sandboxId` to `registry` as
   * `<registry>/dormice-archive:<sandbox id>`, with `record` (the sandbox's ledger row, JSON) in
   * its `dormice.archive.record` label, so another node can resume it.
   */
  async pushArchive(
    sandboxId: string,
    record: string,
    registry: string,
    signal: AbortSignal,
  ): Promise<void> {
    const kept = await this.#snapshots.archiveOf(sandboxId);
    if (kept === undefined) {
      throw new ExecutorError("gone", `No archive of sandbox ${sandboxId} on this node`);
    }
    const repo = `${registry}/${ARCHIVE_REPOSITORY}`;
    await this.#http.relabel(
      await this.#snapshots.archiveRef(kept),
      { [ARCHIVE_RECORD_LABEL]: record },
      repo,
      sandboxId,
      signal,
    );
    try {
      await this.#http.push(repo, sandboxId, signal);
    } finally {
      await this.#http.untag(`${repo}:${sandboxId}`).catch(() => {});
    }
  }

  /**
   * Pulls another node's archive of sandbox `sandboxId` from `registry` and keeps it as this
   * node's archive of it (so `restore` starts it); the record it was pushed with.
   *
   * @throws {ExecutorError} `not_found` when the registry has none.
   */
  async pullArchive(sandboxId: string, registry: string, signal: AbortSignal): Promise<string> {
    const repo = `${registry}/${ARCHIVE_REPOSITORY}`;
    try {
      await this.#http.pull(repo, sandboxId, signal);
    } catch (error) {
      if (error instanceof ExecutorError && /not found|unknown/i.test(error.message)) {
        throw new ExecutorError("not_found", error.message);
      }
      throw error;
    }
    const pulled = await this.#http.inspect(`${repo}:${sandboxId}`, signal);
    const record = pulled?.labels[ARCHIVE_RECORD_LABEL];
    const snapshotId = pulled?.labels["dormice.snapshot"];
    if (
      !pulled || !record || !snapshotId || pulled.labels["dormice.snapshot.archive"] !== sandboxId
    ) {
      throw new ExecutorError("invalid", `The registry's ${repo}:${sandboxId} is no archive of it`);
    }
    await this.#snapshots.adoptArchive(sandboxId, snapshotId, pulled.id, this.#http);
    await this.#http.untag(`${repo}:${sandboxId}`).catch(() => {});
    return record;
  }

  /** Pulls the image from `registry`; a snapshot becomes this instance's as a load's does. */
  async pullImage(name: string, registry: string, signal: AbortSignal): Promise<void> {
    const { repo, tag } = this.#remote(name, registry);
    try {
      await this.#http.pull(repo, tag, signal);
    } catch (error) {
      if (error instanceof ExecutorError && /not found|unknown/i.test(error.message)) {
        throw new ExecutorError("not_found", error.message);
      }
      throw error;
    }
    const pulled = await this.#http.inspect(`${repo}:${tag}`, signal);
    if (pulled === undefined) {
      throw new ExecutorError("not_found", `The registry ${registry} has no ${repo}:${tag}`);
    }
    if (!SNAPSHOT_ID_PATTERN.test(name)) return;
    await this.#adopt(name, pulled.id, pulled.labels);
    // The registry's tag goes: the copy is this instance's, and a delete of it then frees the
    // pulled image too (an untagged parent is removed with its last child).
    await this.#http.untag(`${repo}:${tag}`).catch(() => {});
  }

  /** Closes the image HTTP client, when one was made. */
  close(): void {
    this.#httpClient?.close();
  }
}

/** The repository archives are pushed to on a registry: `<registry>/dormice-archive:<sandbox id>`. */
const ARCHIVE_REPOSITORY = "dormice-archive";
/** The label a pushed archive carries its sandbox's ledger row in (JSON). */
const ARCHIVE_RECORD_LABEL = "dormice.archive.record";
