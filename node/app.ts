/**
 * `createNodeApp()`: the whole node (ledger, executor, service, faces, scanner, check-in) as one
 * object whose `fetch` serves every route, so tests run it in-process and `main.ts` stays thin.
 *
 * @module
 */
import { Hono } from "hono";
import denoJson from "../deno.json" with { type: "json" };
import type { Clock, TimerHandle, Timers } from "../shared/clock.ts";
import { systemClock, systemTimers } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import { CheckInLoop, type CheckInOutcome, lookupDigestOf } from "./check_in.ts";
import type { NodeConfig } from "./config.ts";
import type { Executor } from "./executors/contract.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { HostReader, type HostSampler } from "./host_reading.ts";
import { Ledger } from "./ledger.ts";
import { LedgerUpkeep } from "./ledger_upkeep.ts";
import { AccessTokens } from "../shared/access_tokens.ts";
import { createH1Client } from "../shared/http1/mod.ts";
import { createE2bApi } from "./faces/e2b_api.ts";
import { createEnvd, handleSignedFiles, UploadSlots, UploadStaging } from "./faces/envd/mod.ts";
import { createPortsDoor, PORTS_PATH } from "./faces/ports.ts";
import { createNativeFace, nativeErrorResponse, nativeNotFound } from "./faces/native.ts";
import { DeadlineScanner } from "./deadline_scanner.ts";
import { instrumentExecutor } from "./executors/instrumented.ts";
import { LifecycleOutbox, scannerEvent } from "./lifecycle_outbox.ts";
import { NodeMetrics } from "./metrics.ts";
import { MetricsSampler } from "./metrics_sampler.ts";
import { SandboxService } from "./service.ts";
import type { DirectCreate } from "./service_options.ts";
import { DEFAULT_SNAPSHOT_MIN_DISK_GB, NodeSnapshots } from "./snapshots.ts";
import { TemplateBuilds } from "./templates_build.ts";
import { TemplateTagStore } from "./template_tags.ts";
import { DEFAULT_HEAL_TIMEOUT_SECONDS, ImageMoves } from "./image_moves.ts";
import { ArchiveMoves, withArchiveMoves } from "./archive_moves.ts";
import { HttpError } from "../shared/http_error.ts";
import { TEAM_HEADER } from "../shared/teams.ts";
import { WarmPools } from "./pools.ts";
import { join } from "node:path";
import { configDigest as computeConfigDigest } from "../shared/config_digest.ts";
import { parseTemplates } from "./executors/docker/templates.ts";
import { CapabilitiesReader } from "./capabilities_reader.ts";
import { requireFleetBearer, tokenMatcher } from "../shared/token.ts";
import { LEDGER_SEQ_HEADER, MAX_CHECK_IN_VOLUMES } from "../shared/schemas.ts";
import { type NodeVolumes, nodeVolumesFor } from "./volumes.ts";
import { createVolumeFace } from "./faces/volumes.ts";

/** The build string a node reports (`@dormice/cluster@<version>`). */
export const nodeBuild: string = `${denoJson.name}@${denoJson.version}`;

/**
 * The parts of {@linkcode NodeConfig} the app needs; the body caps keep their defaults (32 MiB
 * of JSON, 1 GiB per upload) when absent.
 */
export type NodeAppConfig =
  & Pick<
    NodeConfig,
    | "apiToken"
    | "dataDir"
    | "nodeId"
    | "nodeEndpoint"
    | "gatewayEndpoint"
    | "gatewayEndpoints"
    | "checkInIntervalSeconds"
    | "scanIntervalSeconds"
  >
  & Partial<
    Pick<
      NodeConfig,
      | "pools"
      | "poolsRefillDelayMs"
      | "templates"
      | "sandboxDomain"
      | "jsonBodyLimitBytes"
      | "jsonMessageLimitBytes"
      | "uploadLimitBytes"
      | "snapshotMinDiskBytes"
      | "templateBuilds"
      | "templateBuildTimeoutMs"
      | "templateContextLimitBytes"
      | "snapshotRegistry"
      | "snapshotHealTimeoutMs"
      | "snapshotHealMaxBytes"
      | "snapshotHeal"
      | "snapshotTtlMs"
      | "uploadGzipMaxRatio"
      | "gatewayCheckInHeader"
      | "volumeRoot"
      | "volumeSizeBytes"
      | "e2bDefaultEgress"
    >
  >;

/** Options of {@linkcode createNodeApp}. */
export interface NodeAppOptions {
  /** The node's settings (token, data dir, ids, endpoints, intervals). */
  config: NodeAppConfig;
  /** The executor; a new `FakeExecutor` when absent. */
  executor?: Executor;
  /** The ledger; `Ledger.open(config.dataDir)` (held exclusively, its reserve beside it) when absent. */
  ledger?: Ledger;
  /**
   * Where `setPools` keeps the pools (`null`: nowhere); `<dataDir>/pools.json` when the ledger is
   * opened here, nowhere when one is given.
   */
  poolsFile?: string | null;
  /** Time source of the service, scanner and host reader; `systemClock` when absent. */
  clock?: Clock;
  /** The deadline and sampling timers; `systemTimers` when absent (a `FakeClock` serves as both). */
  timers?: Timers;
  /** Where every part logs; `silentLog` when absent. */
  log?: Log;
  /**
   * What the check-in loop sends with (the global `fetch` when absent); any
   * `(request) => Response` handler serves, e.g. a host Hono app's `request`.
   */
  fetch?: (request: Request) => Response | Promise<Response>;
  /**
   * The fleet egress CA's fingerprint (`EgressCa.fingerprint`), part of the config digest;
   * `null` or absent when the executor has none.
   */
  egressCaFingerprint?: string | null;
  /** Host numbers; the real machine when absent. */
  sampler?: HostSampler;
  /** The build string reported in check-ins and by the native face; {@linkcode nodeBuild} when absent. */
  build?: string;
  /**
   * The managed volumes (E2B `Volume`); built from the config when absent. Give the same object
   * to the executor (`managedVolumes`) so a create can mount them.
   */
  volumes?: NodeVolumes;
}

/** A built node. Nothing runs in the background until `start()`. */
export interface NodeApp {
  /** Serves every route: the native verbs, `/healthz`, the E2B faces and `/metrics`. */
  fetch: (request: Request) => Promise<Response>;
  /** The sandbox service every face calls. */
  service: SandboxService;
  /** The ledger the node holds (closed by `close()`). */
  ledger: Ledger;
  /** The executor that runs the sandboxes (closed by `close()`). */
  executor: Executor;
  /**
   * The warm pools; `start()` does not start them: call `pools.start()` after the boot
   * reconcile (`service.reconcile()`, which must see their rows first), as the node daemon does.
   */
  pools: WarmPools;
  /** The digest of this node's fleet-invariant settings, sent with every check-in. */
  configDigest: string;
  /** Starts the deadline scanner, the ledger's upkeep, the metrics sampler and the check-in loop. */
  start(): void;
  /**
   * Checks in with the gateway once now, whether or not `start()` was called (an embedder's test,
   * or a host that wants the node placed before the first interval); never rejects. A node with no
   * `gatewayEndpoint` answers `{ ok: false }` saying so.
   */
  checkInNow(): Promise<CheckInOutcome>;
  /**
   * Stops the loops (flushing the idle clock), then closes the executor and the ledger; resolves
   * once all of that is done. Calling it again returns the same promise.
   */
  close(): Promise<void>;
  /** `await using node = createNodeApp(…)` closes it at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void>;
}

/**
 * {@linkcode buildNode}'s node: the public one with the loops and the Hono app the daemon and the
 * tests reach into. Not exported from the package: these parts' types are internals.
 */
export interface BuiltNode extends NodeApp {
  /** The root Hono app every face is mounted on. */
  hono: Hono;
  /** Takes the host readings sent in check-ins and served by the native face. */
  hostReader: HostReader;
  /** Enforces E2B deadlines on one timer; runs once `start()` is called. */
  scanner: DeadlineScanner;
  /** Flushes the ledger's idle clock and restores its reserve; runs once `start()` is called. */
  upkeep: LedgerUpkeep;
  /** Samples every running sandbox's use every 5 s for E2B's metrics; runs once started. */
  metricsSampler: MetricsSampler;
  /** `null` when the node runs standalone (no `DORMICE_GATEWAY_ENDPOINT`). */
  checkIn: CheckInLoop | null;
  /** The series behind `GET /metrics`. */
  metrics: NodeMetrics;
  /** The scanner's kills and pauses, waiting to ride the next check-in. */
  outbox: LifecycleOutbox;
  /** The managed volumes, advertised in check-ins beside the declared ones. */
  volumes: NodeVolumes;
}

/**
 * Builds a node from its config. Opening the ledger takes the single-writer lock, so this throws
 * `DatabaseLockedError` when another daemon holds the data dir.
 *
 * @example
 * ```ts ignore
 * import { createNodeApp, FakeExecutor } from "@dormice/cluster/node";
 * await using node = createNodeApp({ config, executor: new FakeExecutor() });
 * const res = await node.fetch(new Request("http://node/healthz"));
 * ```
 */
export function createNodeApp(options: NodeAppOptions): NodeApp {
  return buildNode(options);
}

/** {@linkcode createNodeApp} with every part of the node in its answer (see {@linkcode BuiltNode}). */
export function buildNode(options: NodeAppOptions): BuiltNode {
  const { config } = options;
  const log = options.log ?? silentLog;
  const clock = options.clock ?? systemClock;
  const build = options.build ?? nodeBuild;
  const ledgerOptions = { nodeId: config.nodeId, endpoint: config.nodeEndpoint };
  const ledger = options.ledger ?? Ledger.open(config.dataDir, { ...ledgerOptions, log });
  const upkeep = new LedgerUpkeep({ ledger, log });
  const volumes = options.volumes ?? nodeVolumesFor(config, ledger);
  const executor = options.executor ??
    new FakeExecutor({ clock, nodeId: config.nodeId, managedVolumes: (n) => volumes.dataDir(n) });
  // Standalone there is no gateway to tell: the outbox stays empty.
  const outbox = new LifecycleOutbox({ onDrop: () => metrics.eventsDropped() });
  const metrics = new NodeMetrics({
    census: () => ledger.census(),
    pendingEvents: () => outbox.size,
    build,
  });
  // The sampler's stats calls are executor calls too: timed like the rest.
  const timed = instrumentExecutor(executor, metrics);
  const pools = new WarmPools({
    ledger,
    executor: timed,
    file: options.poolsFile !== undefined
      ? options.poolsFile
      : options.ledger
      ? null
      : join(config.dataDir, "pools.json"),
    initial: config.pools ?? [],
    claimRefillDelayMs: config.poolsRefillDelayMs,
    clock,
    log,
  });
  // Set below, once the service it records into exists.
  let archives: ArchiveMoves | undefined;
  const service = new SandboxService({
    ledger,
    // With a registry, a resume or kill here keeps the registry's copy right (`archive_moves.ts`).
    executor: config.snapshotRegistry === undefined
      ? timed
      : withArchiveMoves(timed, () => archives, (id) => ledger.byId(id)?.state === "archived"),
    clock,
    log,
    pools,
    onArchived: (row) => archives?.push(row) ?? Promise.resolve(),
    // A create behind the gateway's back reaches the gateway before the node builds it
    // (docs/lookup-digest.md); `checkIn` is built below, before any request is served.
    ...(config.gatewayEndpoint === null ? {} : {
      announceDirect: (what: string, created: DirectCreate): Promise<void> =>
        checkIn!.pushDirectCreate(what, created),
    }),
  });
  const accessTokens = AccessTokens.fromFleetToken(config.apiToken);
  const templateMap = parseTemplates(config.templates ?? undefined);
  const configDigest = computeConfigDigest({
    templates: typeof templateMap === "string" ? {} : templateMap,
    sandboxDomain: config.sandboxDomain ?? null,
    signingSecretId: accessTokens.identity(),
    snapshotTtlMs: config.snapshotTtlMs ?? 0,
    snapshotRegistry: config.snapshotRegistry ?? null,
    egressCa: options.egressCaFingerprint ?? null,
    e2bDefaultEgress: config.e2bDefaultEgress ?? false,
  }, config.apiToken);
  // The executor is asked what it can serve in the background; a check-in sends the last
  // answer, at most one interval old, so a slow engine never delays a check-in.
  const capabilitiesReader = new CapabilitiesReader(
    executor.capabilities === undefined ? undefined : () => executor.capabilities!(),
    log,
  );
  const refreshCapabilities = (): Promise<void> => capabilitiesReader.refresh();
  const hostReader = new HostReader({
    dataDir: config.dataDir,
    census: () => ledger.census(),
    teams: () => ledger.teamCounts(),
    ledgerSeq: () => ledger.changeSeq,
    warm: () => pools.warmCount(),
    sampler: options.sampler,
    clock,
  });
  const moves = new ImageMoves({
    executor: timed,
    token: config.apiToken,
    timeoutMs: config.snapshotHealTimeoutMs,
    maxBytes: config.snapshotHealMaxBytes,
    registry: config.snapshotRegistry,
    heals: config.snapshotHeal ?? true,
    log,
  });
  archives = config.snapshotRegistry === undefined ? undefined : new ArchiveMoves({
    executor: timed,
    nodeId: config.nodeId,
    service,
    registry: config.snapshotRegistry,
    timeoutMs: config.snapshotHealTimeoutMs ?? DEFAULT_HEAL_TIMEOUT_SECONDS * 1000,
    log,
  });
  if (archives && !archives.enabled) archives = undefined;
  const snapshots = new NodeSnapshots({
    moves,
    ttlMs: config.snapshotTtlMs,
    executor: timed,
    service,
    queue: service.queue,
    hostReading: () => hostReader.read(),
    minDiskBytes: config.snapshotMinDiskBytes ?? DEFAULT_SNAPSHOT_MIN_DISK_GB * 1e9,
    templates: async () => (await executor.capabilities?.())?.templates,
    // `checkIn` is built below, before any request is served.
    ...(config.gatewayEndpoint === null
      ? {}
      : { announceRetaken: (snapshotId: string) => checkIn!.pushRetaken(snapshotId) }),
    log,
  });
  const metricsSampler = new MetricsSampler({
    ledger,
    executor: timed,
    history: service.history,
    timers: options.timers,
    log,
  });
  const scanner = new DeadlineScanner({
    ledger,
    service,
    clock,
    timers: options.timers,
    log,
    intervalSeconds: config.scanIntervalSeconds,
    onOutcome: (sandbox, outcome) => {
      metrics.deadlineAction(outcome);
      if (outcome === "failed" || checkIn === null) return;
      outbox.add(scannerEvent(sandbox, outcome, clock.now()));
      checkIn.nudge();
    },
  });
  const checkIn: CheckInLoop | null = config.gatewayEndpoint === null ? null : new CheckInLoop({
    gatewayEndpoint: config.gatewayEndpoint,
    gatewayEndpoints: config.gatewayEndpoints,
    nodeId: config.nodeId,
    endpoint: config.nodeEndpoint,
    intervalSeconds: config.checkInIntervalSeconds,
    build,
    token: config.apiToken,
    header: config.gatewayCheckInHeader,
    reading: () => hostReader.read(),
    fetch: options.fetch,
    log,
    events: outbox,
    lookupDigest: () => lookupDigestOf(ledger.keys(), service.queue.busyKeys()),
    onOutcome: (outcome) => metrics.checkIn(outcome.ok),
    capabilities: () => {
      void refreshCapabilities();
      const capabilities = capabilitiesReader.current;
      return {
        pools: pools.reports(),
        ...(capabilities?.templates ? { templates: capabilities.templates } : {}),
        // The managed volumes present now (a shared root: every volume on it), after the
        // declared ones; a check-in carries at most MAX_CHECK_IN_VOLUMES names.
        volumes: [...(capabilities?.volumes ?? []), ...volumes.ids()].slice(
          0,
          MAX_CHECK_IN_VOLUMES,
        ),
        ...(capabilities?.egressRules ? { egressRules: true } : {}),
        ...snapshots.advertised(),
        ...(config.snapshotRegistry === undefined
          ? {}
          : { snapshotRegistry: config.snapshotRegistry }),
        ...(config.snapshotHeal === false ? { heals: false } : {}),
        configDigest,
      };
    },
  });

  const hono = new Hono();
  hono.onError((error) => nativeErrorResponse(error, log));
  hono.notFound(nativeNotFound);

  // The E2B faces answer in their own dialects (E2B `{code, message}`, Connect) through their
  // own onError, which route() keeps. They come before the native face because that one
  // answers POST /<verb> at the root. The envd secret is derived from the fleet token so every
  // node and every restart agrees on a sandbox's access token without another variable.
  // Before every face: Prometheus sends the fleet token as a bearer token, and a GET at the root
  // is none of the faces' business.
  const matchesToken = tokenMatcher(config.apiToken);
  hono.get("/metrics", async (c) => {
    requireFleetBearer(c.req.header("authorization"), matchesToken, "this node's", "GET /metrics");
    return new Response(await metrics.text(), {
      headers: { "content-type": metrics.contentType, "cache-control": "no-store" },
    });
  });
  // A node that lacks an image gets it from one that holds it (`image_moves.ts`).
  hono.get("/images/:name", async (c) => {
    requireFleetBearer(
      c.req.header("authorization"),
      matchesToken,
      "this node's",
      "GET /images/:name",
    );
    return await moves.export(c.req.param("name"), c.req.raw.signal);
  });
  // A gateway asks a node to take over a sandbox paused to disk on a node that is down
  // (`archive_moves.ts`); the sandbox's own routes then reach it here.
  hono.post("/e2b/api/sandboxes/:id/adopt", async (c) => {
    requireFleetBearer(
      c.req.header("authorization"),
      matchesToken,
      "this node's",
      "POST /e2b/api/sandboxes/:id/adopt",
    );
    if (!archives) {
      throw new HttpError(
        501,
        "This node takes over no sandboxes: it needs DORMICE_SNAPSHOT_REGISTRY and the Docker executor",
      );
    }
    const row = await archives.adopt(c.req.param("id"), c.req.header(TEAM_HEADER) ?? undefined);
    return c.json({ sandboxID: row.id, name: row.name, team: row.team, state: row.state });
  });
  const maxBodyBytes = config.jsonBodyLimitBytes;
  // One bound and one staging dir for both /files doors: the bound is the node's, not a door's.
  const envd = {
    accessTokens,
    log,
    maxJsonBodyBytes: maxBodyBytes,
    maxJsonMessageBytes: config.jsonMessageLimitBytes,
    maxUploadBytes: config.uploadLimitBytes,
    maxGzipRatio: config.uploadGzipMaxRatio,
    uploads: new UploadSlots(),
    staging: new UploadStaging({ dir: join(config.dataDir, "uploads") }),
  };
  hono.route(
    "/e2b/api",
    createE2bApi(service, {
      apiToken: config.apiToken,
      accessTokens,
      log,
      defaultEgress: config.e2bDefaultEgress ?? false,
      maxBodyBytes: config.jsonMessageLimitBytes,
      snapshots,
      builds: new TemplateBuilds({
        executor,
        snapshots,
        dir: join(config.dataDir, "template-contexts"),
        tags: new TemplateTagStore(join(config.dataDir, "template-tags"), clock),
        ...(checkIn === null ? {} : { announce: (id: string) => checkIn.pushRetaken(id) }),
        maxBuilds: config.templateBuilds,
        timeoutMs: config.templateBuildTimeoutMs,
        maxContextBytes: config.templateContextLimitBytes,
        clock,
        log,
      }),
      templates: async () => (await executor.capabilities?.())?.templates,
    }),
  );
  hono.route("/e2b/envd", createEnvd(service, envd));
  // Not a Hono sub-app: the door needs the server's own request to upgrade a WebSocket.
  // Masked-Host requests to sandbox ports (network.maskRequestHost) go out on a client that
  // sends the Host it is given; its pools close with the node.
  const hostClient = createH1Client({ hostFromHeaders: true });
  const ports = createPortsDoor(service, timed, { accessTokens, log, hostClient });
  hono.all(`${PORTS_PATH}/*`, (c) => ports(c.req.raw));
  hono.route("/", handleSignedFiles(service, envd));
  hono.route(
    "/",
    createVolumeFace(volumes, {
      token: config.apiToken,
      nodeId: config.nodeId,
      log,
      changed: () => checkIn?.nudge(),
    }),
  );

  hono.route(
    "/",
    createNativeFace({
      service,
      token: config.apiToken,
      nodeId: config.nodeId,
      endpoint: config.nodeEndpoint,
      build,
      hostReading: () => hostReader.read(),
      health: () => ({ volumeCaps: volumes.caps }),
      pools,
      snapshots,
      log,
      maxBodyBytes,
      maxMessageBytes: config.jsonMessageLimitBytes,
    }),
  );

  let closed = false;
  let closing: Promise<void> | undefined;
  // Snapshots past DORMICE_SNAPSHOT_TTL_HOURS are swept a tenth of the TTL apart (at most every
  // 10 minutes, at least a second apart), one sweep at a time.
  const timers = options.timers ?? systemTimers;
  const ttlMs = config.snapshotTtlMs ?? 0;
  let expiryTimer: TimerHandle | undefined;
  const scheduleExpiry = (): void => {
    if (closed || ttlMs <= 0) return;
    expiryTimer = timers.setTimer(() => {
      void snapshots.expire(clock.now()).catch(() => {}).finally(scheduleExpiry);
    }, Math.max(1_000, Math.min(ttlMs / 10, 600_000)));
  };
  const close = (): Promise<void> =>
    closing ??= (async () => {
      closed = true;
      timers.clearTimer(expiryTimer);
      await Promise.all([scanner.stop(), metricsSampler.stop(), checkIn?.stop()]);
      await upkeep.stop();
      await pools.close();
      await archives?.settled();
      await executor.close();
      hostClient.close();
      ledger.close();
    })();
  return {
    fetch: async (request) => {
      const before = ledger.changeSeq;
      const response = await hono.fetch(request);
      // An answer to a request that changed the ledger (a create, a destroy) names the change
      // number after it, so the gateway can tell which of this node's readings count the change.
      if (ledger.changeSeq !== before) {
        try {
          response.headers.set(LEDGER_SEQ_HEADER, String(ledger.changeSeq));
        } catch {
          // Immutable headers (an answer relayed from elsewhere): left as they came.
        }
      }
      return response;
    },
    hono,
    service,
    ledger,
    executor,
    hostReader,
    scanner,
    upkeep,
    metricsSampler,
    checkIn,
    metrics,
    outbox,
    pools,
    configDigest,
    volumes,
    checkInNow: () =>
      checkIn?.once() ??
        Promise.resolve({
          ok: false,
          cause: "this node runs standalone: set gatewayEndpoint to check in",
        }),
    start() {
      scanner.start();
      upkeep.start();
      scheduleExpiry();
      metricsSampler.start();
      // The first check-in waits (at most 2 s) for the executor's templates: a node that joins
      // without them is placed as if it served any template until its next check-in.
      const known = Promise.all([
        refreshCapabilities(),
        snapshots.refresh(),
        archives?.fence().catch(() => {}),
      ]);
      let timer: ReturnType<typeof setTimeout> | undefined;
      const bound = new Promise<void>((resolve) => timer = setTimeout(resolve, 2_000));
      void Promise.race([known, bound]).then(() => {
        clearTimeout(timer);
        if (!closed) checkIn?.start();
      });
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
