/**
 * Snapshots on the Docker engine: a sandbox's container committed (`docker commit`) to a local
 * image `dormice-snapshot:<snapshot id>`, whose labels say whose it is (team, name, origin
 * sandbox, template, node, node instance, time, bytes). Listed by this node instance's label,
 * as its containers are, so two nodes on one engine never see each other's snapshots. Memory and
 * processes are not captured: a sandbox started from a snapshot boots from its files.
 *
 * @module
 */
import type { Clock } from "../../../shared/clock.ts";
import {
  ExecutorError,
  newSnapshotId,
  type SnapshotInfo,
  snapshotNameTaken,
  snapshotNotFound,
  type SnapshotRequest,
} from "../contract.ts";
import type { Engine, ImageSummary } from "./engine.ts";
import type { EngineHttp } from "./_images.ts";

/** The repository every snapshot image is tagged in; the tag is the snapshot id. */
export const SNAPSHOT_REPOSITORY = "dormice-snapshot";

/** The image reference of a snapshot. */
export function snapshotImage(snapshotId: string): string {
  return `${SNAPSHOT_REPOSITORY}:${snapshotId}`;
}

/**
 * The tag a node gives a snapshot it got from another node or a registry: the snapshot's id
 * and its own instance, so two nodes on one engine never take each other's tag.
 */
export function healedSnapshotImage(snapshotId: string, instanceId: string): string {
  return `${SNAPSHOT_REPOSITORY}:${snapshotId}-${instanceId}`;
}

/**
 * Untags this instance's healed copy of snapshot `snapshotId`, if any: once a new build of it
 * is committed under {@linkcode snapshotImage}, the copy got from another node is an older
 * build and must not be listed or started from.
 */
export async function dropHealedCopy(
  engine: Engine,
  snapshotId: string,
  instanceId: string,
): Promise<void> {
  const image = engine.client.getImage(healedSnapshotImage(snapshotId, instanceId));
  if (!image.remove) return;
  await engine.call(
    `removing the older healed copy of ${snapshotId}`,
    (signal) => image.remove!({ force: true, abortSignal: signal }),
  ).catch((error) => {
    if (!(error instanceof ExecutorError && error.code === "not_found")) throw error;
  });
}

/** The labels a snapshot image carries, named once. */
const L = {
  instance: "dormice.instance",
  node: "dormice.node",
  id: "dormice.snapshot",
  team: "dormice.snapshot.team",
  name: "dormice.snapshot.name",
  sandbox: "dormice.snapshot.sandbox",
  template: "dormice.snapshot.template",
  created: "dormice.snapshot.created",
  bytes: "dormice.snapshot.bytes",
  /** Set on the image a filesystem pause keeps (`archive`): the sandbox it is of. */
  archive: "dormice.snapshot.archive",
  /** `true` on a built template its team published (see `_build.ts`). */
  public: "dormice.template.public",
} as const;

/** What {@link Snapshots} works with. */
export interface SnapshotsOptions {
  engine: Engine;
  nodeId: string;
  instanceId: string;
  clock: Clock;
  /** Deadline of a commit, ms (it copies the container's writable layer). */
  commitTimeoutMs: number;
}

/** This node instance's snapshot images. */
export class Snapshots {
  #engine: Engine;
  #nodeId: string;
  #instanceId: string;
  #clock: Clock;
  #commitTimeoutMs: number;
  /** Takes one snapshot at a time, so two takes of one name cannot both pass the name check. */
  #taking: Promise<unknown> = Promise.resolve();
  /**
   * Images of snapshots deleted while a sandbox still ran from them: untagged, kept by the
   * engine for that sandbox, removed by {@linkcode Snapshots.sweep} once none uses them. Bounded
   * by the snapshots deleted in this process; `sweep(true)` at boot finds any left before.
   */
  #orphans = new Set<string>();
  /** See {@linkcode Snapshots.#archiveMap}. */
  #archives: Promise<Map<string, string>> | undefined;

  constructor(options: SnapshotsOptions) {
    this.#engine = options.engine;
    this.#nodeId = options.nodeId;
    this.#instanceId = options.instanceId;
    this.#clock = options.clock;
    this.#commitTimeoutMs = options.commitTimeoutMs;
  }

  /**
   * Commits sandbox `id`'s container to a new snapshot image (the engine pauses it meanwhile).
   * With `archive`, the image is what a filesystem pause keeps of the sandbox: labelled as
   * such, it is no snapshot (`list` leaves it out) and is found by {@linkcode archiveOf}.
   */
  take(id: string, request: SnapshotRequest, archive = false): Promise<SnapshotInfo> {
    const run = this.#taking.then(() => this.#take(id, request, archive));
    this.#taking = run.catch(() => {});
    return run;
  }

  async #take(id: string, request: SnapshotRequest, archive: boolean): Promise<SnapshotInfo> {
    let snapshotId = request.snapshotId;
    // An id another node holds the name under (the gateway named it) is tagged as this
    // instance's own copy: on an engine shared by nodes, the plain tag is that node's.
    let tag: string | undefined = snapshotId === undefined
      ? undefined
      : healedSnapshotImage(snapshotId, this.#instanceId).split(":")[1];
    if (request.name !== undefined) {
      const taken = (await this.list(request.team)).find((s) =>
        s.name === request.name && s.team === request.team
      );
      // The name's snapshot gets a new build under its id (E2B's createSnapshot({name})).
      if (taken) {
        if (
          !request.rebuild || (snapshotId !== undefined && snapshotId !== taken.snapshotId)
        ) {
          throw snapshotNameTaken(request.name, taken.snapshotId);
        }
        snapshotId = taken.snapshotId;
        tag = (await this.#tagged()).find((t) =>
          !t.archiveOf && t.info.snapshotId === taken.snapshotId
        )?.ref.split(":")[1];
      }
    }
    const inspect = await this.#engine.callContainer(
      id,
      `inspecting sandbox ${id} for a snapshot`,
      (container, signal) => container.inspect({ size: true, abortSignal: signal }),
    );
    const info: SnapshotInfo = {
      snapshotId: snapshotId ?? newSnapshotId(),
      team: request.team,
      ...(request.name === undefined ? {} : { name: request.name }),
      sandboxId: id,
      template: inspect.Config?.Labels?.["dormice.template"] ?? "",
      node: this.#nodeId,
      createdAt: this.#clock.now(),
      sizeBytes: inspect.SizeRw ?? 0,
    };
    const labels: Record<string, string> = {
      [L.instance]: this.#instanceId,
      [L.node]: this.#nodeId,
      [L.id]: info.snapshotId,
      [L.team]: info.team,
      // Always written: a snapshot of a sandbox started from a named one would inherit its name.
      [L.name]: info.name ?? "",
      [L.sandbox]: id,
      [L.template]: info.template,
      [L.created]: String(info.createdAt),
      [L.bytes]: String(info.sizeBytes),
      // Always written: a sandbox restored from an archive would otherwise inherit its label.
      [L.archive]: archive ? id : "",
    };
    await this.#engine.callContainer(
      id,
      `committing sandbox ${id} to snapshot ${info.snapshotId}`,
      (container, signal) => {
        if (!container.commit) throw new TypeError("The engine client cannot commit containers");
        return container.commit({
          repo: SNAPSHOT_REPOSITORY,
          tag: tag ?? info.snapshotId,
          pause: true,
          changes: Object.entries(labels).map(([k, v]) => `LABEL ${k}=${JSON.stringify(v)}`),
          comment: `Snapshot of sandbox ${id} on node ${this.#nodeId}`,
          abortSignal: signal,
        });
      },
      this.#commitTimeoutMs,
    );
    if (archive && this.#engine.client.listImages) {
      (await this.#archiveMap()).set(id, info.snapshotId);
    }
    // Committed under the plain tag: a healed copy of an earlier build here is older now.
    if (snapshotId !== undefined && tag === snapshotId) {
      await dropHealedCopy(this.#engine, snapshotId, this.#instanceId);
    }
    return info;
  }

  /**
   * This instance's snapshots, one team's when `team` is given (with every team's published
   * templates), oldest first.
   */
  async list(team?: string): Promise<SnapshotInfo[]> {
    return (await this.#tagged()).filter((s) => !s.archiveOf)
      .map((s) => s.info)
      .filter((info) => team === undefined || info.team === team || info.public === true);
  }

  /** The snapshot id of what a filesystem pause kept of sandbox `sandboxId`, if any. */
  async archiveOf(sandboxId: string): Promise<string | undefined> {
    // An engine client that cannot list images (a test's) holds no archives.
    if (!this.#engine.client.listImages) return undefined;
    return (await this.#archiveMap()).get(sandboxId);
  }

  /** The sandboxes a filesystem pause kept files of. */
  async archived(): Promise<string[]> {
    if (!this.#engine.client.listImages) return [];
    return [...(await this.#archiveMap()).keys()];
  }

  /**
   * Sandbox id → its archive's snapshot id: read from the engine once (the boot reconcile's
   * `list` reads it), then kept in step by this process's archives and their removals, so a
   * destroy costs no image listing. Bounded by the sandboxes paused to disk; an entry goes with
   * its archive. A failed read is tried again on the next call.
   */
  #archiveMap(): Promise<Map<string, string>> {
    this.#archives ??= this.#tagged().then((all) => {
      const map = new Map<string, string>();
      for (const s of all) if (s.archiveOf) map.set(s.archiveOf, s.info.snapshotId);
      return map;
    }).catch((error) => {
      this.#archives = undefined;
      throw error;
    });
    return this.#archives;
  }

  /** This instance's tagged snapshot images, archives too, oldest first. */
  async #tagged(): Promise<{ info: SnapshotInfo; archiveOf?: string; ref: string }[]> {
    const client = this.#engine.client;
    if (!client.listImages) throw new TypeError("The engine client cannot list images");
    const images: ImageSummary[] = await this.#engine.call(
      "listing this node's snapshot images",
      (signal) =>
        client.listImages!({
          filters: { label: [`${L.instance}=${this.#instanceId}`, L.id] },
          abortSignal: signal,
        }),
    );
    const out: { info: SnapshotInfo; archiveOf?: string; ref: string }[] = [];
    for (const image of images) {
      const info = infoOf(image.Labels ?? {});
      if (!info) continue;
      // An image untagged by a delete while a sandbox still used it is not a snapshot any more.
      const ref = [
        snapshotImage(info.snapshotId),
        healedSnapshotImage(info.snapshotId, this.#instanceId),
      ].find((r) => (image.RepoTags ?? []).includes(r));
      if (ref === undefined) continue;
      const archiveOf = image.Labels?.[L.archive];
      out.push(archiveOf ? { info, archiveOf, ref } : { info, ref });
    }
    return out.sort((a, b) =>
      a.info.createdAt - b.info.createdAt || a.info.snapshotId.localeCompare(b.info.snapshotId)
    );
  }

  /** The image reference of the archive image `snapshotId` of this instance. */
  async archiveRef(snapshotId: string): Promise<string> {
    return (await this.#tagged()).find((s) => s.archiveOf && s.info.snapshotId === snapshotId)
      ?.ref ?? snapshotImage(snapshotId);
  }

  /**
   * Makes image `image` (another node's archive of sandbox `sandboxId`, pulled from a
   * registry) this instance's archive of it, as {@linkcode adopt} does for a snapshot.
   */
  async adoptArchive(
    sandboxId: string,
    snapshotId: string,
    image: string,
    engine: EngineHttp,
  ): Promise<void> {
    await engine.relabel(
      image,
      { [L.instance]: this.#instanceId, [L.archive]: sandboxId },
      SNAPSHOT_REPOSITORY,
      `${snapshotId}-${this.#instanceId}`,
    );
    this.#archives = undefined;
  }

  /** The image reference of snapshot `snapshotId` of this instance, or undefined. */
  async refOf(snapshotId: string): Promise<string | undefined> {
    return (await this.#tagged()).find((s) => !s.archiveOf && s.info.snapshotId === snapshotId)
      ?.ref;
  }

  /**
   * Makes image `image` (loaded or pulled: another node's snapshot `snapshotId`, its labels
   * as taken) this instance's: a copy labelled with this instance and tagged
   * {@linkcode healedSnapshotImage}, sharing every layer.
   */
  async adopt(snapshotId: string, image: string, engine: EngineHttp): Promise<void> {
    await engine.relabel(
      image,
      { [L.instance]: this.#instanceId },
      SNAPSHOT_REPOSITORY,
      `${snapshotId}-${this.#instanceId}`,
    );
    await this.#dropOwnOlder(snapshotId);
  }

  /**
   * Untags this instance's own {@linkcode snapshotImage} of `snapshotId` after a heal: a heal of
   * an id this instance holds itself happens only when its build is older (the name was taken
   * again, or the template built again, on another node), and the newest must be what a create
   * starts from. Another instance's image by that tag (an engine shared by nodes) is left.
   */
  async #dropOwnOlder(snapshotId: string): Promise<void> {
    const ref = snapshotImage(snapshotId);
    const image = this.#engine.client.getImage(ref);
    let labels: Record<string, string> | undefined;
    try {
      const inspect = await this.#engine.call(
        `inspecting ${ref}`,
        (signal) => image.inspect({ abortSignal: signal }),
      );
      labels = (inspect as { Config?: { Labels?: Record<string, string> } }).Config?.Labels;
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") return;
      throw error;
    }
    if (labels?.[L.instance] !== this.#instanceId || !image.remove) return;
    await this.#engine.call(
      `removing the older build of ${snapshotId}`,
      (signal) => image.remove!({ force: true, abortSignal: signal }),
    ).catch((error) => {
      if (!(error instanceof ExecutorError && error.code === "not_found")) throw error;
    });
  }

  /** The snapshot `snapshotId` of this instance (and of `team`, when given), or undefined. */
  async get(snapshotId: string, team?: string): Promise<SnapshotInfo | undefined> {
    return (await this.list()).find((s) =>
      s.snapshotId === snapshotId && (team === undefined || s.team === team)
    );
  }

  /**
   * Untags a snapshot's image; the engine frees it once no container uses it (a sandbox started
   * from it keeps running). False when this instance holds no such snapshot for `team`. With
   * `archive`, the id is an archive's (from {@linkcode archiveOf}), which no team's list names.
   */
  async delete(snapshotId: string, team?: string, archive = false): Promise<boolean> {
    const held = archive
      ? undefined
      : (await this.#tagged()).find((s) =>
        !s.archiveOf && s.info.snapshotId === snapshotId &&
        (team === undefined || s.info.team === team)
      );
    if (!archive && !held) return false;
    const ref = held?.ref ??
      (archive ? await this.archiveRef(snapshotId) : snapshotImage(snapshotId));
    const image = this.#engine.client.getImage(ref);
    if (!image.remove) throw new TypeError("The engine client cannot remove images");
    const remove = (force: boolean) =>
      this.#engine.call(
        `removing snapshot image ${ref}`,
        (signal) => image.remove!({ force, abortSignal: signal }),
      );
    // An archive is forgotten once its image is untagged or gone; one whose removal failed stays
    // known, so the sandbox's destroy tries again.
    const forget = async () => {
      if (!archive) return;
      const map = await this.#archiveMap();
      for (const [sandbox, kept] of map) if (kept === snapshotId) map.delete(sandbox);
    };
    try {
      await remove(false);
    } catch (error) {
      if (!(error instanceof ExecutorError)) throw error;
      if (error.code === "not_found") {
        await forget();
        return false;
      }
      if (error.code !== "exists") throw error;
      // A sandbox runs from it: untag it now (it is no snapshot any more) and free it later.
      const id = await this.#engine.call(
        `inspecting snapshot image ${ref}`,
        (signal) => image.inspect({ abortSignal: signal }),
      ).then((i) => i.Id, () => undefined);
      await remove(true);
      if (id) this.#orphans.add(id);
    }
    await forget();
    return true;
  }

  /**
   * Removes the images of deleted snapshots that no sandbox uses any more: those this process
   * untagged, or with `all`, every untagged snapshot image of this instance (at boot, for those
   * a previous process left). An image still in use stays for the next sweep.
   */
  async sweep(all = false): Promise<void> {
    let ids = [...this.#orphans];
    const client = this.#engine.client;
    if (all && client.listImages) {
      const images: ImageSummary[] = await this.#engine.call(
        "listing this node's deleted snapshot images",
        (signal) =>
          client.listImages!({
            filters: { label: [`${L.instance}=${this.#instanceId}`, L.id], dangling: ["true"] },
            abortSignal: signal,
          }),
      );
      ids = [...new Set([...ids, ...images.map((i) => i.Id).filter((i): i is string => !!i)])];
    }
    for (const id of ids) {
      const image = client.getImage(id);
      if (!image.remove) return;
      try {
        await this.#engine.call(
          `removing a deleted snapshot's image ${id}`,
          (signal) => image.remove!({ abortSignal: signal }),
        );
        this.#orphans.delete(id);
      } catch (error) {
        if (error instanceof ExecutorError && error.code === "not_found") {
          this.#orphans.delete(id);
        } else if (!(error instanceof ExecutorError && error.code === "exists")) throw error;
      }
    }
  }

  /** Whether a deleted snapshot's image waits for its last sandbox to go. */
  get orphaned(): number {
    return this.#orphans.size;
  }

  /**
   * The image a sandbox starts from for `snapshotId`: refused as `not_found` when this
   * instance does not hold it (another node's image on the same engine is not this node's).
   */
  async imageFor(snapshotId: string): Promise<string> {
    const ref = await this.refOf(snapshotId);
    if (ref === undefined) throw snapshotNotFound(snapshotId);
    return ref;
  }
}

function infoOf(labels: Record<string, string>): SnapshotInfo | undefined {
  const snapshotId = labels[L.id];
  if (!snapshotId) return undefined;
  return {
    snapshotId,
    team: labels[L.team] ?? "",
    ...(labels[L.name] ? { name: labels[L.name] } : {}),
    sandboxId: labels[L.sandbox] ?? "",
    template: labels[L.template] ?? "",
    node: labels[L.node] ?? "",
    createdAt: Number(labels[L.created]) || 0,
    sizeBytes: Number(labels[L.bytes]) || 0,
    ...(labels[L.public] === "true" ? { public: true } : {}),
  };
}
