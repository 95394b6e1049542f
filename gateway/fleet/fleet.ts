/**
 * `gateway/fleet/` owns the Fleet, the nodes that checked in: its rules (`fleet.ts`) and
 * options (`options.ts`), the node's shape and the directory the Placer and the Finder read
 * (`node.ts`), the SQLite table (`table.ts`), the once-per-change warnings (`warnings.ts`), the
 * refusals' sentences (`refusals.ts`) and, in shared mode, its replica through etcd (`sync.ts`).
 *
 * The Fleet: the nodes that checked in, their last readings, and who is up. This file holds the
 * rules (join, move, down, silent, remove); the node's shape and how a check-in fills it in are
 * `node.ts`, the SQLite table `table.ts`, the once-per-change warnings
 * `warnings.ts` and the refusals' sentences `refusals.ts`.
 *
 * @module
 */
import type { CheckInOutcome, FleetNode, NodeDirectory, NodeSummary } from "./node.ts";
import { NodeTable } from "./table.ts";
import { FleetWarnings } from "./warnings.ts";
import { DigestCounts } from "./digests.ts";
import { applyCheckIn, joinedMember, loadedMember, type Member } from "./node.ts";
import {
  ownEndpointRefusal,
  stillChecksIn,
  twinRefusal,
  unheardRemoval,
  unknownNode,
} from "./refusals.ts";
import { type CheckIn, checkInSchema, describeZodError } from "../../shared/schemas.ts";
import { HttpError } from "../../shared/http_error.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { ChangeLog, type Log, silentLog } from "../../shared/log.ts";

import type { CheckInApply, FleetOptions } from "./options.ts";

export type { CheckInOutcome, FleetNode, NodeDirectory, NodeSummary } from "./node.ts";
export type { CheckInApply, FleetOptions } from "./options.ts";

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
  #table: NodeTable;
  #clock: Clock;
  #log: Log;
  #warnings: FleetWarnings;
  /** The up nodes' config digests, counted as they change (`digests.ts`). */
  #digests: DigestCounts;
  #downAfter: number;
  #deadAfterMs: number;
  #moveAfter: number;
  #onJoin?: (node: FleetNode) => void;
  #onDown?: (node: FleetNode) => void;
  #onRemove?: (node: FleetNode) => void;
  #isOwnEndpoint?: (endpoint: string) => boolean;
  #onCheckIn?: (body: CheckIn, at: number) => void;
  #members = new Map<string, Member>();
  #seq = 0;
  /** Shared mode: when the node table was last read whole (see `replicaAsOf`); else `null`. */
  #asOf: number | null = null;
  /** When this Fleet was created: no silence before it is counted towards death. */
  #startedAt: number;

  /** Opens (creating if needed) the node table and loads its rows; every loaded node is down. */
  constructor(options: FleetOptions = {}) {
    const {
      database,
      clock = systemClock,
      log = silentLog,
      downAfterIntervals = 2,
      moveAfterIntervals = 1,
      deadAfterMs = 0,
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
    if (!(deadAfterMs >= 0) || !Number.isFinite(deadAfterMs)) {
      throw new RangeError(
        `Cannot create Fleet as 'deadAfterMs' must be 0 or more: received ${deadAfterMs}`,
      );
    }
    const changes = new ChangeLog(log);
    this.#table = new NodeTable(database, changes);
    this.#clock = clock;
    this.#log = log;
    this.#warnings = new FleetWarnings(changes);
    this.#digests = new DigestCounts({
      differs: (id, _digest, reference) =>
        this.#warnings.digestDiffers(this.#members.get(id)!, reference),
      agrees: (id) => this.#warnings.digestAgrees(id),
    });
    this.#downAfter = downAfterIntervals;
    this.#moveAfter = moveAfterIntervals;
    this.#deadAfterMs = deadAfterMs;
    this.#startedAt = clock.now();
    this.#onJoin = onJoin;
    this.#onDown = onDown;
    this.#onRemove = onRemove;
    this.#isOwnEndpoint = isOwnEndpoint;
    this.#onCheckIn = onCheckIn;
    const rows = this.#table.load();
    for (const row of rows) {
      const member = loadedMember(row, ++this.#seq);
      this.#members.set(member.id, member);
      this.#warnings.indexEndpoint(member.id, member.endpoint);
    }
    if (rows.length > 0) {
      log("info", "fleet loaded from the database; every node is down until it checks in", {
        nodes: rows.length,
      });
      for (const endpoint of this.#warnings.endpoints()) this.#warnings.reportShared(endpoint);
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
   * Shared mode: whether the only reason `node` is not silent here is news this gateway could not
   * read. Its last check-in is older than two of its intervals, but etcd has not been read whole
   * since before that silence would count (`replicaAsOf`): it may be checking in with another
   * gateway, or it may have died during the outage. `listNodes` shows it down (flagged
   * `unheard`); routing still serves it, bounded by a probe of the node itself (`NodeProbes`).
   * Always false outside shared mode.
   *
   * @example
   * ```ts
   * import { Fleet } from "@dormice/cluster/gateway";
   * new Fleet().isUnheard("nobody"); // false
   * ```
   */
  isUnheard(node: string | FleetNode, now: number = this.#clock.now()): boolean {
    const m = typeof node === "string" ? this.#members.get(node) : node;
    if (m === undefined || this.#asOf === null || !m.heardSinceStart) return false;
    const downMs = this.#downAfter * m.intervalSeconds * 1000;
    return now - m.lastCheckIn > downMs && this.#silentFor(m, now) <= downMs;
  }

  /**
   * Whether a node is declared dead: down, and silent for more than `deadAfterMs` by its last
   * check-in (persisted, and in shared mode the time the accepting gateway wrote to etcd, so
   * every gateway reaches the same verdict at about the same time; like `isSilent`, silence after
   * the last whole read of etcd is not counted, so a gateway that cannot read the node table
   * declares no node dead that may be checking in elsewhere). Silence counts from this Fleet's
   * creation at the earliest: a gateway that was itself down (or whose table is older than etcd's)
   * heard nothing meanwhile, and declaring the whole fleet dead at its start would free every
   * name of nodes that are about to check in. A dead node's sandboxes are taken as gone with it:
   * lookups do not ask it, so the names it held may be built elsewhere. Never with `deadAfterMs`
   * 0; an unknown id is not dead (it is not there at all).
   *
   * @example
   * ```ts
   * import { Fleet } from "@dormice/cluster/gateway";
   * new Fleet({ deadAfterMs: 600_000 }).isDead("nobody"); // false
   * ```
   */
  isDead(node: string | FleetNode, now: number = this.#clock.now()): boolean {
    if (this.#deadAfterMs === 0) return false;
    const m = typeof node === "string" ? this.#members.get(node) : node;
    if (m === undefined || !this.isDown(m, now)) return false;
    const until = this.#asOf === null ? now : Math.min(now, this.#asOf);
    return until - Math.max(m.lastCheckIn, this.#startedAt) > this.#deadAfterMs;
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
   * Records a check-in: joins a new id, or updates a known one (endpoint, interval, build,
   * reading). The body is held to the check-in route's rules first, unless `apply.parsed` says
   * the route has parsed it already; a body built in code or received by a host service is
   * checked the same way, and the endpoint is taken as the route writes it (its trailing slash
   * dropped).
   *
   * @throws {HttpError} 400 naming each wrong field (a `cpuCount` of 0, a negative count, an
   *   endpoint that is not http(s), a node id with spaces, …); 409 naming both endpoints when
   *   `body.nodeId` is live at another endpoint; 400 when the endpoint is the gateway's own
   *   address (`isOwnEndpoint`).
   * @example
   * ```ts ignore
   * const outcome = fleet.checkIn(await request.json()); // an HttpError 400 names a wrong field
   * ```
   */
  checkIn(body: CheckIn, apply: CheckInApply = {}): CheckInOutcome {
    // A replicated check-in was checked by the gateway that took it, a parsed one by the route.
    if (!apply.replicated && !apply.parsed) body = validCheckIn(body);
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
    if (this.#isOwnEndpoint?.(body.endpoint)) throw ownEndpointRefusal(body);
    const now = apply.at ?? this.#clock.now();
    const known = this.#members.get(body.nodeId);
    if (known === undefined) {
      const member = joinedMember(body, now, ++this.#seq, this.#warnings.lookupDigestOf(body));
      this.#table.insert(member, now);
      this.#members.set(member.id, member);
      this.#warnings.indexEndpoint(member.id, member.endpoint);
      this.#log("info", "node joined the fleet", {
        nodeId: member.id,
        endpoint: member.endpoint,
        intervalSeconds: member.intervalSeconds,
        build: member.build,
      });
      this.#warnings.reportShared(member.endpoint);
      this.#digests.set(member.id, member.configDigest);
      this.#call("onJoin", this.#onJoin, member);
      return "joined";
    }

    if (known.endpoint !== body.endpoint) {
      const silentMs = now - known.lastCheckIn;
      const moveAfterMs = this.#moveAfter * known.intervalSeconds * 1000;
      if (silentMs <= moveAfterMs && !apply.replicated) {
        // The first reporter keeps the id: two daemons sharing an id would each answer for the
        // other's sandboxes, and the one that is really there would lose its traffic.
        this.#warnings.twinRefused(known, body.endpoint);
        throw twinRefusal(known, body.endpoint, silentMs, moveAfterMs);
      }
      this.#warnings.twinGone(known.id);
      this.#log("warn", "node endpoint moved", {
        nodeId: known.id,
        from: known.endpoint,
        to: body.endpoint,
        silentMs,
      });
      const from = known.endpoint;
      known.endpoint = body.endpoint;
      this.#warnings.moved(known.id, from, known.endpoint);
    }

    const wasDown = this.isDown(known, now);
    const wasDead = this.isDead(known, now) || known.announcedDead;
    const previousCheckIn = known.lastCheckIn;
    const firstSinceStart = !known.heardSinceStart;
    applyCheckIn(known, body, now, ++this.#seq, this.#warnings.lookupDigestOf(body));
    this.#table.update(known, now);
    known.announcedDead = false;
    if (wasDead) {
      known.announcedUp = true;
      // Its names were free while it was dead: one rebuilt elsewhere is now held twice, which
      // lookups answer 409 naming both nodes until one copy is destroyed.
      this.#log(
        "warn",
        "a node declared dead checked in again: it is up with what its ledger holds",
        {
          nodeId: known.id,
          endpoint: known.endpoint,
          silentMs: now - previousCheckIn,
        },
      );
    } else if (wasDown || !known.announcedUp) {
      known.announcedUp = true;
      this.#log(
        "info",
        firstSinceStart ? "node checked in since the gateway started" : "node is up again",
        { nodeId: known.id, endpoint: known.endpoint },
      );
    }
    this.#digests.set(known.id, known.configDigest);
    return "updated";
  }

  /**
   * Announces nodes that went down since the last sweep: one warning and one `onDown` per
   * transition. Returns the ids that went down. The server calls it on a timer (every second is
   * plenty); nothing else depends on it, since `isDown` is computed on read. It also writes the
   * batched check-in times once they are a second old.
   *
   * @example
   * ```ts ignore
   * const timer = setInterval(() => fleet.sweep(), 1_000);
   * ```
   */
  sweep(): string[] {
    const now = this.#clock.now();
    this.#table.flushDue(now);
    const wentDown: string[] = [];
    for (const m of this.#members.values()) {
      if (!m.announcedDead && this.isDead(m, now)) {
        m.announcedDead = true;
        this.#log(
          "warn",
          "node declared dead: no check-in for longer than deadAfterMs (the gateway daemon's " +
            "DORMICE_GATEWAY_NODE_DEAD_AFTER_S); " +
            "its sandboxes are taken as gone with it and their names may be built on other nodes",
          {
            nodeId: m.id,
            endpoint: m.endpoint,
            lastCheckInAgeMs: now - m.lastCheckIn,
            deadAfterMs: this.#deadAfterMs,
          },
        );
      }
      if (!m.announcedUp || !this.isDown(m, now)) continue;
      m.announcedUp = false;
      wentDown.push(m.id);
      this.#digests.drop(m.id);
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
   * @throws {HttpError} 404 for an unknown id; 409 while the node still checks in (not down);
   *   503 while it is unheard (shared mode, etcd unreadable: `isUnheard`).
   * @example
   * ```ts ignore
   * fleet.removeNode("node-c");
   * ```
   */
  removeNode(id: string): void {
    const m = this.#members.get(id);
    if (m === undefined) {
      throw unknownNode(id);
    }
    const now = this.#clock.now();
    if (this.isUnheard(m, now)) throw unheardRemoval(m, now);
    if (!this.isDown(m, now)) {
      throw stillChecksIn(m, now, this.#downAfter * m.intervalSeconds * 1000);
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
    this.#digests.drop(m.id);
    this.#table.remove(m.id);
    this.#members.delete(m.id);
    this.#warnings.unindexEndpoint(m.id, m.endpoint);
    this.#warnings.reportShared(m.endpoint);
    this.#warnings.forgotten(m.id);
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
    for (const m of this.#members.values()) {
      const down = this.isDown(m, now);
      out.push({
        id: m.id,
        endpoint: m.endpoint,
        state: this.isDead(m, now) ? "dead" : down || this.isUnheard(m, now) ? "down" : "up",
        unheard: this.isUnheard(m, now),
        lastCheckInAgeMs: Math.max(0, now - m.lastCheckIn),
        intervalSeconds: m.intervalSeconds,
        build: m.build,
        firstSeen: new Date(m.firstSeen).toISOString(),
        reading: m.reading,
        inFlight: inFlight ? inFlight(m.id) : 0,
        pools: m.pools,
        templates: m.templates,
        snapshotNames: m.snapshotNames ?? [],
        volumes: m.volumes,
        egressRules: m.egressRules,
        configDigest: m.configDigest,
        configDigestMismatch: !down && this.#digests.mismatched(m.id),
      });
    }
    return out;
  }

  /**
   * Writes the check-in times still waiting (they are batched, at most a second apart), then
   * closes the database when the Fleet opened it itself (the in-memory default).
   */
  close(): void {
    this.#table.close();
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
}

/** The check-in as `checkInSchema` writes it, or a 400 naming each wrong field. */
function validCheckIn(body: CheckIn): CheckIn {
  const parsed = checkInSchema.safeParse(body);
  if (parsed.success) return parsed.data;
  const id = typeof body?.nodeId === "string" ? body.nodeId.slice(0, 64) : "(no nodeId)";
  throw new HttpError(
    400,
    `Cannot take the check-in of '${id}': ${describeZodError(parsed.error, "the check-in")}; ` +
      "send the fields a node sends (see CheckIn): a positive whole cpuCount, counts of 0 or " +
      "more, an http(s) origin as endpoint, an id of letters, digits, '.', '_' and '-'",
  );
}
