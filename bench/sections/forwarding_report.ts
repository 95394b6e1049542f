/**
 * The forwarding section's figures and what they say: the measurements a run of
 * `runForwarding` collects (bench/sections/forwarding.ts), and their rows and notes in RESULTS.md.
 *
 * @module
 */
import type { WrkResult } from "../lib/wrk.ts";
import { fitLine, median, type Row, row, type Section } from "../lib/stats.ts";

/** The targets in front of (and including) the node, measured in turn within each run. */
export const keys = [
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
/** One target. */
export type Key = typeof keys[number];

/**
 * The proxies whose own process's CPU per request is read at c32, user and system time apart: the
 * kernel's share is the same for every proxy, so the gap to nginx is user time (the runtime's and
 * ours).
 */
export const cpuKeys = ["nginx", "raw-http", "splice", "gateway"] as const;
/** One proxy whose own CPU is read. */
export type CpuKey = typeof cpuKeys[number];

/**
 * The targets behind which the node is watched at c32: its CPU per request, the share of one core
 * it ran (its one JavaScript thread is what sets the rate: at c32 it runs near a whole core), and
 * the machine's busy and stolen time over the same seconds.
 */
export const nodeKeys = ["direct", "nginx", "gateway", "raw-http", "splice"] as const;
/** One target the node is watched behind. */
export type NodeKey = typeof nodeKeys[number];

/** CPU spun per request by the floor's worked twins (bench/proxies/raw_http_proxy.ts `work=`), in µs. */
export const WORK_US = [5, 10, 20] as const;

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

/** The bytes-framed floor again with `us` of CPU spun per request (c32 only). */
export interface Worked {
  /** CPU spun per request, µs. */
  us: number;
  /** Its URL, once started. */
  url: string;
  /** Its process id, once started. */
  pid: number;
  /** Its wrk results, one a run. */
  results: WrkResult[];
  /** Its CPU per request, µs, one a run. */
  cpu: number[];
}

/** What the runs of the forwarding section collect, each list one entry a run. */
export interface Measurements {
  /** Each target at c32. */
  results: Record<Key, WrkResult[]>;
  /** Each target at c1. */
  single: Record<Key, WrkResult[]>;
  /** The node alone at c1, measured just before each other target's c1 measurement. */
  beside: Record<Key, WrkResult[]>;
  /** `lookupSandbox` (the object path on either engine) through the gateway and its Deno twin. */
  objectPath: { gateway: WrkResult[]; "gateway-deno": WrkResult[] };
  /** CPU per request of the proxy's own process at c32, user and system time apart. */
  cpu: Record<CpuKey, { user: number[]; system: number[] }>;
  /**
   * The bytes-framed floor again with this much CPU spun per request (c32 only): what a
   * microsecond of a proxy's CPU costs in throughput on this machine, against nginx's.
   */
  worked: Worked[];
  /** The node behind the proxies at c32 (see `nodeKeys`). */
  nodeSide: Record<NodeKey, { cpu: number[]; share: number[]; busy: number[] }>;
  /** The host's steal over a run's c32 measurements, %. */
  steal: number[];
  /** Per run: CPU per request of the gateway and the floor loaded at once, and their rps ratio. */
  headToHead: { gateway: number[]; floor: number[]; rps: number[] };
}

/** Empty measurements. */
export function newMeasurements(): Measurements {
  const empty = () =>
    Object.fromEntries(keys.map((k) => [k, []])) as unknown as Record<
      Key,
      WrkResult[]
    >;
  return {
    results: empty(),
    single: empty(),
    beside: empty(),
    objectPath: { gateway: [], "gateway-deno": [] },
    cpu: Object.fromEntries(
      cpuKeys.map((k) => [k, { user: [] as number[], system: [] as number[] }]),
    ) as Record<CpuKey, { user: number[]; system: number[] }>,
    worked: WORK_US.map((us) => ({ us, url: "", pid: 0, results: [], cpu: [] })),
    nodeSide: Object.fromEntries(
      nodeKeys.map((k) => [k, { cpu: [], share: [], busy: [] }]),
    ) as unknown as Record<NodeKey, { cpu: number[]; share: number[]; busy: number[] }>,
    steal: [],
    headToHead: { gateway: [], floor: [], rps: [] },
  };
}

/** The forwarding section of RESULTS.md from its measurements. */
export function forwardingSection(
  title: string,
  m: Measurements,
  seconds: number,
  latencySeconds: number,
): Section {
  const { results, single, beside, objectPath, cpu, worked, nodeSide, steal, headToHead } = m;
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
  const cpuTotal = (k: CpuKey) => cpu[k].user.map((u, i) => u + cpu[k].system[i]);
  const nginxCpu = cpuTotal("nginx");
  const cpuRows = (label: string, k: CpuKey) => [
    row(`${label} CPU per request: user`, "µs", cpu[k].user, nginxCpu),
    row(`${label} CPU per request: system`, "µs", cpu[k].system, nginxCpu),
  ];
  const cpuMedian = (k: CpuKey, part: "user" | "system") => median(cpu[k][part]).toFixed(1);
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
      `(bench/proxies/nginx.conf says why). The naive Deno proxy (bench/proxies/naive_proxy.ts: serve + fetch, ` +
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
      "The naive proxy is run with five clients to the node (bench/proxies/clients.ts): " +
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
      "The Deno TCP splice (bench/proxies/splice_proxy.ts) copies bytes between a client's connection " +
      "and one upstream connection of its own, with no HTTP parsing, routing or pool: less " +
      "work than nginx does and than any HTTP forwarder can do. It is this runtime's ceiling " +
      `for throughput and floor for added latency: ${
        median(spliceRps.map((v, i) => v / nginxRps[i])).toFixed(2)
      }× nginx's throughput, and ${median(spliceAdded).toFixed(3)} ms added at c1, ${
        (median(spliceAdded) / median(nginxAdded)).toFixed(1)
      }× nginx's added p50. Where the splice misses a target, no gateway on Deno 2.9.6 meets it.`,
      "The JS-server row (bench/proxies/js_server_proxy.ts) is the naive h1_client proxy behind a " +
      "minimal HTTP/1.1 server written in JS over Deno.listen instead of Deno.serve: it adds " +
      `${median(added("js-server")).toFixed(3)} ms at c1 against ${
        median(added("naive-h1")).toFixed(3)
      } ms with Deno.serve, so Deno's HTTP server is not what keeps a proxy over nginx's ` +
      "latency: the HTTP work on top of the splice's four socket calls is, whichever server " +
      "or client does it.",
      "The bytes-framed row (bench/proxies/raw_http_proxy.ts) finds each message's end by scanning " +
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
      `(a tree against itself, bench/probes/head_to_head.ts: a median of 0.2 µs). The gateway spent ${
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
