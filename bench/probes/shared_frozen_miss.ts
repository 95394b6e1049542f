/**
 * A lookup miss in shared mode with one node frozen, digests `off` (every node asked: the
 * reference) against `on` (the default), in one run: two gateways on one local etcd, three
 * fake-executor nodes checking in with the second gateway every 2 s, the third frozen (SIGSTOP)
 * and shown down. For each mode it times, through the first gateway, `misses` lookups of names
 * nobody holds, and `made` lookups by name of a name created through the other gateway just
 * before (no digest shows it yet; with `off` the create itself is unsure), and prints the
 * medians, the outcomes and the ratio as JSON.
 *
 * ```sh
 * deno run -A bench/probes/shared_frozen_miss.ts [--misses=20] [--made=10]
 * ```
 *
 * @module
 */
import { startEtcd } from "../../tests/support/etcd.ts";
import { type Daemon, postJson, startGateway, startNode } from "../lib/fixtures.ts";
import { median } from "../lib/stats.ts";

const arg = (name: string, fallback: number) => {
  const found = Deno.args.find((a) => a.startsWith(`--${name}=`));
  return found ? Number(found.slice(name.length + 3)) : fallback;
};
const misses = arg("misses", 20);
const made = arg("made", 10);

async function until(what: string, check: () => Promise<boolean>, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`gave up after ${ms} ms waiting until ${what}`);
}

async function state(gateway: string, nodeId: string): Promise<string | undefined> {
  const { json } = await postJson(`${gateway}/listNodes`, {});
  const node = json?.nodes?.find((n: { id: string }) => n.id === nodeId);
  return node?.unheard ? "unheard" : node?.state;
}

async function measure(etcdEndpoints: string, mode: "off" | "on") {
  const env = {
    DORMICE_GATEWAY_ETCD: etcdEndpoints,
    DORMICE_GATEWAY_ETCD_PREFIX: `/probe-${mode}-${crypto.randomUUID().slice(0, 8)}/`,
    DORMICE_GATEWAY_LOOKUP_DIGESTS: mode,
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
  };
  const daemons: Daemon[] = [];
  let frozen: Daemon | undefined;
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
        await until(`node-${i} up`, async () => await state(g.url, `node-${i}`) === "up");
      }
    }
    await new Promise((r) => setTimeout(r, 3000));
    Deno.kill(nodes[2].pid, "SIGSTOP");
    frozen = nodes[2];
    for (const g of [g1, g2]) {
      await until("node-2 down", async () => await state(g.url, "node-2") === "down");
    }

    const missMs: number[] = [];
    const missOutcomes: Record<string, number> = {};
    for (let i = 0; i < misses; i++) {
      const t0 = performance.now();
      const r = await postJson(`${g1.url}/lookupSandbox`, { name: `${mode}-never-${i}` });
      missMs.push(performance.now() - t0);
      const outcome = r.status === 200 ? `found:${r.json.found}` : String(r.status);
      missOutcomes[outcome] = (missOutcomes[outcome] ?? 0) + 1;
    }
    const madeMs: number[] = [];
    const madeOutcomes: Record<string, number> = {};
    for (let i = 0; i < made; i++) {
      const name = `${mode}-made-${i}`;
      const c = await postJson(`${g2.url}/acquireSandbox`, { name });
      if (c.status !== 200) {
        // Digests off: the frozen node makes the create itself unsure.
        madeOutcomes[`create:${c.status}`] = (madeOutcomes[`create:${c.status}`] ?? 0) + 1;
        continue;
      }
      const t0 = performance.now();
      const r = await postJson(`${g1.url}/lookupSandbox`, { name });
      madeMs.push(performance.now() - t0);
      const outcome = r.status === 200 ? `found:${r.json.found}` : String(r.status);
      madeOutcomes[outcome] = (madeOutcomes[outcome] ?? 0) + 1;
    }
    return {
      missMedianMs: median(missMs),
      missOutcomes,
      madeMedianMs: madeMs.length ? median(madeMs) : null,
      madeOutcomes,
    };
  } finally {
    if (frozen) Deno.kill(frozen.pid, "SIGCONT");
    for (const d of daemons.reverse()) await d.stop().catch(() => {});
  }
}

const etcd = await startEtcd(1);
try {
  const off = await measure(etcd.endpoints, "off");
  const on = await measure(etcd.endpoints, "on");
  console.log(JSON.stringify(
    {
      date: new Date().toISOString().slice(0, 10),
      misses,
      made,
      off,
      on,
      missRatioOffOverOn: off.missMedianMs / on.missMedianMs,
    },
    null,
    2,
  ));
} finally {
  await etcd.stop();
}
