/**
 * Benchmark 4, placement: `Placer.pick()` over 100, 1,000 and 10,000 nodes of a real `Fleet`.
 *
 * Reference: a plain loop over the same nodes (an array of the Fleet's own node objects) that
 * keeps the lowest (active / cores) — the least work any placer must do, reading every node
 * once. The ratio is what the filters, the in-flight lookup and the explain cost on top.
 * A sort of all nodes by score (what a naive placer does) is shown against the same reference.
 *
 * @module
 */
import { Fleet } from "../../gateway/fleet/fleet.ts";
import { Placer } from "../../gateway/placer/placer.ts";
import type { FleetNode } from "../../gateway/fleet/fleet.ts";
import { checkIn, reading, seeded } from "../lib/fixtures.ts";
import { median, type Row, row, type Section } from "../lib/stats.ts";

/** Options of the placement benchmark. */
export interface PlacementOptions {
  /** Runs per size (at least five). */
  runs: number;
  /** Fleet sizes. */
  sizes?: number[];
}

/** Builds a fleet of `n` nodes: varied load and memory, 2% above the cpu limit. */
export function buildFleet(n: number): Fleet {
  const fleet = new Fleet();
  const rand = seeded(n);
  for (let i = 0; i < n; i++) {
    const busy = rand() < 0.02;
    fleet.checkIn(checkIn(
      i,
      `http://10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}:3676`,
      reading({
        cpuCount: [2, 4, 8, 16][Math.floor(rand() * 4)],
        cpuUsedPct: busy ? 95 : Math.floor(rand() * 60),
        memoryAvailableBytes: Math.floor(rand() * 64) * 1e9,
      }, Math.floor(rand() * 200)),
    ));
  }
  return fleet;
}

/** Microseconds per call of `fn`, averaged over enough calls to fill about `budgetMs`. */
function perCallMicros(fn: () => unknown, budgetMs: number): number {
  // Calibrate: how many calls fit the budget.
  let calls = 1;
  for (;;) {
    const t0 = performance.now();
    for (let i = 0; i < calls; i++) fn();
    const ms = performance.now() - t0;
    if (ms >= budgetMs / 4 || calls >= 1 << 20) {
      const total = Math.max(calls, Math.ceil((calls * budgetMs) / Math.max(ms, 0.001)));
      const t1 = performance.now();
      for (let i = 0; i < total; i++) fn();
      return ((performance.now() - t1) * 1000) / total;
    }
    calls *= 4;
  }
}

function plainLoop(nodes: FleetNode[]): FleetNode | undefined {
  let best: FleetNode | undefined;
  let bestScore = Infinity;
  for (let i = 0; i < nodes.length; i++) {
    const r = nodes[i].reading!;
    const s = r.sandboxes.active / r.cpuCount;
    if (s < bestScore) {
      bestScore = s;
      best = nodes[i];
    }
  }
  return best;
}

function sortAll(nodes: FleetNode[]): FleetNode {
  return [...nodes].sort((a, b) =>
    a.reading!.sandboxes.active / a.reading!.cpuCount -
      b.reading!.sandboxes.active / b.reading!.cpuCount ||
    b.reading!.memoryAvailableBytes - a.reading!.memoryAvailableBytes ||
    (a.id < b.id ? -1 : 1)
  )[0];
}

/** Runs the placement benchmark. */
export function runPlacement(options: PlacementOptions): Section {
  const { runs, sizes = [100, 1_000, 10_000] } = options;
  const rows: Row[] = [];
  const notes: string[] = [];
  for (const n of sizes) {
    const fleet = buildFleet(n);
    const placer = new Placer({ fleet });
    const nodes = [...fleet.nodes()];
    const check = placer.pick();
    if (!check.ok) throw new Error(`Placement benchmark fleet of ${n} has no feasible node`);
    const ref: number[] = [], pick: number[] = [], sorted: number[] = [];
    let sink = 0;
    for (let r = 0; r < runs; r++) {
      ref.push(perCallMicros(() => sink += plainLoop(nodes) ? 1 : 0, 60));
      pick.push(perCallMicros(() => sink += placer.pick().ok ? 1 : 0, 60));
      sorted.push(perCallMicros(() => sink += sortAll(nodes) ? 1 : 0, 60));
    }
    if (sink < 0) console.log(sink);
    const pickMs = median(pick) / 1000;
    rows.push(row(`plain loop, ${n.toLocaleString("en-US")} nodes (reference)`, "µs", ref, ref));
    rows.push(row(`Placer.pick(), ${n.toLocaleString("en-US")} nodes`, "µs", pick, ref, {
      ...(n === 10_000 ? { target: "≤ 1,000 µs", met: pickMs <= 1 } : {}),
    }));
    rows.push(row(`sort all nodes, ${n.toLocaleString("en-US")} nodes`, "µs", sorted, ref));
    if (n === sizes[sizes.length - 1]) {
      notes.push(
        `At ${n.toLocaleString("en-US")} nodes ${check.explain.rejections.length} are rejected ` +
          `(2% above the cpu limit, each with its detail sentence) and ${check.explain.feasible} ` +
          `are scored; the pick keeps the best ${check.explain.scores.length} for explain.`,
      );
    }
    fleet.close();
  }
  notes.push(
    "The plain loop reads each node's reading once and keeps the lowest active/cores: the floor " +
      "for any placer that looks at every node. Sorting all nodes is what a naive placer does.",
  );
  return {
    title: "Placement: Placer.pick()",
    reference: "a plain loop over the same node objects keeping the lowest active/cores",
    rows,
    notes,
  };
}
