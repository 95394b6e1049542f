/**
 * Lookup digests in shared mode: a miss with one node frozen, digests `on` (the default: the
 * reference) against `off` (every node asked, what shared mode did before digests were on
 * there), measured in the same run. One local etcd; per mode two gateways and three fake-executor nodes
 * checking in with the second gateway every 2 s, the third node frozen (SIGSTOP) until both
 * gateways show it down. Per run, through the first gateway: `misses` lookups of names nobody
 * holds (median), and, with `on`, `made` lookups by name of a name just created through the
 * other gateway, which no digest shows yet (median). Outcomes (503, found) go to the notes.
 *
 * Skipped, saying why, when etcd (Debian's `etcd-server`) is not installed.
 *
 * @module
 */
import { etcdBinary, startEtcd } from "../../tests/support/etcd.ts";
import { type Daemon, postJson, startGateway, startNode } from "../lib/fixtures.ts";
import { median, row, type Section } from "../lib/stats.ts";

/** Options of the shared-mode digests benchmark. */
export interface SharedDigestsOptions {
  /** Runs (batches of lookups over the same fleets). */
  runs: number;
  /** Lookups of names nobody holds per run and mode. */
  misses?: number;
  /** Names created through one gateway and looked up through the other, per run (mode `on`). */
  made?: number;
}

const title = "Lookup digests in shared mode: a miss with one node frozen";

async function until(what: string, check: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`gave up after ${ms} ms waiting until ${what}`);
}

async function stateOf(gateway: string, nodeId: string): Promise<string | undefined> {
  const { json } = await postJson(`${gateway}/listNodes`, {});
  const node = json?.nodes?.find((n: { id: string }) => n.id === nodeId);
  return node?.unheard ? "unheard" : node?.state;
}

/** One mode's fleet: two gateways, three nodes, the third frozen and shown down. */
async function frozenFleet(etcdEndpoints: string, mode: "off" | "on") {
  const env = {
    DORMICE_GATEWAY_ETCD: etcdEndpoints,
    DORMICE_GATEWAY_ETCD_PREFIX: `/bench-${mode}-${crypto.randomUUID().slice(0, 8)}/`,
    DORMICE_GATEWAY_LOOKUP_DIGESTS: mode,
    // The host's real CPU use is noise from whatever else runs on the machine.
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
  };
  const daemons: Daemon[] = [];
  let frozen: Daemon | undefined;
  const stop = async () => {
    if (frozen) Deno.kill(frozen.pid, "SIGCONT");
    for (const d of daemons.reverse()) await d.stop().catch(() => {});
  };
  try {
    const [g1, g2] = await Promise.all([startGateway([], env), startGateway([], env)]);
    daemons.push(g1, g2);
    const nodes = await Promise.all(
      [0, 1, 2].map((i) =>
        startNode(`node-${i}`, g2.url, [], { DORMICE_CHECK_IN_INTERVAL_SECONDS: "2" })
      ),
    );
    daemons.push(...nodes);
    for (const g of [g1, g2]) {
      for (let i = 0; i < 3; i++) {
        await until(`node-${i} up`, async () => await stateOf(g.url, `node-${i}`) === "up");
      }
    }
    // A few check-ins with digests before the freeze.
    await new Promise((r) => setTimeout(r, 3000));
    Deno.kill(nodes[2].pid, "SIGSTOP");
    frozen = nodes[2];
    for (const g of [g1, g2]) {
      await until("node-2 down", async () => await stateOf(g.url, "node-2") === "down");
    }
    return { g1, g2, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

async function timedLookup(gateway: string, body: unknown) {
  const t0 = performance.now();
  const r = await postJson(`${gateway}/lookupSandbox`, body);
  const ms = performance.now() - t0;
  return { ms, outcome: r.status === 200 ? `found: ${r.json?.found}` : String(r.status) };
}

/**
 * Runs the section.
 *
 * @example
 * ```ts ignore
 * const section = await runSharedDigests({ runs: 5 });
 * ```
 */
export async function runSharedDigests(options: SharedDigestsOptions): Promise<Section> {
  const { runs, misses = 10, made = 10 } = options;
  const reference = "a miss with digests on (the default), in the same run";
  if (etcdBinary() === null) {
    return { title, reference, rows: [], notes: [], skipped: "etcd is not installed" };
  }
  const etcd = await startEtcd(1);
  const outcomes: Record<string, Record<string, number>> = { off: {}, on: {}, made: {} };
  const count = (table: Record<string, number>, key: string) => table[key] = (table[key] ?? 0) + 1;
  const offMs: number[] = [];
  const onMs: number[] = [];
  const madeMs: number[] = [];
  try {
    const off = await frozenFleet(etcd.endpoints, "off");
    const on = await frozenFleet(etcd.endpoints, "on").catch(async (e) => {
      await off.stop();
      throw e;
    });
    try {
      for (let run = 0; run < runs; run++) {
        for (const [fleet, into, key] of [[off, offMs, "off"], [on, onMs, "on"]] as const) {
          const times: number[] = [];
          for (let i = 0; i < misses; i++) {
            const r = await timedLookup(fleet.g1.url, { name: `never-${run}-${i}` });
            times.push(r.ms);
            count(outcomes[key], r.outcome);
          }
          into.push(median(times));
        }
        const times: number[] = [];
        for (let i = 0; i < made; i++) {
          const name = `made-${run}-${i}`;
          const c = await postJson(`${on.g2.url}/acquireSandbox`, { name });
          if (c.status !== 200) {
            throw new Error(`create ${name}: ${c.status} ${JSON.stringify(c.json)}`);
          }
          const r = await timedLookup(on.g1.url, { name });
          times.push(r.ms);
          count(outcomes.made, r.outcome);
        }
        madeMs.push(median(times));
      }
    } finally {
      await Promise.all([off.stop(), on.stop()]);
    }
  } finally {
    await etcd.stop();
  }
  const list = (table: Record<string, number>) =>
    Object.entries(table).map(([k, v]) => `${k} ×${v}`).join(", ");
  return {
    title,
    reference,
    rows: [
      row(
        "miss, one node of three frozen, digests on (default; reference), median",
        "ms",
        onMs,
        onMs,
        {
          target: "answers without waiting for the frozen node (< 50 ms)",
          met: median(onMs) < 50,
        },
      ),
      row("the same miss, digests off (every node asked), median", "ms", offMs, onMs),
      row(
        "lookup through gateway 1 of a name just made through gateway 2, on, median",
        "ms",
        madeMs,
        onMs,
      ),
    ],
    notes: [
      `Outcomes of the misses: off ${list(outcomes.off)}; on ${list(outcomes.on)}. ` +
      `Names made through the other gateway, looked up at once: ${list(outcomes.made)}.`,
      "With digests off the frozen node is asked on every miss and its silence makes every new " +
      "name unsure after the 2 s lookup deadline; with on its last digest rules the name out, and " +
      "the record of a recent create in etcd (one read a miss) names the node another gateway " +
      'just used (docs/lookup-digest.md, "Several gateways").',
      `${misses} misses per mode and ${made} made names per run, over the same two fleets.`,
    ],
  };
}
