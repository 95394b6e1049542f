/**
 * `deno bench` entry for the in-process hot paths, for quick looks and `--cpu-prof` sessions:
 * `Placer.pick()` over 10,000 nodes, and a Finder cache hit with 100,000 sandboxes cached.
 * The harness (`deno task bench`) measures the same with ratios; this file is for iterating.
 *
 * Run: `deno bench --allow-read bench/probes/placement_bench.ts`
 *
 * @module
 */
import { Placer } from "../../gateway/placer/placer.ts";
import { Finder } from "../../gateway/finder/finder.ts";
import { buildFleet } from "../sections/placement.ts";
import { benchToken } from "../lib/fixtures.ts";

const fleet = buildFleet(10_000);
const placer = new Placer({ fleet });
const nodes = [...fleet.nodes()];
const finder = new Finder({ fleet, token: benchToken });
for (let i = 0; i < 100_000; i++) {
  finder.remember(nodes[i % nodes.length], {
    id: `sbx-${i}`,
    name: `agent-${String(i).padStart(6, "0")}`,
    state: "active",
  });
}
let i = 0;

Deno.bench("Placer.pick() over 10,000 nodes", { group: "placement", baseline: true }, () => {
  placer.pick();
});

Deno.bench("Finder.cached() hit, 100,000 cached", { group: "cache" }, () => {
  finder.cached("name", `agent-${String(i++ % 100_000).padStart(6, "0")}`);
});

globalThis.addEventListener("unload", () => fleet.close());
