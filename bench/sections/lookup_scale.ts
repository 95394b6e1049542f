/**
 * Benchmark 3b, the lookup miss at 1,000 and 10,000 nodes, with and without lookup digests
 * (docs/lookup-digest.md). The nodes are in-process stubs behind the Finder's injected `fetch`:
 * each answers at once from its own table, so a round's wall time is the gateway's own cost
 * (building 10,000 requests, parsing 10,000 answers, the digest checks), which two cores could
 * not show with 10,000 real listeners; CPU time per round is measured beside it.
 *
 * Reference: the same round asking every node (`lookupDigests: "off"`), in the same run. Every
 * node has checked in twice with a digest of its `perNode` sandboxes, saying it pushes creates
 * made behind the gateway's back, so the default mode `on` trusts it.
 *
 * Also one frozen node among 1,000: it stopped checking in (shown down) and swallows every
 * request. A new name is asked with the default mode (its last digest rules the name out) and,
 * as the reference, asking every node (the round waits out its 2 s deadline and is unsure).
 *
 * @module
 */
import process from "node:process";
import { FakeClock } from "../../shared/clock.ts";
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
    const body = {
      ...checkIn(i, endpoint),
      lookupDigest: { ...digest.toWire(), directPushed: true },
    };
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

/**
 * `n` nodes with empty digests that checked in twice; then node 0 stops checking in (down past
 * two intervals) and hangs every request, while the others check in once more.
 */
function frozenFleet(n: number) {
  const clock = new FakeClock(Date.now());
  const fleet = new Fleet({ clock });
  const empty = { ...LookupDigest.sized(1).toWire(), directPushed: true };
  const bodies = Array.from({ length: n }, (_, i) => ({
    ...checkIn(i, `http://stub-${i}.bench:1`),
    lookupDigest: empty,
  }));
  for (const body of bodies) {
    fleet.checkIn(body);
    fleet.checkIn(body);
  }
  clock.tick(31_000);
  for (const body of bodies.slice(1)) fleet.checkIn(body);
  const frozenHost = new URL(bodies[0].endpoint).host;
  if (!fleet.isDown(bodies[0].nodeId)) throw new Error("The frozen stub is not down");
  const fetchFn = ((input: RequestInfo | URL, init?: RequestInit) => {
    if (new URL(String(input)).host !== frozenHost) {
      return Promise.resolve(Response.json({ found: false }));
    }
    return new Promise<Response>((_, reject) => {
      const signal = init?.signal;
      signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
    });
  }) as typeof fetch;
  return { fleet, fetch: fetchFn };
}

/** Wall time of one lookup of a new name, and what it answered. */
async function timedMiss(finder: Finder, name: string): Promise<{ ms: number; kind: string }> {
  const t0 = performance.now();
  const result = await finder.lookup("name", name);
  return { ms: performance.now() - t0, kind: result.kind };
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
      lookupDigests: "on",
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
  // One frozen node among 1,000.
  const frozen = frozenFleet(1_000);
  const defaultMode = new Finder({
    fleet: frozen.fleet,
    token: benchToken,
    fetch: frozen.fetch,
    lookupDigests: "on",
  });
  const everyNode = new Finder({ fleet: frozen.fleet, token: benchToken, fetch: frozen.fetch });
  const frozenOn: number[] = [], frozenOff: number[] = [];
  for (let r = 0; r < runs; r++) {
    const walls: number[] = [];
    for (let k = 0; k < rounds; k++) {
      const m = await timedMiss(defaultMode, `frozen-on-${++seq}`);
      if (m.kind !== "none") throw new Error(`A round beside the frozen node was '${m.kind}'`);
      walls.push(m.ms);
    }
    frozenOn.push(percentile(walls, 50));
    const off = await timedMiss(everyNode, `frozen-off-${++seq}`);
    if (off.kind !== "unsure") throw new Error(`Asking every node was '${off.kind}'`);
    frozenOff.push(off.ms);
  }
  frozen.fleet.close();
  rows.push(
    row(
      "one frozen node among 1,000, new name, every node asked (reference): wall (unsure, 503)",
      "ms",
      frozenOff,
      frozenOff,
    ),
  );
  rows.push(
    row(
      "one frozen node among 1,000, new name, default digests: wall p50 (none, placed)",
      "ms",
      frozenOn,
      frozenOff,
      { target: "answers at once (< 20 ms)", met: median(frozenOn) < 20 },
    ),
  );
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
      "Frozen node: one stub of 1,000 stopped checking in (down) and never answers; each run " +
      `times ${rounds} new names with the default mode and one asking every node (2 s deadline).`,
    ],
  };
}
