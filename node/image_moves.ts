/**
 * Moving images between nodes: a node that lacks a snapshot (or any image its executor serves
 * by name) gets it from a node that holds it — the holder streams it out of its executor
 * (`GET /images/<name>`, fleet token), this node streams it into its own executor, checked
 * against the digest the holder named — or, with `DORMICE_SNAPSHOT_REGISTRY`, pulls it from
 * the registry every node pushes its snapshots to. Each heal is bounded in time (one budget
 * across every holder tried) and in bytes, and at most {@linkcode MAX_HEALS_AT_ONCE} run at
 * once on a node (past it a 503 naming the cap, never a queue).
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import {
  type Executor,
  ExecutorError,
  executorErrorToHttp,
  SNAPSHOT_ID_PATTERN,
} from "./executors/contract.ts";

/** Heals that may run at once on one node; one more is a 503 naming this cap. */
export const MAX_HEALS_AT_ONCE = 2;

/** The header the holder names the image's digest in (see `Executor.exportImage`). */
export const IMAGE_DIGEST_HEADER = "x-dormice-image-digest";

export { HEAL_FROM_HEADER } from "../shared/snapshots.ts";

/** The default time budget of one heal, seconds (`DORMICE_SNAPSHOT_HEAL_TIMEOUT_SECONDS`). */
export const DEFAULT_HEAL_TIMEOUT_SECONDS = 600;

/** The default bytes cap of one heal, GB (`DORMICE_SNAPSHOT_HEAL_MAX_GB`). */
export const DEFAULT_HEAL_MAX_GB = 20;

/** The repository snapshots are kept in on the registry: `<registry>/dormice-snapshot:<id>`. */
export const REGISTRY_SNAPSHOT_REPOSITORY = "dormice-snapshot";

/** The most registry tags one expiry sweep reads (the rest wait for the next sweep). */
export const MAX_REGISTRY_TAGS_PER_SWEEP = 1000;

/** The manifest types a registry is asked for (Docker's, then OCI's). */
const MANIFEST_TYPES = "application/vnd.docker.distribution.manifest.v2+json, " +
  "application/vnd.oci.image.manifest.v1+json";

/** A node a heal may get an image from. */
export interface HealSource {
  /** Its node id (for messages). */
  nodeId: string;
  /** Its endpoint origin, e.g. `http://10.0.0.2:3676`. */
  endpoint: string;
}

/** Options of {@linkcode ImageMoves}. */
export interface ImageMovesOptions {
  /** Holds the images; without the export/import verbs this node neither serves nor heals. */
  executor: Executor;
  /** The fleet token: a holder's route asks for it, and this node sends it. */
  token: string;
  /** One heal's time budget across every holder it tries, ms. */
  timeoutMs?: number;
  /** The most bytes one heal reads from a holder. */
  maxBytes?: number;
  /** `host:port` of the OCI registry snapshots are pushed to and pulled from; none when absent. */
  registry?: string;
  /** Fetches from holders; the global `fetch` when absent. */
  fetch?: typeof fetch;
  /** Where heals, pushes and pulls are logged. */
  log?: Log;
  /**
   * Whether this node heals from other nodes and serves its images to theirs
   * (`DORMICE_SNAPSHOT_HEAL`); absent: it does. Off, a registry pull still works.
   */
  heals?: boolean;
}

/** Why a node with `DORMICE_SNAPSHOT_HEAL=off` refuses a heal, for both sides' 503s. */
const HEAL_OFF =
  "DORMICE_SNAPSHOT_HEAL=off on this node: it neither gets snapshots from other nodes nor " +
  "serves its own to them; write DORMICE_SNAPSHOT_HEAL=on (with DORMICE_SNAPSHOT_TTL_HOURS " +
  "above 0) to heal, or create from the snapshot on a node that holds it";

/** What one finished heal moved, for the log and the bench. */
export interface HealResult {
  /** Where it came from: a node id, or `registry`. */
  from: string;
  /** Bytes read from the holder (0 from a registry: the engine reads those). */
  bytes: number;
  /** How long it took, ms. */
  ms: number;
}

/**
 * The node's image moves.
 *
 * @example
 * ```ts ignore
 * const moves = new ImageMoves({ executor, token });
 * await moves.heal("snap-…", [{ nodeId: "node-a", endpoint: "http://127.0.0.1:3676" }]);
 * ```
 */
export class ImageMoves {
  #options: ImageMovesOptions;
  #log: Log;
  #fetch: typeof fetch;
  /** Heals running now, by image name; a second create for one image waits for the first. */
  #running = new Map<string, Promise<HealResult>>();
  /** Heals running now whose snapshot was deleted meanwhile; an entry goes with its heal. */
  #deleted = new Set<string>();

  /** Keeps the options; makes no call. */
  constructor(options: ImageMovesOptions) {
    this.#options = options;
    this.#log = options.log ?? silentLog;
    this.#fetch = options.fetch ?? fetch;
  }

  /** The registry, when one is set. */
  get registry(): string | undefined {
    return this.#options.registry;
  }

  /** Whether this node can get images from other nodes or a registry at all. */
  get canHeal(): boolean {
    const e = this.#options.executor;
    return (e.importImage !== undefined) || (this.registry !== undefined && !!e.pullImage);
  }

  /**
   * The holder's side: image `name` streamed out of the executor, its digest in
   * {@linkcode IMAGE_DIGEST_HEADER}. The caller has checked the fleet token.
   *
   * Serves snapshots only (every heal is of one): a template's or base image, another node's
   * image on a shared engine, or anything else the engine holds by name is not this route's.
   *
   * @throws {HttpError} 404 when not held or no snapshot id, 501 when the executor cannot export.
   */
  async export(name: string, signal: AbortSignal): Promise<Response> {
    if (!SNAPSHOT_ID_PATTERN.test(name)) {
      throw new HttpError(
        404,
        `'${name.slice(0, 80)}' is no snapshot id (snap- and 20 letters or digits): this node ` +
          "serves snapshots only to other nodes",
      );
    }
    if (this.#options.heals === false) throw new HttpError(503, `Not served: ${HEAL_OFF}`);
    const executor = this.#options.executor;
    if (!executor.exportImage) {
      throw new HttpError(501, `This node's ${executor.kind} executor cannot export images`);
    }
    try {
      const out = await executor.exportImage(name, signal);
      this.#log("info", "image export started", { image: name });
      return new Response(out.body, {
        headers: {
          "content-type": "application/octet-stream",
          [IMAGE_DIGEST_HEADER]: out.digest,
        },
      });
    } catch (error) {
      throw executorErrorToHttp(error);
    }
  }

  /**
   * Gets image `name` onto this node: from the registry first when one is set, else from each
   * of `sources` in turn, within one time budget. Two heals of one image at once share one
   * transfer. With `team`, a registry snapshot of another team is a 404 and is not pulled.
   *
   * @throws {HttpError} 503 past the cap, or when no source gave it (each one's cause named).
   */
  heal(name: string, sources: readonly HealSource[], team?: string): Promise<HealResult> {
    if (this.#options.heals === false) {
      if (this.registry === undefined) {
        throw new HttpError(503, `Snapshot '${name.slice(0, 80)}' is not here: ${HEAL_OFF}`);
      }
      sources = [];
    }
    const running = this.#running.get(name);
    if (running) return running;
    if (this.#running.size >= MAX_HEALS_AT_ONCE) {
      throw new HttpError(
        503,
        `This node is already getting ${this.#running.size} images from other nodes, the most ` +
          `it gets at once (${MAX_HEALS_AT_ONCE}): retry shortly`,
        { headers: { "retry-after": "5" } },
      );
    }
    const run = this.#heal(name, sources, team).then(async (result) => {
      if (!this.#deleted.has(name)) return result;
      await this.#options.executor.deleteSnapshot(name).catch((error) =>
        this.#log("warn", "could not drop a snapshot deleted while it healed", {
          image: name,
          error: messageOf(error),
        })
      );
      throw new HttpError(
        404,
        `Snapshot '${name}' was deleted while this node was getting it from another node: ` +
          "nothing was kept. Take a new snapshot, or start from a template",
      );
    }).finally(() => {
      this.#running.delete(name);
      this.#deleted.delete(name);
    });
    this.#running.set(name, run);
    return run;
  }

  /**
   * Says snapshot `name` was deleted: a heal of it running now drops what it got and answers
   * 404, so a delete that reached this node mid-heal leaves no copy behind.
   */
  deleted(name: string): void {
    if (this.#running.has(name)) this.#deleted.add(name);
  }

  async #heal(
    name: string,
    sources: readonly HealSource[],
    team: string | undefined,
  ): Promise<HealResult> {
    const timeoutMs = this.#options.timeoutMs ?? DEFAULT_HEAL_TIMEOUT_SECONDS * 1000;
    const signal = AbortSignal.timeout(timeoutMs);
    const started = performance.now();
    const causes: string[] = [];
    const executor = this.#options.executor;
    if (this.registry !== undefined && executor.pullImage) {
      try {
        // Another team's snapshot (not a published template) is not pulled for this one: the
        // registry's labels are read first, as the create would not find it after the pull.
        if (team !== undefined) {
          const held = await registrySnapshot(this.registry, name, this.#fetch, signal);
          const labels = held?.labels ?? {};
          if (
            held && labels["dormice.snapshot.team"] !== team &&
            labels["dormice.template.public"] !== "true"
          ) {
            throw new HttpError(
              404,
              `Snapshot '${name}' not found: list your team's snapshots (GET /snapshots) for ` +
                "their ids and names",
            );
          }
        }
        await executor.pullImage(name, this.registry, signal);
        const result = { from: "registry", bytes: 0, ms: performance.now() - started };
        this.#log("info", "image pulled from the registry", { image: name, ...result });
        return result;
      } catch (error) {
        if (error instanceof HttpError && error.status === 404) throw error;
        causes.push(`registry ${this.registry}: ${messageOf(error)}`);
      }
    }
    if (executor.importImage) {
      for (const source of sources) {
        if (signal.aborted) break;
        try {
          const bytes = await this.#fromNode(name, source, signal);
          const result = { from: source.nodeId, bytes, ms: performance.now() - started };
          this.#log("info", "image healed from another node", { image: name, ...result });
          return result;
        } catch (error) {
          causes.push(`node '${source.nodeId}': ${messageOf(error)}`);
        }
      }
    }
    if (signal.aborted) causes.push(`the heal's budget of ${timeoutMs} ms ran out`);
    if (causes.length === 0) {
      causes.push(
        executor.importImage
          ? "no node holding it is up"
          : `this node's ${executor.kind} executor cannot load images`,
      );
    }
    this.#log("warn", "could not get an image from another node", { image: name, causes });
    throw new HttpError(
      503,
      `This node lacks '${name}' and could not get it: ${causes.join("; ")}. Retry shortly, ` +
        "or once a node holding it is up",
      { headers: { "retry-after": "5" } },
    );
  }

  /** Streams `name` from `source` into the executor; the bytes read. */
  async #fromNode(name: string, source: HealSource, signal: AbortSignal): Promise<number> {
    const url = new URL(`/images/${encodeURIComponent(name)}`, source.endpoint);
    const response = await this.#fetch(url, {
      headers: { authorization: `Bearer ${this.#options.token}` },
      redirect: "manual",
      signal,
    });
    const digest = response.headers.get(IMAGE_DIGEST_HEADER);
    if (!response.ok || !response.body || digest === null) {
      const text = (await response.text().catch(() => "")).slice(0, 300);
      throw new Error(
        `HTTP ${response.status}${digest === null ? " without a digest" : ""}: ${text}`,
      );
    }
    const maxBytes = this.#options.maxBytes ?? DEFAULT_HEAL_MAX_GB * 1e9;
    let bytes = 0;
    const counted = response.body.pipeThrough(
      new TransformStream<Uint8Array, Uint8Array>({
        transform(chunk, controller) {
          bytes += chunk.length;
          if (bytes > maxBytes) {
            controller.error(
              new ExecutorError(
                "invalid",
                `it sent more than ${maxBytes} bytes, the heal's cap ` +
                  "(DORMICE_SNAPSHOT_HEAL_MAX_GB)",
              ),
            );
            return;
          }
          controller.enqueue(chunk);
        },
      }),
    );
    await this.#options.executor.importImage!(name, counted, { digest }, signal);
    return bytes;
  }

  /**
   * Removes snapshot `id` from the registry (of `team` only, when given); false when the
   * registry has none by that id for that team, or no registry is set.
   *
   * @throws {HttpError} 503 when the registry does not answer or refuses the delete.
   */
  async unpublish(id: string, team?: string): Promise<boolean> {
    const registry = this.registry;
    if (registry === undefined) return false;
    const signal = AbortSignal.timeout(30_000);
    try {
      const held = await registrySnapshot(registry, id, this.#fetch, signal);
      if (!held || (team !== undefined && held.labels["dormice.snapshot.team"] !== team)) {
        return false;
      }
      const res = await this.#fetch(
        `http://${registry}/v2/${REGISTRY_SNAPSHOT_REPOSITORY}/manifests/${held.digest}`,
        { method: "DELETE", signal },
      );
      await res.body?.cancel();
      if (res.status === 404) return false;
      if (!res.ok) {
        throw new Error(
          `it answered HTTP ${res.status} to the delete (a registry must be started with ` +
            "storage.delete.enabled: true)",
        );
      }
      this.#log("info", "snapshot removed from the registry", { snapshot: id, registry });
      return true;
    } catch (error) {
      throw new HttpError(
        503,
        `Could not remove snapshot '${id}' from the registry ${registry}: ${messageOf(error)}`,
        { headers: { "retry-after": "5" } },
      );
    }
  }

  /**
   * Removes from the registry every snapshot taken `ttlMs` or longer before `now` (by the
   * creation time it was taken with), reading at most {@linkcode MAX_REGISTRY_TAGS_PER_SWEEP}
   * tags; the ids removed. Failures are logged, not thrown.
   */
  async expireRegistry(ttlMs: number, now: number): Promise<string[]> {
    const registry = this.registry;
    if (registry === undefined) return [];
    const removed: string[] = [];
    try {
      const signal = AbortSignal.timeout(60_000);
      const res = await this.#fetch(
        `http://${registry}/v2/${REGISTRY_SNAPSHOT_REPOSITORY}/tags/list?n=${MAX_REGISTRY_TAGS_PER_SWEEP}`,
        { signal },
      );
      if (res.status === 404) {
        await res.body?.cancel();
        return [];
      }
      const tags = ((await res.json()) as { tags?: string[] | null }).tags ?? [];
      for (const tag of tags.slice(0, MAX_REGISTRY_TAGS_PER_SWEEP)) {
        const held = await registrySnapshot(registry, tag, this.#fetch, signal);
        const created = Number(held?.labels["dormice.snapshot.created"]);
        if (!held || !Number.isFinite(created) || created + ttlMs > now) continue;
        if (await this.unpublish(tag)) removed.push(tag);
      }
    } catch (error) {
      this.#log("warn", "could not expire snapshots in the registry", {
        registry,
        error: messageOf(error),
      });
    }
    return removed;
  }

  /** Pushes image `name` to the registry, when one is set; a failure is logged, not thrown. */
  async push(name: string): Promise<void> {
    const executor = this.#options.executor;
    if (this.registry === undefined || !executor.pushImage) return;
    const timeoutMs = this.#options.timeoutMs ?? DEFAULT_HEAL_TIMEOUT_SECONDS * 1000;
    try {
      await executor.pushImage(name, this.registry, AbortSignal.timeout(timeoutMs));
      this.#log("info", "image pushed to the registry", { image: name, registry: this.registry });
    } catch (error) {
      this.#log("warn", "could not push an image to the registry", {
        image: name,
        registry: this.registry,
        error: messageOf(error),
      });
    }
  }
}

/**
 * What the registry knows of snapshot `id`: its manifest digest and the labels its image was
 * taken with, or undefined when the registry has no such snapshot.
 */
async function registrySnapshot(
  registry: string,
  id: string,
  fetcher: typeof fetch,
  signal: AbortSignal,
): Promise<{ digest: string; labels: Record<string, string> } | undefined> {
  const base = `http://${registry}/v2/${REGISTRY_SNAPSHOT_REPOSITORY}`;
  const manifest = await fetcher(`${base}/manifests/${encodeURIComponent(id)}`, {
    headers: { accept: MANIFEST_TYPES },
    signal,
  });
  if (manifest.status === 404) {
    await manifest.body?.cancel();
    return undefined;
  }
  if (!manifest.ok) {
    throw new Error(`the registry ${registry} answered HTTP ${manifest.status} for ${id}`);
  }
  const digest = manifest.headers.get("docker-content-digest");
  const body = await manifest.json() as { config?: { digest?: string } };
  if (!digest || !body.config?.digest) {
    throw new Error(`the registry ${registry} named no digest for ${id}`);
  }
  const config = await fetcher(`${base}/blobs/${body.config.digest}`, { signal });
  if (!config.ok) {
    await config.body?.cancel();
    throw new Error(`the registry ${registry} answered HTTP ${config.status} for ${id}'s config`);
  }
  const json = await config.json() as { config?: { Labels?: Record<string, string> | null } };
  return { digest, labels: json.config?.Labels ?? {} };
}

/**
 * Reads {@linkcode HEAL_FROM_HEADER}: the sources it names, or none for an absent or bad value.
 *
 * @example
 * ```ts
 * import { parseHealFrom } from "./image_moves.ts";
 * parseHealFrom("node-a=http://127.0.0.1:3676"); // [{ nodeId: "node-a", endpoint: "http://127.0.0.1:3676" }]
 * ```
 */
export function parseHealFrom(value: string | null | undefined): HealSource[] {
  if (!value) return [];
  const out: HealSource[] = [];
  for (const part of value.split(",").slice(0, 16)) {
    const at = part.indexOf("=");
    if (at <= 0) continue;
    const endpoint = part.slice(at + 1).trim();
    if (!URL.canParse(endpoint) || !/^https?:$/.test(new URL(endpoint).protocol)) continue;
    out.push({ nodeId: part.slice(0, at).trim(), endpoint });
  }
  return out;
}

function messageOf(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
