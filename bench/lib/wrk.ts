/**
 * The load tools the forwarding section and the profiling probes share: wrk with the routed verb's
 * script, nginx in front of a node, two proxies loaded at once, and the wait for a node's check-in.
 *
 * @module
 */
import { cpuTimes, freePort, postJson, stopProcess } from "./fixtures.ts";
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

/** Starts nginx from bench/proxies/nginx.conf proxying to `nodePort`. */
export async function startNginx(nodePort: number): Promise<Nginx> {
  const prefix = await Deno.makeTempDir({ prefix: "dormice-bench-nginx-" });
  const port = freePort();
  const template = await Deno.readTextFile(new URL("../proxies/nginx.conf", import.meta.url));
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
