/**
 * Profiles the gateway on the routed verb: one gateway (`--cpu-prof`) in front of one node on the
 * fake executor, wrk -t2 -c32 on `POST /getSandboxMetrics` for a cached name, then the profile's
 * self time by function, ours (this repository, not node_modules) marked. Not a section of
 * RESULTS.md: a tool for before/after figures of one change.
 *
 * With `--workload=upload` or `--workload=download` the gateway relays 64 MiB transfers to a
 * sandbox port instead (bench/children/port_node.ts, as bench/sections/ports.ts does), `--transfers` of them, and
 * the figure per request becomes per MiB. `--websockets=on|off` picks the gateway's engine
 * (DORMICE_GATEWAY_WEBSOCKETS: on is Deno.serveHttp; off for the verb and on for transfers by
 * default), and with it off `--engine=bytes|deno` picks between the bytes engine (the default)
 * and Deno's per-connection server (DORMICE_GATEWAY_ENGINE). `--connections=1` runs wrk with one
 * connection (the c1 rows of the forwarding benchmark) instead of 32.
 *
 * `--verb=lookupSandbox` runs wrk on that verb instead (one the object path serves).
 * `--inclusive=40` adds the 40 largest times per request with callees (each function's own and
 * what it calls), which is how docs/forwarding-engine.md prices each piece of the lane's work.
 *
 * `deno run -A bench/probes/profile.ts [--client=h1|fetch] [--workload=verb|upload|download] [--verb=…]
 * [--websockets=on|off] [--engine=bytes|deno] [--connections=32] [--seconds=10] [--transfers=8] [--top=25]
 * [--inclusive=0]`
 *
 * @module
 */
import { benchToken, postJson, startGateway, startNode } from "../lib/fixtures.ts";
import { waitForNode, wrk } from "../lib/wrk.ts";
import { download, startPortNode, upload } from "../sections/ports.ts";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

const flag = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const client = flag("client", "h1");
const seconds = Number(flag("seconds", "10"));
const top = Number(flag("top", "25"));
// With `--inclusive=N`, the N largest times with callees too (self time alone hides a piece's
// builtins and helpers).
const inclusive = Number(flag("inclusive", "0"));
const workload = flag("workload", "verb");
const transfers = Number(flag("transfers", "8"));
// The gateway's engine: on is Deno.serveHttp (WebSockets); off, the bytes engine or Deno's own.
const websockets = flag("websockets", workload === "verb" ? "off" : "on");
const engine = flag("engine", "bytes");
// wrk's connections on the verb: 32 loads the gateway; 1 puts all of its work on the request's path.
const connections = Number(flag("connections", "32"));
// The routed verb by default; `--verb=lookupSandbox` profiles a verb the object path serves.
const verb = flag("verb", "getSandboxMetrics");
if (!["verb", "upload", "download"].includes(workload)) {
  console.error(`--workload=${workload}: give verb, upload or download`);
  Deno.exit(2);
}
const root = new URL("../../", import.meta.url).href;

const dir = await Deno.makeTempDir({ prefix: "dormice-prof-" });
// Transfers go to a port as a gateway with a sandbox domain serves them: with WebSockets on.
const gw = await startGateway(["--cpu-prof", `--cpu-prof-dir=${dir}`], {
  DORMICE_GATEWAY_NODE_CLIENT: client,
  DORMICE_GATEWAY_WEBSOCKETS: websockets,
  DORMICE_GATEWAY_ENGINE: engine,
});
let result: { rps: number; p50: number | string; errors: number };
/** Units of work profiled: requests for the verb, MiB for a transfer. */
let units = 0;
if (workload === "verb") {
  const node = await startNode("prof-node", gw.url);
  try {
    await waitForNode(gw.url, "prof-node");
    const made = await postJson(`${gw.url}/acquireSandbox`, { name: "prof" });
    if (made.status !== 200) throw new Error(`acquireSandbox answered ${made.status}`);
    const env = { BENCH_TOKEN: benchToken, BENCH_NAME: "prof" };
    await wrk(`${gw.url}/${verb}`, 1, env, connections);
    result = await wrk(`${gw.url}/${verb}`, seconds, env, connections);
    units = result.rps * seconds;
  } finally {
    await gw.stop();
    await node.stop();
  }
} else {
  const child = await startPortNode(gw.url);
  try {
    await waitForNode(gw.url, "bench-port-node");
    const route = {
      url: `${gw.url}/e2b/envd`,
      headers: { "e2b-sandbox-id": child.ready.sandboxId, "e2b-sandbox-port": "8000" },
    };
    const move = workload === "upload" ? upload : download;
    const rates: number[] = [];
    for (let i = 0; i < transfers; i++) rates.push(await move(route, 64));
    rates.sort((a, b) => a - b);
    result = { rps: rates[Math.floor(rates.length / 2)], p50: "-", errors: 0 };
    units = 64 * transfers;
  } finally {
    await gw.stop();
    await child.stop();
  }
}
const file = [...Deno.readDirSync(dir)].find((e) => e.name.endsWith(".cpuprofile"));
if (file === undefined) throw new Error(`No .cpuprofile was written to ${dir}`);
const profile: CpuProfile = JSON.parse(await Deno.readTextFile(`${dir}/${file.name}`));

// Self time per sample: each sample's delta goes to the node it landed in.
const selfUs = new Map<number, number>();
for (let i = 0; i < profile.samples.length; i++) {
  const id = profile.samples[i];
  selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0));
}
const byFunction = new Map<string, number>();
let total = 0, idle = 0, ours = 0;
for (const n of profile.nodes) {
  const us = selfUs.get(n.id) ?? 0;
  total += us;
  const { functionName, url, lineNumber } = n.callFrame;
  if (functionName === "(idle)") idle += us;
  const mine = url.startsWith(root) && !url.includes("node_modules");
  if (mine) ours += us;
  const where = url === ""
    ? ""
    : ` ${url.replace(root, "").replace(/^.*node_modules\//, "npm:")}:${lineNumber + 1}`;
  const key = `${mine ? "* " : "  "}${functionName || "(anonymous)"}${where}`;
  byFunction.set(key, (byFunction.get(key) ?? 0) + us);
}
const busy = total - idle;
console.log(
  `client=${client} workload=${workload} websockets=${websockets} engine=${engine} ${
    result.rps.toFixed(0)
  } ${
    workload === "verb" ? "req/s" : "MiB/s (median)"
  } p50 ${result.p50} ms errors ${result.errors}; ` +
    `profile ${(total / 1e6).toFixed(1)} s, busy ${(busy / 1e6).toFixed(1)} s, ours ${
      (100 * ours / busy).toFixed(1)
    }% of busy; µs of self time per ${workload === "verb" ? "request" : "MiB"}: ${
      (busy / units).toFixed(1)
    }`,
);
console.log("self % of busy  function (* = this repository)");
for (const [k, us] of [...byFunction].sort((a, b) => b[1] - a[1]).slice(0, top)) {
  console.log(`${(100 * us / busy).toFixed(1).padStart(6)}%  ${k}`);
}

if (inclusive > 0) {
  // Each sample's time goes to every function on its stack, once: what a piece costs with all it
  // calls. An await cuts the stack, so an async function's time is that of its stretch in view.
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const nodesById = new Map(profile.nodes.map((n) => [n.id, n]));
  const withCallees = new Map<string, number>();
  for (let i = 0; i < profile.samples.length; i++) {
    const seen = new Set<string>();
    for (let id = profile.samples[i] as number | undefined; id !== undefined; id = parent.get(id)) {
      const { functionName, url, lineNumber } = nodesById.get(id)!.callFrame;
      if (functionName === "(idle)" || functionName === "(root)") continue;
      const where = url === ""
        ? ""
        : ` ${url.replace(root, "").replace(/^.*node_modules\//, "npm:")}:${lineNumber + 1}`;
      const key = `${functionName || "(anonymous)"}${where}`;
      if (seen.has(key)) continue;
      seen.add(key);
      withCallees.set(key, (withCallees.get(key) ?? 0) + (profile.timeDeltas[i] ?? 0));
    }
  }
  console.log(`µs per ${workload === "verb" ? "request" : "MiB"} with callees (inclusive)`);
  for (const [k, us] of [...withCallees].sort((a, b) => b[1] - a[1]).slice(0, inclusive)) {
    console.log(`${(us / units).toFixed(2).padStart(8)}  ${k}`);
  }
}
await Deno.remove(dir, { recursive: true });
