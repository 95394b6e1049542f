/**
 * Benchmark 3b, the lookup miss at 1,000 and 10,000 nodes, with and without lookup digests
 * (docs/lookup-digest.md). The nodes are in-process stubs behind the Finder's injected `fetch`:
 * each answers at once from its own table, so a round's wall time is the gateway's own cost
 * (building 10,000 requests, parsing 10,000 answers, the digest checks), which two cores could
 * not show with 10,000 real listeners; CPU time per round is measured beside it.
 *
 * Reference: the same round asking every node (`lookupDigests: "off"`, the default), in
 * the same run. Every node has checked in twice with a digest of its `perNode` sandboxes.
 *
 * @module
 */
import process from "node:process";
import { Fleet } from "../../gateway/fleet/fleet.ts";
import { Finder } from "../../gateway/finder/finder.ts";
import {
  idDigestKey,
  LookupDigest,
  nameDigestKey,
  NODE_DIGEST_FALSE_POSITIVE_RATE,
} from "../../shared/lookup_digest.ts";
import { benchToken, checkIn } from "../lib/fixtures.ts";
import { median, percentile, type Row, row, type Section } from "../lib/stats.ts";

/** Options of the lookup-at-scale benchmark. */
export interface LookupScaleOptions {
  /** Runs per size (at least five). */
  runs: number;
  /** Fleet sizes. */
  sizes?: number[];
  /** Sandboxes each node holds (names and ids in its digest). */
  perNode?: number;
  /** Rounds per run and mode. */
  rounds?: number;
}

interface Measured {
  wall50: number;
  cpu50: number;
  asked: number;
}

/** An in-process fleet of `n` stub nodes, each holding `perNode` sandboxes. */
function stubFleet(n: number, perNode: number) {
  const fleet = new Fleet();
  const held = new Map<string, Set<string>>();
  let requests = 0;
  for (let i = 0; i < n; i++) {
    const endpoint = `http://stub-${i}.bench:1`;
    const names = new Set<string>();
    const digest = LookupDigest.sized(perNode * 2, NODE_DIGEST_FALSE_POSITIVE_RATE);
    for (let s = 0; s < perNode; s++) {
      names.add(`held-${i}-${s}`);
      digest.add(nameDigestKey(undefined, `held-${i}-${s}`));
      digest.add(idDigestKey(`sbx_${i}_${s}`));
    }
    held.set(new URL(endpoint).host, names);
    const body = { ...checkIn(i, endpoint), lookupDigest: digest.toWire() };
    // Twice: the Finder trusts a node's digest from its second check-in to this process.
    fleet.checkIn(body);
    fleet.checkIn(body);
  }
  const fetchFn = async (request: Request) => {
    requests++;
    const url = new URL(request.url);
    const { name } = await request.json() as { name?: string };
    const found = name !== undefined && held.get(url.host)?.has(name);
    return Response.json(
      found
        ? { found: true, sandbox: { id: `sbx_${name}`, name, state: "active" } }
        : { found: false },
    );
  };
  return { fleet, fetch: fetchFn, requests: () => requests };
}

async function measure(
  finder: Finder,
  requests: () => number,
  rounds: number,
  key: (k: number) => string,
  expect: "none" | "one",
): Promise<Measured> {
  const wall: number[] = [], cpu: number[] = [];
  const before = requests();
  for (let k = 0; k < rounds; k++) {
    const c0 = process.cpuUsage();
    const t0 = performance.now();
    const result = await finder.lookup("name", key(k));
    wall.push(performance.now() - t0);
    const c = process.cpuUsage(c0);
    cpu.push((c.user + c.system) / 1000);
    if (result.kind !== expect) throw new Error(`A round came back '${result.kind}'`);
  }
  return {
    wall50: percentile(wall, 50),
    cpu50: percentile(cpu, 50),
    asked: (requests() - before) / rounds,
  };
}

/** Runs the lookup-at-scale benchmark. */
export async function runLookupScale(options: LookupScaleOptions): Promise<Section> {
  const { runs, sizes = [1_000, 10_000], perNode = 20, rounds = 30 } = options;
  const rows: Row[] = [];
  let seq = 0;
  for (const n of sizes) {
    const stubs = stubFleet(n, perNode);
    const every = new Finder({ fleet: stubs.fleet, token: benchToken, fetch: stubs.fetch });
    const digests = new Finder({
      fleet: stubs.fleet,
      token: benchToken,
      fetch: stubs.fetch,
      lookupDigests: "sole-writer",
    });
    // Warm the JIT on both paths before measuring.
    await measure(every, stubs.requests, 3, (k) => `warm-${k}-${++seq}`, "none");
    await measure(digests, stubs.requests, 3, (k) => `warm-${k}-${++seq}`, "none");
    const off: Measured[] = [], on: Measured[] = [], hit: Measured[] = [];
    for (let r = 0; r < runs; r++) {
      off.push(await measure(every, stubs.requests, rounds, () => `miss-${++seq}`, "none"));
      on.push(await measure(digests, stubs.requests, rounds, () => `miss-${++seq}`, "none"));
      hit.push(
        await measure(digests, stubs.requests, rounds, (k) => `held-${(k * 7919) % n}-3`, "one"),
      );
    }
    stubs.fleet.close();
    const label = `${n.toLocaleString("en-US")} nodes`;
    const ref = off.map((m) => m.wall50);
    const refAsked = off.map((m) => m.asked);
    rows.push(row(`miss, every node asked (reference), ${label}: wall p50`, "ms", ref, ref));
    rows.push(row(`miss, every node asked, ${label}: CPU p50`, "ms", off.map((m) => m.cpu50), ref));
    rows.push(row(`miss, every node asked, ${label}: nodes asked`, "requests", refAsked, null));
    rows.push(row(`miss with digests, ${label}: wall p50`, "ms", on.map((m) => m.wall50), ref, {
      ...(n === 10_000 ? { target: "p50 < 20 ms", met: median(on.map((m) => m.wall50)) < 20 } : {}),
    }));
    rows.push(row(`miss with digests, ${label}: CPU p50`, "ms", on.map((m) => m.cpu50), ref));
    const asked = on.map((m) => m.asked);
    rows.push(row(`miss with digests, ${label}: nodes asked`, "requests", asked, refAsked, {
      ...(n === 10_000 ? { target: "≤ a few dozen (≤ 36)", met: median(asked) <= 36 } : {}),
    }));
    rows.push(
      row(
        `hit on one node with digests, ${label}: nodes asked`,
        "requests",
        hit.map((m) => m.asked),
        refAsked,
      ),
    );
    rows.push(
      row(`hit on one node with digests, ${label}: wall p50`, "ms", hit.map((m) => m.wall50), ref),
    );
  }
  return {
    title: "Lookup miss at scale, with lookup digests",
    reference:
      "the same miss asking every node (lookupDigests off, today's rule), wall p50, same run",
    rows,
    notes: [
      `${rounds} sequential rounds per run and mode; every node holds ${perNode} sandboxes and ` +
      "has checked in twice with its digest (0.1% false positives, as nodes size them), so the " +
      "expected fan-out of a miss is 0.1% of the fleet. Stubs are in-process (the Finder's fetch seam) and answer at " +
      "once: wall time is the gateway's own work, CPU time is process.cpuUsage over the round. " +
      "Real nodes add one network round trip (see the lookup round table) to either mode.",
    ],
  };
}
