/**
 * The Placer: which node takes a new sandbox. Feasibility filters, then a score, Nomad style.
 *
 * @module
 */
import type { FleetNode, NodeDirectory } from "./fleet.ts";
import { poolKey } from "../shared/pools.ts";
import type { SandboxSpec } from "../shared/schemas.ts";

/** Why a node cannot take a new sandbox, in the order the filters run. */
export type RejectReason =
  | "down"
  | "no-reading"
  | "template"
  | "volume"
  | "cpu"
  | "active-limit"
  | "disk";

/** What a create asks of its node, as far as placement can tell. */
export interface PlacementAsk {
  /** The template; a node that says which templates it holds must hold it. */
  template?: string;
  /** Volume names; a node must advertise every one. */
  volumes?: readonly string[];
  /** The warm pool a claim would come from (see {@linkcode placementAsk}); none: no claim. */
  poolKey?: string;
}

/**
 * What placement needs of a create: its template (`base` when it names none, as a node
 * defaults), the volumes it asks for, and the pool key a claim would match, or none when the
 * spec asks for what a warm sandbox lacks (network, pids, volumes), as the node's pools decide.
 *
 * @example
 * ```ts
 * import { placementAsk } from "@dormice/cluster/gateway";
 * placementAsk("minimal", { cpus: 1 }); // { template: "minimal", volumes: [], poolKey: "minimal/1/-" }
 * ```
 */
export function placementAsk(template: string | undefined, spec: SandboxSpec = {}): PlacementAsk {
  const t = template ?? "base";
  const volumes = (spec.volumes ?? []).map((v) => v.name);
  const claimable = spec.network === undefined && spec.pids === undefined && volumes.length === 0;
  return {
    template: t,
    volumes,
    ...(claimable ? { poolKey: poolKey(t, { cpus: spec.cpus, memoryMB: spec.memoryMB }) } : {}),
  };
}

/** A warm holder sampled by the power-of-two-choices pick. */
export interface WarmSample {
  /** The node id. */
  nodeId: string;
  /** Its warm count for the key, less the claims placed since its reading. */
  warm: number;
  /** Its {@linkcode loadScore}. */
  score: number;
}

/** How the warm-aware choice went, in `explain.warm`. */
export interface WarmExplain {
  /** The pool key the create would claim from. */
  poolKey: string;
  /** Feasible nodes with warm capacity for the key. */
  candidates: number;
  /** The (at most two) nodes sampled, weighted by warm count. */
  sampled: WarmSample[];
  /** The node kept. */
  chosen: string;
  /** Why it won, in a sentence. */
  why: string;
}

/** One rejected node and its named reason. */
export interface Rejection {
  /** The rejected node's id. */
  nodeId: string;
  /** The first filter it failed (the chain stops there). */
  reason: RejectReason;
  /** A sentence with the numbers and the variable that moves the limit. */
  detail: string;
}

/** A feasible node and the numbers behind its score. */
export interface ScoredNode {
  /** The node id. */
  nodeId: string;
  /** Its {@linkcode loadScore}, `(active + inFlight) / cores`: lower is better. */
  score: number;
  /** Active sandboxes in its last reading. */
  active: number;
  /** Placements since that reading. */
  inFlight: number;
  /** Its cpu count, the score's divisor. */
  cores: number;
  /** The first tie-breaker: more is better. */
  memoryAvailableBytes: number;
}

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

/** The limits the filters apply. */
export interface PlacerLimits {
  /** Reject a node whose cpu used % is above this. */
  cpuLimitPct: number;
  /** Reject a node whose active + in-flight count is at or above this. */
  activeLimit: number;
  /** Reject a node whose data disk has fewer available bytes than this. */
  minDiskBytes: number;
}

/**
 * What a filter sees of one node. `pick()` reuses one object for every node (no allocation per
 * node), so a filter must not keep it.
 */
export interface FilterInput {
  /** The node being judged; its `reading` is non-null for every filter after `no-reading`. */
  node: FleetNode;
  /** Now, by the fleet's clock. */
  now: number;
  /** Placements counted against it since its last reading, not yet in `reading`. */
  inFlight: number;
  /** The Placer's limits: a filter's sentence quotes the one it applies. */
  limits: PlacerLimits;
  /** Whether the fleet calls it down at `now`. */
  down: boolean;
  /** What the create asks for (template, volumes). */
  ask: PlacementAsk;
}

/** One feasibility filter: returns a detail sentence when it rejects, `undefined` otherwise. */
export interface PlacementFilter {
  /** The reason counted in `explain.rejected` and shown with each rejection. */
  reason: RejectReason;
  /** Rejects with a sentence, or passes with `undefined`. */
  check(input: FilterInput): string | undefined;
}

/**
 * The filter chain, built in one place. Why this order: the first reason a node fails is the
 * one reported, so the cheapest and most fundamental questions come first. Down and no-reading
 * mean there is nothing current to judge by (every later filter reads the reading); template
 * and volume next because a node without them can never serve the create, however idle, so
 * its load is not the news; cpu is a host-wide pressure signal; active-limit is our own
 * ceiling; disk last because it rarely binds and a full disk on a busy node is better reported
 * as busy.
 */
export const placementFilters: readonly PlacementFilter[] = [
  {
    reason: "down",
    check: ({ node, now, down }) =>
      down
        ? node.heardSinceStart
          ? `down: no check-in for ${
            Math.round((now - node.lastCheckIn) / 1000)
          } s (interval ${node.intervalSeconds} s)`
          : "down: not heard since the gateway started"
        : undefined,
  },
  {
    reason: "no-reading",
    check: ({ node }) => node.reading === null ? "no reading yet" : undefined,
  },
  {
    reason: "template",
    // A node that does not say (it predates capabilities) is not refused: it did not before.
    check: ({ node, ask }) =>
      ask.template !== undefined && node.templates !== null &&
        !node.templates.includes(ask.template)
        ? `lacks template '${ask.template}'`
        : undefined,
  },
  {
    reason: "volume",
    check: ({ node, ask }) => {
      for (const v of ask.volumes ?? []) {
        if (!node.volumes.includes(v)) return `lacks volume '${v}'`;
      }
      return undefined;
    },
  },
  {
    reason: "cpu",
    check: ({ node, limits }) => {
      const pct = node.reading!.cpuUsedPct;
      // A first reading has no cpu figure (it needs two samples); it must not block a new node.
      return pct !== null && pct > limits.cpuLimitPct
        ? `cpu ${pct.toFixed(0)}% is above the limit ${limits.cpuLimitPct}% ` +
          `(DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT)`
        : undefined;
    },
  },
  {
    reason: "active-limit",
    check: ({ node, inFlight, limits }) => {
      const active = node.reading!.sandboxes.active;
      return active + inFlight >= limits.activeLimit
        ? `${active} active + ${inFlight} in flight reaches the limit ${limits.activeLimit} ` +
          `(DORMICE_GATEWAY_NODE_ACTIVE_LIMIT)`
        : undefined;
    },
  },
  {
    reason: "disk",
    check: ({ node, limits }) => {
      const disk = node.reading!.dataDisk;
      return disk !== null && disk.availableBytes < limits.minDiskBytes
        ? `data disk has ${gb(disk.availableBytes)} GB available, below the floor ` +
          `${gb(limits.minDiskBytes)} GB (DORMICE_GATEWAY_NODE_MIN_DISK_GB)`
        : undefined;
    },
  },
];

/**
 * The score of a node that passed every filter; lower wins:
 *
 *     score = (active + inFlight) / cores
 *
 * Per core, so a node with twice the cores takes twice the sandboxes before the two tie; with the
 * placements in flight, so a burst of creates inside one check-in interval spreads over the
 * fleet instead of piling onto the node whose last reading looked emptiest. Ties go to more
 * available memory, then the smaller node id (see `Placer.pick()`). Warm-aware placement (power
 * of two choices among the nodes holding a warm sandbox) compares candidates with this score.
 *
 * @example
 * ```ts
 * import { Fleet, loadScore } from "@dormice/cluster/gateway";
 * const fleet = new Fleet();
 * fleet.checkIn({
 *   nodeId: "a", endpoint: "http://10.0.0.1:3676", intervalSeconds: 15, build: "dev",
 *   reading: {
 *     takenAt: 0, cpuCount: 4, cpuUsedPct: null, memoryTotalBytes: 8e9,
 *     memoryAvailableBytes: 4e9, swapTotalBytes: 0, swapFreeBytes: 0, dataDisk: null,
 *     sandboxes: { active: 6, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
 *   },
 * });
 * console.log(loadScore(fleet.get("a")!, 2)); // 2, that is (6 active + 2 in flight) / 4 cores
 * fleet.close();
 * ```
 */
export function loadScore(node: FleetNode, inFlight: number): number {
  const reading = node.reading!;
  return (reading.sandboxes.active + inFlight) / reading.cpuCount;
}

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
 * A small seeded random source (mulberry32): the same seed gives the same sequence, so a test
 * or a post-mortem replays the power-of-two-choices picks.
 *
 * @example
 * ```ts
 * import { seededRandom } from "@dormice/cluster/gateway";
 * const a = seededRandom(7), b = seededRandom(7);
 * console.log(a() === b()); // true
 * ```
 */
export function seededRandom(seed: number): () => number {
  let t = seed >>> 0;
  return () => {
    t = (t + 0x6d2b79f5) >>> 0;
    let r = Math.imul(t ^ (t >>> 15), 1 | t);
    r = (r + Math.imul(r ^ (r >>> 7), 61 | r)) ^ r;
    return ((r ^ (r >>> 14)) >>> 0) / 4294967296;
  };
}

/** One warm holder offered to {@linkcode pickTwoChoices}. */
export interface WarmCandidate {
  /** The node id. */
  nodeId: string;
  /** Its warm count for the key (already less the claims in flight); above 0. */
  warm: number;
  /** Its {@linkcode loadScore}: lower is better. */
  score: number;
}

/**
 * Power of two choices over warm holders: two distinct candidates sampled with probability
 * proportional to their warm count, the one with the lower load score kept (ties: more warm,
 * then the first sampled). Sampling, not the best of all, so several gateways reading the same
 * check-ins do not all send their claims to one node; weighting by warm, so a node with a
 * deep pool takes more claims than one with a single warm sandbox. One candidate is simply
 * chosen. Returns the chosen index, the sampled indexes and why.
 *
 * @example
 * ```ts
 * import { pickTwoChoices, seededRandom } from "@dormice/cluster/gateway";
 * const r = pickTwoChoices([
 *   { nodeId: "a", warm: 4, score: 2 },
 *   { nodeId: "b", warm: 4, score: 1 },
 * ], seededRandom(1));
 * console.log(r.chosen); // 1: both were sampled and b is less loaded
 * ```
 */
export function pickTwoChoices(
  candidates: readonly WarmCandidate[],
  random: () => number,
): { chosen: number; sampled: number[]; why: string } {
  if (candidates.length === 0) throw new RangeError("pickTwoChoices needs a candidate");
  if (candidates.length === 1) {
    return { chosen: 0, sampled: [0], why: "the only node with a warm sandbox for this pool" };
  }
  let total = 0;
  for (const c of candidates) total += c.warm;
  const first = weighted(candidates, total, random, -1);
  const second = weighted(candidates, total - candidates[first].warm, random, first);
  const a = candidates[first], b = candidates[second];
  let chosen = first;
  let why: string;
  if (b.score < a.score) chosen = second, why = "lower load score";
  else if (b.score > a.score) why = "lower load score";
  else if (b.warm > a.warm) chosen = second, why = "same load score, more warm";
  else why = b.warm < a.warm ? "same load score, more warm" : "a tie: the first sampled";
  return { chosen, sampled: [first, second], why };
}

/** An index drawn with probability proportional to warm, skipping `except`. */
function weighted(
  candidates: readonly WarmCandidate[],
  total: number,
  random: () => number,
  except: number,
): number {
  let at = random() * total;
  let last = -1;
  for (let i = 0; i < candidates.length; i++) {
    if (i === except) continue;
    last = i;
    at -= candidates[i].warm;
    if (at < 0) return i;
  }
  return last; // rounding at the top end
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
      "volume": 0,
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

/**
 * The best `k` feasible nodes seen so far, best first, kept in a small sorted array: one pass
 * over the fleet and no sort of all nodes, so `pick()` stays under a millisecond for 10,000.
 */
class BestNodes {
  /** What `explain.scores` shows. */
  readonly scores: ScoredNode[] = [];
  /** The nodes behind `scores`, index for index. */
  readonly nodes: FleetNode[] = [];
  readonly #k: number;

  constructor(k: number) {
    this.#k = k;
  }

  /** Keeps `node` if it ranks among the best `k`; its entry is built only then. */
  offer(node: FleetNode, score: number, inFlight: number): void {
    const { scores, nodes } = this;
    const k = this.#k;
    const reading = node.reading!;
    const memory = reading.memoryAvailableBytes;
    if (scores.length === k && !better(score, memory, node.id, scores[k - 1])) return;
    let at = scores.length < k ? scores.length : k - 1;
    while (at > 0 && better(score, memory, node.id, scores[at - 1])) at--;
    if (scores.length === k) {
      scores.pop();
      nodes.pop();
    }
    scores.splice(at, 0, {
      nodeId: node.id,
      score,
      active: reading.sandboxes.active,
      inFlight,
      cores: reading.cpuCount,
      memoryAvailableBytes: memory,
    });
    nodes.splice(at, 0, node);
  }
}

/** Whether (score, memory, id) beats `than`: lower score, then more memory, then smaller id. */
function better(score: number, memory: number, id: string, than: ScoredNode): boolean {
  if (score !== than.score) return score < than.score;
  if (memory !== than.memoryAvailableBytes) return memory > than.memoryAvailableBytes;
  return id < than.nodeId;
}

function gb(bytes: number): string {
  return (bytes / 1e9).toFixed(1);
}
