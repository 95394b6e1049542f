/**
 * Benchmark 1, forwarding cost: wrk (-t2 -c32) on `POST /getSandboxMetrics` for a cached sandbox
 * name, straight to a node, through the gateway, and through nginx `proxy_pass` with upstream
 * keep-alive in front of the same node (bench/nginx.conf). One node and one gateway process on
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
  freePort,
  machineTimes,
  postJson,
  startGateway,
  startNode,
  startScript,
  stopProcess,
} from "./_fixtures.ts";
import { fitLine, median, type Row, row, type Section } from "./_stats.ts";

/** One wrk result. */
export interface WrkResult {
  /** Requests per second. */
  rps: number;
  /** Latency percentiles in ms. */
  p50: number;
  p99: number;
  /** Non-2xx answers plus socket errors. */
  errors: number;
}

function toMs(value: string, unit: string): number {
  const v = Number(value);
  return unit === "us" ? v / 1000 : unit === "ms" ? v : unit === "s" ? v * 1000 : v * 60_000;
}

/** Parses wrk's `--latency` output. */
export function parseWrk(text: string): WrkResult {
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(text)?.[1]);
  const pct = (p: string) => {
    const m = new RegExp(`\\s${p}%\\s+([\\d.]+)(us|ms|s|m)\\b`).exec(text);
    return m ? toMs(m[1], m[2]) : NaN;
  };
  const non2xx = Number(/Non-2xx or 3xx responses:\s+(\d+)/.exec(text)?.[1] ?? 0);
  const sock = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(text);
  const sockErrors = sock ? sock.slice(1).reduce((a, b) => a + Number(b), 0) : 0;
  if (!Number.isFinite(rps)) throw new Error(`Cannot read wrk's output: ${text.slice(0, 500)}`);
  return { rps, p50: pct("50"), p99: pct("99"), errors: non2xx + sockErrors };
}

/** Runs wrk against `url` with the POST script. */
export async function wrk(
  url: string,
  seconds: number,
  env: Record<string, string>,
  connections = 32,
): Promise<WrkResult> {
  const out = await new Deno.Command("wrk", {
    args: [
      `-t${Math.min(2, connections)}`,
      `-c${connections}`,
      `-d${seconds}s`,
      "--latency",
      "-s",
      new URL("./post.lua", import.meta.url).pathname,
      url,
    ],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(`wrk failed: ${new TextDecoder().decode(out.stderr)}${text}`);
  }
  return parseWrk(text);
}

/** nginx in front of a node, run in the foreground with its own prefix. */
export interface Nginx {
  /** `http://127.0.0.1:<port>`. */
  url: string;
  /** The process id of its one worker, which does the proxying (for /proc readings). */
  pid: number;
  /** Stops it (SIGQUIT) and removes its prefix. */
  stop(): Promise<void>;
}

/** The process id of nginx's one worker: the master's child. */
async function workerOf(master: number): Promise<number> {
  const out = await new Deno.Command("ps", {
    args: ["-o", "pid=", "--ppid", String(master)],
    stdout: "piped",
  }).output();
  const pid = Number(new TextDecoder().decode(out.stdout).trim().split(/\s+/)[0]);
  if (!Number.isInteger(pid) || pid <= 0) throw new Error(`nginx ${master} has no worker process`);
  return pid;
}

/** Starts nginx from bench/nginx.conf proxying to `nodePort`. */
export async function startNginx(nodePort: number): Promise<Nginx> {
  const prefix = await Deno.makeTempDir({ prefix: "dormice-bench-nginx-" });
  const port = freePort();
  const template = await Deno.readTextFile(new URL("./nginx.conf", import.meta.url));
  const conf = template.replaceAll("@PREFIX@", prefix).replaceAll("@PORT@", String(port))
    .replaceAll("@NODE_PORT@", String(nodePort));
  await Deno.writeTextFile(`${prefix}/nginx.conf`, conf);
  const proc = new Deno.Command("nginx", {
    args: [
      "-p",
      prefix,
      "-e",
      `${prefix}/error.log`,
      "-c",
      `${prefix}/nginx.conf`,
      "-g",
      "daemon off;",
    ],
    stdin: "null",
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const errText = proc.stderr.pipeThrough(new TextDecoderStream());
  const errChunks: string[] = [];
  const errDone = (async () => {
    for await (const c of errText) errChunks.push(c);
  })();
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    // nginx's graceful stop is SIGQUIT.
    await stopProcess(proc, "SIGQUIT");
    await errDone;
    await Deno.remove(prefix, { recursive: true }).catch(() => {});
  };
  for (let i = 0; i < 100; i++) {
    try {
      const res = await fetch(`${url}/healthz`);
      await res.body?.cancel();
      return { url, pid: await workerOf(proc.pid), stop };
    } catch { /* not yet */ }
    await new Promise((r) => setTimeout(r, 50));
  }
  await stop();
  throw new Error(`nginx did not come up: ${errChunks.join("")}`);
}

/** CPU spun per request by the floor's worked twins (bench/_raw_http_proxy.ts `work=`), in µs. */
const WORK_US = [5, 10, 20] as const;

/**
 * What the floor's line of throughput against CPU says: its slope and where it crosses 1.0x, or,
 * when it does not fall (the runs' noise was larger than the spun work), that it gives no figure.
 */
function parityNote(
  parity: { b: number; crossing: number; gateway: number },
  cpu: { nginx: number; gateway: number; measured: number },
): string {
  if (!(parity.b < 0)) {
    return "Through the floor's four points (CPU per request, ÷ nginx's throughput; medians) " +
      "the least-squares line does not fall in this run: the runs' noise was larger than " +
      `${WORK_US[WORK_US.length - 1]} µs of spun CPU, so it gives no crossing.`;
  }
  return "Through the floor's four points (CPU per request, ÷ nginx's throughput; medians) the " +
    `least-squares line falls ${(-100 * parity.b).toFixed(2)} % of nginx's throughput per µs ` +
    `and crosses 1.0× at ${parity.crossing.toFixed(1)} µs per request: the most a proxy may ` +
    `spend here to match nginx, against nginx's own ${cpu.nginx.toFixed(1)}. The gateway ` +
    `spends ${cpu.gateway.toFixed(1)} µs, where the line puts ${parity.gateway.toFixed(2)}× ` +
    `(measured: ${cpu.measured.toFixed(2)}×).`;
}

/** Command-line availability of wrk and nginx, or the reason they are missing. */
export async function missingTools(tools: string[]): Promise<string | undefined> {
  for (const t of tools) {
    try {
      await new Deno.Command(t, { args: ["-v"], stdout: "null", stderr: "null" }).output();
    } catch {
      return `${t} is not installed (deno task bench installs it with apt-get as root)`;
    }
  }
  return undefined;
}

/** Two proxies loaded at the same time, and what each spent: its CPU a request and its rate. */
export interface AtOnce {
  /** CPU per request answered, µs (user + system, from /proc), of the first and the second. */
  cpu: [number, number];
  /** Requests per second of the first and the second. */
  rps: [number, number];
}

/**
 * Loads `a` and `b` at the same time for `seconds`, each with its own wrk -t1 -c16 on
 * `POST /getSandboxMetrics`, and reads both processes' CPU over the same seconds: the host's
 * noise, which moves a proxy's CPU per request by several µs between measurements one after the
 * other, then hits both.
 */
export async function atOnce(
  a: { url: string; pid: number },
  b: { url: string; pid: number },
  seconds: number,
  env: Record<string, string>,
): Promise<AtOnce> {
  const pids = [a.pid, b.pid];
  const before = await cpuTimes(pids);
  const [ra, rb] = await Promise.all([
    wrk(`${a.url}/getSandboxMetrics`, seconds, env, 16),
    wrk(`${b.url}/getSandboxMetrics`, seconds, env, 16),
  ]);
  const after = await cpuTimes(pids);
  const per = (i: number, rps: number) =>
    1000 * (after[i].user + after[i].system - before[i].user - before[i].system) /
    (rps * seconds);
  return { cpu: [per(0, ra.rps), per(1, rb.rps)], rps: [ra.rps, rb.rps] };
}

/** Waits until the gateway lists `nodeId`. */
export async function waitForNode(gateway: string, nodeId: string): Promise<void> {
  for (let i = 0; i < 200; i++) {
    const r = await postJson(`${gateway}/listNodes`, {});
    if (r.status === 200 && JSON.stringify(r.json).includes(`"${nodeId}"`)) return;
    await new Promise((res) => setTimeout(res, 50));
  }
  throw new Error(`Node '${nodeId}' did not check in to the gateway at ${gateway}`);
}

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

/** Runs the forwarding benchmark. */
export async function runForwarding(options: ForwardingOptions): Promise<Section> {
  const { runs, seconds = 3, latencySeconds = 2, gatewayArgs = [] } = options;
  const title = "Forwarding cost: POST /getSandboxMetrics on a cached name (wrk -t2 -c32)";
  const missing = await missingTools(["wrk", "nginx"]);
  if (missing) return { title, reference: "", rows: [], notes: [], skipped: missing };
  const started: { stop(): Promise<void> }[] = [];
  const name = "bench-fwd";
  const keys = [
    "direct",
    "gateway",
    "gateway-deno",
    "gateway-fetch",
    "nginx",
    "naive",
    "naive-node-http",
    "naive-undici",
    "naive-h1",
    "naive-h2",
    "splice",
    "js-server",
    "raw-http",
  ] as const;
  type Key = typeof keys[number];
  const empty = () =>
    Object.fromEntries(keys.map((k) => [k, []])) as unknown as Record<
      Key,
      WrkResult[]
    >;
  const results = empty();
  const single = empty();
  /** The node alone at c1, measured just before each other target's c1 measurement. */
  const beside = empty();
  const objectPath = { gateway: [] as WrkResult[], "gateway-deno": [] as WrkResult[] };
  // CPU per request of the proxy's own process at c32, user and system time apart: the kernel's
  // share is the same for every proxy, so the gap to nginx is user time (the runtime's and ours).
  const cpuKeys = ["nginx", "raw-http", "splice", "gateway"] as const;
  const pids: Partial<Record<Key, number>> = {};
  const cpu = Object.fromEntries(
    cpuKeys.map((k) => [k, { user: [] as number[], system: [] as number[] }]),
  );
  // The bytes-framed floor again with this much CPU spun per request (c32 only): what a
  // microsecond of a proxy's CPU costs in throughput on this machine, against nginx's.
  const worked = WORK_US.map((us) => ({
    us,
    url: "",
    pid: 0,
    results: [] as WrkResult[],
    cpu: [] as number[],
  }));
  // The node behind the proxies at c32: its CPU per request, the share of one core it ran
  // (its one JavaScript thread is what sets the rate: at c32 it runs near a whole core), and the
  // machine's busy and stolen time over the same seconds.
  const nodeKeys = ["direct", "nginx", "gateway", "raw-http", "splice"] as const;
  type NodeKey = typeof nodeKeys[number];
  const nodeSide = Object.fromEntries(
    nodeKeys.map((k) => [k, { cpu: [] as number[], share: [] as number[], busy: [] as number[] }]),
  ) as Record<NodeKey, { cpu: number[]; share: number[]; busy: number[] }>;
  const steal: number[] = [];
  /**
   * The targets in a run's order: nginx and the gateway one right after the other, which goes
   * first taking turns, so the target's ratio compares two measurements seconds apart (a run
   * apart, the host's drift was as large as the gap read) with neither always first.
   */
  const inOrder = (run: number): Key[] => {
    const pair: Key[] = run % 2 === 0 ? ["nginx", "gateway"] : ["gateway", "nginx"];
    return ["direct", ...pair, ...keys.filter((k) => k !== "direct" && !pair.includes(k))];
  };
  /** Per run: CPU per request of the gateway and the floor loaded at once, and their rps ratio. */
  const headToHead = { gateway: [] as number[], floor: [] as number[], rps: [] as number[] };
  try {
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
      const child = await startScript<{ port: number }>("_naive_proxy.ts", [node.url, client], [
        "--allow-env",
      ]);
      started.push(child);
      return `http://127.0.0.1:${child.ready.port}`;
    };
    // The runtime's floor: a TCP splice on Deno, no HTTP at all (bench/_splice_proxy.ts).
    const splice = await startScript<{ port: number }>("_splice_proxy.ts", [
      `127.0.0.1:${node.port}`,
    ]);
    started.push(splice);
    // The naive h1 proxy without Deno's HTTP server (bench/_js_server_proxy.ts).
    const jsServer = await startScript<{ port: number }>("_js_server_proxy.ts", [node.url]);
    started.push(jsServer);
    // HTTP framed on bytes, no objects (bench/_raw_http_proxy.ts): the floor of a proxy that
    // must find each message's end.
    const rawHttp = await startScript<{ port: number }>("_raw_http_proxy.ts", [
      `127.0.0.1:${node.port}`,
    ]);
    started.push(rawHttp);
    pids["raw-http"] = rawHttp.pid;
    // The floor again, in front of the first twin's node (which holds the sandbox too), for the
    // head-to-head window: it and the gateway loaded at once, each on its own node.
    const rawBeside = await startScript<{ port: number }>("_raw_http_proxy.ts", [
      `127.0.0.1:${twinNodes[0].port}`,
    ]);
    started.push(rawBeside);
    pids.splice = splice.pid;
    const env = { BENCH_TOKEN: benchToken, BENCH_NAME: name };
    for (const w of worked) {
      const child = await startScript<{ port: number }>("_raw_http_proxy.ts", [
        `127.0.0.1:${node.port}`,
        `work=${w.us}`,
      ]);
      started.push(child);
      w.url = `http://127.0.0.1:${child.ready.port}`;
      w.pid = child.pid;
      await wrk(`${w.url}/getSandboxMetrics`, 1, env);
    }
    const targets: Record<Key, string> = {
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
    for (const [key, url] of Object.entries(targets)) {
      const check = await postJson(`${url}/getSandboxMetrics`, { name });
      if (check.status !== 200) {
        throw new Error(`${key} answered ${check.status}: ${JSON.stringify(check.json)}`);
      }
      await wrk(`${url}/getSandboxMetrics`, 1, env); // warm-up: pools, JIT
    }
    for (let r = 0; r < runs; r++) {
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
          cpu[key].user.push(1000 * (after[0].user - before[0].user) / requests);
          cpu[key].system.push(1000 * (after[0].system - before[0].system) / requests);
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
      // node (bench/_head_to_head.ts does the same for two trees' gateways).
      {
        const floor = { url: `http://127.0.0.1:${rawBeside.ready.port}`, pid: rawBeside.pid };
        const { cpu, rps } = await atOnce(gw, floor, seconds, env);
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
  } finally {
    for (const s of started.reverse()) await s.stop();
  }
  const pick = (k: Key, f: keyof WrkResult) => results[k].map((x) => x[f]);
  const one = (k: Key) => single[k].map((x) => x.p50);
  const nginxRps = pick("nginx", "rps"),
    gwRps = pick("gateway", "rps"),
    dRps = pick("direct", "rps");
  const nginxP50 = pick("nginx", "p50");
  const nginx1 = one("nginx"), gw1 = one("gateway"), d1 = one("direct");
  /** What `k` adds to the direct p50 at c1, per run. */
  const added = (k: Key) => one(k).map((v, i) => v - beside[k][i].p50);
  const nginxAdded = added("nginx");
  const gwAdded = added("gateway");
  const gwfRps = pick("gateway-fetch", "rps");
  const gwfAdded = added("gateway-fetch");
  const gwdRps = pick("gateway-deno", "rps");
  const gwdAdded = added("gateway-deno");
  const errors = [...Object.values(results), ...Object.values(single), ...Object.values(objectPath)]
    .flat()
    .reduce((a, x) => a + x.errors, 0);
  const rpsRatio = gwRps.map((v, i) => v / nginxRps[i]);
  // nginx's added latency is tens of µs, within the noise of one run (it can come out negative),
  // so the target compares the medians over runs rather than per-run ratios.
  const addedRatio = median(gwAdded) / median(nginxAdded);
  const spliceRps = pick("splice", "rps");
  const cpuTotal = (k: typeof cpuKeys[number]) => cpu[k].user.map((u, i) => u + cpu[k].system[i]);
  const nginxCpu = cpuTotal("nginx");
  const cpuRows = (label: string, k: typeof cpuKeys[number]) => [
    row(`${label} CPU per request: user`, "µs", cpu[k].user, nginxCpu),
    row(`${label} CPU per request: system`, "µs", cpu[k].system, nginxCpu),
  ];
  const cpuMedian = (k: typeof cpuKeys[number], part: "user" | "system") =>
    median(cpu[k][part]).toFixed(1);
  const spliceAdded = added("splice");
  // Throughput against CPU per request, through the floor and its worked twins.
  const line = fitLine(
    [median(cpuTotal("raw-http")), ...worked.map((w) => median(w.cpu))],
    [
      median(pick("raw-http", "rps").map((v, i) => v / nginxRps[i])),
      ...worked.map((w) => median(w.results.map((x, i) => x.rps / nginxRps[i]))),
    ],
  );
  const parity = {
    b: line.b,
    crossing: line.b < 0 ? (1 - line.a) / line.b : NaN,
    gateway: line.a + line.b * median(cpuTotal("gateway")),
  };
  const behind: Record<NodeKey, string> = {
    direct: "no proxy (direct)",
    nginx: "nginx (reference)",
    gateway: "the gateway",
    "raw-http": "the bytes-framed floor",
    splice: "the TCP splice",
  };
  const share = (k: NodeKey) => median(nodeSide[k].share).toFixed(0);
  /** The median over runs of `k`'s node figure ÷ the same behind nginx, as text. */
  const vsNginx = (k: NodeKey, f: "share" | "cpu") =>
    median(nodeSide[k][f].map((v, i) => v / nodeSide.nginx[f][i])).toFixed(2);
  const rows: Row[] = [
    row("nginx proxy_pass throughput (reference)", "req/s", nginxRps, nginxRps),
    row("direct to the node throughput", "req/s", dRps, nginxRps),
    row("through the gateway throughput", "req/s", gwRps, nginxRps, {
      target: "≥ 1.0× nginx",
      met: median(rpsRatio) >= 1,
    }),
    row("through the gateway on Deno's HTTP server throughput", "req/s", gwdRps, nginxRps),
    row(
      "through the gateway on Deno's server with fetch to the node throughput",
      "req/s",
      gwfRps,
      nginxRps,
    ),
    row(
      "naive Deno fetch proxy throughput",
      "req/s",
      pick("naive", "rps"),
      nginxRps,
    ),
    row(
      "naive proxy with node:http keep-alive Agent throughput",
      "req/s",
      pick("naive-node-http", "rps"),
      nginxRps,
    ),
    row("naive proxy with undici Pool throughput", "req/s", pick("naive-undici", "rps"), nginxRps),
    row(
      "naive proxy with the Deno.connect HTTP/1.1 client throughput",
      "req/s",
      pick("naive-h1", "rps"),
      nginxRps,
    ),
    row("naive proxy with fetch over h2c throughput", "req/s", pick("naive-h2", "rps"), nginxRps),
    row(
      "naive HTTP/1.1 client proxy behind a JS HTTP server (no Deno.serve) throughput",
      "req/s",
      pick("js-server", "rps"),
      nginxRps,
    ),
    row(
      "HTTP framed on bytes, no objects (the floor of an HTTP-aware proxy) throughput",
      "req/s",
      pick("raw-http", "rps"),
      nginxRps,
    ),
    ...worked.map((w) =>
      row(
        `HTTP framed on bytes + ${w.us} µs of CPU spun a request throughput`,
        "req/s",
        w.results.map((x) => x.rps),
        nginxRps,
      )
    ),
    row(
      "Deno TCP splice throughput (the runtime's floor: no HTTP)",
      "req/s",
      pick("splice", "rps"),
      nginxRps,
    ),
    row(
      "lookupSandbox through the gateway on Deno's server (the object path; reference for the next row)",
      "req/s",
      objectPath["gateway-deno"].map((x) => x.rps),
      objectPath["gateway-deno"].map((x) => x.rps),
    ),
    row(
      "lookupSandbox through the gateway on the bytes engine (the object path: no lane)",
      "req/s",
      objectPath.gateway.map((x) => x.rps),
      objectPath["gateway-deno"].map((x) => x.rps),
    ),
    row("gateway ÷ direct throughput", "×", gwRps.map((v, i) => v / dRps[i]), null, { digits: 2 }),
    row("nginx p50 at c32 (reference)", "ms", nginxP50, nginxP50),
    row("direct p50 at c32", "ms", pick("direct", "p50"), nginxP50),
    row("gateway p50 at c32", "ms", pick("gateway", "p50"), nginxP50),
    row("nginx p99 at c32", "ms", pick("nginx", "p99"), nginxP50),
    row("direct p99 at c32", "ms", pick("direct", "p99"), nginxP50),
    row("gateway p99 at c32", "ms", pick("gateway", "p99"), nginxP50),
    row("direct p50 at c1", "ms", d1, nginx1),
    row("nginx p50 at c1 (reference for c1)", "ms", nginx1, nginx1),
    row("gateway p50 at c1", "ms", gw1, nginx1),
    row("gateway on Deno's server p50 at c1", "ms", one("gateway-deno"), nginx1),
    row("gateway on Deno's server with fetch p50 at c1", "ms", one("gateway-fetch"), nginx1),
    row("naive Deno proxy p50 at c1", "ms", one("naive"), nginx1),
    row("nginx added p50 at c1 (− direct)", "ms", nginxAdded, nginx1),
    row("gateway added p50 at c1 (− direct)", "ms", gwAdded, nginx1, {
      target: "≤ 2× nginx's added p50",
      met: addedRatio <= 2 && median(nginxAdded) > 0,
    }),
    row("gateway on Deno's server added p50 at c1 (− direct)", "ms", gwdAdded, nginx1),
    row("gateway on Deno's server with fetch added p50 at c1 (− direct)", "ms", gwfAdded, nginx1),
    row(
      "naive Deno proxy added p50 at c1 (− direct)",
      "ms",
      added("naive"),
      nginx1,
    ),
    row(
      "naive node:http proxy added p50 at c1 (− direct)",
      "ms",
      added("naive-node-http"),
      nginx1,
    ),
    row(
      "naive undici proxy added p50 at c1 (− direct)",
      "ms",
      added("naive-undici"),
      nginx1,
    ),
    row(
      "naive HTTP/1.1 client proxy added p50 at c1 (− direct)",
      "ms",
      added("naive-h1"),
      nginx1,
    ),
    row(
      "naive h2c proxy added p50 at c1 (− direct)",
      "ms",
      added("naive-h2"),
      nginx1,
    ),
    row(
      "naive HTTP/1.1 client proxy behind a JS HTTP server added p50 at c1 (− direct)",
      "ms",
      added("js-server"),
      nginx1,
    ),
    row(
      "HTTP framed on bytes, no objects added p50 at c1 (− direct)",
      "ms",
      added("raw-http"),
      nginx1,
    ),
    row("Deno TCP splice added p50 at c1 (− direct)", "ms", spliceAdded, nginx1),
    row(
      "nginx worker CPU per request at c32, user + system (reference for the CPU rows)",
      "µs",
      nginxCpu,
      nginxCpu,
    ),
    ...cpuRows("nginx worker", "nginx"),
    ...cpuRows("Deno TCP splice", "splice"),
    ...cpuRows("HTTP framed on bytes, no objects", "raw-http"),
    row(
      "HTTP framed on bytes, no objects CPU per request, user + system",
      "µs",
      cpuTotal("raw-http"),
      nginxCpu,
    ),
    ...worked.map((w) =>
      row(
        `HTTP framed on bytes + ${w.us} µs spun CPU per request, user + system`,
        "µs",
        w.cpu,
        nginxCpu,
      )
    ),
    ...cpuRows("gateway", "gateway"),
    row("gateway CPU per request, user + system", "µs", cpuTotal("gateway"), nginxCpu),
    row(
      "head to head, at once: the floor's CPU per request (reference for the next two rows)",
      "µs",
      headToHead.floor,
      headToHead.floor,
    ),
    row(
      "head to head, at once: the gateway's CPU per request",
      "µs",
      headToHead.gateway,
      headToHead.floor,
    ),
    row(
      "head to head, at once: the gateway above the floor",
      "µs",
      headToHead.gateway.map((g, i) => g - headToHead.floor[i]),
      headToHead.floor,
    ),
    row(
      "head to head, at once: the gateway's requests ÷ the floor's",
      "×",
      headToHead.rps,
      null,
      { digits: 2 },
    ),
    ...nodeKeys.flatMap((k) => [
      row(
        `the node's share of one core at c32, behind ${behind[k]}`,
        "%",
        nodeSide[k].share,
        nodeSide.nginx.share,
      ),
      row(
        `the node's CPU per request at c32, behind ${behind[k]}`,
        "µs",
        nodeSide[k].cpu,
        nodeSide.nginx.cpu,
      ),
    ]),
    ...nodeKeys.map((k) =>
      row(`the machine's two cores busy at c32, behind ${behind[k]}`, "%", nodeSide[k].busy, null)
    ),
    row("the host's steal over a run's c32 measurements", "%", steal, null),
  ];
  return {
    title,
    reference:
      "nginx proxy_pass (one worker, upstream keep-alive) in front of the same node, same " +
      "run: its c32 throughput and p50 for the c32 rows, its c1 p50 for the c1 rows",
    rows,
    notes: [
      `${seconds} s per wrk -t2 -c32 measurement and ${latencySeconds} s per wrk -t1 -c1 ` +
      `measurement, the thirteen targets in turn within each run, nginx and the gateway one ` +
      `right after the other and in turn first (and the three worked twins of ` +
      `the bytes-framed proxy, at c32 only); one node ` +
      `(fake executor) per gateway, each its own Deno process; nginx has one worker ` +
      `(bench/nginx.conf says why). The naive Deno proxy (bench/_naive_proxy.ts: serve + fetch, ` +
      `nothing else) is the floor of any gateway on this runtime. Non-2xx answers and socket errors over all runs: ${errors}.`,
      `Headline: gateway ÷ nginx throughput ${median(rpsRatio).toFixed(2)}, gateway ÷ direct ` +
      `${median(gwRps.map((v, i) => v / dRps[i])).toFixed(2)}, gateway ÷ naive Deno proxy ` +
      `${
        median(gwRps.map((v, i) => v / pick("naive", "rps")[i])).toFixed(2)
      }; gateway added p50 ÷ nginx added ` +
      `p50 (medians) ${addedRatio.toFixed(1)}.`,
      `At c1 the naive Deno proxy adds ${median(added("naive")).toFixed(3)} ms ` +
      `and nginx ${
        median(nginxAdded).toFixed(3)
      } ms: a serve + fetch hop in this runtime costs more ` +
      "than twice nginx's added latency before the gateway does any work of its own.",
      "The naive proxy is run with five clients to the node (bench/_clients.ts): " +
      "fetch, node:http request with a keep-alive Agent (32 sockets), npm:undici's Pool (32 " +
      "connections), shared/http1/client.ts (HTTP/1.1 over Deno.connect, its own pool) and fetch " +
      "over h2c (Deno.createHttpClient with http1 off: prior-knowledge HTTP/2, which the node's " +
      "server answers on its plain port); each streams the request body on. Which of them keep " +
      "the forwarding rules is the next table. The gateway uses h1_client (it keeps every " +
      "rule and halves fetch's added latency); DORMICE_GATEWAY_NODE_CLIENT=fetch goes back.",
      "The gateway rows are gateway/main.ts as deployed: the bytes engine (shared/http1/server.ts, " +
      "DORMICE_GATEWAY_ENGINE=bytes) serving the routed verb from its bytes (gateway/faces/bytes_lane.ts) " +
      "over its own HTTP/1.1 client to the node (DORMICE_GATEWAY_NODE_CLIENT=h1). The 'on Deno's " +
      "server' rows are the same daemon as it was before the engine (DORMICE_GATEWAY_ENGINE=deno), " +
      "and 'with fetch' as it was before the client too (DORMICE_GATEWAY_NODE_CLIENT=fetch), " +
      "each in front of a twin node (a node checks in to one gateway), measured in the same " +
      "runs. Before/after (medians of per-run ratios): throughput " +
      `${median(gwfRps.map((v, i) => v / nginxRps[i])).toFixed(2)} → ${
        median(gwdRps.map((v, i) => v / nginxRps[i])).toFixed(2)
      } → ${median(rpsRatio).toFixed(2)}× nginx; added p50 at c1 ${median(gwfAdded).toFixed(3)} → ${
        median(gwdAdded).toFixed(3)
      } → ${median(gwAdded).toFixed(3)} ms (÷ nginx's added p50: ${
        (median(gwfAdded) / median(nginxAdded)).toFixed(1)
      } → ${(median(gwdAdded) / median(nginxAdded)).toFixed(1)} → ${addedRatio.toFixed(1)}).`,
      "The lookupSandbox rows are a verb the lane does not serve (a lookup by name or id, its " +
      "own rules), so both engines answer it by the object path: a Request to the app and a " +
      "Response back. There the bytes engine builds in JavaScript what Deno's server builds " +
      `natively: ${
        median(objectPath.gateway.map((x, i) => x.rps / objectPath["gateway-deno"][i].rps))
          .toFixed(2)
      }× the requests per second of Deno's server.`,
      "The Deno TCP splice (bench/_splice_proxy.ts) copies bytes between a client's connection " +
      "and one upstream connection of its own, with no HTTP parsing, routing or pool: less " +
      "work than nginx does and than any HTTP forwarder can do. It is this runtime's ceiling " +
      `for throughput and floor for added latency: ${
        median(spliceRps.map((v, i) => v / nginxRps[i])).toFixed(2)
      }× nginx's throughput, and ${median(spliceAdded).toFixed(3)} ms added at c1, ${
        (median(spliceAdded) / median(nginxAdded)).toFixed(1)
      }× nginx's added p50. Where the splice misses a target, no gateway on Deno 2.9.6 meets it.`,
      "The JS-server row (bench/_js_server_proxy.ts) is the naive h1_client proxy behind a " +
      "minimal HTTP/1.1 server written in JS over Deno.listen instead of Deno.serve: it adds " +
      `${median(added("js-server")).toFixed(3)} ms at c1 against ${
        median(added("naive-h1")).toFixed(3)
      } ms with Deno.serve, so Deno's HTTP server is not what keeps a proxy over nginx's ` +
      "latency: the HTTP work on top of the splice's four socket calls is, whichever server " +
      "or client does it.",
      "The bytes-framed row (bench/_raw_http_proxy.ts) finds each message's end by scanning " +
      "its bytes for the blank line and Content-Length, and passes the bytes on over one " +
      "upstream connection per client connection: no string, Headers, Request or Response. " +
      "It is the least an HTTP-aware proxy does (a gateway must know where a request ends to " +
      `route the next one): ${
        median(pick("raw-http", "rps").map((v, i) => v / nginxRps[i])).toFixed(2)
      }× nginx's throughput and ${median(added("raw-http")).toFixed(3)} ms added at c1 (${
        (median(added("raw-http")) / median(nginxAdded)).toFixed(1)
      }× nginx's). What a gateway adds over it is the price of its objects and its own work.`,
      "The CPU rows read the proxy's own process in /proc over each c32 measurement (nginx: its " +
      "one worker), user and system time apart, per request answered. The system time is the " +
      `kernel's, and about the same for every proxy (nginx ${cpuMedian("nginx", "system")}, ` +
      `bytes-framed ${cpuMedian("raw-http", "system")}, gateway ${
        cpuMedian("gateway", "system")
      } µs): each makes two sends and two receives a request (strace -c, once, in ` +
      "docs/forwarding-engine.md). The user time is where they part: nginx " +
      `${cpuMedian("nginx", "user")} µs, the splice ${cpuMedian("splice", "user")}, the ` +
      `bytes-framed proxy ${cpuMedian("raw-http", "user")}, the gateway ${
        cpuMedian("gateway", "user")
      }. The bytes-framed proxy, which does nothing but find each message's end, already ` +
      `spends ${(median(cpuTotal("raw-http")) / median(nginxCpu)).toFixed(2)}× nginx's CPU ` +
      "per request: that is the runtime's own share (its op calls, promises and event loop). " +
      "Everything the gateway must do on top of it (name the caller, parse and check the body, " +
      "find the sandbox, count the forward) can only add to that.",
      "The node rows split each throughput into its two factors: requests a second are the " +
      "share of a core the node's one JavaScript thread ran, over the CPU it spent a request " +
      "(an identity of the /proc readings, not a model). The node is the busiest process at " +
      `c32 (behind nginx ${share("nginx")} % of a core, direct ${share("direct")} %) while ` +
      `the two cores are not all busy (behind nginx ${
        median(nodeSide.nginx.busy).toFixed(0)
      } %), so a proxy's CPU costs throughput where it takes time from the node's thread, or ` +
      "makes it spend more a request, not by using up the machine. The gateway against nginx, " +
      `medians of per-run ratios: the node's share ${vsNginx("gateway", "share")}×, its CPU ` +
      `per request ${vsNginx("gateway", "cpu")}×; the floor ${vsNginx("raw-http", "share")}× ` +
      `and ${
        vsNginx("raw-http", "cpu")
      }×. The node's CPU per request moves with the host (the steal row: time the hypervisor ` +
      "gave away while this machine had work), which is why nginx and the gateway are " +
      "measured one right after the other, in turn first.",
      "The worked rows are the bytes-framed proxy again with a fixed amount of CPU spun per " +
      "request (loop turns calibrated at its start): the same floor with a gateway's cost of " +
      "logic added and nothing else changed. " + parityNote(parity, {
        nginx: median(nginxCpu),
        gateway: median(cpuTotal("gateway")),
        measured: median(rpsRatio),
      }),
      `Head to head: once a run, the gateway and the bytes-framed floor are loaded at the same ` +
      `time for ${seconds} s, each in front of its own node (the floor before the first twin's) ` +
      "with its own wrk -t1 -c16, and each one's CPU per request is read from /proc over the same " +
      "seconds. One after the other, the host moves a proxy's CPU per request by several µs " +
      "between measurements; at once, it moves both, so the difference is the steadier figure " +
      `(a tree against itself, bench/_head_to_head.ts: a median of 0.2 µs). The gateway spent ${
        median(headToHead.gateway.map((g, i) => g - headToHead.floor[i])).toFixed(1)
      } µs a request above the floor this way.`,
      "Added p50 is measured with one connection (wrk -c1): at c32 every server is saturated and " +
      "p50 is queueing time, so the difference to direct can even be negative for nginx. Each " +
      "target's c1 p50 is taken right after one of the node alone (the direct c1 row is the " +
      "first of those), and its added p50 is the difference of that pair: measured a whole run " +
      "apart, the machine's drift between the two was as large as nginx's added p50 itself.",
    ],
  };
}
