/**
 * `createGateway()`: the whole gateway as one object whose `fetch(Request)` an embedder mounts in
 * its own server. This file only wires the pieces together: the door (`door.ts`: loops and dot
 * segments), the Fleet (`fleet/fleet.ts`), the Finder (`finder/finder.ts`) and the Placer
 * (`placer/placer.ts`) under the routing rules (`routing/routing.ts`), and the faces on top: the
 * native face as the root (`faces/native.ts`), the others through `mount` (the E2B faces in
 * `faces/e2b/e2b.ts`), each checking credentials as `keys/auth.ts` says.
 *
 * @module
 */
import type { Hono } from "hono";
import { DatabaseSync } from "node:sqlite";
import { FleetVolumes } from "./volumes/fleet_volumes.ts";
import { VolumeTable } from "./volumes/table.ts";
import { EtcdVolumeTable } from "./volumes/etcd_table.ts";
import { bearerBytesCheck, callerCheck, fleetTokenCheck } from "./keys/auth.ts";
import { doorAnswer, isOwnAddress, type ListenAddress, newGatewayInstanceId } from "./door.ts";
import { Fleet } from "./fleet/fleet.ts";
import { Finder, type LookupDigestMode, type RecentLookup } from "./finder/finder.ts";
import { RecentCreates, recentCreatesTtlSeconds } from "./etcd/recent.ts";
import { teamScopedName } from "../shared/teams.ts";
import { ApiKeys } from "./keys/keys.ts";
import { TeamLimits } from "./keys/team_limits.ts";
import { EtcdTeamLedger, type TeamLedger } from "./keys/team_ledger.ts";
import { createNativeFace } from "./faces/native.ts";
import type { H1Client } from "../shared/http1/mod.ts";
import type { GatewayBytesLane } from "./faces/bytes_lane.ts";
import type { GatewayParts } from "./faces/parts.ts";
import { Placer } from "./placer/placer.ts";
import { ledgerSeqOf } from "./routing/create.ts";
import { GatewayRouting } from "./routing/routing.ts";
import { LifecycleEvents } from "./observe/lifecycle.ts";
import { GatewayMetrics } from "./observe/metrics.ts";
import { mountOperatorView } from "./faces/operator.ts";
import { mountE2b } from "./faces/e2b/e2b.ts";
import { gatewayOptionErrors } from "./options.ts";
import { PlacementLog } from "./placer/placement_log.ts";
import { createPortProxy, type PortProxy } from "./faces/ports.ts";
import { createDomainFront } from "./faces/sandbox_domain.ts";
import { type WebhookOptions, WebhookSender } from "./observe/webhooks.ts";
import { AccessTokens } from "../shared/access_tokens.ts";
import { EtcdClient } from "./etcd/client.ts";
import { EtcdSession } from "./etcd/session.ts";
import { EtcdSlots, type Slots } from "./routing/slots.ts";
import { FleetSync } from "./fleet/sync.ts";
import { KeySync } from "./keys/sync.ts";
import { type Clock, systemClock, systemTimers, type Timers } from "../shared/clock.ts";
import { type Log, silentLog } from "../shared/log.ts";
import denoJson from "../deno.json" with { type: "json" };
import { asFetch, type FetchHandler } from "../shared/fetch_handler.ts";

export type { GatewayParts } from "./faces/parts.ts";

/** Options for {@linkcode createGateway}. */
export interface GatewayOptions {
  /** The fleet token: clients and nodes present it, and the gateway forwards with it. */
  token: string;
  /**
   * The Fleet's table and the key table; `main.ts` passes
   * `openExclusiveDatabase(path, "DORMICE_GATEWAY_DB")`. A private in-memory database by default.
   */
  database?: DatabaseSync;
  /**
   * Reject a node above this CPU %: above 0, at most 100.
   *
   * @default {70}
   */
  cpuLimitPct?: number;
  /**
   * Reject a node at this many active + in-flight sandboxes.
   *
   * @default {400}
   */
  activeLimit?: number;
  /**
   * Reject a node with less available data disk, GB.
   *
   * @default {10}
   */
  minDiskGB?: number;
  /**
   * One deadline for a lookup round, connect included, ms (at most 60,000).
   *
   * @default {2000}
   */
  lookupTimeoutMs?: number;
  /**
   * Nodes one lookup round asks at once (`FinderOptions.lookupConcurrency`), 1 to 4096.
   *
   * @default {128}
   */
  lookupConcurrency?: number;
  /**
   * Whether a lookup miss may skip nodes whose digest rules the key out (`FinderOptions`):
   * `"on"` by default: trusts the digests of nodes that push creates made behind the gateway's
   * back, and in shared mode (`etcd`) also asks the node a key's record of a recent create
   * names (every gateway publishes its creates there); `"off"` asks every node; `"sole-writer"`
   * only while this gateway is the one way sandboxes are created on its nodes
   * (docs/lookup-digest.md).
   *
   * @default {"on"}
   */
  lookupDigests?: LookupDigestMode;
  /**
   * Bound of each node's answer to a fleet-wide listing, ms.
   *
   * @default {5000}
   */
  fanOutTimeoutMs?: number;
  /**
   * Bound of a forwarded request's wait for the node's head, once its body is sent, ms (see
   * `GatewayRoutingOptions.headTimeoutMs`).
   *
   * @default {120000}
   */
  headTimeoutMs?: number;
  /**
   * A node silent this long (ms) is declared dead and the names it held are free
   * (`FleetOptions.deadAfterMs`); 0 never declares one.
   *
   * @default {600000}
   */
  nodeDeadAfterMs?: number;
  /**
   * Finder cache entries per index.
   *
   * @default {100000}
   */
  cacheSize?: number;
  /**
   * Cap of a JSON request body the gateway reads to route (native verbs, E2B control plane),
   * bytes; envd and `/files` stream through uncapped, the node caps them.
   *
   * @default {33554432}
   */
  maxJsonBodyBytes?: number;
  /** Time source; the real clock by default. */
  clock?: Clock;
  /**
   * The timers the sweep runs on; the real ones by default (a `FakeClock` is both, for tests).
   */
  timers?: Timers;
  /**
   * HTTP client to the nodes; the global `fetch` (pooled connections) by default. Any
   * `(request) => Response` handler serves, e.g. `(r) => app.request(r)` of a Hono app.
   */
  fetch?: FetchHandler;
  /** Where events go; silent by default. */
  log?: Log;
  /**
   * Where the gateway listens (`main.ts` passes `DORMICE_GATEWAY_HOST` and `_PORT`), so a
   * check-in whose endpoint is the gateway itself is refused at once (see `isOwnAddress`).
   * Unknown by default: the hop marker still refuses the loop when it happens.
   */
  listenAddress?: ListenAddress;
  /**
   * This gateway's id in the hop marker (`x-dormice-hop`) of every request it sends; a request
   * that comes back with it is refused with a 508. A fresh random id by default.
   */
  instanceId?: string;
  /**
   * Which faces to serve beside the native one (the root: `/healthz`, the fleet verbs nodes check
   * in with, the native sandbox verbs). Every face is served by default; set one to `false` to
   * leave it out.
   *
   * @default {{ e2b: true, operator: true, ports: true }}
   */
  faces?: GatewayFaces;
  /**
   * How often (ms) the gateway sweeps for nodes that went down, announcing each in the log and to
   * the webhook; `0` leaves the sweep to the caller ({@linkcode Gateway.sweep}). `close()` stops
   * it.
   *
   * @default {1000}
   */
  sweepIntervalMs?: number;
  /**
   * Where lifecycle events are POSTed, signed with `secret` (`DORMICE_WEBHOOK_URL`,
   * `DORMICE_WEBHOOK_SECRET`; see `observe/webhooks.ts`); none are sent without it.
   */
  webhook?: WebhookOptions;
  /**
   * Shared mode (`DORMICE_GATEWAY_ETCD`): the slots and the Fleet live in etcd, so several
   * gateways front one fleet (see docs/shared-mode.md). Absent: the embedded default.
   */
  etcd?: SharedModeOptions;
  /**
   * The sandbox domain (`DORMICE_SANDBOX_DOMAIN`): requests are then routed by Host first, as
   * `faces/sandbox_domain.ts` says (`api.<domain>` to the E2B control plane mounted at `/e2b/api`,
   * `<port>-<id>.<domain>` to envd or that sandbox port), and E2B answers carry it as `domain`.
   * The E2B faces (on unless `faces.e2b` is `false`) answer for the control plane and envd.
   */
  sandboxDomain?: string;
}

/**
 * {@linkcode buildGateway}'s options: {@linkcode GatewayOptions} and the daemon's own (the bytes
 * engine's client, faces of one's own on the root Hono app).
 */
export interface GatewayBuildOptions extends GatewayOptions {
  /**
   * The gateway's HTTP/1.1 client to the nodes (`shared/http1/client.ts`): with it, `fetch` defaults to
   * its `fetch`, and the gateway has a `lane` for the bytes engine.
   */
  nodeClient?: H1Client;
  /**
   * Mounts more faces before the app serves its first request (Hono locks its router then).
   * It runs after the root's bearer gate and before the native verbs, so root middleware it adds
   * sees those verbs first. Paths under `/e2b/` and `/files` are left to the mounted faces, which
   * answer auth and errors in their own dialect. A POST to a routed native verb (`/execCommand`,
   * `/getSandboxMetrics`, …) is answered before Hono, so middleware mounted at the root does not
   * see it.
   */
  mount?: (app: Hono, gateway: GatewayParts) => void;
}

/** The faces {@linkcode createGateway} serves beside the native one; each `true` by default. */
export interface GatewayFaces {
  /**
   * The E2B control plane at `/e2b/api`, envd at `/e2b/envd` and the SDK's signed `/files` door
   * at the root (`faces/e2b/e2b.ts`).
   *
   * @default {true}
   */
  e2b?: boolean;
  /**
   * The operator's view: `GET /metrics` (Prometheus text) and the fleet page under `/ui`.
   *
   * @default {true}
   */
  operator?: boolean;
  /**
   * A sandbox's ports at `<port>-<id>.<sandboxDomain>` (with `sandboxDomain` only; without it
   * there is no address for them).
   *
   * @default {true}
   */
  ports?: boolean;
}

/** Where shared mode keeps its state. */
export interface SharedModeOptions {
  /** The etcd members' client URLs. */
  endpoints: readonly string[];
  /**
   * This fleet's key prefix.
   *
   * @default {"/dormice/"}
   */
  prefix?: string;
  /**
   * The gateway's lease TTL in seconds.
   *
   * @default {10}
   */
  leaseSeconds?: number;
  /**
   * How often the node table is read back from etcd, ms.
   *
   * @default {1000}
   */
  pollMs?: number;
  /** The HTTP client to etcd; the gateway's `fetch` by default. */
  fetch?: FetchHandler;
}

/** Shared mode's running pieces. */
export interface SharedMode {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The gateway's lease, which every slot it holds is tied to. */
  session: EtcdSession;
  /** Keeps the Fleet in step with etcd's node table. */
  sync: FleetSync;
  /** Keeps the key table in step with etcd's; mints and revokes go through it. */
  keySync: KeySync;
  /** Stops the sync and revokes the lease, so the slots it held are free at once. */
  close(): Promise<void>;
}

/** A built gateway: serve `fetch`, and `close()` it (or `await using` it) when done. */
export interface Gateway {
  /**
   * Serves every route, after the door (`door.ts`: a request carrying this gateway's own hop
   * marker is a 508, a path with dot segments a 400). Mount this in `Deno.serve` or an
   * embedder's Hono app.
   */
  fetch(request: Request): Promise<Response>;
  /** The nodes that checked in, with their last readings (the `listNodes` answer). */
  fleet: Fleet;
  /** Which node holds a sandbox. */
  finder: Finder;
  /** Which node takes a new sandbox. */
  placer: Placer;
  /** This gateway's id in the hop marker of the requests it sends. */
  instanceId: string;
  /**
   * Announces nodes that went down; the gateway calls it every `sweepIntervalMs` itself, so call
   * it only with `sweepIntervalMs: 0`.
   */
  sweep(): string[];
  /**
   * Stops the sweep, closes the database (node and key tables) when the gateway opened it itself,
   * stops the webhook sender (events not yet delivered are logged as lost) and, in shared mode,
   * the sync and the lease; resolves once all of that is done. Calling it again returns the same
   * promise.
   */
  close(): Promise<void>;
  /** `await using gateway = createGateway(…)` closes it at the end of the scope. */
  [Symbol.asyncDispose](): Promise<void>;
}

/** {@linkcode buildGateway}'s gateway: the public one with every part a face builds on. */
export interface BuiltGateway extends Gateway, GatewayParts {
  /** The root Hono app (mount more faces through the `mount` option). */
  app: Hono;
  /**
   * The routed verbs served from their bytes (`faces/bytes_lane.ts`), for `serveGuarded`'s bytes
   * engine; present when `nodeClient` was given and no sandbox domain routes by Host.
   */
  lane?: GatewayBytesLane;
  /** The webhook queue, when `webhook` was given. */
  webhooks?: WebhookSender;
  /** Shared mode's pieces, when `etcd` was given. */
  shared?: SharedMode;
}

/**
 * Builds the gateway: a Fleet, a Finder and a Placer over it, the routing rules over those three,
 * and every face. The native face is the root (`GET /healthz` open, the fleet verbs `checkIn`,
 * `listNodes`, `removeNode`, and the native sandbox verbs routed to the node that holds the
 * sandbox, or placed for `acquireSandbox`); the E2B faces, the operator's view and, with a sandbox
 * domain, the ports are served beside it unless `faces` leaves them out; `mount` adds more. One
 * fleet token guards every route but `/healthz` and those the E2B faces check themselves (see
 * `keys/auth.ts`). The gateway sweeps for down nodes on its own timer until `close()`.
 *
 * @throws {TypeError} naming every option that is wrong (e.g. a `token` shorter than 32
 *   characters, `cpuLimitPct` above 100) and what to pass instead.
 *
 * @example
 * ```ts
 * import { createGateway } from "@dormice/cluster/gateway";
 * await using gateway = createGateway({ token: "t".repeat(32) });
 * const res = await gateway.fetch(new Request("http://gw/healthz"));
 * console.log(res.status); // 200
 * ```
 */
export function createGateway(options: GatewayOptions): Gateway {
  return buildGateway(options);
}

/**
 * {@linkcode createGateway} for the daemon and for faces of one's own: the same gateway, with its
 * parts (routing, keys, metrics, the root Hono app, …) and the `nodeClient` and `mount` options.
 *
 * @example
 * ```ts
 * import { buildGateway } from "./app.ts";
 * await using gateway = buildGateway({
 *   token: "t".repeat(32),
 *   mount: (app, parts) => app.get("/hello", (c) => c.json({ nodes: parts.fleet.size })),
 * });
 * const res = await gateway.fetch(
 *   new Request("http://gw/hello", { headers: { authorization: `Bearer ${"t".repeat(32)}` } }),
 * );
 * console.log(res.status); // 200
 * ```
 */
export function buildGateway(options: GatewayBuildOptions): BuiltGateway {
  const {
    token,
    database,
    cpuLimitPct,
    activeLimit,
    minDiskGB,
    lookupTimeoutMs,
    lookupConcurrency,
    lookupDigests = "on",
    fanOutTimeoutMs,
    headTimeoutMs,
    cacheSize,
    maxJsonBodyBytes,
    clock = systemClock,
    nodeClient,
    fetch: fetchOption,
    log = silentLog,
    listenAddress,
    instanceId = newGatewayInstanceId(),
  } = options;
  const fetchFn = fetchOption ? asFetch(fetchOption) : nodeClient?.fetch ?? globalThis.fetch;
  const refused = gatewayOptionErrors(options);
  if (refused.length > 0) {
    throw new TypeError(`Cannot create the gateway: ${refused.join("; ")}`);
  }
  // The key table lives beside the node table: one file, one lock, one backup.
  const db = database ?? new DatabaseSync(":memory:");
  const metrics = new GatewayMetrics({ build: `${denoJson.name}@${denoJson.version}` });
  const placements = new PlacementLog({ clock });
  const webhooks = options.webhook === undefined ? undefined : new WebhookSender({
    log,
    clock,
    registry: metrics.registry,
    ...options.webhook,
  });
  // The events need the Finder, built after the Fleet; onDown runs only from sweep(), long after.
  const late: { events?: LifecycleEvents; sync?: FleetSync } = {};
  const deadAfterMs = options.nodeDeadAfterMs ?? 600_000;
  const fleet = new Fleet({
    database: db,
    clock,
    log,
    deadAfterMs,
    onDown: (node) => late.events?.nodeLost(node),
    // removeNode only, long after `finder` and `placer` below exist.
    onRemove: (node) => {
      finder.forgetNode(node.id);
      placer.forgetNode(node.id);
      late.sync?.removed(node.id);
    },
    isOwnEndpoint: listenAddress && ((endpoint) => isOwnAddress(endpoint, listenAddress)),
    onCheckIn: options.etcd && ((body, at) => late.sync?.written(body, at)),
  });
  const keys = new ApiKeys({ database: db, clock, log });
  const shared = options.etcd &&
    startShared(options.etcd, fleet, keys, fetchFn, log, clock, deadAfterMs);
  late.sync = shared?.mode.sync;
  const limits = new TeamLimits({ fleet, clock, ledger: shared?.ledger });
  const finder = new Finder({
    fleet,
    token,
    timeoutMs: lookupTimeoutMs,
    lookupConcurrency,
    // Shared mode: every gateway's recent creates are read from etcd (docs/lookup-digest.md).
    lookupDigests,
    recent: shared?.recent,
    cacheSize,
    fetch: fetchFn,
    clock,
    log,
    metrics,
    hopMarker: instanceId,
  });
  const events = new LifecycleEvents({
    finder,
    clock,
    sink: webhooks && ((e) => webhooks.send(e)),
  });
  late.events = events;
  const placer = new Placer({ fleet, cpuLimitPct, activeLimit, minDiskGB });
  // Logged so a post-mortem can replay the power-of-two-choices picks (Placer seed option).
  log("info", "placer ready", { seed: placer.seed });
  const routing = new GatewayRouting({
    fleet,
    finder,
    placer,
    token,
    fetch: fetchFn,
    log,
    fanOutTimeoutMs,
    fanOutConcurrency: lookupConcurrency,
    headTimeoutMs,
    slots: shared?.slots,
    publishId: shared && ((id, nodeId) => shared.recent.records.publishId(id, nodeId)),
    onDestroyed: (found, answer) =>
      limits.destroyed(found.node.id, found.sandbox.team ?? "default", ledgerSeqOf(answer.headers)),
    observer: {
      placed: (key, pick) => {
        metrics.placement(pick);
        placements.record(key, pick);
      },
      forwarded: (path, status, seconds, found) => {
        metrics.forwarded(path, status, seconds);
        events.forwarded(path, status, found);
      },
      created: (node, sandbox, path) => events.created(node, sandbox, path),
      destroyed: (found, path) => events.destroyed(found, path),
    },
    hopMarker: instanceId,
  });
  metrics.observe({ fleet, finder, slots: routing.slots });
  const authorized = fleetTokenCheck(token);
  const identify = callerCheck(token, keys, shared?.mode.keySync.unconfirmed);
  const accessTokens = AccessTokens.fromFleetToken(token);
  const jsonBodyCap = {
    maxBytes: maxJsonBodyBytes,
    capVariable: "DORMICE_GATEWAY_JSON_BODY_LIMIT_MB",
  };
  const parts: GatewayParts = {
    fleet,
    finder,
    placer,
    routing,
    authorized,
    identify,
    identifyBearer: bearerBytesCheck(token, identify),
    keys,
    keySync: shared?.mode.keySync,
    recordDirect: shared &&
      ((nodeId, created) =>
        shared.recent.records.publishDirect(
          teamScopedName(created.team, created.name),
          created.id,
          nodeId,
        )),
    limits,
    accessTokens,
    log,
    metrics,
    placements,
    lifecycle: events,
    jsonBodyCap,
    sandboxDomain: options.sandboxDomain,
  };
  // The volume table lives beside the node and key tables (one file, one lock, one backup); in
  // shared mode, in etcd, so every gateway of the fleet knows every volume.
  parts.volumes = new FleetVolumes(
    parts,
    shared
      ? new EtcdVolumeTable({
        client: shared.mode.client,
        session: shared.mode.session,
        prefix: options.etcd?.prefix ?? "/dormice/",
      })
      : new VolumeTable(db),
  );
  const faces = options.faces ?? {};
  const native = createNativeFace(parts, {
    mount: (app, p) => {
      if (faces.operator !== false) mountOperatorView(app, p);
      if (faces.e2b !== false) mountE2b(app, p);
      options.mount?.(app, p);
    },
  });
  const ports = faces.ports === false ? noPorts : createPortProxy(parts);
  const served = options.sandboxDomain === undefined ? native.fetch : createDomainFront({
    domain: options.sandboxDomain,
    next: native.fetch,
    port: ports,
  });
  // Down is decided on read; the sweep only announces transitions (log, webhook).
  const sweepMs = options.sweepIntervalMs ?? 1000;
  const timers = options.timers ?? systemTimers;
  let sweeper: ReturnType<Timers["setTimer"]> | undefined;
  const sweepSoon = () => {
    sweeper = timers.setTimer(() => {
      fleet.sweep();
      if (closing === undefined) sweepSoon();
    }, sweepMs);
  };
  if (sweepMs > 0) sweepSoon();
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> =>
    closing ??= (() => {
      timers.clearTimer(sweeper);
      const pending = [webhooks?.close(), shared?.mode.close()];
      // Writes the batched check-in times before the database goes.
      fleet.close();
      if (database === undefined && db.isOpen) db.close();
      return Promise.all(pending).then(() => {});
    })();
  return {
    ...parts,
    app: native.app,
    instanceId,
    fetch: (request) => {
      const refused = doorAnswer(request, instanceId);
      return refused === undefined ? served(request) : Promise.resolve(refused);
    },
    // By Host first with a domain: the lane, which routes by path, would skip that.
    lane: nodeClient && options.sandboxDomain === undefined ? native.lane(nodeClient) : undefined,
    webhooks,
    shared: shared?.mode,
    sweep: () => fleet.sweep(),
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** The port hop with `faces.ports: false`, in the shape of the port hop's own errors. */
const noPorts: PortProxy = (_request, sandboxId) =>
  Promise.resolve(
    Response.json({
      message: "This gateway does not serve sandbox ports (created with faces.ports false): " +
        "reach the port through a gateway that serves them",
      sandboxId,
      code: 404,
    }, { status: 404 }),
  );

function startShared(
  options: SharedModeOptions,
  fleet: Fleet,
  keys: ApiKeys,
  fetchFn: typeof fetch,
  log: Log,
  clock: Clock,
  deadAfterMs: number,
): {
  mode: SharedMode;
  slots: Slots;
  ledger: TeamLedger;
  recent: RecentLookup & { records: RecentCreates };
} {
  const prefix = options.prefix ?? "/dormice/";
  const client = new EtcdClient({
    endpoints: options.endpoints,
    fetch: options.fetch ? asFetch(options.fetch) : fetchFn,
  });
  const session = new EtcdSession({ client, ttlSeconds: options.leaseSeconds, log });
  // A node's digest is trusted while its last check-in is younger than the time after which it
  // is declared dead (or 10 minutes, when none is declared), and every create's record outlives
  // that window plus the create's own bound (docs/lookup-digest.md, "Several gateways").
  const trustMs = (deadAfterMs > 0 ? deadAfterMs : 600_000) + 10_000;
  const records = new RecentCreates({
    client,
    prefix,
    ttlSeconds: recentCreatesTtlSeconds(trustMs, 120_000),
  });
  const slots = new EtcdSlots({ client, session, prefix, recent: records });
  const sync = new FleetSync({ client, prefix, fleet, pollMs: options.pollMs, log });
  const keySync = new KeySync({ client, prefix, keys, pollMs: options.pollMs, log, clock });
  sync.start();
  keySync.start();
  // The lease at once, so a first create does not pay for it and an unreachable etcd is logged
  // at boot rather than at the first create.
  void session.lease().catch(() => {});
  let closing: Promise<void> | undefined;
  return {
    slots,
    recent: { records, trustMs, nodesFor: (by, key) => records.nodesFor(by, key) },
    ledger: new EtcdTeamLedger({ client, session, prefix, clock }),
    mode: {
      client,
      session,
      sync,
      keySync,
      close: () =>
        closing ??= Promise.all([sync.stop(), keySync.stop()]).then(() => session.close()),
    },
  };
}
