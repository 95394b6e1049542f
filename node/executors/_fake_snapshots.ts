/**
 * The fake executor's snapshots: each one's description with the file tree it keeps, the rule
 * for a snapshot's name within its team, and their export as JSON bytes to another fake executor
 * (the stand-in for an image moved between nodes).
 *
 * @module
 */
import {
  ExecutorError,
  type ImageExport,
  newSnapshotId,
  type SnapshotInfo,
  snapshotNameTaken,
  snapshotNotFound,
  type SnapshotRequest,
} from "./contract.ts";
import { FakeFs } from "./_fake_fs.ts";

/** The SHA-256 of `bytes` as `sha256:` and 64 hex digits, as Docker names its image ids. */
async function sha256Hex(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return `sha256:${Array.from(hash, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** One snapshot held: its description and the file tree it keeps. */
export interface HeldSnapshot {
  info: SnapshotInfo;
  fs: FakeFs;
}

/** Snapshots by id, each with the file tree it keeps; gone when deleted. */
export class FakeSnapshots {
  #snapshots = new Map<string, HeldSnapshot>();

  /** The snapshot of that id, if held. */
  get(snapshotId: string): HeldSnapshot | undefined {
    return this.#snapshots.get(snapshotId);
  }

  /** Keeps `fs` as the snapshot `info` describes, replacing one by its id. */
  keep(info: SnapshotInfo, fs: FakeFs): void {
    this.#snapshots.set(info.snapshotId, { info, fs });
  }

  /**
   * The id a new snapshot of `request` takes: a name the team already uses is `exists`, unless
   * the request rebuilds it (E2B's createSnapshot({name})), when it keeps that snapshot's id.
   */
  idFor(request: SnapshotRequest): string {
    let snapshotId = request.snapshotId;
    if (request.name !== undefined) {
      const taken = [...this.#snapshots.values()].find((s) =>
        s.info.team === request.team && s.info.name === request.name
      );
      // The name's snapshot gets a new build under its id (E2B's createSnapshot({name})).
      if (taken) {
        if (
          !request.rebuild || (snapshotId !== undefined && snapshotId !== taken.info.snapshotId)
        ) {
          throw snapshotNameTaken(request.name, taken.info.snapshotId);
        }
        snapshotId = taken.info.snapshotId;
      }
    }
    return snapshotId ?? newSnapshotId();
  }

  /** Forgets every snapshot of `team` named `name`. */
  dropNamed(team: string, name: string): void {
    for (const [key, held] of this.#snapshots) {
      if (held.info.team === team && held.info.name === name) {
        this.#snapshots.delete(key);
      }
    }
  }

  /** Publishes (or unpublishes) a snapshot of `team`; false when it holds none. */
  setPublic(templateId: string, team: string, published: boolean): boolean {
    const held = this.#snapshots.get(templateId);
    if (!held || held.info.team !== team) return false;
    if (published) held.info.public = true;
    else delete held.info.public;
    return true;
  }

  /** Their descriptions (one team's, with every published one, when `team` is given), oldest first. */
  list(team?: string): SnapshotInfo[] {
    return [...this.#snapshots.values()].map((s) => ({ ...s.info }))
      .filter((info) => team === undefined || info.team === team || info.public === true)
      .sort((a, b) => a.createdAt - b.createdAt || a.snapshotId.localeCompare(b.snapshotId));
  }

  /** Forgets a snapshot; false when it holds none by that id for `team`. */
  delete(snapshotId: string, team?: string): boolean {
    const held = this.#snapshots.get(snapshotId);
    if (!held || (team !== undefined && held.info.team !== team)) return false;
    this.#snapshots.delete(snapshotId);
    return true;
  }

  /** A snapshot as JSON (its description and file tree); the digest is the SHA-256 of those bytes. */
  async export(name: string): Promise<ImageExport> {
    const held = this.#snapshots.get(name);
    if (!held) throw snapshotNotFound(name);
    const bytes = new TextEncoder().encode(
      JSON.stringify({ info: held.info, fs: new TextDecoder().decode(held.fs.toBytes()) }),
    );
    return { digest: await sha256Hex(bytes), body: ReadableStream.from([bytes]) };
  }

  /**
   * Keeps a snapshot another fake executor exported, refusing it unless it is `name` with
   * `expected.digest`; it keeps the creation time and origin node it was taken with.
   */
  async import(
    name: string,
    body: ReadableStream<Uint8Array>,
    expected: { digest: string },
    now: () => number,
  ): Promise<void> {
    const bytes = new Uint8Array(await new Response(body).arrayBuffer());
    const digest = await sha256Hex(bytes);
    if (digest !== expected.digest) {
      throw new ExecutorError(
        "invalid",
        `The image '${name}' that arrived has digest ${digest}, not the ${expected.digest} its ` +
          "holder named: it was cut or changed on the way; nothing was kept",
      );
    }
    let parsed: { info: SnapshotInfo; fs: string };
    try {
      parsed = JSON.parse(new TextDecoder().decode(bytes));
    } catch (error) {
      throw new ExecutorError("invalid", `The image '${name}' that arrived is not one: ${error}`);
    }
    if (parsed.info?.snapshotId !== name) {
      throw new ExecutorError(
        "invalid",
        `The image that arrived is '${parsed.info?.snapshotId}', not '${name}': nothing was kept`,
      );
    }
    const fs = FakeFs.fromBytes(new TextEncoder().encode(parsed.fs), now);
    this.#snapshots.set(name, { info: parsed.info, fs });
  }
}
