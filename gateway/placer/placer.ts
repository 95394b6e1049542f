/**
 * `gateway/placer/` owns the choice of node for a new sandbox: the in-flight counts and the explain
 * (`placer.ts`), the feasibility filters (`filters.ts`), the choice among the nodes that pass
 * (`choice.ts`) and the recent decisions the fleet page shows (`placement_log.ts`).
 *
 * The Placer: which node takes a new sandbox. Feasibility filters (placement_filters.ts), then a
 * choice among the nodes that pass (placement_choice.ts), Nomad style; this file holds the
 * in-flight counts and the explain.
 *
 * @module
 */
import type { FleetNode, NodeDirectory } from "../fleet/fleet.ts";
import { poolKey } from "../../shared/pools.ts";
import {
  type FilterInput,
  type PlacementAsk,
  placementFilters,
  type PlacerLimits,
  type Rejection,
  type RejectReason,
} from "./filters.ts";
import {
  BestNodes,
  loadScore,
  pickTwoChoices,
  type ScoredNode,
  seededRandom,
  type WarmCandidate,
  type WarmExplain,
} from "./choice.ts";

export {
  type FilterInput,
  type PlacementAsk,
  placementAsk,
  type PlacementFilter,
  placementFilters,
  type PlacerLimits,
  type Rejection,
  type RejectReason,
} from "./filters.ts";
export {
  loadScore,
  pickTwoChoices,
  type ScoredNode,
  seededRandom,
  type WarmCandidate,
  type WarmExplain,
  type WarmSample,
} from "./choice.ts";

/** How a placement was decided, for the answer and the log. */
export interface PlacementExplain {
  /** Nodes looked at. */
  considered: number;
  /** Nodes that passed every filter. */
  feasible: number;
  /** How many nodes each filter rejected. */
  rejected: Record<RejectReason, number>;
  /** Every rejected node with its reason. */
  rejections: Rejection[];
  /**
   * The best feasible nodes by {@linkcode loadScore}, best first (at most `explainTop`); the
   * first was chosen unless `warm` says otherwise.
   */
  scores: ScoredNode[];
  /** The warm-aware choice, when a feasible node had warm capacity for the create's pool. */
  warm?: WarmExplain;
}

/** The result of {@linkcode Placer.pick}: a node, or why none fits. */
export type PickResult =
  | { ok: true; node: FleetNode; score: number; explain: PlacementExplain }
  | {
    ok: false;
    /** A sentence naming every node's reason (the first few, then a count). */
    message: string;
    /** Seconds until the next reading is due somewhere (the 503's Retry-After). */
    retryAfterSeconds: number;
    explain: PlacementExplain;
    /**
     * Set when no node of the fleet, up or down, holds the asked template (a 400, not a 503:
     * waiting will not help): the templates the fleet offers.
     */
    templateNowhere?: { template: string; offered: string[] };
  };

/** Options for {@linkcode Placer}. */
export interface PlacerOptions {
  /** Where the nodes and their readings come from (a `Fleet`). */
  fleet: NodeDirectory;
  /**
   * Default 70 (`DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT`): above it a host is busy enough that a new
   * sandbox would slow every tenant on it, while leaving room for the ones already placed to
   * burst.
   */
  cpuLimitPct?: number;
  /**
   * Default 400 (`DORMICE_GATEWAY_NODE_ACTIVE_LIMIT`): a ceiling on running sandboxes per node
   * whatever its size, so one large host cannot absorb a whole burst and become a single point
   * of loss.
   */
  activeLimit?: number;
  /**
   * Default 10 (`DORMICE_GATEWAY_NODE_MIN_DISK_GB`; 1 GB = 10^9 bytes): below it a node cannot
   * be trusted to hold a new sandbox's files plus image layers without filling the disk that
   * also holds its ledger.
   */
  minDiskGB?: number;
  /** How many best candidates `explain.scores` keeps. Default 5. */
  explainTop?: number;
  /** How many rejections the "nothing fits" sentence spells out before counting. Default 10. */
  messageLimit?: number;
  /**
   * The random source of the power-of-two-choices pick, `[0, 1)`. Default: {@linkcode
   * seededRandom} over `seed`, so a placement sequence replays from its seed.
   */
  random?: () => number;
  /** The seed of the default random source; a random one when absent (see `Placer.seed`). */
  seed?: number;
}

interface NodeFlight {
  /** The reading these placements are counted against. */
  seq: number;
  /** Names placed since that reading. */
  names: Set<string>;
  /** Of those, the ones placed as claims, with their pool key. */
  claims: Map<string, string>;
  /** Claims per pool key, counted against that pool's warm count in the reading. */
  claimCounts: Map<string, number>;
}

/**
 * Chooses the node for a new sandbox: every node through the filters (each rejection named),
 * then the lowest {@linkcode loadScore}; ties by more available memory, then node id, so a
 * placement replays exactly in tests and post-mortems.
 *
 * In-flight counting (why: a burst of creates inside one check-in interval would otherwise all
 * see the same stale reading and land on one node):
 * - in-flight = placements since the node's last reading; a check-in resets it (the Placer sees
 *   the fleet's `readingSeq` change, so no callback is needed);
 * - `record(name, nodeId)` counts a placement (`place()` picks and records);
 * - `release(name)` takes a placement back when that sandbox is destroyed within the interval;
 * - `refused(name)` uncounts a create the node refused with a 4xx (nothing was built);
 * - a 5xx or no answer stays counted: the sandbox may exist;
 * - a wake of a sandbox found on a node is not a placement: do not record it.
 *
 * `pick()` is one pass over the nodes with no sort, so it stays under a millisecond for 10,000.
 *
 * @example
 * ```ts
 * import { Fleet, Placer } from "@dormice/cluster/gateway";
 * const fleet = new Fleet();
 * const placer = new Placer({ fleet });
 * const result = placer.pick();
 * if (!result.ok) console.log(result.message); // no node has checked in yet
 * fleet.close();
 * ```
 */
export class Placer {
  /** The limits in force. */
  readonly limits: Readonly<PlacerLimits>;
  #fleet: NodeDirectory;
  #explainTop: number;
  #messageLimit: number;
  #flights = new Map<string, NodeFlight>();
  /** sandbox name → the node it was placed on, for `release` / `refused`. */
  #placements = new Map<string, string>();
  #random: () => number;
  /** The seed of the random source (when the default one is used), logged at start for replay. */
  readonly seed: number;

  /**
   * Builds a placer over `fleet`.
   *
   * @throws {RangeError} when a limit is not a finite non-negative number.
   */
  constructor(options: PlacerOptions) {
    const {
      fleet,
      cpuLimitPct = 70,
      activeLimit = 400,
      minDiskGB = 10,
      explainTop = 5,
      messageLimit = 10,
      seed = (Math.random() * 2 ** 32) >>> 0,
    } = options;
    for (const [name, value] of Object.entries({ cpuLimitPct, activeLimit, minDiskGB })) {
      if (!Number.isFinite(value) || value < 0) {
        throw new RangeError(
          `Cannot create Placer as '${name}' must be a non-negative number: received ${value}`,
        );
      }
    }
    this.#fleet = fleet;
    this.limits = Object.freeze({ cpuLimitPct, activeLimit, minDiskBytes: minDiskGB * 1e9 });
    this.#explainTop = Math.max(1, explainTop);
    this.#messageLimit = messageLimit;
    this.seed = seed;
    this.#random = options.random ?? seededRandom(seed);
  }

  /**
   * Chooses a node without counting anything (see `place()` to count).
   *
   * @example
   * ```ts ignore
   * const r = placer.pick();
   * if (r.ok) console.log(r.node.id, r.explain.scores);
   * ```
   */
  pick(ask: PlacementAsk = {}): PickResult {
    const now = this.#fleet.now();
    const limits = this.limits;
    const rejected: Record<RejectReason, number> = {
      "down": 0,
      "no-reading": 0,
      "template": 0,
      "snapshot": 0,
      "heal": 0,
      "volume": 0,
      "egress-rules": 0,
      "cpu": 0,
      "active-limit": 0,
      "disk": 0,
    };
    const rejections: Rejection[] = [];
    const best = new BestNodes(this.#explainTop);
    let considered = 0, feasible = 0;
    let minInterval = Infinity;
    const input: FilterInput = {
      node: undefined as unknown as FleetNode,
      now,
      inFlight: 0,
      limits,
      down: false,
      ask,
    };
    const key = ask.poolKey;
    const warm: WarmCandidate[] = [];
    const warmNodes: FleetNode[] = [];
    for (const node of this.#fleet.nodes()) {
      considered++;
      if (node.intervalSeconds < minInterval) minInterval = node.intervalSeconds;
      input.node = node;
      input.down = this.#fleet.isDown(node, now);
      input.inFlight = this.#currentFlight(node);
      let failed = false;
      for (let i = 0; i < placementFilters.length; i++) {
        const filter = placementFilters[i];
        const detail = filter.check(input);
        if (detail !== undefined) {
          rejected[filter.reason]++;
          rejections.push({ nodeId: node.id, reason: filter.reason, detail });
          failed = true;
          break;
        }
      }
      if (failed) continue;
      feasible++;
      const score = loadScore(node, input.inFlight);
      best.offer(node, score, input.inFlight);
      if (key !== undefined && node.pools.length > 0) {
        const left = this.#warmLeft(node, key);
        if (left > 0) {
          warm.push({ nodeId: node.id, warm: left, score });
          warmNodes.push(node);
        }
      }
    }
    // Counts of nodes that left the directory without forgetNode (an embedder's own directory).
    if (this.#flights.size > considered) this.#dropUnknownNodes();
    const top = best.scores;
    const explain: PlacementExplain = { considered, feasible, rejected, rejections, scores: top };
    if (warm.length > 0) {
      // Warm capacity first: a claim is a ledger write where a cold create is engine work.
      const r = pickTwoChoices(warm, this.#random);
      const chosen = warm[r.chosen];
      explain.warm = {
        poolKey: key!,
        candidates: warm.length,
        sampled: r.sampled.map((i) => ({ ...warm[i] })),
        chosen: chosen.nodeId,
        why: r.why,
      };
      return { ok: true, node: warmNodes[r.chosen], score: chosen.score, explain };
    }
    if (top.length > 0) return { ok: true, node: best.nodes[0], score: top[0].score, explain };
    const nowhere = ask.template === undefined ? undefined : this.#templateNowhere(ask.template);
    return {
      ok: false,
      message: this.#nothingFits(rejections),
      // The next reading can change the answer; it is due within the shortest interval.
      retryAfterSeconds: Number.isFinite(minInterval)
        ? Math.min(60, Math.max(1, Math.ceil(minInterval)))
        : 15,
      explain,
      ...(nowhere ? { templateNowhere: nowhere } : {}),
    };
  }

  /**
   * Whether no node, up or down, holds `template` while every node says what it holds (a
   * node that does not say might hold it); with the templates the fleet offers.
   */
  #templateNowhere(template: string): { template: string; offered: string[] } | undefined {
    const offered = new Set<string>();
    let any = false;
    for (const node of this.#fleet.nodes()) {
      any = true;
      if (node.templates === null || node.templates.includes(template)) return undefined;
      for (const t of node.templates) offered.add(t);
    }
    return any ? { template, offered: [...offered].sort() } : undefined;
  }

  /** The node's warm count for `key` less the claims placed on it since that reading. */
  #warmLeft(node: FleetNode, key: string): number {
    let warm = 0;
    for (const p of node.pools) {
      if (poolKey(p.template, p.spec) === key) warm += p.warm;
    }
    if (warm === 0) return 0;
    const flight = this.#flights.get(node.id);
    const claimed = flight !== undefined && flight.seq === node.readingSeq
      ? flight.claimCounts.get(key) ?? 0
      : 0;
    return warm - claimed;
  }

  /**
   * Picks a node and records the placement of `name` on it.
   *
   * @example
   * ```ts ignore
   * const r = placer.place("agent-1");
   * if (!r.ok) throw new HttpError(503, r.message, { headers: { "Retry-After": String(r.retryAfterSeconds) } });
   * ```
   */
  place(name: string, ask: PlacementAsk = {}): PickResult {
    const result = this.pick(ask);
    if (result.ok) {
      this.record(name, result.node.id, result.explain.warm ? ask.poolKey : undefined);
    }
    return result;
  }

  /**
   * Counts a placement of `name` on `nodeId` until the node's next reading.
   *
   * @example
   * ```ts ignore
   * placer.record("agent-1", "node-a");
   * ```
   */
  record(name: string, nodeId: string, claimFrom?: string): void {
    const node = this.#fleet.get(nodeId);
    if (node === undefined) return;
    const flight = this.#flightFor(node);
    // A name placed again (a retry after a 5xx) stays counted where it went first: it may exist.
    this.#placements.set(name, nodeId);
    flight.names.add(name);
    if (claimFrom !== undefined && !flight.claims.has(name)) {
      // Counted against that pool's warm count until the node reports it again.
      flight.claims.set(name, claimFrom);
      flight.claimCounts.set(claimFrom, (flight.claimCounts.get(claimFrom) ?? 0) + 1);
    }
  }

  /**
   * Takes back the placement of `name` if it is still counted (destroyed within the interval).
   * Returns whether a count was given back.
   *
   * @example
   * ```ts ignore
   * placer.release("agent-1"); // after a successful destroy
   * ```
   */
  release(name: string): boolean {
    const nodeId = this.#placements.get(name);
    if (nodeId === undefined) return false;
    this.#placements.delete(name);
    const node = this.#fleet.get(nodeId);
    const flight = this.#flights.get(nodeId);
    if (node === undefined || flight === undefined) return false;
    if (flight.seq !== node.readingSeq) {
      // The node has reported since: its reading already says whether the sandbox exists.
      this.#reset(nodeId, flight, node.readingSeq);
      return false;
    }
    const key = flight.claims.get(name);
    if (key !== undefined) {
      flight.claims.delete(name);
      const n = (flight.claimCounts.get(key) ?? 1) - 1;
      if (n > 0) flight.claimCounts.set(key, n);
      else flight.claimCounts.delete(key);
    }
    return flight.names.delete(name);
  }

  /**
   * Uncounts a create the node refused with a 4xx: nothing was built. (A 5xx or no answer is
   * not refused: leave it counted.) Returns whether a count was given back.
   *
   * @example
   * ```ts ignore
   * if (answer.status >= 400 && answer.status < 500) placer.refused("agent-1");
   * ```
   */
  refused(name: string): boolean {
    return this.release(name);
  }

  /**
   * Drops what is counted for a node that left the fleet (`Fleet`'s `onRemove` calls it), so a
   * removed node leaves nothing behind. `pick()` also drops the counts of nodes the directory no
   * longer knows whenever it sees more counted nodes than registered ones, so the counts stay
   * bounded by the fleet even when nothing calls this.
   *
   * @example
   * ```ts ignore
   * const fleet = new Fleet({ onRemove: (node) => placer.forgetNode(node.id) });
   * ```
   */
  forgetNode(nodeId: string): void {
    const flight = this.#flights.get(nodeId);
    if (flight === undefined) return;
    for (const name of flight.names) {
      if (this.#placements.get(name) === nodeId) this.#placements.delete(name);
    }
    this.#flights.delete(nodeId);
  }

  /** How many nodes and placed names the in-flight counts hold (diagnostics and tests). */
  get tracked(): { nodes: number; names: number } {
    return { nodes: this.#flights.size, names: this.#placements.size };
  }

  /**
   * Placements counted against `nodeId` since its last reading.
   *
   * @example
   * ```ts ignore
   * fleet.list((id) => placer.inFlight(id));
   * ```
   */
  inFlight(nodeId: string): number {
    const node = this.#fleet.get(nodeId);
    return node === undefined ? 0 : this.#currentFlight(node);
  }

  #currentFlight(node: FleetNode): number {
    const flight = this.#flights.get(node.id);
    return flight !== undefined && flight.seq === node.readingSeq ? flight.names.size : 0;
  }

  #flightFor(node: FleetNode): NodeFlight {
    let flight = this.#flights.get(node.id);
    if (flight === undefined) {
      this.#flights.set(
        node.id,
        flight = {
          seq: node.readingSeq,
          names: new Set(),
          claims: new Map(),
          claimCounts: new Map(),
        },
      );
    } else if (flight.seq !== node.readingSeq) {
      this.#reset(node.id, flight, node.readingSeq);
    }
    return flight;
  }

  #dropUnknownNodes(): void {
    for (const nodeId of [...this.#flights.keys()]) {
      if (this.#fleet.get(nodeId) === undefined) this.forgetNode(nodeId);
    }
  }

  /** Starts a new interval for a node, dropping its old placements from the name index. */
  #reset(nodeId: string, flight: NodeFlight, seq: number): void {
    for (const name of flight.names) {
      if (this.#placements.get(name) === nodeId) this.#placements.delete(name);
    }
    flight.names.clear();
    flight.claims.clear();
    flight.claimCounts.clear();
    flight.seq = seq;
  }

  #nothingFits(rejections: Rejection[]): string {
    if (rejections.length === 0) {
      return "No node has checked in yet: start a node with DORMICE_GATEWAY_ENDPOINT pointing " +
        "at this gateway";
    }
    const shown = rejections.slice(0, this.#messageLimit)
      .map((r) => `'${r.nodeId}': ${r.detail}`).join("; ");
    const more = rejections.length > this.#messageLimit
      ? `; and ${rejections.length - this.#messageLimit} more (listNodes shows them)`
      : "";
    return `No node can take a new sandbox now: ${shown}${more}`;
  }
}
