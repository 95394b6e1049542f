/**
 * `createGateway()`: the whole gateway as one object whose `fetch(Request)` an embedder mounts in
 * its own server. This file only wires the pieces together: the door (`door.ts`: loops and dot
 * segments), the Fleet (`fleet/fleet.ts`), the Finder (`finder/finder.ts`) and the Placer
 * (`placer/placer.ts`) under the routing rules (`routing/routing.ts`), and the faces on top: the
 * native face as the root (`faces/native.ts`), the others through `mount` (the E2B faces in
 * `faces/e2b/e2b.ts`), each checking credentials as `keys/auth.ts` says. The options it takes
 * and the gateway objects it gives are declared in `app_types.ts`; shared mode's pieces are
 * started by `app_shared.ts`.
 *
 * @module
 */
import { DatabaseSync } from "node:sqlite";
import { FleetVolumes } from "./volumes/fleet_volumes.ts";
import { VolumeTable } from "./volumes/table.ts";
import { EtcdVolumeTable } from "./volumes/etcd_table.ts";
import { bearerBytesCheck, callerCheck, fleetTokenCheck } from "./keys/auth.ts";
import { doorAnswer, isOwnAddress, newGatewayInstanceId } from "./door.ts";
import { Fleet } from "./fleet/fleet.ts";
import { Finder } from "./finder/finder.ts";
import { teamScopedName } from "../shared/teams.ts";
import { ApiKeys } from "./keys/keys.ts";
import { TeamLimits } from "./keys/team_limits.ts";
import { createNativeFace } from "./faces/native.ts";
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
import { WebhookSender } from "./observe/webhooks.ts";
import { AccessTokens } from "../shared/access_tokens.ts";
import type { FleetSync } from "./fleet/sync.ts";
import { systemClock, systemTimers, type Timers } from "../shared/clock.ts";
import { silentLog } from "../shared/log.ts";
import denoJson from "../deno.json" with { type: "json" };
import { asFetch } from "../shared/fetch_handler.ts";
import type { BuiltGateway, Gateway, GatewayBuildOptions, GatewayOptions } from "./app_types.ts";
import { startShared } from "./app_shared.ts";

export type { GatewayParts } from "./faces/parts.ts";
export type {
  BuiltGateway,
  Gateway,
  GatewayBuildOptions,
  GatewayFaces,
  GatewayOptions,
  SharedMode,
  SharedModeOptions,
} from "./app_types.ts";

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
    snapshotRetakes: shared && {
      record: (nodeId, snapshotId) => shared.recent.records.publishRetaken(snapshotId, nodeId),
      nodes: (snapshotId) => shared.recent.records.retakenOn(snapshotId),
    },
    templateNames: shared && {
      record: (scopedName, templateId, nodeId) =>
        shared.recent.records.publishTemplate(scopedName, templateId, nodeId),
      get: (scopedName) => shared.recent.records.templateNamed(scopedName),
      nodesOf: async (team, templateId) =>
        (await shared.recent.records.templatesOf(team))
          .filter((r) => templateId === undefined || r.templateId === templateId)
          .map((r) => r.node),
      forget: (team, templateId) => shared.recent.records.forgetTemplate(team, templateId),
    },
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
      parts.volumes?.reconciler.tick(clock.now());
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
