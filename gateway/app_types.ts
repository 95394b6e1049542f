/**
 * The shapes of {@linkcode createGateway} and {@linkcode buildGateway} (`app.ts`): the options an
 * embedder passes (shared mode's and the faces' among them) and the gateway objects they get
 * back.
 *
 * @module
 */
import type { Hono } from "hono";
import type { DatabaseSync } from "node:sqlite";
import type { ListenAddress } from "./door.ts";
import type { Fleet } from "./fleet/fleet.ts";
import type { Finder, LookupDigestMode } from "./finder/finder.ts";
import type { H1Client } from "../shared/http1/mod.ts";
import type { GatewayBytesLane } from "./faces/bytes_lane.ts";
import type { GatewayParts } from "./faces/parts.ts";
import type { Placer } from "./placer/placer.ts";
import type { WebhookOptions, WebhookSender } from "./observe/webhooks.ts";
import type { EtcdClient } from "./etcd/client.ts";
import type { EtcdSession } from "./etcd/session.ts";
import type { FleetSync } from "./fleet/sync.ts";
import type { KeySync } from "./keys/sync.ts";
import type { Clock, Timers } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import type { FetchHandler } from "../shared/fetch_handler.ts";

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
