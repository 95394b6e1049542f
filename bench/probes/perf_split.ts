/**
 * Where a forwarding proxy's CPU goes on the wire, as `perf` sees it: the gateway, the
 * bytes-framed floor (`bench/proxies/raw_http_proxy.ts`) and nginx in turn, each in front of the same
 * node under wrk (-t2 -c32 on `POST /getSandboxMetrics` for a cached name; `--connections=1` for
 * one request at a time), sampled by `perf record -g` with V8's perf map (`--perf-basic-prof`).
 * Printed per request answered:
 *
 * - the samples by where they fell: the kernel, the runtime's own binary (V8's C++ and Deno's
 *   Rust: its ops, event loop and garbage collector; it has no symbols; for nginx, nginx's own
 *   binary), JavaScript compiled by V8 (named by the map), libc; and the main thread against the
 *   others;
 * - the runtime binary's samples by the first JavaScript function above them on the stack: the
 *   calls each function makes out of JavaScript (a builtin written in C++, an op), which the V8
 *   profiler (`bench/probes/profile.ts`) folds into the function and `bench/probes/lane_js.ts` cannot price
 *   apart. "(event loop)" is work no JavaScript frame is above: ops polled, promises resolved.
 *
 * Not a section of RESULTS.md: a tool that found a call per header line into C++
 * this way (docs/forwarding-engine.md). Needs `perf` (linux-perf) and wrk; without them it says so.
 *
 * `deno run -A bench/probes/perf_split.ts [--seconds=6] [--callers=15] [--only=gateway|floor|nginx]
 * [--connections=32]`
 *
 * @module
 */
import { benchToken, postJson, startGateway, startNode, startScript } from "../lib/fixtures.ts";
import { missingTools, startNginx, waitForNode, wrk } from "../lib/wrk.ts";

const flag = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const seconds = Number(flag("seconds", "6"));
const callers = Number(flag("callers", "15"));
const only = flag("only", "");
const connections = Number(flag("connections", "32"));
const HZ = 1999;
const PERF_MAP = "--v8-flags=--perf-basic-prof";

/** One sample: its thread and its frames, the leaf first. */
interface Sample {
  tid: number;
  frames: { dso: string; name: string }[];
}

/** What `perf script -F tid,ip,sym,dso` printed, as samples. */
export function parsePerfScript(text: string): Sample[] {
  const samples: Sample[] = [];
  for (const block of text.split(/\n\s*\n/)) {
    const lines = block.split("\n").filter((l) => l.trim() !== "");
    if (lines.length < 2) continue;
    const tid = Number(lines[0].trim().split(/\s+/)[0]);
    const frames = lines.slice(1).map((line) => {
      // "<ip> <symbol> (<dso>)": the symbol may hold spaces, the dso is the last parentheses.
      const m = /^\s*[0-9a-f]+\s+(.*)\s+\(([^()]*)\)\s*$/.exec(line);
      return m ? { name: m[1], dso: m[2] } : { name: line.trim(), dso: "" };
    });
    samples.push({ tid, frames });
  }
  return samples;
}

/** Where a frame's code lies. */
export function placeOf(dso: string): "kernel" | "runtime" | "JavaScript" | "libc" | "other" {
  if (dso.includes("kernel")) return "kernel";
  if (/\/(deno|nginx)$/.test(dso)) return "runtime";
  if (dso.includes("perf-") || dso.startsWith("[JIT]")) return "JavaScript";
  if (dso.includes("libc")) return "libc";
  return "other";
}

/** A V8 perf-map name without its marker and file path: `JS:*'serve file:///…:258:17` → serve. */
function jsName(name: string): string {
  const bare = name.replace(/^JS:[*~^+']*/, "").replace(/^'/, "");
  const at = /\s(file|ext|npm):/.exec(bare);
  const file = at ? bare.slice(at.index + 1).split("/").slice(-1)[0] : "";
  return `${at ? bare.slice(0, at.index) : bare || "(anonymous)"}${file ? ` ${file}` : ""}`;
}

/** The split of `samples` taken from process `pid` over `requests` requests. */
export function split(samples: Sample[], pid: number, requests: number) {
  const us = 1e6 / HZ / requests;
  const places = new Map<string, number>();
  const threads = { main: 0, others: 0 };
  const byCaller = new Map<string, number>();
  for (const s of samples) {
    const leaf = s.frames[0];
    if (leaf === undefined) continue;
    const place = placeOf(leaf.dso);
    places.set(place, (places.get(place) ?? 0) + us);
    if (s.tid === pid) threads.main += us;
    else threads.others += us;
    if (place !== "runtime" || s.tid !== pid) continue;
    const js = s.frames.find((f) => placeOf(f.dso) === "JavaScript");
    const caller = js === undefined ? "(event loop)" : jsName(js.name);
    byCaller.set(caller, (byCaller.get(caller) ?? 0) + us);
  }
  return { places, threads, byCaller };
}

async function record(pid: number, url: string, out: string): Promise<number> {
  const env = { BENCH_TOKEN: benchToken, BENCH_NAME: "bench-fwd" };
  await wrk(`${url}/getSandboxMetrics`, 2, env); // warm-up: pools, JIT
  const perf = new Deno.Command("perf", {
    args: ["record", "-F", String(HZ), "-g", "-o", out, "-p", String(pid)],
    stdout: "null",
    stderr: "null",
  }).spawn();
  // perf attaches to the threads before the measured run starts.
  await new Promise((r) => setTimeout(r, 300));
  const result = await wrk(`${url}/getSandboxMetrics`, seconds, env, connections);
  perf.kill("SIGINT");
  await perf.status;
  return result.rps * seconds;
}

async function samplesOf(file: string): Promise<Sample[]> {
  const out = await new Deno.Command("perf", {
    args: ["script", "-i", file, "-F", "tid,ip,sym,dso"],
    stdout: "piped",
    stderr: "null",
  }).output();
  return parsePerfScript(new TextDecoder().decode(out.stdout));
}

if (import.meta.main) {
  const missing = await missingTools(["wrk", "perf", "nginx"]);
  if (missing) {
    console.log(`Not measured: ${missing}`);
    Deno.exit(0);
  }
  const dir = await Deno.makeTempDir({ prefix: "dormice-perf-" });
  const gw = await startGateway([PERF_MAP]);
  const node = await startNode("perf-node", gw.url);
  const stops: { stop(): Promise<void> }[] = [node, gw];
  const results: { label: string; split: ReturnType<typeof split> }[] = [];
  // V8 writes its map to /tmp/perf-<pid>.map for perf to read: removed at the end.
  const maps = [gw.pid];
  try {
    await waitForNode(gw.url, "perf-node");
    const made = await postJson(`${gw.url}/acquireSandbox`, { name: "bench-fwd" });
    if (made.status !== 200) throw new Error(`acquireSandbox answered ${made.status}`);
    const floor = await startScript<{ port: number }>(
      "proxies/raw_http_proxy.ts",
      [`127.0.0.1:${node.port}`],
      [PERF_MAP],
    );
    stops.unshift(floor);
    maps.push(floor.pid);
    const nginx = await startNginx(node.port);
    stops.unshift(nginx);
    const targets = [
      { label: "gateway", pid: gw.pid, url: gw.url },
      { label: "floor", pid: floor.pid, url: `http://127.0.0.1:${floor.ready.port}` },
      { label: "nginx", pid: nginx.pid, url: nginx.url },
    ].filter((t) => only === "" || t.label === only);
    for (const t of targets) {
      const file = `${dir}/${t.label}.data`;
      const requests = await record(t.pid, t.url, file);
      results.push({ label: t.label, split: split(await samplesOf(file), t.pid, requests) });
    }
  } finally {
    for (const s of stops) await s.stop();
    for (const pid of maps) await Deno.remove(`/tmp/perf-${pid}.map`).catch(() => {});
    await Deno.remove(dir, { recursive: true });
  }
  const fmt = (n: number | undefined) => (n ?? 0).toFixed(2).padStart(7);
  const labels = results.map((r) => r.label);
  console.log(`µs a request     ${labels.map((l) => l.padStart(7)).join(" ")}`);
  for (const place of ["kernel", "runtime", "JavaScript", "libc", "other"]) {
    console.log(
      `${place.padEnd(16)} ${results.map((r) => fmt(r.split.places.get(place))).join(" ")}`,
    );
  }
  console.log(
    `${"main thread".padEnd(16)} ${results.map((r) => fmt(r.split.threads.main)).join(" ")}`,
  );
  console.log(
    `${"other threads".padEnd(16)} ${results.map((r) => fmt(r.split.threads.others)).join(" ")}`,
  );
  for (const r of results) {
    if (r.split.byCaller.size === 1 && r.split.byCaller.has("(event loop)")) continue; // no JS
    console.log(`\n${r.label}: the runtime binary's time on the main thread, by the JS above it`);
    for (const [name, t] of [...r.split.byCaller].sort((a, b) => b[1] - a[1]).slice(0, callers)) {
      console.log(`${fmt(t)}  ${name}`);
    }
  }
}
