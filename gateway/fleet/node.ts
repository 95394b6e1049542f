/**
 * The node as the Fleet's readers see it: the live record of one node, what `listNodes` shows
 * of it, and the {@linkcode NodeDirectory} the Placer and Finder read. Kept apart from
 * `fleet.ts` so those readers (and the fleet page, the lookups, a test's fake directory) depend
 * on the shape of a node, not on the Fleet's table and check-in rules. The Fleet's own mutable
 * record ({@linkcode Member}) is filled in here too, from a row or a check-in, so every field a
 * check-in sets is set in one place.
 *
 * @module
 */
import type { CheckIn, HostReading } from "../../shared/schemas.ts";
import type { PoolReport } from "../../shared/pools.ts";
import type { LookupDigest } from "../../shared/lookup_digest.ts";

/**
 * One node as the Fleet knows it. The object is live: the Fleet updates it in place at each
 * check-in (so a cached reference always shows the current endpoint and reading) and drops it on
 * `removeNode`. Treat it as read-only.
 */
export interface FleetNode {
  /** The node's `DORMICE_NODE_ID`. */
  readonly id: string;
  /** The origin the gateway forwards to. */
  readonly endpoint: string;
  /** The node's own check-in interval; its down and move rules are counted in it. */
  readonly intervalSeconds: number;
  /** The build string the node reported. */
  readonly build: string;
  /** When this id first checked in (ms since the epoch, gateway clock). */
  readonly firstSeen: number;
  /** When this id last checked in (ms since the epoch, gateway clock; persisted). */
  readonly lastCheckIn: number;
  /** Whether it checked in since this gateway process started. */
  readonly heardSinceStart: boolean;
  /** The last reading, kept in memory only; `null` until it checks in with this process. */
  readonly reading: HostReading | null;
  /**
   * Changes at every check-in and is unique across the Fleet's life, so a consumer that keeps
   * per-reading state (the Placer's in-flight count) can tell a new reading from the old one
   * without a callback.
   */
  readonly readingSeq: number;
  /** Its warm pools as of its last check-in (empty for a node without pools). */
  readonly pools: readonly PoolReport[];
  /** Templates whose images it holds; `null` when it does not say (it may serve any). */
  readonly templates: readonly string[] | null;
  /** Volumes it can mount (names). */
  readonly volumes: readonly string[];
  /** Whether it enforces egress address rules (false for a node that does not say). */
  readonly egressRules: boolean;
  /**
   * Snapshot ids it advertised at its last check-in (at most `MAX_CHECK_IN_SNAPSHOTS`, the
   * newest). Optional so a test's or embedder's directory may omit it: absent reads as none.
   */
  readonly snapshots?: ReadonlySet<string>;
  /** The `<team>/<name>` of the named snapshots it holds (built templates among them). */
  readonly snapshotNames?: readonly string[];
  /** It holds more snapshots than it advertised: it may hold any snapshot no node lists. */
  readonly snapshotsTruncated?: boolean;
  /** The registry it pulls snapshots from (`DORMICE_SNAPSHOT_REGISTRY`), when it has one. */
  readonly snapshotRegistry?: string;
  /** `false` when it takes and serves no heal (`DORMICE_SNAPSHOT_HEAL=off`); absent: it does. */
  readonly heals?: boolean;
  /** The digest of its fleet-invariant settings; `null` when it does not send one. */
  readonly configDigest: string | null;
  /**
   * The lookup digest of its last check-in to this process, or `null` (a node that sends none,
   * or not heard since this process started). Whether a lookup may trust it is the Finder's
   * rule (docs/lookup-digest.md). Optional so a test's or embedder's directory may omit it:
   * absent reads as `null`.
   */
  readonly lookupDigest?: LookupDigest | null;
  /** Check-ins heard by this process, so a rule can wait for "two check-ins after X". */
  readonly checkInsSinceStart?: number;
}

/** What `listNodes` shows for one node. */
export interface NodeSummary {
  /** The node's `DORMICE_NODE_ID`, what `removeNode` takes. */
  id: string;
  /** The origin the gateway forwards to. */
  endpoint: string;
  /**
   * `up`; `down` (silent past two intervals, or not heard since this gateway started); or `dead`
   * (silent past `DORMICE_GATEWAY_NODE_DEAD_AFTER_S`: its sandboxes are taken as gone and their
   * names may be built elsewhere until it checks in again).
   */
  state: "up" | "down" | "dead";
  /**
   * Shared mode: `true` when this gateway cannot read etcd and has heard nothing of the node for
   * two of its intervals. `state` is then `down` by what this gateway heard, while the node may
   * be checking in with another gateway: its sandboxes are still routed, each request bounded by
   * a health check of the node (docs/shared-mode.md).
   */
  unheard: boolean;
  /** Milliseconds since its last check-in (persisted, so it survives a gateway restart). */
  lastCheckInAgeMs: number;
  /** Its check-in interval: `state` turns `down` after two of them without a check-in. */
  intervalSeconds: number;
  /** The build string it reported, to spot a node running other software. */
  build: string;
  /** When it first checked in, ISO 8601. */
  firstSeen: string;
  /** Its last reading, or `null` when it has not checked in with this gateway process. */
  reading: HostReading | null;
  /** Placements counted against it since its last reading (from the `inFlight` callback). */
  inFlight: number;
  /** Its warm pools: template, size, warm and target. */
  pools: readonly PoolReport[];
  /** Templates whose images it holds; `null` when it does not say. */
  templates: readonly string[] | null;
  /** The `<team>/<name>` of the named snapshots it holds: built templates by name. */
  snapshotNames?: readonly string[];
  /** Volumes it can mount. */
  volumes: readonly string[];
  /** Whether it enforces egress address rules. */
  egressRules: boolean;
  /** The digest of its fleet-invariant settings, or `null`. */
  configDigest: string | null;
  /**
   * True when its digest differs from the one most nodes report: its templates, sandbox domain
   * or signing secret are not the fleet's. Warn-only: it keeps serving (a rolling change is a
   * legitimate, passing mismatch).
   */
  configDigestMismatch: boolean;
}

/** What a check-in did. */
export type CheckInOutcome = "joined" | "updated";

/**
 * What the Placer and Finder need from a fleet: the Fleet implements it, a test may fake it.
 */
export interface NodeDirectory {
  /** Every registered node, up or down. */
  nodes(): Iterable<FleetNode>;
  /** The node with `id`, or `undefined`. */
  get(id: string): FleetNode | undefined;
  /** Whether `node` is down at `now` (the directory's own clock when omitted). */
  isDown(node: string | FleetNode, now?: number): boolean;
  /**
   * Whether `node` is declared dead at `now`: lookups do not ask it and its cached sandboxes are
   * forgotten. Optional: a directory without it declares no node dead.
   */
  isDead?(node: string | FleetNode, now?: number): boolean;
  /** The directory's clock, so every rule about time reads one clock. */
  now(): number;
}

/** What of a node the Fleet's table keeps across a restart (`table.ts`). */
export type NodeRow = Pick<
  FleetNode,
  "id" | "endpoint" | "intervalSeconds" | "build" | "firstSeen" | "lastCheckIn"
>;

/** The Fleet's own record of a node: the live {@linkcode FleetNode} it hands out, writable. */
export interface Member extends FleetNode {
  id: string;
  endpoint: string;
  intervalSeconds: number;
  build: string;
  firstSeen: number;
  lastCheckIn: number;
  heardSinceStart: boolean;
  reading: HostReading | null;
  readingSeq: number;
  pools: PoolReport[];
  templates: string[] | null;
  volumes: string[];
  egressRules: boolean;
  snapshots: Set<string>;
  snapshotsTruncated: boolean;
  snapshotRegistry?: string;
  heals?: boolean;
  configDigest: string | null;
  lookupDigest: LookupDigest | null;
  checkInsSinceStart: number;
  /** The last up/down state announced in the log and hooks. */
  announcedUp: boolean;
  /** Whether its death was announced in the log (until it checks in again). */
  announcedDead: boolean;
}

/**
 * A node loaded from the table at start: down until it checks in with this process (no
 * reading, nothing announced).
 *
 * @example
 * ```ts ignore
 * const member = loadedMember(row, ++seq);
 * ```
 */
export function loadedMember(row: NodeRow, readingSeq: number): Member {
  return {
    ...row,
    heardSinceStart: false,
    reading: null,
    readingSeq,
    pools: [],
    templates: null,
    volumes: [],
    egressRules: false,
    snapshots: new Set(),
    snapshotsTruncated: false,
    configDigest: null,
    lookupDigest: null,
    checkInsSinceStart: 0,
    announcedUp: false,
    announcedDead: false,
  };
}

/**
 * A new id's record from its first check-in at `now`: heard, up and announced.
 *
 * @example
 * ```ts ignore
 * const member = joinedMember(body, now, ++seq, warnings.lookupDigestOf(body));
 * ```
 */
export function joinedMember(
  body: CheckIn,
  now: number,
  readingSeq: number,
  lookupDigest: LookupDigest | null,
): Member {
  return {
    id: body.nodeId,
    endpoint: body.endpoint,
    intervalSeconds: body.intervalSeconds,
    build: body.build,
    firstSeen: now,
    lastCheckIn: now,
    heardSinceStart: true,
    reading: body.reading,
    readingSeq,
    ...capabilitiesOf(body),
    lookupDigest,
    checkInsSinceStart: 1,
    announcedUp: true,
    announcedDead: false,
  };
}

/**
 * A known node's check-in at `now`, applied in place (the endpoint is the caller's: a move has
 * its own rule); `announcedUp` is left to the caller, which logs the transition.
 *
 * @example
 * ```ts ignore
 * applyCheckIn(known, body, now, ++seq, warnings.lookupDigestOf(body));
 * ```
 */
export function applyCheckIn(
  known: Member,
  body: CheckIn,
  now: number,
  readingSeq: number,
  lookupDigest: LookupDigest | null,
): void {
  known.intervalSeconds = body.intervalSeconds;
  known.build = body.build;
  known.lastCheckIn = now;
  known.reading = body.reading;
  known.readingSeq = readingSeq;
  Object.assign(known, capabilitiesOf(body));
  known.lookupDigest = lookupDigest;
  known.checkInsSinceStart++;
  known.heardSinceStart = true;
}

/** What a check-in says the node can serve; a field it leaves out keeps its old meaning. */
function capabilitiesOf(body: CheckIn) {
  return {
    pools: body.pools ?? [],
    templates: body.templates ?? null,
    volumes: body.volumes ?? [],
    egressRules: body.egressRules ?? false,
    snapshots: new Set(body.snapshots ?? []),
    snapshotsTruncated: body.snapshotsTruncated ?? false,
    snapshotNames: body.snapshotNames ?? [],
    snapshotRegistry: body.snapshotRegistry,
    heals: body.heals,
    configDigest: body.configDigest ?? null,
  };
}
