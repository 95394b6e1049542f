/**
 * How the Placer chooses among the nodes that pass every filter: the load score, the k best by
 * score, and power of two choices among warm holders with a seeded random source.
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";

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
 * The best `k` feasible nodes seen so far, best first, kept in a small sorted array: one pass
 * over the fleet and no sort of all nodes, so `pick()` stays under a millisecond for 10,000.
 */
export class BestNodes {
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
