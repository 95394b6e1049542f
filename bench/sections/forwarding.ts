/**
 * Benchmark 1, forwarding cost: wrk (-t2 -c32) on `POST /getSandboxMetrics` for a cached sandbox
 * name, straight to a node, through the gateway, and through nginx `proxy_pass` with upstream
 * keep-alive in front of the same node (bench/proxies/nginx.conf). One node and one gateway process on
 * the fake executor; the three targets are measured in turn inside each run.
 *
 * Reference: nginx in the same run. The targets: gateway ≥ 1.0× nginx's throughput and
 * ≤ 2× nginx's added p50 (p50 through the proxy minus p50 direct).
 *
 * @module
 */
import {
  benchToken,
  cpuTimes,
  type Daemon,
  machineTimes,
  postJson,
  startGateway,
  startNode,
  startScript,
} from "../lib/fixtures.ts";
import type { Section } from "../lib/stats.ts";
import { atOnce, missingTools, startNginx, waitForNode, wrk } from "../lib/wrk.ts";
import {
  type CpuKey,
  forwardingSection,
  type Key,
  keys,
  type Measurements,
  newMeasurements,
  type NodeKey,
  nodeKeys,
} from "./forwarding_report.ts";

/** Options of the forwarding benchmark. */
export interface ForwardingOptions {
  /** Runs (at least five). */
  runs: number;
  /** Seconds per wrk measurement. */
  seconds?: number;
  /** Seconds per one-connection latency measurement. */
  latencySeconds?: number;
  /** Extra `deno run` flags for the gateway (e.g. `--cpu-prof`). */
  gatewayArgs?: string[];
}

/** The processes of a forwarding run once started, and where each target answers. */
interface Targets {
  /** Each target's URL. */
  urls: Record<Key, string>;
  /** The process ids of the proxies whose CPU is read. */
  pids: Partial<Record<Key, number>>;
  /** The gateway as deployed. */
  gw: Daemon;
  /** The node behind the gateway, nginx and the comparison proxies. */
  node: Daemon;
  /** The bytes-framed floor in front of the first twin's node, for the head-to-head window. */
  rawBeside: { url: string; pid: number };
}

/**
 * Starts the gateway, its node, its two twins, nginx and the comparison proxies (each pushed on
 * `started` for the caller to stop), makes the sandbox `name` on each gateway, starts the worked
 * twins of the floor in `m.worked`, and checks and warms up every target.
 */
async function startTargets(
  gatewayArgs: string[],
  name: string,
  env: Record<string, string>,
  m: Measurements,
  started: { stop(): Promise<void> }[],
): Promise<Targets> {
  const pids: Partial<Record<Key, number>> = {};
  const gw: Daemon = await startGateway(gatewayArgs);
  started.push(gw);
  const node = await startNode("bench-fwd-node", gw.url);
  started.push(node);
  await waitForNode(gw.url, "bench-fwd-node");
  // The same gateway with each of its two forwarding choices undone, for their before/after in
  // one run: Deno's own HTTP server in place of the bytes engine (DORMICE_GATEWAY_ENGINE=deno),
  // and with it fetch in place of the HTTP/1.1 client (DORMICE_GATEWAY_NODE_CLIENT=fetch). A
  // node checks in to one gateway, so each has a twin of its own on the fake executor.
  const twinNodes: Daemon[] = [];
  const twin = async (id: string, env: Record<string, string>) => {
    const g: Daemon = await startGateway(gatewayArgs, env);
    started.push(g);
    const n = await startNode(id, g.url);
    started.push(n);
    twinNodes.push(n);
    await waitForNode(g.url, id);
    return g;
  };
  const gwDeno = await twin("bench-fwd-node-d", { DORMICE_GATEWAY_ENGINE: "deno" });
  const gwFetch = await twin("bench-fwd-node-f", {
    DORMICE_GATEWAY_ENGINE: "deno",
    DORMICE_GATEWAY_NODE_CLIENT: "fetch",
  });
  for (const g of [gw, gwDeno, gwFetch]) {
    const made = await postJson(`${g.url}/acquireSandbox`, { name });
    if (made.status !== 200) {
      throw new Error(`acquireSandbox answered ${made.status}: ${JSON.stringify(made.json)}`);
    }
  }
  const nginx = await startNginx(node.port);
  started.push(nginx);
  pids.gateway = gw.pid;
  pids.nginx = nginx.pid;
  // The same bare proxy with each HTTP client the runtime offers.
  const naiveWith = async (client: string) => {
    const child = await startScript<{ port: number }>(
      "proxies/naive_proxy.ts",
      [node.url, client],
      [
        "--allow-env",
      ],
    );
    started.push(child);
    return `http://127.0.0.1:${child.ready.port}`;
  };
  // The runtime's floor: a TCP splice on Deno, no HTTP at all (bench/proxies/splice_proxy.ts).
  const splice = await startScript<{ port: number }>("proxies/splice_proxy.ts", [
    `127.0.0.1:${node.port}`,
  ]);
  started.push(splice);
  // The naive h1 proxy without Deno's HTTP server (bench/proxies/js_server_proxy.ts).
  const jsServer = await startScript<{ port: number }>("proxies/js_server_proxy.ts", [node.url]);
  started.push(jsServer);
  // HTTP framed on bytes, no objects (bench/proxies/raw_http_proxy.ts): the floor of a proxy that
  // must find each message's end.
  const rawHttp = await startScript<{ port: number }>("proxies/raw_http_proxy.ts", [
    `127.0.0.1:${node.port}`,
  ]);
  started.push(rawHttp);
  pids["raw-http"] = rawHttp.pid;
  // The floor again, in front of the first twin's node (which holds the sandbox too), for the
  // head-to-head window: it and the gateway loaded at once, each on its own node.
  const rawBeside = await startScript<{ port: number }>("proxies/raw_http_proxy.ts", [
    `127.0.0.1:${twinNodes[0].port}`,
  ]);
  started.push(rawBeside);
  pids.splice = splice.pid;
  for (const w of m.worked) {
    const child = await startScript<{ port: number }>("proxies/raw_http_proxy.ts", [
      `127.0.0.1:${node.port}`,
      `work=${w.us}`,
    ]);
    started.push(child);
    w.url = `http://127.0.0.1:${child.ready.port}`;
    w.pid = child.pid;
    await wrk(`${w.url}/getSandboxMetrics`, 1, env);
  }
  const urls: Record<Key, string> = {
    direct: node.url,
    gateway: gw.url,
    "gateway-deno": gwDeno.url,
    "gateway-fetch": gwFetch.url,
    nginx: nginx.url,
    naive: await naiveWith("fetch"),
    "naive-node-http": await naiveWith("node-http"),
    "naive-undici": await naiveWith("undici"),
    "naive-h1": await naiveWith("h1"),
    "naive-h2": await naiveWith("h2"),
    splice: `http://127.0.0.1:${splice.ready.port}`,
    "js-server": `http://127.0.0.1:${jsServer.ready.port}`,
    "raw-http": `http://127.0.0.1:${rawHttp.ready.port}`,
  };
  for (const [key, url] of Object.entries(urls)) {
    const check = await postJson(`${url}/getSandboxMetrics`, { name });
    if (check.status !== 200) {
      throw new Error(`${key} answered ${check.status}: ${JSON.stringify(check.json)}`);
    }
    await wrk(`${url}/getSandboxMetrics`, 1, env); // warm-up: pools, JIT
  }
  return {
    urls,
    pids,
    gw,
    node,
    rawBeside: { url: `http://127.0.0.1:${rawBeside.ready.port}`, pid: rawBeside.pid },
  };
}

/**
 * The targets in a run's order: nginx and the gateway one right after the other, which goes
 * first taking turns, so the target's ratio compares two measurements seconds apart (a run
 * apart, the host's drift was as large as the gap read) with neither always first.
 */
function inOrder(run: number): Key[] {
  const pair: Key[] = run % 2 === 0 ? ["nginx", "gateway"] : ["gateway", "nginx"];
  return ["direct", ...pair, ...keys.filter((k) => k !== "direct" && !pair.includes(k))];
}

/** One run: every target in turn at c32 and c1, the worked twins, head to head, the object path. */
async function measureRun(
  r: number,
  t: Targets,
  m: Measurements,
  times: { seconds: number; latencySeconds: number },
  env: Record<string, string>,
): Promise<void> {
  const { seconds, latencySeconds } = times;
  const { results, single, beside, objectPath, cpu, worked, nodeSide, steal, headToHead } = m;
  const { urls: targets, pids, gw, node } = t;
  let stealMs = 0, allMs = 0;
  for (const key of inOrder(r)) {
    const pid = pids[key];
    // The node is read only behind the targets in front of it (the twins have their own).
    const watched = (nodeKeys as readonly string[]).includes(key);
    const readPids = [...(pid === undefined ? [] : [pid]), ...(watched ? [node.pid] : [])];
    const before = readPids.length > 0 ? await cpuTimes(readPids) : [];
    const machineBefore = watched ? await machineTimes() : undefined;
    const wall = performance.now();
    const result = await wrk(`${targets[key]}/getSandboxMetrics`, seconds, env);
    const wallMs = performance.now() - wall;
    const machineAfter = watched ? await machineTimes() : undefined;
    const after = readPids.length > 0 ? await cpuTimes(readPids) : [];
    results[key].push(result);
    const requests = result.rps * seconds;
    if (pid !== undefined) {
      cpu[key as CpuKey].user.push(1000 * (after[0].user - before[0].user) / requests);
      cpu[key as CpuKey].system.push(1000 * (after[0].system - before[0].system) / requests);
    }
    if (machineBefore !== undefined && machineAfter !== undefined) {
      const side = nodeSide[key as NodeKey];
      const n = readPids.length - 1;
      const nodeMs = after[n].user + after[n].system - before[n].user - before[n].system;
      side.cpu.push(1000 * nodeMs / requests);
      side.share.push(100 * nodeMs / wallMs);
      const busy = machineAfter.busy - machineBefore.busy;
      const all = busy + machineAfter.idle - machineBefore.idle + machineAfter.steal -
        machineBefore.steal;
      side.busy.push(100 * busy / all);
      stealMs += machineAfter.steal - machineBefore.steal;
      allMs += all;
    }
    // At c1 each target is measured right after the node alone, so the machine's drift
    // between the two (seconds apart, not a whole run) is what little enters its added p50.
    if (key !== "direct") {
      beside[key].push(
        await wrk(`${targets.direct}/getSandboxMetrics`, latencySeconds, env, 1),
      );
    }
    single[key].push(await wrk(`${targets[key]}/getSandboxMetrics`, latencySeconds, env, 1));
  }
  for (const w of worked) {
    const before = (await cpuTimes([w.pid]))[0];
    const result = await wrk(`${w.url}/getSandboxMetrics`, seconds, env);
    const after = (await cpuTimes([w.pid]))[0];
    w.results.push(result);
    const spent = after.user - before.user + after.system - before.system;
    w.cpu.push(1000 * spent / (result.rps * seconds));
  }
  // Head to head: the gateway and the floor loaded at the same time, each in front of its own
  // node (bench/probes/head_to_head.ts does the same for two trees' gateways).
  {
    const { cpu, rps } = await atOnce(gw, t.rawBeside, seconds, env);
    headToHead.gateway.push(cpu[0]);
    headToHead.floor.push(cpu[1]);
    headToHead.rps.push(rps[0] / rps[1]);
  }
  // A verb the object path serves on either engine (no lane): what the engine costs there.
  for (const key of ["gateway", "gateway-deno"] as const) {
    objectPath[key].push(await wrk(`${targets[key]}/lookupSandbox`, seconds, env));
  }
  steal.push(allMs > 0 ? 100 * stealMs / allMs : 0);
}

/** Runs the forwarding benchmark. */
export async function runForwarding(options: ForwardingOptions): Promise<Section> {
  const { runs, seconds = 3, latencySeconds = 2, gatewayArgs = [] } = options;
  const title = "Forwarding cost: POST /getSandboxMetrics on a cached name (wrk -t2 -c32)";
  const missing = await missingTools(["wrk", "nginx"]);
  if (missing) return { title, reference: "", rows: [], notes: [], skipped: missing };
  const started: { stop(): Promise<void> }[] = [];
  const name = "bench-fwd";
  const env = { BENCH_TOKEN: benchToken, BENCH_NAME: name };
  const m = newMeasurements();
  try {
    const targets = await startTargets(gatewayArgs, name, env, m, started);
    for (let r = 0; r < runs; r++) {
      await measureRun(r, targets, m, { seconds, latencySeconds }, env);
    }
  } finally {
    for (const s of started.reverse()) await s.stop();
  }
  return forwardingSection(title, m, seconds, latencySeconds);
}
