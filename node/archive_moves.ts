/**
 * Sandboxes paused to disk that leave their node, through the registry
 * (`DORMICE_SNAPSHOT_REGISTRY`): a pause to disk pushes the kept files with the sandbox's row;
 * when its node is down, the gateway asks another node to take it over (`adopt`): it pulls
 * them, records the row as its own, and marks the move in the registry (a second tag,
 * `<sandbox id>.moved-<pushing node's hash>`); a node that comes back with a row whose move is
 * marked drops it at
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
  /** This node's id: its own moves are marked under it (see `fence`). */
  nodeId: string;
  /** One push or pull's time budget, ms. */
  timeoutMs: number;
  /** Where moves are logged. */
  log?: Log;
}

/** The node's moves of sandboxes paused to disk. */
export class ArchiveMoves {
  #options: ArchiveMovesOptions;
  #log: Log;
  /** Removals from the registry running now, by sandbox id; an entry goes when it settles. */
  #forgetting = new Map<string, Promise<void>>();
  /** Take-overs running now, by sandbox id; an entry goes when its take-over settles. */
  #adopting = new Map<string, Promise<SandboxRecord>>();

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
    // A removal of an earlier push still running would read, and remove, this one.
    await this.#forgetting.get(sandbox.id);
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
  adopt(id: string, team: string | undefined): Promise<SandboxRecord> {
    const here = this.#options.service.list({}).find((s) => s.id === id);
    if (here && (team === undefined || here.team === team)) return Promise.resolve(here);
    // Two take-overs of one sandbox on this node at once share one: the second would pull over
    // the files the first adopted.
    const running = this.#adopting.get(id);
    const run = running ?? this.#adopt(id, team).finally(() => this.#adopting.delete(id));
    if (!running) this.#adopting.set(id, run);
    return run.then((row) => {
      if (team !== undefined && row.team !== team) throw this.#gone(id);
      return row;
    });
  }

  #gone(id: string): HttpError {
    return new HttpError(
      404,
      `Sandbox '${id}' is not paused to disk in the registry ${this.#options.registry}: it was ` +
        "never pushed there, or another node took it over already",
    );
  }

  async #adopt(id: string, team?: string): Promise<SandboxRecord> {
    const { executor, registry, timeoutMs } = this.#options;
    if (!executor.pullArchive) {
      throw new HttpError(501, `This node's ${executor.kind} executor cannot take over sandboxes`);
    }
    const gone = this.#gone(id);
    // Whose it is, read from the registry before anything is pulled: another team's files never
    // reach this node, and a refusal never touches a sandbox this node already holds.
    const pushed = await this.#recordOf(id);
    if (pushed === undefined || pushed.id !== id || (team !== undefined && pushed.team !== team)) {
      throw gone;
    }
    if (await this.#moved(id, pushed.node)) throw gone;
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
    // The move is marked, then claimed by deleting what was pushed: of two nodes taking it over
    // at once (two gateways), the registry answers one delete and refuses the other.
    await this.#markMoved(id, pushed);
    if (!(await this.#claim(id, pushed.digest))) {
      if (!this.#options.service.list({}).some((s) => s.id === id)) {
        await executor.destroy(id).catch(() => {});
      }
      throw gone;
    }
    const row = await this.#options.service.adoptArchived(record);
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
        if (!(await this.#moved(s.id, this.#options.nodeId))) continue;
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
  async #recordOf(id: string): Promise<Pushed | undefined> {
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
      const digest = manifest.headers.get("docker-content-digest");
      const bytes = new Uint8Array(await manifest.arrayBuffer());
      const config = (JSON.parse(new TextDecoder().decode(bytes)) as {
        config?: { digest?: string };
      }).config?.digest;
      if (!config || !digest) throw new Error("its manifest names no config or digest");
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
        node: labels["dormice.node"] ?? "",
        digest,
        manifest: bytes,
        type: manifest.headers.get("content-type") ?? MANIFEST_TYPES,
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

  /**
   * Whether what node `node` pushed of sandbox `id` was taken over: the tag
   * `<id>.moved-<node's hash>`, one per pushing node, so a sandbox that moved, was paused to
   * disk again on its new node and lost that one too can move again, while its first node
   * still finds its own move marked.
   */
  async #moved(id: string, node: string): Promise<boolean> {
    const res = await fetch(this.#url(await movedTag(id, node)), {
      method: "HEAD",
      headers: { accept: MANIFEST_TYPES },
      signal: AbortSignal.timeout(10_000),
    });
    await res.body?.cancel();
    return res.ok;
  }

  /**
   * Marks sandbox `id` moved: its manifest as pushed, under its moved tag, written with
   * one more byte (a newline) so its digest differs and {@linkcode #claim}'s delete of the
   * pushed one leaves it (the registry's API, no engine).
   */
  async #markMoved(id: string, pushed: Pushed): Promise<void> {
    const body = new Uint8Array(pushed.manifest.length + 1);
    body.set(pushed.manifest);
    body[pushed.manifest.length] = 0x0a;
    const put = await fetch(this.#url(await movedTag(id, pushed.node)), {
      method: "PUT",
      headers: { "content-type": pushed.type },
      body,
      signal: AbortSignal.timeout(10_000),
    });
    await put.body?.cancel();
    if (!put.ok) {
      throw new HttpError(
        503,
        `The registry refused to mark sandbox '${id}' moved (${put.status})`,
      );
    }
  }

  /**
   * Claims the take-over of sandbox `id` by deleting the manifest it was pushed with: true
   * when this node's delete removed it, false when another's did first. A registry that allows
   * no deletes (405) cannot tell two take-overs apart: true, with a warning.
   */
  async #claim(id: string, digest: string): Promise<boolean> {
    const res = await fetch(this.#url(digest), {
      method: "DELETE",
      signal: AbortSignal.timeout(10_000),
    });
    await res.body?.cancel();
    if (res.ok) return true;
    if (res.status === 404) {
      this.#log("warn", "another node took over a sandbox paused to disk first", { id });
      return false;
    }
    this.#log(
      "warn",
      "the registry allows no deletes: two take-overs at once cannot be told apart",
      {
        id,
        status: res.status,
      },
    );
    return true;
  }

  /**
   * Removes what a pause to disk pushed of sandbox `id`, once it resumed or was killed on this
   * node: a take-over after that would resume stale files under a live sandbox's id. Runs in
   * the background (a registry that does not answer must not hold up a connect or a kill; each
   * call has 10 s), before any later push of that sandbox; a failure is logged.
   */
  forget(id: string): void {
    const prior = this.#forgetting.get(id) ?? Promise.resolve();
    const run: Promise<void> = prior.then(() => this.#forget(id)).finally(() => {
      if (this.#forgetting.get(id) === run) this.#forgetting.delete(id);
    });
    this.#forgetting.set(id, run);
  }

  /**
   * Whether sandbox `id`, paused to disk here, was taken over by another node meanwhile (its
   * move marked under this node's id): a node cut off from the gateway without restarting must
   * not resume it too. A registry that does not answer within 2 s says no (logged).
   */
  async movedAway(id: string): Promise<boolean> {
    try {
      const res = await fetch(this.#url(await movedTag(id, this.#options.nodeId)), {
        method: "HEAD",
        headers: { accept: MANIFEST_TYPES },
        signal: AbortSignal.timeout(2_000),
      });
      await res.body?.cancel();
      return res.ok;
    } catch (error) {
      this.#log("warn", "could not check whether a sandbox moved before resuming it", {
        id,
        error: error instanceof Error ? error.message : String(error),
      });
      return false;
    }
  }

  /** Settles once every removal from the registry asked for so far has ended. */
  async settled(): Promise<void> {
    await Promise.all(this.#forgetting.values());
  }

  async #forget(id: string): Promise<void> {
    try {
      const pushed = await this.#recordOf(id);
      if (pushed === undefined) return;
      const res = await fetch(this.#url(pushed.digest), {
        method: "DELETE",
        signal: AbortSignal.timeout(10_000),
      });
      await res.body?.cancel();
      if (!res.ok && res.status !== 404) {
        throw new Error(`the registry answered HTTP ${res.status}`);
      }
    } catch (error) {
      this.#log("warn", "could not remove a resumed sandbox's files from the registry", {
        id,
        error: error instanceof Error ? error.message : String(error),
      });
    }
  }
}

/** What the registry holds of a sandbox paused to disk. */
interface Pushed {
  /** The sandbox id and team its row names. */
  id?: string;
  team?: string;
  /** The node that pushed it (its archive image's `dormice.node` label). */
  node: string;
  /** The digest of the manifest it was pushed with. */
  digest: string;
  /** That manifest, as stored, and its media type. */
  manifest: Uint8Array;
  type: string;
}

/** The tag marking what `node` pushed of sandbox `id` as taken over. */
async function movedTag(id: string, node: string): Promise<string> {
  const hash = new Uint8Array(
    await crypto.subtle.digest("SHA-256", new TextEncoder().encode(node)),
  );
  const hex = [...hash.subarray(0, 8)].map((b) => b.toString(16).padStart(2, "0")).join("");
  return `${id}.moved-${hex}`;
}

/**
 * `executor` as a node with a registry serves sandboxes through it: a sandbox paused to disk
 * that resumes or is killed here takes its pushed files out of the registry, so no take-over can
 * resume them later ({@linkcode ArchiveMoves.forget}), and one another node took over meanwhile
 * is not resumed here ({@linkcode ArchiveMoves.movedAway}). `archives` is read at each call
 * (undefined: no registry moves); `archived` tells whether a sandbox is paused to disk now.
 */
export function withArchiveMoves(
  executor: Executor,
  archives: () => ArchiveMoves | undefined,
  archived: (id: string) => boolean,
): Executor {
  return new Proxy(executor, {
    get(target, key) {
      if (key === "restore") {
        return async (request: Parameters<Executor["restore"]>[0]) => {
          if (await archives()?.movedAway(request.id)) {
            throw new ExecutorError(
              "gone",
              `Sandbox ${request.id} was resumed on another node while this node was out of ` +
                "the gateway's reach: it lives there now; kill it here",
            );
          }
          archives()?.forget(request.id);
          return await target.restore(request);
        };
      }
      if (key === "destroy") {
        return async (id: string) => {
          const wasArchived = archived(id);
          await target.destroy(id);
          if (wasArchived) archives()?.forget(id);
        };
      }
      const value = Reflect.get(target, key, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}
