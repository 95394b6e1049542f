/**
 * Benchmark 3, the lookup round on a miss: `Finder.lookup()` asking 1, 10, 50 and 200 stub
 * nodes in parallel, and a round with one node whose SYNs are dropped (bounded at the deadline).
 *
 * The stub nodes run in a child process (one listener per node), so their work happens on the
 * other core, as real nodes' would on other machines; the Finder and its `fetch` run here.
 *
 * Reference: one direct `POST /lookupSandbox` to one stub, measured in the same run: the round
 * trip every lookup is made of. The ratio is what asking N nodes at once costs over asking one.
 *
 * @module
 */
import { Fleet } from "../../gateway/fleet/fleet.ts";
import { Finder } from "../../gateway/finder/finder.ts";
import { benchToken, checkIn, freePort, reading, startStubNodes } from "../lib/fixtures.ts";
import { median, percentile, type Row, row, type Section } from "../lib/stats.ts";
import { dropSyns, synDropUnavailable } from "../../tests/support/syn_drop.ts";

/** Options of the lookup benchmark. */
export interface LookupOptions {
  /** Runs per size (at least five). */
  runs: number;
  /** Fleet sizes. */
  sizes?: number[];
  /** Rounds per run at each size (p50/p99 are taken within a run). */
  rounds?: number;
}

async function directLookup(port: number, name: string): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`http://127.0.0.1:${port}/lookupSandbox`, {
    method: "POST",
    headers: { "authorization": `Bearer ${benchToken}`, "content-type": "application/json" },
    body: JSON.stringify({ name }),
  });
  await res.json();
  return performance.now() - t0;
}

/** Runs the lookup-round benchmark over stub nodes. */
export async function runLookup(options: LookupOptions): Promise<Section> {
  const { runs, sizes = [1, 10, 50, 200], rounds = 60 } = options;
  const max = Math.max(...sizes);
  const stubs = await startStubNodes(max);
  const rows: Row[] = [];
  const notes: string[] = [];
  let seq = 0;
  try {
    const ports = stubs.ready.ports;
    for (const n of sizes) {
      const fleet = new Fleet();
      for (let i = 0; i < n; i++) fleet.checkIn(checkIn(i, `http://127.0.0.1:${ports[i]}`));
      const finder = new Finder({ fleet, token: benchToken });
      // Warm the connection pool: a gateway that is up has connections to its nodes.
      await finder.lookup("name", `warm-${n}`);
      await directLookup(ports[0], "warm");
      const ref50: number[] = [], ref99: number[] = [], p50: number[] = [], p99: number[] = [];
      for (let r = 0; r < runs; r++) {
        const direct: number[] = [], round: number[] = [];
        for (let k = 0; k < rounds; k++) {
          direct.push(await directLookup(ports[0], `miss-${++seq}`));
          const t0 = performance.now();
          const result = await finder.lookup("name", `miss-${++seq}`);
          round.push(performance.now() - t0);
          if (result.kind !== "none") throw new Error(`A miss came back '${result.kind}'`);
        }
        ref50.push(percentile(direct, 50));
        ref99.push(percentile(direct, 99));
        p50.push(percentile(round, 50));
        p99.push(percentile(round, 99));
      }
      fleet.close();
      const label = `${n} node${n === 1 ? "" : "s"}`;
      rows.push(row(`direct lookup to one stub p50 (reference, ${label} run)`, "ms", ref50, ref50));
      rows.push(row(`lookup round p50, ${label}`, "ms", p50, ref50, {
        ...(n === 200 ? { target: "p50 ≤ 20 ms", met: median(p50) <= 20 } : {}),
      }));
      rows.push(row(`lookup round p99, ${label}`, "ms", p99, ref50));
    }
    notes.push(
      `${rounds} sequential rounds per run, each for a name no node has (every node answers ` +
        `{found:false}); p50/p99 are within one run, then the median over runs. Connections to ` +
        `the stubs are warm (fetch keeps them alive), as in a running gateway.`,
    );
  } finally {
    await stubs.stop();
  }
  return {
    title: "Lookup round on a miss",
    reference: "one direct POST /lookupSandbox to one stub node, p50, measured in the same run",
    rows,
    notes,
  };
}

/** Options of the SYN-drop benchmark. */
export interface SynDropOptions {
  /** Runs (at least five). */
  runs: number;
  /** The Finder's deadline (the default 2,000 ms). */
  timeoutMs?: number;
}

/** Runs the lookup round with one of ten nodes dropping SYNs. */
export async function runSynDrop(options: SynDropOptions): Promise<Section> {
  const { runs, timeoutMs = 2000 } = options;
  const title = "Lookup round with one node dropping SYNs";
  const why = await synDropUnavailable();
  if (why !== undefined) return { title, reference: "", rows: [], notes: [], skipped: why };
  const stubs = await startStubNodes(9);
  // A port nothing listens on: the DROP rule means no RST either, so connect just hangs.
  const blackhole = freePort();
  const fleet = new Fleet();
  const rows: Row[] = [];
  let undrop: (() => Promise<void>) | undefined;
  try {
    stubs.ready.ports.forEach((p, i) => fleet.checkIn(checkIn(i, `http://127.0.0.1:${p}`)));
    fleet.checkIn(checkIn(9, `http://127.0.0.1:${blackhole}`, reading()));
    const finder = new Finder({ fleet, token: benchToken, timeoutMs });
    undrop = await dropSyns(blackhole);
    const took: number[] = [];
    for (let r = 0; r < runs; r++) {
      const t0 = performance.now();
      const result = await finder.lookup("name", `syn-${r}`);
      took.push(performance.now() - t0);
      if (result.kind !== "unsure") throw new Error(`Expected 'unsure', got '${result.kind}'`);
    }
    const deadline = took.map(() => timeoutMs);
    rows.push(row("deadline (reference)", "ms", deadline, deadline));
    rows.push(row("round with 1 of 10 nodes dropping SYNs", "ms", took, deadline, {
      target: `${timeoutMs} ms ± 5%`,
      met: took.every((t) => Math.abs(t - timeoutMs) <= timeoutMs * 0.05),
    }));
  } finally {
    await undrop?.();
    fleet.close();
    await stubs.stop();
  }
  return {
    title,
    reference: "the Finder's deadline (DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS default)",
    rows,
    notes: [
      "iptables -I INPUT -p tcp --dport P --syn -j DROP on a loopback port nothing listens on; " +
      "the rule is removed in a finally. The answer is 'unsure' (a 503 with Retry-After at the " +
      "gateway). Met means every run, not just the median, is within ±5%.",
    ],
  };
}
