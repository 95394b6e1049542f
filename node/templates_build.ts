/**
 * The node's template builds (E2B's `Template.build`): the uploaded file contexts, a bound on
 * builds at once and on each build's time, each build's status and log lines for the SDK's
 * polling, and the snapshot refresh and pushed check-in that advertise a finished template
 * before it reads ready. The building itself is the executor's (`TemplateBuilder`).
 *
 * Moving a built template to another node is the snapshot images' movement (heal or registry):
 * the result is a snapshot image like any other, so that mechanism carries it unchanged.
 *
 * @module
 */
import { join } from "node:path";
import { HttpError } from "../shared/http_error.ts";
import type { Clock } from "../shared/clock.ts";
import { systemClock } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import type { SnapshotInfo } from "./executors/contract.ts";
import type { TemplateTagStore } from "./template_tags.ts";
import {
  checkContext,
  CONTEXT_UNPACKED_RATIO,
  DEFAULT_CONTEXT_ENTRIES,
} from "./template_context.ts";
import {
  type BuildLogLine,
  isTemplateBuilder,
  stepName,
  TemplateBuildError,
  type TemplateBuildSpec,
  type TemplateStep,
} from "./executors/template_build.ts";

/** The default bound on builds running at once on a node (`DORMICE_TEMPLATE_BUILDS`). */
export const DEFAULT_TEMPLATE_BUILDS = 2;
/** The default bound on one build's time, seconds (`DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS`). */
export const DEFAULT_TEMPLATE_BUILD_TIMEOUT_SECONDS = 1800;
/** The default cap of one uploaded file context, bytes (`DORMICE_TEMPLATE_CONTEXT_LIMIT_MB`). */
export const DEFAULT_TEMPLATE_CONTEXT_LIMIT_BYTES = 256 * 1024 * 1024;
/** How many finished builds the node remembers the status of (the oldest goes first). */
const KEPT_BUILDS = 200;
/** How many log lines one build keeps; later ones are counted, not kept. */
const KEPT_LOG_LINES = 5000;
/** How many characters of log lines one build keeps; later lines are counted, not kept. */
export const KEPT_LOG_CHARS = 1024 * 1024;
/** How long one log line may be; the rest of a longer one is cut. */
export const LOG_LINE_CHARS = 4096;
/** How many uploaded contexts are kept (the least recently used goes first). */
const KEPT_CONTEXTS = 64;
/** How many requested builds the node remembers (the oldest goes first). */
export const KEPT_RESERVATIONS = 1000;
/** A context file's hash: what the SDK sends (sha256 hex). */
const HASH = /^[a-f0-9]{64}$/;

/** One build as the status route answers it. */
export interface BuildRecord {
  spec: TemplateBuildSpec;
  status: "building" | "ready" | "error";
  logs: BuildLogLine[];
  dropped: number;
  reason?: { message: string; step?: string; logEntries: BuildLogLine[] };
  result?: SnapshotInfo;
  startedAt: number;
  finishedAt?: number;
}

/**
 * A build a gateway accepted (`POST /v3/templates`) and placed here, before and after its steps
 * arrive: whichever gateway the SDK's next calls reach finds it here, so the upload URL, the
 * steps and the status need not come back to the accepting gateway.
 */
export interface BuildReservation {
  templateId: string;
  buildId: string;
  team: string;
  name: string;
  /** The SDK's `cpuCount` and `memoryMB`, which bound the build's steps. */
  cpus?: number;
  memoryMB?: number;
  /** Whether its steps arrived: its upload URL is spent then. */
  started: boolean;
  at: number;
}

/** Options of {@linkcode TemplateBuilds}. */
export interface TemplateBuildsOptions {
  /** Builds templates (a `TemplateBuilder`); builds answer 501 when it does not. */
  executor: unknown;
  /**
   * Told of each finished template: `push` puts it on the registry (when one is set), so every
   * node can start from it while the builder is down; `refresh` makes the check-in advertise it.
   */
  snapshots?: { refresh(): Promise<void>; push?(snapshotId: string): Promise<void> };
  /**
   * Pushes a check-in advertising a finished template (after `refresh`), before the build
   * reads ready: the gateway knows its holder at once, so a tag read or a create that follows
   * the SDK's last status poll finds it there. None without a gateway.
   */
  announce?(templateId: string): Promise<unknown>;
  /** The tags of the templates built here (`<data dir>/template-tags`); none kept when absent. */
  tags?: TemplateTagStore;
  /** Where uploaded contexts are kept (`<data dir>/template-contexts`). */
  dir: string;
  /** Builds at once (`DORMICE_TEMPLATE_BUILDS`). */
  maxBuilds?: number;
  /** One build's bound, ms (`DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS`). */
  timeoutMs?: number;
  /** Cap of one uploaded context, bytes (`DORMICE_TEMPLATE_CONTEXT_LIMIT_MB`). */
  maxContextBytes?: number;
  /** Cap of the entries of one context. */
  maxContextEntries?: number;
  clock?: Clock;
  log?: Log;
}

/**
 * The node's builds.
 *
 * @example
 * ```ts ignore
 * const builds = new TemplateBuilds({ executor, dir: "/var/lib/dormice/template-contexts" });
 * builds.start(spec);
 * builds.status(spec.templateId, spec.buildId, 0, "default");
 * ```
 */
export class TemplateBuilds {
  #o: TemplateBuildsOptions;
  #builds = new Map<string, BuildRecord>();
  #contexts = new Map<string, string>();
  /** `<template id>/<build id>` → the build accepted, oldest first. */
  #reserved = new Map<string, BuildReservation>();
  #running = 0;
  #clock: Clock;
  #log: Log;

  constructor(options: TemplateBuildsOptions) {
    this.#o = options;
    this.#clock = options.clock ?? systemClock;
    this.#log = options.log ?? silentLog;
  }

  /**
   * Whether `team` uploaded the context of `hash`. Contexts are kept per team: the hash is what
   * the uploader says, not checked against the bytes, so one team's upload never stands for
   * another's files.
   */
  async hasContext(hash: string, team: string): Promise<boolean> {
    checkHash(hash);
    return (await this.#contextPath(hash, team)) !== undefined;
  }

  /**
   * Keeps an uploaded context (a gzipped tar) of `team` under `hash`, within the cap, once its
   * entries stay inside it and its unpacked size is bounded (`template_context.ts`).
   */
  async putContext(
    hash: string,
    team: string,
    body: ReadableStream<Uint8Array> | null,
  ): Promise<void> {
    checkHash(hash);
    if (!body) throw new HttpError(400, "The upload has no body: PUT the context's tar.gz");
    const cap = this.#o.maxContextBytes ?? DEFAULT_TEMPLATE_CONTEXT_LIMIT_BYTES;
    await Deno.mkdir(join(this.#o.dir, team), { recursive: true });
    const path = join(this.#o.dir, team, hash);
    const partial = `${path}.${crypto.randomUUID().slice(0, 8)}.part`;
    const file = await Deno.open(partial, { write: true, create: true, truncate: true });
    let size = 0;
    try {
      for await (const chunk of body) {
        size += chunk.length;
        if (size > cap) {
          throw new HttpError(
            413,
            `The file context is over ${Math.round(cap / 1048576)} MB ` +
              "(DORMICE_TEMPLATE_CONTEXT_LIMIT_MB): copy fewer files, or add a .dockerignore",
          );
        }
        let written = 0;
        while (written < chunk.length) written += await file.write(chunk.subarray(written));
      }
      file.close();
      const check = await Deno.open(partial, { read: true });
      await checkContext(check.readable, {
        maxBytes: cap * CONTEXT_UNPACKED_RATIO,
        maxEntries: this.#o.maxContextEntries ?? DEFAULT_CONTEXT_ENTRIES,
      });
    } catch (error) {
      try {
        file.close();
      } catch { /* closed already */ }
      await Deno.remove(partial).catch(() => {});
      throw error;
    }
    await Deno.rename(partial, path);
    this.#remember(`${team}/${hash}`, path);
  }

  /**
   * Records a build a gateway placed here: any gateway then finds it (see
   * {@linkcode pending}); at most {@linkcode KEPT_RESERVATIONS}, the oldest forgotten first.
   */
  reserve(r: Omit<BuildReservation, "started" | "at">): BuildReservation {
    const key = keyOf(r.templateId, r.buildId);
    const held = this.#reserved.get(key);
    if (held) {
      if (held.team !== r.team) {
        throw new HttpError(409, `Build '${r.buildId}' of '${r.templateId}' is another team's`);
      }
      return held;
    }
    const reservation = { ...r, started: false, at: this.#clock.now() };
    this.#reserved.set(key, reservation);
    while (this.#reserved.size > KEPT_RESERVATIONS) {
      this.#reserved.delete(this.#reserved.keys().next().value!);
    }
    return reservation;
  }

  /**
   * The build of `templateId` for `team` a gateway placed here: `buildId`'s, or without it the
   * newest whose steps have not arrived (the newest at all when every one started).
   */
  pending(templateId: string, team: string, buildId?: string): BuildReservation | undefined {
    if (buildId !== undefined) {
      const r = this.#reserved.get(keyOf(templateId, buildId));
      return r?.team === team ? r : undefined;
    }
    const mine = [...this.#reserved.values()].filter((r) =>
      r.templateId === templateId && r.team === team
    );
    return mine.findLast((r) => !r.started) ?? mine.at(-1);
  }

  /** Marks build `buildId` of `team` as started elsewhere (its upload URL spent here). */
  spend(templateId: string, buildId: string, team: string): boolean {
    const r = this.#reserved.get(keyOf(templateId, buildId));
    if (!r || r.team !== team) return false;
    r.started = true;
    return true;
  }

  /**
   * Why an upload for build `buildId` of `team` is refused, or undefined when it is open: it is
   * spent once every build of its template sent its steps (builds of one template at once may
   * have been handed each other's URL).
   */
  uploadRefusal(templateId: string, buildId: string, team: string): string | undefined {
    const r = this.#reserved.get(keyOf(templateId, buildId));
    if (!r || r.team !== team) return "its build is unknown or was forgotten";
    const open = [...this.#reserved.values()].some((b) =>
      b.templateId === templateId && b.team === team && !b.started
    );
    return open ? undefined : "its build has started";
  }

  /** Starts a build; a 429 when the node already runs its bound of builds. */
  start(spec: TemplateBuildSpec): BuildRecord {
    const executor = this.#o.executor;
    if (!isTemplateBuilder(executor)) {
      throw new HttpError(501, "This node's executor builds no templates: run it on Docker");
    }
    const max = this.#o.maxBuilds ?? DEFAULT_TEMPLATE_BUILDS;
    if (this.#running >= max) {
      throw new HttpError(
        429,
        `This node runs ${this.#running} template builds, its bound (DORMICE_TEMPLATE_BUILDS=` +
          `${max}): retry once one finished`,
        { headers: { "retry-after": "10" } },
      );
    }
    for (const [index, step] of spec.steps.entries()) checkCopy(step, index);
    const key = keyOf(spec.templateId, spec.buildId);
    if (this.#builds.get(key)?.status === "building") {
      throw new HttpError(409, `Build ${spec.buildId} of ${spec.templateId} is running already`);
    }
    const record: BuildRecord = {
      spec,
      status: "building",
      logs: [],
      dropped: 0,
      startedAt: this.#clock.now(),
    };
    this.#builds.set(key, record);
    this.#evict();
    const reserved = this.#reserved.get(key);
    if (reserved) reserved.started = true;
    this.#running++;
    const timeoutMs = this.#o.timeoutMs ?? DEFAULT_TEMPLATE_BUILD_TIMEOUT_SECONDS * 1000;
    const signal = AbortSignal.timeout(timeoutMs);
    let chars = 0;
    const log = (level: BuildLogLine["level"], message: string, step?: string, last = false) => {
      if (message.length > LOG_LINE_CHARS) {
        message = `${message.slice(0, LOG_LINE_CHARS)}… (${message.length - LOG_LINE_CHARS} ` +
          "more characters cut)";
      }
      // The build's last line (finished or failed) is kept past the caps.
      if (!last && (record.logs.length >= KEPT_LOG_LINES || chars >= KEPT_LOG_CHARS)) {
        record.dropped++;
        return;
      }
      chars += message.length;
      record.logs.push({ at: this.#clock.now(), level, message, ...(step ? { step } : {}) });
    };
    const io = {
      log: (level: BuildLogLine["level"], message: string, step?: string) =>
        log(level, message, step),
      contextFile: (hash: string) => this.#contexts.get(`${spec.team}/${hash}`),
      signal,
    };
    (async () => {
      try {
        record.result = await executor.buildTemplate(spec, io);
        // Pushed before it is called ready, as a snapshot's take is: a create from it then
        // works with this node down.
        await this.#o.snapshots?.push?.(spec.templateId);
        await this.#o.snapshots?.refresh();
        await this.#o.announce?.(spec.templateId);
        record.status = "ready";
        log(
          "info",
          `Build finished: template ${spec.name} (${spec.templateId}) is ready` +
            (record.dropped > 0 ? ` (${record.dropped} log lines past the cap not kept)` : ""),
          undefined,
          true,
        );
      } catch (error) {
        const failure = error instanceof TemplateBuildError
          ? { message: error.message, step: error.step }
          : signal.aborted
          ? {
            message: `The build ran past its bound of ${Math.round(timeoutMs / 1000)} s ` +
              "(DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS): make its steps shorter, or raise it",
          }
          : { message: `The build failed: ${error instanceof Error ? error.message : error}` };
        log("error", failure.message, failure.step, true);
        record.status = "error";
        record.reason = {
          ...failure,
          logEntries: record.logs.filter((l) => l.step === failure.step).slice(-20),
        };
        this.#log("warn", "a template build failed", {
          template: spec.templateId,
          build: spec.buildId,
          step: failure.step,
          error: failure.message,
        });
      } finally {
        record.finishedAt = this.#clock.now();
        this.#running--;
      }
    })();
    return record;
  }

  /**
   * Publishes or unpublishes template `templateId` of `team`; false when the node holds no
   * template of that team by that id.
   */
  async setPublic(templateId: string, team: string, published: boolean): Promise<boolean> {
    const executor = this.#o.executor;
    if (!isTemplateBuilder(executor)) return false;
    const done = await executor.setTemplatePublic(templateId, team, published);
    if (done) await this.#o.snapshots?.refresh();
    return done;
  }

  /** The build `buildId` of `templateId` for `team`; a 404 when there is none. */
  get(templateId: string, buildId: string, team: string): BuildRecord {
    const record = this.#builds.get(keyOf(templateId, buildId));
    if (!record || record.spec.team !== team) {
      throw new HttpError(
        404,
        `Build '${buildId}' of template '${templateId}' not found on this node: start it with ` +
          "POST /v2/templates/{templateID}/builds/{buildID}",
      );
    }
    return record;
  }

  /** The node's clock, ms since the epoch. */
  now(): number {
    return this.#clock.now();
  }

  /** The tags of the templates built here, when kept. */
  get tags(): TemplateTagStore | undefined {
    return this.#o.tags;
  }

  /** Builds running now. */
  get running(): number {
    return this.#running;
  }

  async #contextPath(hash: string, team: string): Promise<string | undefined> {
    const key = `${team}/${hash}`;
    const known = this.#contexts.get(key);
    if (known) return known;
    const path = join(this.#o.dir, team, hash);
    try {
      await Deno.stat(path);
    } catch {
      return undefined;
    }
    this.#remember(key, path);
    return path;
  }

  #remember(key: string, path: string): void {
    this.#contexts.delete(key);
    this.#contexts.set(key, path);
    while (this.#contexts.size > KEPT_CONTEXTS) {
      const [oldest, file] = this.#contexts.entries().next().value!;
      this.#contexts.delete(oldest);
      Deno.remove(file).catch(() => {});
    }
  }

  #evict(): void {
    if (this.#builds.size <= KEPT_BUILDS) return;
    for (const [key, record] of this.#builds) {
      if (this.#builds.size <= KEPT_BUILDS) return;
      if (record.status !== "building") this.#builds.delete(key);
    }
  }
}

/**
 * The status answer E2B's SDK reads (`TemplateBuildInfo`), from log line `offset` on.
 */
export function buildInfo(record: BuildRecord, offset: number): Record<string, unknown> {
  const entry = (l: BuildLogLine) => ({
    timestamp: new Date(l.at).toISOString(),
    level: l.level,
    message: l.message,
    ...(l.step ? { step: l.step } : {}),
  });
  const lines = record.logs.slice(Math.max(0, offset));
  return {
    templateID: record.spec.templateId,
    buildID: record.spec.buildId,
    status: record.status,
    logs: lines.map((l) => l.message),
    logEntries: lines.map(entry),
    ...(record.reason
      ? {
        reason: {
          message: record.reason.message,
          ...(record.reason.step ? { step: record.reason.step } : {}),
          logEntries: record.reason.logEntries.map(entry),
        },
      }
      : {}),
  };
}

/** A `COPY` step's sources: relative paths inside the uploaded context; a 400 otherwise. */
function checkCopy(step: TemplateStep, index: number): void {
  if (step.type.toUpperCase() !== "COPY") return;
  for (const src of (step.args[0] ?? "").split(/\s+/).filter((s) => s !== "")) {
    if (src.startsWith("/") || src.split("/").includes("..")) {
      throw new HttpError(
        400,
        `Step ${stepName(index)} copies '${src.slice(0, 120)}', which is outside the ` +
          "uploaded files: copy paths relative to the template's file context, without '..'",
      );
    }
  }
}

function keyOf(templateId: string, buildId: string): string {
  return `${templateId}/${buildId}`;
}

function checkHash(hash: string): void {
  if (!HASH.test(hash)) {
    throw new HttpError(
      400,
      `'${hash.slice(0, 80)}' is no files hash: the SDK sends 64 hex digits`,
    );
  }
}
