/**
 * Benchmark 5, bursts: 1,000 simultaneous acquires of distinct names over 10 nodes (how evenly
 * they spread, and how fast), and 200 simultaneous acquires of one name (exactly one create).
 *
 * Two paths, each a section of its own: through a real gateway process (`gateway/main.ts`) with
 * the stub nodes checked in to it (`bursts`), and in-process with the library pieces the gateway
 * is made of (NameQueue slot → Finder.confirm → Placer.place → create on the node → remember;
 * `bursts-inprocess`), which shows what the HTTP face adds.
 * The stub nodes run in a child process and count the sandboxes they create.
 *
 * Reference: the same 1,000 acquires sent straight to the stub nodes round-robin (no slot, no
 * lookup, no placement), and for the one-name burst 200 lookups by id sent one after another to
 * the node (what the slot serialises the burst into).
 *
 * @module
 */
import { Fleet } from "../../gateway/fleet/fleet.ts";
import { Finder } from "../../gateway/finder/finder.ts";
import { Placer } from "../../gateway/placer/placer.ts";
import { NameQueue } from "../../shared/name_queue.ts";
import { benchToken, checkIn, postJson, startStubNodes } from "../lib/fixtures.ts";
import { median, type Row, row, type Section } from "../lib/stats.ts";

const post = postJson;

/** An acquire by name, as the gateway does it (used when no gateway process exists). */
type Acquire = (name: string) => Promise<void>;

function inProcessAcquire(
  fleet: Fleet,
  timeoutMs: number,
  fetchFn: typeof fetch,
): { acquire: Acquire; close(): void } {
  const finder = new Finder({ fleet, token: benchToken, timeoutMs, fetch: fetchFn });
  const placer = new Placer({ fleet });
  const queue = new NameQueue();
  const acquire: Acquire = (name) =>
    queue.run(name, async () => {
      const found = await finder.confirm("name", name);
      if (found.kind === "one") return;
      if (found.kind !== "none") {
        throw new Error(
          `Lookup of '${name}' was '${found.kind}': ${"message" in found ? found.message : ""}`,
        );
      }
      const placed = placer.place(name);
      if (!placed.ok) throw new Error(placed.message);
      const answer = await post(`${placed.node.endpoint}/acquireSandbox`, { name });
      if (answer.status !== 200) throw new Error(`Create answered ${answer.status}`);
      finder.remember(placed.node, answer.json.sandbox);
    });
  return { acquire, close: () => {} };
}

/** Where acquires go: an in-process stand-in, or a real gateway's URL. */
export interface BurstTarget {
  /** How the path was measured, for the notes. */
  label: string;
  /** Registers the stub nodes with the target (check-ins). */
  join(ports: number[]): Promise<void>;
  /** Acquires one name. */
  acquire: Acquire;
  /** Releases what it holds. */
  close(): Promise<void>;
}

/** The in-process target: the library pieces without the HTTP face. */
export function inProcessTarget(
  timeoutMs = 2000,
  fetchFn: typeof fetch = fetch,
  label = "in-process: NameQueue + Finder.confirm + Placer.place + create",
): BurstTarget {
  const fleet = new Fleet();
  const inner = inProcessAcquire(fleet, timeoutMs, fetchFn);
  return {
    label,
    join: (ports) => {
      ports.forEach((p, i) => fleet.checkIn(checkIn(i, `http://127.0.0.1:${p}`)));
      return Promise.resolve();
    },
    acquire: inner.acquire,
    close: () => {
      fleet.close();
      return Promise.resolve();
    },
  };
}

/** A real gateway at `origin`: check-ins and acquires go over HTTP. */
export function gatewayTarget(origin: string, label: string): BurstTarget {
  return {
    label,
    join: async (ports) => {
      for (let i = 0; i < ports.length; i++) {
        const r = await post(`${origin}/checkIn`, checkIn(i, `http://127.0.0.1:${ports[i]}`));
        if (r.status >= 300) {
          throw new Error(`checkIn answered ${r.status}: ${JSON.stringify(r.json)}`);
        }
      }
    },
    acquire: async (name) => {
      const r = await post(`${origin}/acquireSandbox`, { name });
      if (r.status !== 200) {
        throw new Error(`acquireSandbox answered ${r.status}: ${JSON.stringify(r.json)}`);
      }
    },
    close: () => Promise.resolve(),
  };
}

/** Options of the burst benchmark. */
export interface BurstOptions {
  /** Runs (at least five). */
  runs: number;
  /** Builds a fresh target for one run (a fresh gateway or in-process set). */
  target: () => Promise<BurstTarget>;
  /** Distinct names per burst. */
  distinct?: number;
  /** Acquires of one name per burst. */
  same?: number;
}

/** Runs the burst benchmark. */
export async function runBursts(options: BurstOptions): Promise<Section> {
  const { runs, distinct = 1000, same = 200 } = options;
  const stubs = await startStubNodes(10);
  const ports = stubs.ready.ports;
  const spread: number[] = [], rate: number[] = [], refRate: number[] = [];
  const creates: number[] = [], sameMs: number[] = [], refSameMs: number[] = [];
  const failed: number[] = [];
  let label = "", firstError = "";
  try {
    for (let r = 0; r < runs; r++) {
      await Promise.all(ports.map((p) => post(`http://127.0.0.1:${p}/reset`, {})));
      const target = await options.target();
      label = target.label;
      try {
        await target.join(ports);
        // Warm connections: one acquire, then reset the counts.
        await target.acquire(`warm-${r}`);
        await Promise.all(ports.map((p) => post(`http://127.0.0.1:${p}/reset`, {})));

        let t0 = performance.now();
        const settled = await Promise.allSettled(
          Array.from({ length: distinct }, (_, i) => target.acquire(`burst-${r}-${i}`)),
        );
        rate.push(distinct / ((performance.now() - t0) / 1000));
        const errors = settled.filter((s) => s.status === "rejected") as PromiseRejectedResult[];
        failed.push(errors.length);
        if (errors.length > 0 && firstError === "") {
          firstError = String(errors[0].reason?.message ?? errors[0].reason);
        }
        const counts = await Promise.all(
          ports.map(async (p) =>
            (await (await fetch(`http://127.0.0.1:${p}/stats`)).json()).creates as number
          ),
        );
        const total = counts.reduce((a, b) => a + b, 0);
        if (total !== distinct - errors.length) {
          throw new Error(`${total} creates for ${distinct - errors.length} acquired names`);
        }
        spread.push(Math.max(...counts) - Math.min(...counts));

        t0 = performance.now();
        await Promise.all(
          Array.from({ length: same }, () => target.acquire(`one-name-${r}`)),
        );
        sameMs.push(performance.now() - t0);
        const after = await Promise.all(
          ports.map(async (p) =>
            (await (await fetch(`http://127.0.0.1:${p}/stats`)).json()).creates as number
          ),
        );
        creates.push(after.reduce((a, b) => a + b, 0) - total);
      } finally {
        await target.close();
      }

      // References: the creates straight to the nodes, and the one-name burst's serial floor.
      await Promise.all(ports.map((p) => post(`http://127.0.0.1:${p}/reset`, {})));
      let t0 = performance.now();
      await Promise.all(
        Array.from(
          { length: distinct },
          (_, i) =>
            post(`http://127.0.0.1:${ports[i % ports.length]}/acquireSandbox`, {
              name: `direct-${r}-${i}`,
            }),
        ),
      );
      refRate.push(distinct / ((performance.now() - t0) / 1000));
      const made = await post(`http://127.0.0.1:${ports[0]}/acquireSandbox`, { name: "x" });
      t0 = performance.now();
      for (let i = 0; i < same; i++) {
        await post(`http://127.0.0.1:${ports[0]}/lookupSandbox`, { id: made.json.sandbox.id });
      }
      refSameMs.push(performance.now() - t0);
    }
  } finally {
    await stubs.stop();
  }
  const ones = creates.map(() => 1);
  const rows: Row[] = [
    row(`${distinct} creates straight to the nodes (reference)`, "acquires/s", refRate, refRate),
    row(`${distinct} simultaneous acquires, distinct names, 10 nodes`, "acquires/s", rate, refRate),
    row("acquires that failed", "acquires", failed, null, {
      target: "0",
      met: failed.every((f) => f === 0),
      digits: 0,
    }),
    row("spread: max − min sandboxes per node", "sandboxes", spread, null, {
      target: "≤ 1",
      met: Math.max(...spread) <= 1,
      digits: 0,
    }),
    row(
      `${same} lookups by id, one after another, to one node (reference)`,
      "ms",
      refSameMs,
      refSameMs,
    ),
    row(`${same} simultaneous acquires of one name`, "ms", sameMs, refSameMs),
    row("creates for that one name", "creates", creates, ones, {
      target: "exactly 1",
      met: creates.every((c) => c === 1),
      digits: 0,
    }),
  ];
  return {
    title: "Bursts",
    reference: `the same work sent straight to the stub nodes in the same run`,
    rows,
    notes: [
      `Path: ${label}.`,
      `Met means every run, not just the median. Each acquire of a new name is a slot, a lookup ` +
      `round over the 10 nodes, a placement and a create; a repeat of a cached name is a ` +
      `confirmation by id with its node.`,
      `Throughput median ${median(rate).toFixed(0)} acquires/s through the slot path.`,
      ...(firstError ? [`First failure: ${firstError.slice(0, 400)}`] : []),
    ],
  };
}
