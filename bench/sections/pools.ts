/**
 * Warm-pool benchmarks: a claim from a warm pool against a cold create, on Docker and
 * through the gateway; and two gateways placing onto eight simulated nodes with pools, power
 * of two choices against the deterministic least-loaded pick.
 *
 * @module
 */
import { Fleet } from "../../gateway/fleet/fleet.ts";
import { placementAsk, Placer } from "../../gateway/placer/placer.ts";
import { type Daemon, postJson, reading, startDockerNode, startGateway } from "../lib/fixtures.ts";
import { median, row, type Section } from "../lib/stats.ts";

/** Options of both benchmarks. */
export interface PoolsBenchOptions {
  /** Runs (at least five). */
  runs: number;
}

async function until(check: () => Promise<boolean>, ms: number): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out after ${ms} ms`);
}

/**
 * Claim latency on Docker: per run, one `acquireSandbox` that claims (the node's pool had a
 * warm sandbox and the gateway's reading said so) and one cold create of an unpooled size,
 * both through the gateway; and one claim straight at the node.
 */
export async function runClaimLatency({ runs }: PoolsBenchOptions): Promise<Section> {
  const title = "Warm pool claim against a cold create, on Docker";
  const reference = "a cold create of the same template through the gateway, in the same run";
  const n = Math.max(5, runs);
  const gw = await startGateway([], { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" });
  const nodeId = `bench-pools-${crypto.randomUUID().slice(0, 6)}`;
  let node;
  try {
    node = await startDockerNode(nodeId, gw.url);
    // The node answers before its first check-in lands, and a gateway that knows no node
    // refuses setPools (409).
    await until(
      async () => (await postJson(`${gw.url}/listNodes`, {})).json.nodes.length > 0,
      30_000,
    );
    const set = await postJson(`${gw.url}/setPools`, {
      pools: [{ template: "minimal", warm: 2 }],
    });
    if (set.status !== 200) throw new Error(`setPools: ${JSON.stringify(set.json)}`);
    const claims: number[] = [], colds: number[] = [], direct: number[] = [];
    const warmSeen = async () => {
      const nodes = (await postJson(`${gw.url}/listNodes`, {})).json.nodes;
      return nodes[0]?.pools?.[0]?.warm === 2;
    };
    for (let i = 0; i < n; i++) {
      await until(warmSeen, 30_000);
      let t0 = performance.now();
      const claim = await postJson(`${gw.url}/acquireSandbox`, {
        name: `claim-${i}`,
        template: "minimal",
      });
      claims.push(performance.now() - t0);
      t0 = performance.now();
      const viaNode = await postJson(`${node.url}/acquireSandbox`, {
        name: `direct-${i}`,
        template: "minimal",
      });
      direct.push(performance.now() - t0);
      t0 = performance.now();
      const cold = await postJson(`${gw.url}/acquireSandbox`, {
        name: `cold-${i}`,
        template: "minimal",
        spec: { cpus: 0.5 },
      });
      colds.push(performance.now() - t0);
      for (const a of [claim, viaNode, cold]) {
        if (a.status !== 200) throw new Error(`acquireSandbox: ${JSON.stringify(a.json)}`);
      }
      for (const name of [`claim-${i}`, `cold-${i}`]) {
        await postJson(`${gw.url}/destroySandbox`, { name });
      }
      await postJson(`${node.url}/destroySandbox`, { name: `direct-${i}` });
    }
    return {
      title,
      reference,
      rows: [
        row("cold create through the gateway", "ms", colds, colds),
        row("claim through the gateway", "ms", claims, colds, {
          target: "p50 < 5 ms",
          met: median(claims) < 5,
        }),
        row(
          "claim straight at the node (HTTP and the ledger commit included)",
          "ms",
          direct,
          colds,
        ),
      ],
      notes: [
        "Template minimal, a pool of 2 warm sandboxes, one check-in a second; each run waits " +
        "until the gateway's reading shows the pool full again, then claims once through the " +
        "gateway and once at the node, and makes one cold create of an unpooled size (cpus 0.5).",
        "The node-side claim itself (a ledger transaction, no engine call) is the in-process " +
        "figure of node/pools_test.ts; the row above adds the node's HTTP face and loopback.",
      ],
    };
  } finally {
    await node?.stop();
    await gw.stop();
  }
}

/**
 * The first commands after a claim, on Docker: two standalone nodes with a pool of two `base`
 * sandboxes each, one refilling the moment a claim is made (`DORMICE_POOLS_REFILL_DELAY_MS=0`,
 * as before the delay), one after the default second; the runs alternate between them. Each
 * run waits until its node's pool is full and quiet, claims with `acquireSandbox`, runs
 * `echo hi` three times with `execCommand`, then waits for the refill to end and runs it once
 * more: that settled command is the reference.
 */
export async function runFirstCommand({ runs }: PoolsBenchOptions): Promise<Section> {
  const title = "First commands after a claim, on Docker (refill at once against after 1 s)";
  const reference = "an `echo` in the same sandbox once its pool's refill has ended, same run";
  const n = Math.max(5, runs);
  const tag = crypto.randomUUID().slice(0, 6);
  const variants = [
    { label: "refill at once", delay: "0", node: undefined as Daemon | undefined },
    { label: "refill after 1 s", delay: "1000", node: undefined as Daemon | undefined },
  ];
  type Samples = { claim: number[]; first: number[]; second: number[]; third: number[] };
  const samples = new Map<string, Samples & { settled: number[] }>();
  try {
    for (const v of variants) {
      v.node = await startDockerNode(`bench-first-${tag}-${v.delay}`, null, {
        DORMICE_POOLS: "base=2",
        DORMICE_POOLS_REFILL_DELAY_MS: v.delay,
      });
      samples.set(v.label, { claim: [], first: [], second: [], third: [], settled: [] });
    }
    const quiet = async (url: string) => {
      await until(async () => {
        const { json } = await postJson(`${url}/listPools`, {});
        const pool = json.pools?.[0];
        return pool?.warm === pool?.target && pool?.refilling === 0;
      }, 60_000);
      // The probe's exec and the engine's own bookkeeping after a start settle too.
      await new Promise((r) => setTimeout(r, 1500));
    };
    const echo = async (url: string, name: string) => {
      const t0 = performance.now();
      const r = await postJson(`${url}/execCommand`, { name, command: "echo hi" });
      if (r.status !== 200 || r.json.stdout !== "hi\n") {
        throw new Error(`execCommand: ${JSON.stringify(r.json)}`);
      }
      return performance.now() - t0;
    };
    for (let i = 0; i < n; i++) {
      // Alternate which goes first, so neither always meets the other's leftovers.
      for (const v of i % 2 ? [...variants].reverse() : variants) {
        const url = v.node!.url;
        const s = samples.get(v.label)!;
        await quiet(url);
        const name = `first-${i}`;
        const t0 = performance.now();
        const claim = await postJson(`${url}/acquireSandbox`, { name });
        s.claim.push(performance.now() - t0);
        if (claim.status !== 200) throw new Error(`acquireSandbox: ${JSON.stringify(claim.json)}`);
        s.first.push(await echo(url, name));
        s.second.push(await echo(url, name));
        s.third.push(await echo(url, name));
        await quiet(url);
        s.settled.push(await echo(url, name));
        await postJson(`${url}/destroySandbox`, { name });
      }
    }
    const rows = [];
    for (const v of variants) {
      const s = samples.get(v.label)!;
      rows.push(
        row(`${v.label}: settled command (reference)`, "ms", s.settled, s.settled),
        row(`${v.label}: claim (acquireSandbox at the node)`, "ms", s.claim, s.settled),
        row(`${v.label}: first command`, "ms", s.first, s.settled),
        row(`${v.label}: second command`, "ms", s.second, s.settled),
        row(`${v.label}: third command`, "ms", s.third, s.settled),
      );
    }
    return {
      title,
      reference,
      rows,
      notes: [
        "Straight at each node (native verbs, no gateway): the claim and the commands are the " +
        "node's and the engine's. A refill is a container create and start, then the probe's " +
        "exec, on the same engine and the same two cores as the claimed sandbox's commands.",
        "Every command is a docker exec (create, start, runc putting the process in the " +
        "container); that last step is most of a command's time on this machine and the same " +
        "for the first command as for the later ones once nothing else runs.",
      ],
    };
  } finally {
    for (const v of variants) await v.node?.stop();
    // A node stopped mid-run leaves its sandboxes; both ids are this run's own.
    const ids = variants.map((v) => `bench-first-${tag}-${v.delay}`);
    await new Deno.Command("sh", {
      args: [
        "-c",
        ids.map((id) => `docker ps -aq --filter label=dormice.node=${id} | xargs -r docker rm -f`)
          .join("; ") +
        `; docker network ls -q --filter name=dormice-bench-first-${tag} | ` +
        "xargs -r docker network rm",
      ],
      stdout: "null",
      stderr: "null",
    }).output().catch(() => {});
  }
}

interface SimNode {
  id: string;
  cores: number;
  active: number;
  warm: number;
  target: number;
  placed: number;
}

/**
 * Two gateways in one process, each with its own Fleet and Placer fed the same check-ins,
 * placing 500 creates each, alternating, onto eight simulated nodes with pools. Every 40
 * placements the nodes check in with both: active is what they hold, warm what is left after
 * the claims they received, refilled by up to 4. Claims beyond a node's real warm are misses
 * (cold creates).
 */
function simulate(warmAware: boolean, seed: number) {
  const nodes: SimNode[] = Array.from({ length: 8 }, (_, i) => ({
    id: `sim-${i}`,
    cores: 4,
    active: 0,
    warm: 8,
    target: 8,
    placed: 0,
  }));
  const gateways = [0, 1].map((g) => {
    const fleet = new Fleet();
    return { fleet, placer: new Placer({ fleet, seed: seed + g, cpuLimitPct: 100 }) };
  });
  const report = () => {
    for (const { fleet } of gateways) {
      for (const [i, n] of nodes.entries()) {
        fleet.checkIn({
          nodeId: n.id,
          endpoint: `http://10.0.0.${i + 1}:3676`,
          intervalSeconds: 15,
          build: "bench",
          reading: reading({ cpuCount: n.cores, cpuUsedPct: 10 }, n.active),
          pools: [{ template: "base", spec: {}, warm: n.warm, target: n.target }],
        });
      }
    }
  };
  report();
  const ask = warmAware ? placementAsk("base") : { template: "base" };
  let misses = 0, claims = 0;
  for (let i = 0; i < 1000; i++) {
    const { placer } = gateways[i % 2];
    const pick = placer.place(`s${i}`, ask);
    if (!pick.ok) throw new Error(pick.message);
    const node = nodes.find((n) => n.id === pick.node.id)!;
    node.placed++;
    node.active++;
    if (node.warm > 0) node.warm--, claims++;
    else misses++;
    if ((i + 1) % 40 === 0) {
      for (const n of nodes) n.warm = Math.min(n.target, n.warm + 4);
      report();
    }
  }
  for (const { fleet } of gateways) fleet.close();
  const mean = 1000 / nodes.length;
  const busiest = Math.max(...nodes.map((n) => n.placed));
  return { ratio: busiest / mean, claims, misses };
}

/** The two-gateway placement simulation, power of two choices against least loaded. */
export function runTwoGateways({ runs }: PoolsBenchOptions): Section {
  const n = Math.max(5, runs);
  const p2c = Array.from({ length: n }, (_, i) => simulate(true, 1000 + i * 7));
  const least = Array.from({ length: n }, (_, i) => simulate(false, 1000 + i * 7));
  const ratio = (xs: typeof p2c) => xs.map((x) => x.ratio);
  return {
    title: "Two gateways, 500 creates each, 8 simulated nodes with pools",
    reference: "the deterministic least-loaded pick (loadScore, no warm preference), same runs",
    rows: [
      row("least loaded: busiest ÷ mean", "×", ratio(least), ratio(least), { digits: 2 }),
      row("power of two choices: busiest ÷ mean", "×", ratio(p2c), ratio(least), {
        digits: 2,
        target: "≤ 1.5",
        met: median(ratio(p2c)) <= 1.5,
      }),
      row("least loaded: creates served warm", "of 1000", least.map((x) => x.claims), null),
      row("power of two choices: creates served warm", "of 1000", p2c.map((x) => x.claims), null),
    ],
    notes: [
      "Each gateway has its own Fleet and Placer (its own in-flight counts) and sees the same " +
      "check-ins, every 40 placements; nodes start empty with 8 warm each and refill 4 per " +
      "interval. Seeds differ per run and per gateway.",
      "Measured, not assumed: with in-flight counting the least-loaded pick does not herd in " +
      "this setup either (each gateway spreads its own placements between readings); the herd " +
      "the issue names is that of a deterministic warm-aware pick, which p2c replaces.",
    ],
  };
}

/**
 * The node-side claim on its own: an in-process node (no socket), its pool full, one
 * `acquireSandbox` per name through `app.fetch`. The claim path makes no executor call, so the
 * fake executor measures exactly what a Docker node does on it: routing, the name's slot and one
 * ledger transaction. The reference is a `lookupSandbox` read through the same app, which has the
 * same routing and JSON costs and no write.
 */
export async function runNodeClaim({ runs }: PoolsBenchOptions): Promise<Section> {
  const { createNodeApp } = await import("../../node/app.ts");
  const n = Math.max(5, runs);
  const perRun = 40;
  const claims: number[] = [];
  const reads: number[] = [];
  const claimedCounts: number[] = [];
  const token = "b".repeat(40);
  const call = (
    app: { fetch(r: Request): Response | Promise<Response> },
    verb: string,
    body: unknown,
  ) =>
    Promise.resolve(app.fetch(
      new Request(`http://node/${verb}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}` },
        body: JSON.stringify(body),
      }),
    )).then((r) => r.json());
  for (let run = 0; run < n; run++) {
    const dir = await Deno.makeTempDir({ prefix: "bench-claim-" });
    const app = createNodeApp({
      config: {
        apiToken: token,
        dataDir: dir,
        nodeId: "bench-claim",
        nodeEndpoint: "http://127.0.0.1:1",
        gatewayEndpoint: null,
        gatewayEndpoints: [],
        checkInIntervalSeconds: 15,
        scanIntervalSeconds: 60,
        pools: [{ template: "base", spec: {}, warm: perRun + 5 }],
      },
    });
    try {
      await app.pools.start();
      await until(() => Promise.resolve(app.pools.warmCount() >= perRun + 5), 30_000);
      const claimTimes: number[] = [];
      const readTimes: number[] = [];
      for (let i = 0; i < perRun; i++) {
        let t = performance.now();
        await call(app, "acquireSandbox", { name: `claim-${i}` });
        claimTimes.push(performance.now() - t);
        t = performance.now();
        await call(app, "lookupSandbox", { name: `claim-${i}` });
        readTimes.push(performance.now() - t);
      }
      const listed = await call(app, "listPools", {});
      claimedCounts.push(listed.pools[0].claimed);
      claims.push(median(claimTimes));
      reads.push(median(readTimes));
    } finally {
      await app.close();
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  }
  return {
    title: "Warm pool claim on the node, in process",
    reference:
      "a lookupSandbox read through the same in-process app, same runs (routing, JSON, no write)",
    rows: [
      row("lookupSandbox (reference)", "ms", reads, reads, { digits: 3 }),
      row("acquireSandbox served by a claim", "ms", claims, reads, {
        digits: 3,
        target: "< 1 ms",
        met: median(claims) < 1,
      }),
      row("claims per run (of 40 creates)", "", claimedCounts, null, { digits: 0 }),
    ],
    notes: [
      `Median of ${perRun} claims per run, ${n} runs; load average ${
        Deno.loadavg().map((x) => x.toFixed(1)).join(" ")
      } when it ended. No executor call is made on the claim path (a unit test counts them).`,
    ],
  };
}
