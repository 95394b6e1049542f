/**
 * Sandboxes paused to disk that leave their node, through the registry
 * (`DORMICE_SNAPSHOT_REGISTRY`): a pause to disk pushes the kept files with the sandbox's row;
 * when its node is down, the gateway asks another node to take it over (`adopt`): it pulls
 * them, records the row as its own, and marks the move in the registry (a second tag,
 * `<sandbox id>.moved`); a node that comes back with a row whose move is marked drops it at
 * boot (`fence`), so the sandbox lives on one node only.
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import { type Executor, ExecutorError, executorErrorToHttp } from "./executors/contract.ts";
import type { SandboxRecord } from "./service_contract.ts";
import type { SandboxService } from "./service.ts";

/** The repository archives are pushed to on the registry. */
export const REGISTRY_ARCHIVE_REPOSITORY = "dormice-archive";

/** The label an archive image carries its sandbox's row in (`DockerExecutor.pushArchive`). */
export const ARCHIVE_RECORD_LABEL = "dormice.archive.record";

const MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, " +
  "application/vnd.oci.image.manifest.v1+json";

/** Options of {@linkcode ArchiveMoves}. */
export interface ArchiveMovesOptions {
  /** Pushes and pulls the kept files (`pushArchive`, `pullArchive`). */
  executor: Executor;
  /** Records a taken-over sandbox and drops a moved one. */
  service: Pick<SandboxService, "adoptArchived" | "destroy" | "list">;
  /** `host:port` of the registry. */
  registry: string;
  /** One push or pull's time budget, ms. */
  timeoutMs: number;
  /** Where moves are logged. */
  log?: Log;
}

/** The node's moves of sandboxes paused to disk. */
export class ArchiveMoves {
  #options: ArchiveMovesOptions;
  #log: Log;

  /** Keeps the options; makes no call. */
  constructor(options: ArchiveMovesOptions) {
    this.#options = options;
    this.#log = options.log ?? silentLog;
  }

  /** Whether the executor can move archives at all. */
  get enabled(): boolean {
    return !!this.#options.executor.pushArchive && !!this.#options.executor.pullArchive;
  }

  /** Pushes what a pause to disk kept of `sandbox`, with its row. */
  async push(sandbox: SandboxRecord): Promise<void> {
    const { executor, registry, timeoutMs } = this.#options;
    if (!executor.pushArchive) return;
    await executor.pushArchive(
      sandbox.id,
      JSON.stringify(sandbox),
      registry,
      AbortSignal.timeout(timeoutMs),
    );
    this.#log("info", "sandbox paused to disk pushed to the registry", { id: sandbox.id });
  }

  /**
   * Takes over sandbox `id`, paused to disk on another node: pulls its files and row from the
   * registry, records it here, marks the move. `team`, when given, must be its team.
   *
   * @throws {HttpError} 404 when the registry has no such sandbox (of that team), or it moved
   * already; 409 for a name taken here; 503 when the registry fails.
   */
  async adopt(id: string, team: string | undefined): Promise<SandboxRecord> {
    const { executor, registry, timeoutMs } = this.#options;
    if (!executor.pullArchive) {
      throw new HttpError(501, `This node's ${executor.kind} executor cannot take over sandboxes`);
    }
    const gone = new HttpError(
      404,
      `Sandbox '${id}' is not paused to disk in the registry ${registry}: it was never pushed ` +
        "there, or another node took it over already",
    );
    if (await this.#moved(id)) throw gone;
    // Whose it is, read from the registry before anything is pulled: another team's files never
    // reach this node, and a refusal never touches a sandbox this node already holds.
    const pushed = await this.#recordOf(id);
    if (pushed === undefined || pushed.id !== id || (team !== undefined && pushed.team !== team)) {
      throw gone;
    }
    let text: string;
    try {
      text = await executor.pullArchive(id, registry, AbortSignal.timeout(timeoutMs));
    } catch (error) {
      if (error instanceof ExecutorError && error.code === "not_found") throw gone;
      throw executorErrorToHttp(error);
    }
    const record = JSON.parse(text) as SandboxRecord;
    if (record.id !== id || (team !== undefined && record.team !== team)) {
      // Changed in the registry since it was read: what was pulled goes, unless the sandbox is
      // this node's already (a take-over that finished meanwhile).
      if (!this.#options.service.list({}).some((s) => s.id === id)) {
        await executor.destroy(id).catch(() => {});
      }
      throw gone;
    }
    const row = await this.#options.service.adoptArchived(record);
    await this.#markMoved(id);
    this.#log("info", "sandbox paused to disk taken over from another node", { id });
    return row;
  }

  /**
   * Drops every sandbox paused to disk here that another node took over since (its move is
   * marked in the registry); the ids dropped. Run at boot, before the first check-in.
   */
  async fence(): Promise<string[]> {
    const dropped: string[] = [];
    for (const s of this.#options.service.list({}).filter((s) => s.state === "archived")) {
      try {
        if (!(await this.#moved(s.id))) continue;
        await this.#options.service.destroy({ id: s.id });
        dropped.push(s.id);
        this.#log("warn", "a sandbox paused to disk here was resumed on another node: dropped", {
          id: s.id,
        });
      } catch (error) {
        this.#log("warn", "could not check whether a sandbox moved", { id: s.id, error });
      }
    }
    return dropped;
  }

  /**
   * The row sandbox `id` was pushed with (its archive image's `dormice.archive.record` label,
   * read through the registry's API), or undefined when the registry has none.
   *
   * @throws {HttpError} 503 when the registry does not answer.
   */
  async #recordOf(id: string): Promise<{ id?: string; team?: string } | undefined> {
    const signal = AbortSignal.timeout(10_000);
    const registry = this.#options.registry;
    try {
      const manifest = await fetch(this.#url(encodeURIComponent(id)), {
        headers: { accept: MANIFEST_TYPES },
        signal,
      });
      if (manifest.status === 404) {
        await manifest.body?.cancel();
        return undefined;
      }
      if (!manifest.ok) throw new Error(`HTTP ${manifest.status} for its manifest`);
      const config = (await manifest.json() as { config?: { digest?: string } }).config?.digest;
      if (!config) throw new Error("its manifest names no config");
      const blob = await fetch(
        `http://${registry}/v2/${REGISTRY_ARCHIVE_REPOSITORY}/blobs/${config}`,
        { signal },
      );
      if (!blob.ok) {
        await blob.body?.cancel();
        throw new Error(`HTTP ${blob.status} for its config`);
      }
      const labels =
        (await blob.json() as { config?: { Labels?: Record<string, string> | null } }).config
          ?.Labels ?? {};
      const text = labels[ARCHIVE_RECORD_LABEL];
      if (!text) return undefined;
      const record = JSON.parse(text) as { id?: unknown; team?: unknown };
      return {
        ...(typeof record.id === "string" ? { id: record.id } : {}),
        ...(typeof record.team === "string" ? { team: record.team } : {}),
      };
    } catch (error) {
      throw new HttpError(
        503,
        `Could not read sandbox '${id}' from the registry ${registry}: ` +
          `${error instanceof Error ? error.message : String(error)}. Retry shortly`,
        { headers: { "retry-after": "5" } },
      );
    }
  }

  #url(tag: string): string {
    return `http://${this.#options.registry}/v2/${REGISTRY_ARCHIVE_REPOSITORY}/manifests/${tag}`;
  }

  async #moved(id: string): Promise<boolean> {
    const res = await fetch(this.#url(`${id}.moved`), {
      method: "HEAD",
      headers: { accept: MANIFEST_TYPES },
      signal: AbortSignal.timeout(10_000),
    });
    await res.body?.cancel();
    return res.ok;
  }

  /** Tags the sandbox's manifest again as `<id>.moved` (the registry's API, no engine). */
  async #markMoved(id: string): Promise<void> {
    const signal = AbortSignal.timeout(10_000);
    const manifest = await fetch(this.#url(id), { headers: { accept: MANIFEST_TYPES }, signal });
    if (!manifest.ok) {
      await manifest.body?.cancel();
      throw new HttpError(503, `Could not mark sandbox '${id}' moved in the registry`);
    }
    const body = new Uint8Array(await manifest.arrayBuffer());
    const put = await fetch(this.#url(`${id}.moved`), {
      method: "PUT",
      headers: { "content-type": manifest.headers.get("content-type") ?? MANIFEST_TYPES },
      body,
      signal,
    });
    await put.body?.cancel();
    if (!put.ok) {
      throw new HttpError(
        503,
        `The registry refused to mark sandbox '${id}' moved (${put.status})`,
      );
    }
  }
}
