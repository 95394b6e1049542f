/**
 * {@linkcode GatewayParts}: what `createGateway()` hands each face it mounts. A file of its own so
 * the faces (`faces/native.ts`, `faces/e2b/e2b.ts`) and `app.ts`, which builds the parts and mounts
 * the faces, all import it without importing each other.
 *
 * @module
 */
import type { BearerBytesCheck, CallerCheck } from "../keys/auth.ts";
import type { Fleet } from "../fleet/fleet.ts";
import type { ApiKeys } from "../keys/keys.ts";
import type { KeySync } from "../keys/sync.ts";
import type { TeamLimits } from "../keys/team_limits.ts";
import type { Finder } from "../finder/finder.ts";
import type { Placer } from "../placer/placer.ts";
import type { GatewayRouting } from "../routing/routing.ts";
import type { LifecycleEvents } from "../observe/lifecycle.ts";
import type { GatewayMetrics } from "../observe/metrics.ts";
import type { PlacementLog } from "../placer/placement_log.ts";
import type { AccessTokens } from "../../shared/access_tokens.ts";
import type { BodyCapOptions } from "../../shared/json_body.ts";
import type { Log } from "../../shared/log.ts";
import type { FleetVolumes } from "../volumes/fleet_volumes.ts";

/** The pieces a mounted face builds on; one set per gateway, shared by every face. */
export interface GatewayParts {
  /** The nodes that checked in, with their last readings (the `listNodes` answer). */
  fleet: Fleet;
  /** Which node holds a sandbox: read `cached()` first on a hot path, it never awaits. */
  finder: Finder;
  /** Which node takes a new sandbox; `routing.create` already calls it, a face rarely needs to. */
  placer: Placer;
  /** The routing rules every face shares: locate, stream, create, destroy and fan out. */
  routing: GatewayRouting;
  /** Constant-time check of a presented token against the fleet token (see `keys/auth.ts`). */
  authorized(token: string | undefined): boolean;
  /** Who a presented credential stands for: the operator, a client's key, or nobody. */
  identify: CallerCheck;
  /**
   * The same check of an `Authorization` value given as bytes, the fleet token compared without
   * a string (the bytes lane's); without it the lane decodes the value and asks `identify`.
   */
  identifyBearer?: BearerBytesCheck;
  /** The key table (`createApiKey`, `listApiKeys`, `revokeApiKey`). */
  keys: ApiKeys;
  /** Shared mode: mints and revokes go through etcd first (absent in the embedded default). */
  keySync?: KeySync;
  /**
   * Shared mode: records a create a node made behind the gateways' back (a pushed check-in's
   * `directCreate`) in etcd, so every gateway's lookup asks that node for it; absent with one
   * gateway.
   */
  recordDirect?: (
    nodeId: string,
    created: { team: string; name: string; id?: string },
  ) => Promise<void>;
  /**
   * Shared mode: snapshot ids taken again on a node (a pushed check-in's `snapshotRetaken`),
   * recorded in etcd before the check-in is answered and read by every gateway's create from
   * a snapshot id, so none places it on an older build while its node table lags; absent with
   * one gateway (its node table has the check-in before the take is answered).
   */
  snapshotRetakes?: {
    record(nodeId: string, snapshotId: string): Promise<void>;
    nodes(snapshotId: string): Promise<string[]>;
  };
  /**
   * Shared mode: the template id and node of a team's template build by name
   * (`<team>/<name>`), written in etcd when a build is placed (inside the name's template
   * slot) and read by every gateway before that build is advertised; absent with one gateway.
   */
  templateNames?: {
    record(scopedName: string, templateId: string, nodeId: string): Promise<void>;
    get(scopedName: string): Promise<{ templateId: string; node: string } | undefined>;
    /** The nodes the team's recent builds of template `templateId` (of any) were placed on. */
    nodesOf(team: string, templateId: string | undefined): Promise<string[]>;
    /** Drops the team's records naming template `templateId` (deleted). */
    forget(team: string, templateId: string): Promise<void>;
  };
  /** A key's `maxSandboxes` and `createsPerMinute`, checked where a sandbox is placed. */
  limits: TeamLimits;
  /**
   * The sandboxes' envd access tokens, derived from the fleet token as every node derives them:
   * the envd faces check a request's token (or signed URL) before any node hears of it.
   */
  accessTokens: AccessTokens;
  /** The gateway's log: a face logs its unexpected errors (its 500s) here. */
  log: Log;
  /** The Prometheus series behind `GET /metrics`. */
  metrics: GatewayMetrics;
  /** The recent placement decisions the fleet page shows. */
  placements: PlacementLog;
  /** Lifecycle events for the webhook: the check-in verb hands it what nodes report. */
  lifecycle: LifecycleEvents;
  /** The cap every JSON body the gateway reads is read under: pass it to `readJsonObject`. */
  jsonBodyCap: BodyCapOptions;
  /**
   * The sandbox domain (`DORMICE_SANDBOX_DOMAIN`, e.g. `sbx.example.com`), answered as `domain`
   * in E2B create and connect answers; `undefined` when the gateway serves no domain.
   */
  sandboxDomain?: string;
  /** Managed volumes (E2B `Volume`): their table and routes (`volumes/fleet_volumes.ts`). */
  volumes?: FleetVolumes;
}
