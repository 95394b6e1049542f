/**
 * The Fleet: the nodes that checked in, their last readings, and who is up.
 *
 * @module
 */
import { DatabaseSync, type StatementSync } from "node:sqlite";
import type { CheckIn, HostReading } from "../shared/schemas.ts";
import type { PoolReport } from "../shared/pools.ts";
import { compareDigests } from "../shared/config_digest.ts";
import { type Clock, systemClock } from "../shared/clock.ts";
import { ChangeLog, type Log, silentLog } from "../shared/log.ts";
import { HttpError } from "../shared/http_error.ts";
import { LookupDigest } from "../shared/lookup_digest.ts";

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
  /** `up`, or `down` (silent past two intervals, or not heard since this gateway started). */
  state: "up" | "down";
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
  /** Volumes it can mount. */
  volumes: readonly string[];
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
  /** The directory's clock, so every rule about time reads one clock. */
  now(): number;
}

/** Options for {@linkcode Fleet}. */
export interface FleetOptions {
  /**
   * Where the node table lives. The server passes the handle from
   * `openExclusiveDatabase(path, "DORMICE_GATEWAY_DB")`; the default is a private in-memory
   * database (closed by `close()`).
   */
  database?: DatabaseSync;
  /** Time source; the real clock by default. */
  clock?: Clock;
  /** Where events go; silent by default. */
  log?: Log;
  /**
   * A node is down once silent for more than this many of its own intervals. Default 2: one late
   * check-in (a GC pause, a slow network, a busy gateway) must not flap a node out of placement;
   * two in a row is a pattern worth acting on.
   */
  downAfterIntervals?: number;
  /**
   * A second endpoint may take over a live id once the old reporter has been silent this many of
   * its intervals. Default 1: a reporter that is alive checks in within one interval, so a full
   * interval of silence means it stopped, and the node really moved.
   */
  moveAfterIntervals?: number;
  /**
   * Called when a new id checks in for the first time. Runs synchronously inside `checkIn()`,
   * after the node is stored and before `checkIn()` returns; it must not throw (a throw is caught
   * and logged) and should not call back into the Fleet. Start async work without awaiting it.
   */
  onJoin?: (node: FleetNode) => void;
  /**
   * Called once when a node that was up is found down. Runs synchronously inside `sweep()` (the
   * server calls it on a timer), with the same rules as `onJoin`. A node loaded from the
   * database that never checked in with this process was never up, so it gets no `onDown`.
   */
  onDown?: (node: FleetNode) => void;
  /**
   * Called once `removeNode` has dropped a node, so whoever keeps state per node (the Finder's
   * cache and failing-node log, the Placer's in-flight counts) can let it go. Same rules as
   * `onJoin`.
   */
  onRemove?: (node: FleetNode) => void;
  /**
   * Whether an endpoint is the gateway itself (see `isOwnAddress`): such a check-in is refused
   * with a 400, since every lookup and forward to it would come back to the gateway.
   */
  isOwnEndpoint?: (endpoint: string) => boolean;
  /**
   * Called after every check-in this gateway accepted itself (not a replicated one), with the
   * time it was accepted at: shared mode writes it to etcd for the other gateways. Same rules as
   * `onJoin`.
   */
  onCheckIn?: (body: CheckIn, at: number) => void;
}

/** Options of {@linkcode Fleet.checkIn}. */
export interface CheckInApply {
  /**
   * When the check-in was accepted (ms since the epoch): another gateway's time, read from
   * etcd, for a replicated one. The Fleet's clock by default.
   */
  at?: number;
  /**
   * A check-in another gateway already accepted (shared mode): applied as is, without the
   * live-id refusal (that gateway judged it) and without `onCheckIn`.
   */
  replicated?: boolean;
}

interface Member extends FleetNode {
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
  configDigest: string | null;
  lookupDigest: LookupDigest | null;
  checkInsSinceStart: number;
  /** The last up/down state announced in the log and hooks. */
  announcedUp: boolean;
}

interface Row {
  id: string;
  endpoint: string;
  interval_seconds: number;
  build: string;
  first_seen: number;
  last_check_in: number;
}

const schema = `CREATE TABLE IF NOT EXISTS gateway_nodes (
  id TEXT PRIMARY KEY,
  endpoint TEXT NOT NULL,
  interval_seconds REAL NOT NULL,
  build TEXT NOT NULL,
  first_seen INTEGER NOT NULL,
  last_check_in INTEGER NOT NULL
)`;

/**
 * The nodes that checked in. A node joins at its first check-in (there is no registration verb
 * and no nodes file); the table is written only by check-ins and `removeNode`, and each node's
 * last reading is kept in memory only.
 *
 * Rules:
 * - down = silent for more than two of its own intervals, or not heard since this gateway
 *   process started (a row loaded from the database is down until the node checks in);
 * - a second reporter under a live id with another endpoint is a 409 naming both endpoints: the
 *   first keeps the id, and a node that really moved is accepted once the old reporter has been
 *   silent for one of its intervals;
 * - an endpoint move and two ids reporting one endpoint are warned in the log, once per change;
 * - `removeNode` refuses a node that still checks in (409) and an unknown id (404).
 *
 * Down is decided on read (`isDown`), so the Fleet needs no timer; `sweep()` only announces
 * transitions (log and `onDown`) and the server calls it periodically.
 *
 * @example
 * ```ts
 * import { Fleet } from "@dormice/cluster/gateway";
 * const fleet = new Fleet();
 * fleet.checkIn({
 *   nodeId: "a",
 *   endpoint: "http://10.0.0.5:3676",
 *   intervalSeconds: 15,
 *   build: "0.1.0",
 *   reading: {
 *     takenAt: Date.now(), cpuCount: 8, cpuUsedPct: null,
 *     memoryTotalBytes: 16e9, memoryAvailableBytes: 12e9, swapTotalBytes: 0, swapFreeBytes: 0,
 *     dataDisk: null,
 *     sandboxes: { active: 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
 *   },
 * }); // "joined"
 * fleet.isDown("a"); // false
 * fleet.close();
 * ```
 */
export class Fleet implements NodeDirectory {
  #db: DatabaseSync;
  #ownsDb: boolean;
  #clock: Clock;
  #log: Log;
  #changes: ChangeLog;
  #downAfter: number;
  #moveAfter: number;
  #onJoin?: (node: FleetNode) => void;
  #onDown?: (node: FleetNode) => void;
  #onRemove?: (node: FleetNode) => void;
  #isOwnEndpoint?: (endpoint: string) => boolean;
  #onCheckIn?: (body: CheckIn, at: number) => void;
  #members = new Map<string, Member>();
  /** endpoint → ids reporting it, to warn when two ids share one daemon. */
  #byEndpoint = new Map<string, Set<string>>();
  #seq = 0;
  /** Shared mode: when the node table was last read whole (see `replicaAsOf`); else `null`. */
  #asOf: number | null = null;
  #insert: StatementSync;
  #update: StatementSync;
  #remove: StatementSync;

  /** Opens (creating if needed) the node table and loads its rows; every loaded node is down. */
  constructor(options: FleetOptions = {}) {
    const {
      database,
      clock = systemClock,
      log = silentLog,
      downAfterIntervals = 2,
      moveAfterIntervals = 1,
      onJoin,
      onDown,
      onRemove,
      isOwnEndpoint,
      onCheckIn,
    } = options;
    if (!(downAfterIntervals > 0)) {
      throw new RangeError(
        `Cannot create Fleet as 'downAfterIntervals' must be positive: received ${downAfterIntervals}`,
      );
    }
    if (!(moveAfterIntervals > 0)) {
      throw new RangeError(
        `Cannot create Fleet as 'moveAfterIntervals' must be positive: received ${moveAfterIntervals}`,
      );
    }
    this.#db = database ?? new DatabaseSync(":memory:");
    this.#ownsDb = database === undefined;
    this.#clock = clock;
    this.#log = log;
    this.#changes = new ChangeLog(log);
    this.#downAfter = downAfterIntervals;
    this.#moveAfter = moveAfterIntervals;
    this.#onJoin = onJoin;
    this.#onDown = onDown;
    this.#onRemove = onRemove;
    this.#isOwnEndpoint = isOwnEndpoint;
    this.#onCheckIn = onCheckIn;
    this.#db.exec(schema);
    this.#insert = this.#db.prepare(
      `INSERT INTO gateway_nodes (id, endpoint, interval_seconds, build, first_seen, last_check_in)
       VALUES (?, ?, ?, ?, ?, ?)`,
    );
    this.#update = this.#db.prepare(
      `UPDATE gateway_nodes SET endpoint = ?, interval_seconds = ?, build = ?, last_check_in = ?
       WHERE id = ?`,
    );
    this.#remove = this.#db.prepare(`DELETE FROM gateway_nodes WHERE id = ?`);
    const rows = this.#db.prepare(`SELECT * FROM gateway_nodes ORDER BY id`).all() as unknown[];
    for (const raw of rows) {
      const row = raw as Row;
      const member: Member = {
        id: row.id,
        endpoint: row.endpoint,
        intervalSeconds: row.interval_seconds,
        build: row.build,
        firstSeen: row.first_seen,
        lastCheckIn: row.last_check_in,
        heardSinceStart: false,
        reading: null,
        readingSeq: ++this.#seq,
        pools: [],
        templates: null,
        volumes: [],
        configDigest: null,
        lookupDigest: null,
        checkInsSinceStart: 0,
        announcedUp: false,
      };
      this.#members.set(member.id, member);
      this.#indexEndpoint(member.id, member.endpoint);
    }
    if (rows.length > 0) {
      log("info", "fleet loaded from the database; every node is down until it checks in", {
        nodes: rows.length,
      });
      for (const endpoint of this.#byEndpoint.keys()) this.#reportShared(endpoint);
    }
  }

  /** How many nodes are registered. */
  get size(): number {
    return this.#members.size;
  }

  /** The Fleet's clock. */
  now(): number {
    return this.#clock.now();
  }

  /** Every registered node, up or down, in join order (live objects; treat as read-only). */
  nodes(): IterableIterator<FleetNode> {
    return this.#members.values();
  }

  /** The node with `id`, or `undefined`. */
  get(id: string): FleetNode | undefined {
    return this.#members.get(id);
  }

  /**
   * Whether a node is down: silent for more than two of its intervals, or not heard since this
   * gateway process started. An unknown id is down.
   *
   * @example
   * ```ts
   * import { Fleet } from "@dormice/cluster/gateway";
   * new Fleet().isDown("nobody"); // true
   * ```
   */
  isDown(node: string | FleetNode, now: number = this.#clock.now()): boolean {
    const m = typeof node === "string" ? this.#members.get(node) : node;
    if (m === undefined || !m.heardSinceStart) return true;
    return this.#silentFor(m, now) > this.#downAfter * m.intervalSeconds * 1000;
  }

  /**
   * How long `m` has been without news at `now`. In shared mode the other gateways' check-ins
   * arrive only with a read of etcd, so the time since the last read began is an absence of
   * news, not of check-ins, and is not counted: a read held up by an etcd election (seconds on a
   * loaded machine) must not make every node checking in elsewhere look down. A check-in heard
   * here since is later than that, so its silence starts at 0.
   */
  #silentFor(m: FleetNode, now: number): number {
    const until = this.#asOf === null ? now : Math.min(now, this.#asOf);
    return until - m.lastCheckIn;
  }

  /**
   * Whether a node has been silent for more than two of its intervals, by its last check-in
   * (persisted, so this holds across a gateway restart). Unlike `isDown`, a node this process has
   * not heard yet but whose last check-in is recent is not silent: right after a restart every
   * node is down until it checks in, and treating their sandboxes as unreachable would make each
   * gateway restart an outage of one interval. An unknown id is silent.
   *
   * @example
   * ```ts
   * import { Fleet } from "@dormice/cluster/gateway";
   * new Fleet().isSilent("nobody"); // true
   * ```
   */
  isSilent(node: string | FleetNode, now: number = this.#clock.now()): boolean {
    const m = typeof node === "string" ? this.#members.get(node) : node;
    if (m === undefined) return true;
    return this.#silentFor(m, now) > this.#downAfter * m.intervalSeconds * 1000;
  }

  /**
   * Shared mode: `at` is when the last whole read of the node table in etcd began (`null`: not
   * shared, the default). `isDown` and `isSilent` count no silence after `at`: a node that checks
   * in with another gateway is not judged down here because a read is slow or etcd is away (its
   * sandboxes keep answering; one that really died costs its requests the head timeout instead
   * of an immediate 503, and creates wait for etcd anyway). The cost in step: a death is seen
   * one read (about a second) later.
   *
   * @example
   * ```ts
   * import { Fleet } from "@dormice/cluster/gateway";
   * const fleet = new Fleet();
   * fleet.replicaAsOf(Date.now()); // a read of etcd that began now has ended
   * fleet.close();
   * ```
   */
  replicaAsOf(at: number | null): void {
    this.#asOf = at;
  }

  /**
   * Records a check-in (already validated against `checkInSchema`): joins a new id, or updates a
   * known one (endpoint, interval, build, reading).
   *
   * @throws {HttpError} 409 naming both endpoints when `body.nodeId` is live at another endpoint;
   *   400 when the endpoint is the gateway's own address (`isOwnEndpoint`).
   * @example
   * ```ts ignore
   * const outcome = fleet.checkIn(checkInSchema.parse(await request.json()));
   * ```
   */
  checkIn(body: CheckIn, apply: CheckInApply = {}): CheckInOutcome {
    const outcome = this.#checkIn(body, apply);
    if (!apply.replicated && this.#onCheckIn) {
      const at = this.#members.get(body.nodeId)?.lastCheckIn ?? this.#clock.now();
      try {
        this.#onCheckIn(body, at);
      } catch (error) {
        this.#log("error", "the fleet's onCheckIn hook threw", {
          nodeId: body.nodeId,
          error: (error as Error)?.message ?? String(error),
        });
      }
    }
    return outcome;
  }

  #checkIn(body: CheckIn, apply: CheckInApply): CheckInOutcome {
    if (this.#isOwnEndpoint?.(body.endpoint)) {
      throw new HttpError(
        400,
        `Node '${body.nodeId}' checks in with the endpoint ${body.endpoint}, which is this ` +
          "gateway's own address: set the node's DORMICE_NODE_ENDPOINT to the address where " +
          "the gateway reaches that node",
        { details: { nodeId: body.nodeId, endpoint: body.endpoint } },
      );
    }
    const now = apply.at ?? this.#clock.now();
    const known = this.#members.get(body.nodeId);
    if (known === undefined) {
      const member: Member = {
        id: body.nodeId,
        endpoint: body.endpoint,
        intervalSeconds: body.intervalSeconds,
        build: body.build,
        firstSeen: now,
        lastCheckIn: now,
        heardSinceStart: true,
        reading: body.reading,
        readingSeq: ++this.#seq,
        ...capabilitiesOf(body),
        lookupDigest: this.#lookupDigestOf(body),
        checkInsSinceStart: 1,
        announcedUp: true,
      };
      this.#persist(() =>
        this.#insert.run(member.id, member.endpoint, member.intervalSeconds, member.build, now, now)
      );
      this.#members.set(member.id, member);
      this.#indexEndpoint(member.id, member.endpoint);
      this.#log("info", "node joined the fleet", {
        nodeId: member.id,
        endpoint: member.endpoint,
        intervalSeconds: member.intervalSeconds,
        build: member.build,
      });
      this.#reportShared(member.endpoint);
      this.#reportDigests();
      this.#call("onJoin", this.#onJoin, member);
      return "joined";
    }

    if (known.endpoint !== body.endpoint) {
      const silentMs = now - known.lastCheckIn;
      const moveAfterMs = this.#moveAfter * known.intervalSeconds * 1000;
      if (silentMs <= moveAfterMs && !apply.replicated) {
        // The first reporter keeps the id: two daemons sharing an id would each answer for the
        // other's sandboxes, and the one that is really there would lose its traffic.
        const message = `Node id '${known.id}' is checking in from ${known.endpoint} ` +
          `(last check-in ${seconds(silentMs)} ago), so ${body.endpoint} cannot use it: ` +
          `give the node at ${body.endpoint} its own DORMICE_NODE_ID, or, if the node really ` +
          `moved, stop the one at ${known.endpoint}; the new endpoint is accepted after ` +
          `${seconds(moveAfterMs)} of silence from the old one`;
        this.#changes.report(
          `twin:${known.id}`,
          body.endpoint,
          "warn",
          "check-in refused: a second endpoint uses a live node id",
          { nodeId: known.id, endpoint: known.endpoint, refusedEndpoint: body.endpoint },
        );
        throw new HttpError(409, message, {
          details: { nodeId: known.id, endpoint: known.endpoint, refusedEndpoint: body.endpoint },
        });
      }
      this.#changes.clear(`twin:${known.id}`);
      this.#log("warn", "node endpoint moved", {
        nodeId: known.id,
        from: known.endpoint,
        to: body.endpoint,
        silentMs,
      });
      const from = known.endpoint;
      this.#unindexEndpoint(known.id, from);
      known.endpoint = body.endpoint;
      this.#indexEndpoint(known.id, known.endpoint);
      this.#reportShared(from);
      this.#reportShared(known.endpoint);
    }

    const wasDown = this.isDown(known, now);
    known.intervalSeconds = body.intervalSeconds;
    known.build = body.build;
    known.lastCheckIn = now;
    known.reading = body.reading;
    known.readingSeq = ++this.#seq;
    Object.assign(known, capabilitiesOf(body));
    known.lookupDigest = this.#lookupDigestOf(body);
    known.checkInsSinceStart++;
    const firstSinceStart = !known.heardSinceStart;
    known.heardSinceStart = true;
    this.#persist(() =>
      this.#update.run(known.endpoint, known.intervalSeconds, known.build, now, known.id)
    );
    if (wasDown || !known.announcedUp) {
      known.announcedUp = true;
      this.#log(
        "info",
        firstSinceStart ? "node checked in since the gateway started" : "node is up again",
        { nodeId: known.id, endpoint: known.endpoint },
      );
    }
    this.#reportDigests();
    return "updated";
  }

  /**
   * Announces nodes that went down since the last sweep: one warning and one `onDown` per
   * transition. Returns the ids that went down. The server calls it on a timer (every second is
   * plenty); nothing else depends on it, since `isDown` is computed on read.
   *
   * @example
   * ```ts ignore
   * const timer = setInterval(() => fleet.sweep(), 1_000);
   * ```
   */
  sweep(): string[] {
    const now = this.#clock.now();
    const wentDown: string[] = [];
    for (const m of this.#members.values()) {
      if (!m.announcedUp || !this.isDown(m, now)) continue;
      m.announcedUp = false;
      wentDown.push(m.id);
      this.#log("warn", "node is down: no check-in for more than two of its intervals", {
        nodeId: m.id,
        endpoint: m.endpoint,
        lastCheckInAgeMs: now - m.lastCheckIn,
        intervalSeconds: m.intervalSeconds,
      });
      this.#call("onDown", this.#onDown, m);
    }
    return wentDown;
  }

  /**
   * Forgets a node that stopped checking in.
   *
   * @throws {HttpError} 404 for an unknown id; 409 while the node still checks in (not down).
   * @example
   * ```ts ignore
   * fleet.removeNode("node-c");
   * ```
   */
  removeNode(id: string): void {
    const m = this.#members.get(id);
    if (m === undefined) {
      throw new HttpError(404, `No node '${id}' in the fleet: listNodes shows the registered ids`);
    }
    const now = this.#clock.now();
    if (!this.isDown(m, now)) {
      const downMs = this.#downAfter * m.intervalSeconds * 1000;
      throw new HttpError(
        409,
        `Node '${id}' at ${m.endpoint} still checks in (last check-in ` +
          `${
            seconds(now - m.lastCheckIn)
          } ago): stop it (or unset its DORMICE_GATEWAY_ENDPOINT), ` +
          `wait two check-in intervals (${seconds(downMs)}) until listNodes shows it down, ` +
          `then remove it`,
        { details: { nodeId: id, endpoint: m.endpoint } },
      );
    }
    this.#forget(m);
    this.#log("info", "node removed from the fleet", { nodeId: id, endpoint: m.endpoint });
    this.#call("onRemove", this.#onRemove, m);
  }

  /**
   * Forgets a node another gateway removed (shared mode: its record left etcd). Unlike
   * `removeNode` it asks nothing: that gateway already checked the node was down. `onRemove`
   * runs as for `removeNode`, so per-node state here is let go too.
   *
   * @example
   * ```ts ignore
   * fleet.forgetRemoved("node-c");
   * ```
   */
  forgetRemoved(id: string): void {
    const m = this.#members.get(id);
    if (m === undefined) return;
    this.#forget(m);
    this.#log("info", "node removed from the fleet by another gateway", {
      nodeId: id,
      endpoint: m.endpoint,
    });
    this.#call("onRemove", this.#onRemove, m);
  }

  #forget(m: Member): void {
    this.#persist(() => this.#remove.run(m.id));
    this.#members.delete(m.id);
    this.#unindexEndpoint(m.id, m.endpoint);
    this.#reportShared(m.endpoint);
    this.#changes.clear(`twin:${m.id}`);
    this.#changes.clear(`lookup-digest:${m.id}`);
  }

  /**
   * What `listNodes` shows, in join order. `inFlight` supplies each node's in-flight count (the
   * Placer owns it: pass `(id) => placer.inFlight(id)`); without it the count is 0.
   *
   * @example
   * ```ts ignore
   * const nodes = fleet.list((id) => placer.inFlight(id));
   * ```
   */
  list(inFlight?: (nodeId: string) => number): NodeSummary[] {
    const now = this.#clock.now();
    const out: NodeSummary[] = [];
    const { mismatched } = this.#compareDigests(now);
    for (const m of this.#members.values()) {
      out.push({
        id: m.id,
        endpoint: m.endpoint,
        state: this.isDown(m, now) ? "down" : "up",
        lastCheckInAgeMs: Math.max(0, now - m.lastCheckIn),
        intervalSeconds: m.intervalSeconds,
        build: m.build,
        firstSeen: new Date(m.firstSeen).toISOString(),
        reading: m.reading,
        inFlight: inFlight ? inFlight(m.id) : 0,
        pools: m.pools,
        templates: m.templates,
        volumes: m.volumes,
        configDigest: m.configDigest,
        configDigestMismatch: mismatched.has(m.id),
      });
    }
    return out;
  }

  /** Closes the database when the Fleet opened it itself (the in-memory default). */
  close(): void {
    if (this.#ownsDb && this.#db.isOpen) this.#db.close();
  }

  /** A check-in's digest; one that will not decode is dropped (the node is then always asked). */
  #lookupDigestOf(body: CheckIn): LookupDigest | null {
    if (body.lookupDigest === undefined) return null;
    try {
      return LookupDigest.fromWire(body.lookupDigest);
    } catch (error) {
      this.#changes.report(
        `lookup-digest:${body.nodeId}`,
        String(error),
        "warn",
        "lookup digest refused",
        {
          nodeId: body.nodeId,
          cause: error instanceof Error ? error.message : String(error),
        },
      );
      return null;
    }
  }

  #persist(write: () => unknown): void {
    // The table only matters at the next start; a full disk must not stop routing now.
    try {
      write();
      this.#changes.clear("persist");
    } catch (error) {
      this.#changes.report("persist", "failing", "error", "could not write the node table", {
        error: (error as Error).message,
      });
    }
  }

  #call(name: string, hook: ((node: FleetNode) => void) | undefined, node: FleetNode): void {
    if (!hook) return;
    try {
      hook(node);
    } catch (error) {
      this.#log("error", `the fleet's ${name} hook threw`, {
        nodeId: node.id,
        error: (error as Error)?.message ?? String(error),
      });
    }
  }

  #indexEndpoint(id: string, endpoint: string): void {
    let ids = this.#byEndpoint.get(endpoint);
    if (!ids) this.#byEndpoint.set(endpoint, ids = new Set());
    ids.add(id);
  }

  #unindexEndpoint(id: string, endpoint: string): void {
    const ids = this.#byEndpoint.get(endpoint);
    if (!ids) return;
    ids.delete(id);
    if (ids.size === 0) this.#byEndpoint.delete(endpoint);
  }

  /** The digest comparison over the nodes that are up (a down node's settings may be old). */
  #compareDigests(now: number) {
    const up: [string, string | undefined][] = [];
    for (const m of this.#members.values()) {
      if (!this.isDown(m, now)) up.push([m.id, m.configDigest ?? undefined]);
    }
    return compareDigests(up);
  }

  /**
   * Warns at the moment a node's digest parts from the fleet's (once per change, not per
   * check-in), and says so again when it agrees once more.
   */
  #reportDigests(): void {
    const { reference, mismatched } = this.#compareDigests(this.#clock.now());
    for (const m of this.#members.values()) {
      const key = `digest:${m.id}`;
      if (mismatched.has(m.id)) {
        this.#changes.report(
          key,
          `${m.configDigest}/${reference}`,
          "warn",
          "node's fleet-invariant settings differ from the fleet's (DORMICE_TEMPLATES, " +
            "DORMICE_SANDBOX_DOMAIN or the fleet token's signing secret): it keeps serving; " +
            "align its settings, or finish the rolling change",
          {
            nodeId: m.id,
            endpoint: m.endpoint,
            digest: m.configDigest?.slice(0, 12),
            fleetDigest: reference?.slice(0, 12),
          },
        );
      } else this.#changes.clear(key);
    }
  }

  /** Warns once per change when two or more ids report one endpoint. */
  #reportShared(endpoint: string): void {
    const ids = this.#byEndpoint.get(endpoint);
    const key = `shared:${endpoint}`;
    if (!ids || ids.size < 2) {
      this.#changes.clear(key);
      return;
    }
    const sorted = [...ids].sort();
    this.#changes.report(
      key,
      sorted.join(","),
      "warn",
      "several node ids report one endpoint: one daemon answers for all of them, so its " +
        "sandboxes look duplicated; remove the id that no longer checks in with removeNode, or " +
        "correct the DORMICE_NODE_ENDPOINT of a node that names the wrong machine",
      { endpoint, nodeIds: sorted },
    );
  }
}

/** What a check-in says the node can serve; a field it leaves out keeps its old meaning. */
function capabilitiesOf(body: CheckIn) {
  return {
    pools: body.pools ?? [],
    templates: body.templates ?? null,
    volumes: body.volumes ?? [],
    configDigest: body.configDigest ?? null,
  };
}

function seconds(ms: number): string {
  const s = ms / 1000;
  return `${Number.isInteger(s) ? s : s.toFixed(1)} s`;
}
