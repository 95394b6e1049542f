/**
 * Two gateways loaded at the same time, each in front of its own node with its own wrk (-t1
 * -c16 on `POST /getSandboxMetrics` for a cached name): the CPU each spends a request, read from
 * /proc over the same seconds. On these machines the host's noise moves a proxy's CPU per request
 * by several µs between runs one after the other; at the same time it moves both. So a change is
 * priced on the wire here (the tree before as A, the tree after as B), after `bench/probes/lane_js.ts`
 * has priced it without sockets. A tree against itself gives the spread to read it against.
 *
 * Each gateway is its tree's `gateway/main.ts` as deployed, started by that tree's
 * `bench/lib/fixtures.ts`. Not a section of RESULTS.md: a tool for before/after figures.
 *
 * `deno run -A bench/probes/head_to_head.ts <tree A> <tree B> [--windows=10] [--seconds=3]
 *   [--latency | --path] [--alternate]`
 *
 * With `--latency`, each window loads the two with wrk -c1 instead (windows of 2 s by default) and
 * the figure is their p50s' difference: one request at a time, where a request's work is its
 * latency. Read one after the other, a c1 p50 moves by ±10 µs between windows; at once, a few.
 * But at once the two chains share both cores, so work a change moves into the wait for the node
 * (free at one connection when the node has the other core) is still paid there: with
 * `--alternate` the two are loaded one after the other instead, the first of each pair in turn,
 * as the forwarding benchmark loads them. A tree against itself read −4.5 µs that way (40 pairs
 * of 1 s), and a change moved 6.0 and 7.0 µs with the trees swapped (60 pairs).
 *
 * With `--path`, each window records the two at c1 with perf and splits each request's time on
 * the proxy's main thread at its two sends (`bench/probes/c1_path.ts`): what is on one connection's
 * chain and what runs while the node works. Needs perf and root.
 *
 * With `--floor=<arguments>` in place of the trees it loads two of this tree's bytes-framed floors
 * (`bench/proxies/raw_http_proxy.ts`), A as it is and B with those arguments (`--floor=timer=10`): what
 * the runtime makes a proxy pay for something, with no gateway in the way. With `--vs-floor` in
 * place of the trees, A is this tree's floor and B this tree's gateway: the gateway's own price,
 * read at once (with `--latency`, what it adds to one request's latency over the floor's).
 *
 * @module
 */
import { median } from "../lib/stats.ts";
import type { PathSplit } from "./c1_path.ts";
import { type Daemon, startScript, treeBenchFile } from "../lib/fixtures.ts";

interface Fixtures {
  benchToken: string;
  startGateway(args?: string[], env?: Record<string, string>): Promise<Daemon>;
  startNode(id: string, gateway?: string): Promise<Daemon>;
  postJson(url: string, body: unknown): Promise<{ status: number }>;
}

const flag = (name: string, fallback: number) =>
  Number(Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback);
const latency = Deno.args.includes("--latency");
const alternate = Deno.args.includes("--alternate");
const path = Deno.args.includes("--path");
const windows = flag("windows", latency ? 30 : 10);
const seconds = flag("seconds", latency ? 2 : 3);
const floorArgs = Deno.args.find((a) => a.startsWith("--floor="))?.slice(8).split(" ")
  .filter((a) => a !== "");
const vsFloor = Deno.args.includes("--vs-floor");
// Two floors, or the floor and the gateway, are all this tree's.
const here = new URL("../..", import.meta.url).pathname;
const trees = floorArgs || vsFloor ? [here, here] : Deno.args.filter((a) => !a.startsWith("--"));
if (trees.length !== 2) {
  console.error(
    "Give two trees (each a checkout of this repository), e.g. /work/wt-base /work/wt-new, " +
      "or --floor=<the floor's arguments for B>, e.g. --floor=timer=10, or --vs-floor",
  );
  Deno.exit(2);
}
const [A, B] = await Promise.all(
  trees.map((t) =>
    import(treeBenchFile(Deno.realPathSync(t), "lib/fixtures.ts", "_fixtures.ts")) as Promise<
      Fixtures
    >
  ),
);
const { atOnce, missingTools, waitForNode, wrk } = await import("../lib/wrk.ts");
const missing = await missingTools(["wrk"]);
if (missing) {
  console.log(`Not measured: ${missing}`);
  Deno.exit(0);
}

const started: { stop(): Promise<void> }[] = [];
/** A gateway of `f`'s tree with a node of its own and the sandbox cached. */
/** A proxy under load: its URL and process, and the port of the node behind it. */
interface Proxy {
  url: string;
  pid: number;
  nodePort: number;
}

async function up(f: Fixtures, id: string): Promise<Proxy> {
  const gw = await f.startGateway();
  started.push(gw);
  const node = await f.startNode(id, gw.url);
  started.push(node);
  await waitForNode(gw.url, id);
  const made = await f.postJson(`${gw.url}/acquireSandbox`, { name: "bench-fwd" });
  if (made.status !== 200) throw new Error(`acquireSandbox answered ${made.status} on ${id}`);
  return { url: gw.url, pid: gw.pid, nodePort: node.port };
}

/** A floor with `args` in front of a node of its own, which holds the sandbox. */
async function floor(id: string, args: string[]): Promise<Proxy> {
  const node = await A.startNode(id);
  started.push(node);
  const made = await A.postJson(`${node.url}/acquireSandbox`, { name: "bench-fwd" });
  if (made.status !== 200) throw new Error(`acquireSandbox answered ${made.status} on ${id}`);
  const proxy = await startScript<{ port: number }>("proxies/raw_http_proxy.ts", [
    `127.0.0.1:${node.port}`,
    ...args,
  ]);
  started.push(proxy);
  return { url: `http://127.0.0.1:${proxy.ready.port}`, pid: proxy.pid, nodePort: node.port };
}

try {
  const [ga, gb] = floorArgs
    ? [await floor("h2h-a", []), await floor("h2h-b", floorArgs)]
    : vsFloor
    ? [await floor("h2h-a", []), await up(B, "h2h-b")]
    : [await up(A, "h2h-a"), await up(B, "h2h-b")];
  const env = { BENCH_TOKEN: A.benchToken, BENCH_NAME: "bench-fwd" };
  const url = (g: { url: string }) => `${g.url}/getSandboxMetrics`;
  await Promise.all([wrk(url(ga), 1, env, 16), wrk(url(gb), 1, env, 16)]); // warm-up: JIT, pools
  if (path) {
    const { recordPath, parsePerfScript, socketsTo, splitPath } = await import("./c1_path.ts");
    const rows: { a: PathSplit; b: PathSplit }[] = [];
    /** One proxy's split while `loaded` carry wrk -c1 each (the proxies given, at once). */
    const during = async (loaded: Proxy[]) => {
      const load = Promise.all(loaded.map((g) => wrk(url(g), seconds, env, 1)));
      await new Promise((r) => setTimeout(r, 500));
      // Read while wrk runs: a floor's connection to its node ends with wrk's.
      const fds = await Promise.all(loaded.map((g) => socketsTo(g.pid, g.nodePort)));
      const text = await recordPath(loaded.map((g) => g.pid), Math.max(1, seconds - 1));
      await load;
      const events = parsePerfScript(text);
      return loaded.map((g, i) => splitPath(events, g.pid, fds[i]));
    };
    for (let w = 0; w < windows; w++) {
      if (!alternate) {
        const [a, b] = await during([ga, gb]);
        rows.push({ a, b });
      } else if (w % 2 === 0) {
        const [a] = await during([ga]);
        const [b] = await during([gb]);
        rows.push({ a, b });
      } else {
        const [b] = await during([gb]);
        const [a] = await during([ga]);
        rows.push({ a, b });
      }
    }
    const parts = ["toNode", "toClient", "waiting"] as const;
    for (const part of parts) {
      const diffs = rows.map((r) => r.b[part] - r.a[part]);
      console.log(
        `${part}, µs of the main thread a request (median of ${windows} windows): A ${
          median(rows.map((r) => r.a[part])).toFixed(1)
        }, B ${median(rows.map((r) => r.b[part])).toFixed(1)}; B − A ${median(diffs).toFixed(1)} ` +
          `(windows: ${diffs.map((d) => d.toFixed(1)).join(" ")})`,
      );
    }
    const onPath = rows.map((r) => r.b.toNode + r.b.toClient - r.a.toNode - r.a.toClient);
    console.log(
      `on the chain (toNode + toClient), B − A ${median(onPath).toFixed(1)} µs; requests a window ${
        median(rows.map((r) => r.a.requests))
      } and ${median(rows.map((r) => r.b.requests))}`,
    );
  } else if (latency) {
    const p50s: { a: number; b: number }[] = [];
    for (let w = 0; w < windows; w++) {
      // At once, or one right after the other, the first of each pair swapped in turn (ABBA...).
      const [ra, rb] = !alternate
        ? await Promise.all([wrk(url(ga), seconds, env, 1), wrk(url(gb), seconds, env, 1)])
        : w % 2 === 0
        ? [await wrk(url(ga), seconds, env, 1), await wrk(url(gb), seconds, env, 1)]
        : [await wrk(url(gb), seconds, env, 1), await wrk(url(ga), seconds, env, 1)].reverse();
      p50s.push({ a: ra.p50 * 1000, b: rb.p50 * 1000 });
    }
    const diffs = p50s.map((p) => p.b - p.a);
    console.log(
      `p50 at one connection, µs (median of ${windows} windows of ${seconds} s): A ${
        median(p50s.map((p) => p.a)).toFixed(1)
      }, B ${median(p50s.map((p) => p.b)).toFixed(1)}; B − A ${median(diffs).toFixed(1)} ` +
        `(windows: ${diffs.map((d) => d.toFixed(0)).join(" ")})`,
    );
  } else {
    const cpu: { a: number; b: number }[] = [], rps: number[] = [];
    for (let w = 0; w < windows; w++) {
      const both = await atOnce(ga, gb, seconds, env);
      cpu.push({ a: both.cpu[0], b: both.cpu[1] });
      rps.push(both.rps[1] / both.rps[0]);
    }
    const diffs = cpu.map((c) => c.b - c.a);
    console.log(
      `CPU a request, µs (median of ${windows} windows of ${seconds} s): A ${
        median(cpu.map((c) => c.a)).toFixed(1)
      }, B ${median(cpu.map((c) => c.b)).toFixed(1)}; B − A ${median(diffs).toFixed(1)} ` +
        `(windows: ${diffs.map((d) => d.toFixed(1)).join(" ")}); B ÷ A requests answered ${
          median(rps).toFixed(3)
        }`,
    );
  }
} finally {
  for (const s of started.reverse()) await s.stop();
}
