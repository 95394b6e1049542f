/**
 * Shared pieces of the benchmarks: node readings, child stub-node processes, free ports, timing.
 *
 * @module
 */
import type { CheckIn, HostReading } from "../../shared/schemas.ts";

/** The fleet token every benchmark process uses (never a real secret). */
export const benchToken = "bench-token-0123456789abcdef0123456789abcdef";

/** A host reading with the given counts (defaults: 4 cores, 8 GB free, 50 GB disk). */
export function reading(over: Partial<HostReading> = {}, active = 0): HostReading {
  return {
    takenAt: Date.now(),
    cpuCount: 4,
    cpuUsedPct: 10,
    memoryTotalBytes: 16e9,
    memoryAvailableBytes: 8e9,
    swapTotalBytes: 0,
    swapFreeBytes: 0,
    dataDisk: {
      path: "/var/lib/dormice",
      totalBytes: 100e9,
      usedBytes: 50e9,
      availableBytes: 50e9,
    },
    sandboxes: { active, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    ...over,
  };
}

/** A check-in body for node `i` at `endpoint`. */
export function checkIn(i: number, endpoint: string, r: HostReading = reading()): CheckIn {
  return {
    nodeId: `node-${String(i).padStart(5, "0")}`,
    endpoint,
    intervalSeconds: 15,
    build: "bench",
    reading: r,
  };
}

/** A deterministic pseudo-random source (mulberry32), so every run builds the same fleet. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A TCP port on 127.0.0.1 that nothing listens on now. */
export function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** A running child process started by the harness, with the JSON line it printed first. */
export interface Child<T> {
  /** The first stdout line, parsed. */
  ready: T;
  /** Its process id (for /proc readings). */
  pid: number;
  /** Stops it (SIGTERM, then waits). */
  stop(): Promise<void>;
}

/**
 * Starts `deno run <args>` and waits for its first stdout line (JSON). Stderr is passed through
 * only when it is not empty at exit, to keep the runner's output readable. With `nice`, the child
 * runs at that niceness (`nice -n`): simulated nodes that stand for machines of their own then
 * take a core only when the gateway does not want it.
 */
export async function startChild<T>(
  args: string[],
  env: Record<string, string> = {},
  timeoutMs = 30_000,
  nice?: number,
): Promise<Child<T>> {
  // `nice` execs the child in its own place: the pid stays the child's.
  const proc = new Deno.Command(nice === undefined ? Deno.execPath() : "nice", {
    args: nice === undefined ? args : ["-n", String(nice), Deno.execPath(), ...args],
    env,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderrChunks: Uint8Array[] = [];
  const stderrDone = (async () => {
    for await (const c of proc.stderr) {
      if (stderrChunks.length < 200) stderrChunks.push(c);
    }
  })();
  const reader = proc.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  const timer = setTimeout(() => {
    try {
      proc.kill("SIGKILL");
    } catch { /* already gone */ }
  }, timeoutMs);
  try {
    while (!buf.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += value;
    }
  } finally {
    clearTimeout(timer);
  }
  const drain = (async () => {
    try {
      while (!(await reader.read()).done) { /* keep the pipe flowing */ }
    } catch { /* closed */ }
  })();
  if (!buf.includes("\n")) {
    await proc.status;
    await stderrDone;
    const err = new TextDecoder().decode(concat(stderrChunks));
    throw new Error(`Child ${args.join(" ")} exited before it was ready: ${err.slice(-2000)}`);
  }
  let stopped = false;
  return {
    ready: JSON.parse(buf.slice(0, buf.indexOf("\n"))) as T,
    pid: proc.pid,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      await stopProcess(proc, "SIGTERM", 3000);
      await drain;
      await stderrDone;
    },
  };
}

function concat(chunks: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(chunks.reduce((n, c) => n + c.length, 0));
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.length;
  }
  return out;
}

/** What `children/stub_nodes.ts` prints when it is listening. */
export interface StubReady {
  /** One port per stub node. */
  ports: number[];
}

/** Starts `count` stub nodes in one child process (so they run on the other core). */
export function startStubNodes(count: number): Promise<Child<StubReady>> {
  return startChild<StubReady>([
    "run",
    "--allow-net=127.0.0.1",
    new URL("../children/stub_nodes.ts", import.meta.url).pathname,
    String(count),
  ]);
}

/** Milliseconds taken by `fn`. */
export async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await fn();
  return performance.now() - t0;
}

/** A daemon started by the harness (gateway or node main). */
export interface Daemon {
  /** `http://127.0.0.1:<port>`. */
  url: string;
  /** Its port. */
  port: number;
  /** Its process id (for /proc readings). */
  pid: number;
  /** Stops it (SIGTERM, then SIGKILL after 5 s) and removes its temporary directory. */
  stop(): Promise<void>;
}

async function spawnDaemon(
  script: string,
  permissions: string[],
  env: Record<string, string>,
  port: number,
  dir: string,
  extraArgs: string[] = [],
): Promise<Daemon> {
  const proc = new Deno.Command(Deno.execPath(), {
    args: ["run", ...extraArgs, ...permissions, new URL(script, import.meta.url).pathname],
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const tail: string[] = [];
  const drain = async (s: ReadableStream<Uint8Array>) => {
    for await (const c of s.pipeThrough(new TextDecoderStream())) {
      tail.push(c);
      if (tail.length > 50) tail.shift();
    }
  };
  const drained = Promise.all([drain(proc.stdout), drain(proc.stderr)]);
  const url = `http://127.0.0.1:${port}`;
  let stopped = false;
  const stop = async () => {
    if (stopped) return;
    stopped = true;
    await stopProcess(proc, "SIGTERM");
    await drained;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    try {
      const res = await fetch(`${url}/healthz`);
      await res.body?.cancel();
      if (res.ok) break;
    } catch { /* not yet */ }
    const status = await Promise.race([
      proc.status,
      new Promise((r) => setTimeout(r, 50, undefined)),
    ]);
    if (status !== undefined || Date.now() > deadline) {
      await stop();
      throw new Error(`${script} did not come up at ${url}: ${tail.join("").slice(-2000)}`);
    }
  }
  return { url, port, pid: proc.pid, stop };
}

/** Starts `gateway/main.ts` on a free port with its database in a temporary directory. */
export async function startGateway(
  extraArgs: string[] = [],
  extraEnv: Record<string, string> = {},
  /** The network permission: loopback 127.0.0.1 by default; `--allow-net` for 127.1.x.y nodes. */
  allowNet = "--allow-net=127.0.0.1",
  /** Its port on 127.0.0.1: a free one by default. */
  port = freePort(),
): Promise<Daemon> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-bench-gw-" });
  return spawnDaemon(
    "../../gateway/main.ts",
    [
      "--unstable-no-legacy-abort",
      allowNet,
      "--allow-env",
      `--allow-read=${dir}`,
      `--allow-write=${dir}`,
    ],
    {
      DORMICE_API_TOKEN: benchToken,
      DORMICE_GATEWAY_HOST: "127.0.0.1",
      DORMICE_GATEWAY_PORT: String(port),
      DORMICE_GATEWAY_DB: `${dir}/gateway.db`,
      ...extraEnv,
    },
    port,
    dir,
    extraArgs,
  );
}

/**
 * Starts one of bench/'s helper scripts (`name`, its path under bench/, e.g.
 * `proxies/splice_proxy.ts`) with loopback network
 * access and `permissions` more, and waits for its first stdout line (JSON).
 */
export function startScript<T>(
  name: string,
  args: string[],
  permissions: string[] = [],
): Promise<Child<T>> {
  return startChild<T>([
    "run",
    "--frozen",
    "--allow-net=127.0.0.1",
    ...permissions,
    new URL(`../${name}`, import.meta.url).pathname,
    ...args,
  ]);
}

/**
 * Starts `node/main.ts` on the fake executor, checking in to `gateway` when given (several
 * gateways comma-separated), with `env` on top.
 */
export async function startNode(
  nodeId: string,
  gateway?: string,
  extraArgs: string[] = [],
  env: Record<string, string> = {},
): Promise<Daemon> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-bench-node-" });
  const port = freePort();
  return spawnDaemon(
    "../../node/main.ts",
    [
      "--allow-net=127.0.0.1",
      "--allow-env",
      `--allow-read=${dir}`,
      `--allow-write=${dir}`,
      "--allow-sys=cpus,systemMemoryInfo,statfs",
    ],
    {
      DORMICE_API_TOKEN: benchToken,
      DORMICE_HOST: "127.0.0.1",
      DORMICE_PORT: String(port),
      DORMICE_DATA_DIR: dir,
      DORMICE_EXECUTOR: "fake",
      DORMICE_NODE_ID: nodeId,
      DORMICE_NODE_ENDPOINT: `http://127.0.0.1:${port}`,
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
      // The faster engine (no WebSocket upgrades): these benchmarks measure what the gateway
      // adds in front of a node, which a slower node would hide.
      DORMICE_WEBSOCKETS: "off",
      ...(gateway ? { DORMICE_GATEWAY_ENDPOINT: gateway } : {}),
      ...env,
    },
    port,
    dir,
    extraArgs,
  );
}

/**
 * Starts `node/main.ts` on the Docker executor (the default templates), checking in to
 * `gateway` every second (standalone when `null`), with `env` on top. Its containers carry the
 * label `dormice.node=<nodeId>`.
 */
export async function startDockerNode(
  nodeId: string,
  gateway: string | null,
  env: Record<string, string> = {},
): Promise<Daemon> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-bench-docker-node-" });
  const port = freePort();
  const socket = "/var/run/docker.sock";
  return spawnDaemon(
    "../../node/main.ts",
    [
      // The ports door connects to sandbox addresses the engine picks from its address pools, so
      // the hosts cannot be listed (deno task node grants --allow-net too).
      "--allow-net",
      // dockerode's dependencies read the environment as they load.
      "--allow-env",
      `--allow-read=${dir},${socket}`,
      `--allow-write=${dir},${socket}`,
      "--allow-sys=cpus,systemMemoryInfo,statfs,networkInterfaces",
      // The host firewall: one iptables rule per sandbox network (as deno task node grants it);
      // openssl for the egress CA.
      "--allow-run=iptables,openssl",
    ],
    {
      DORMICE_API_TOKEN: benchToken,
      DORMICE_HOST: "127.0.0.1",
      DORMICE_PORT: String(port),
      DORMICE_DATA_DIR: dir,
      DORMICE_EXECUTOR: "docker",
      DORMICE_NODE_ID: nodeId,
      DORMICE_NODE_ENDPOINT: `http://127.0.0.1:${port}`,
      // The host firewall runs iptables, found on PATH (the daemon's environment is cleared).
      PATH: Deno.env.get("PATH") ?? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
      ...(gateway ? { DORMICE_GATEWAY_ENDPOINT: gateway } : {}),
      ...env,
    },
    port,
    dir,
  );
}

/** Waits until the node shows `up` in the gateway's listNodes, at most 30 s. */
export async function waitForNodeUp(gateway: string, nodeId: string): Promise<void> {
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    const { json } = await postJson(`${gateway}/listNodes`, {});
    if (
      json?.nodes?.some((n: { id: string; state: string }) => n.id === nodeId && n.state === "up")
    ) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`node ${nodeId} did not show up at the gateway within 30 s`);
}

/** A JSON answer; the harness reads a few known fields, so the body is loosely typed. */
// deno-lint-ignore no-explicit-any
export type JsonAnswer = { status: number; json: any };

/** POSTs JSON with the bench token and returns the status and parsed body. */
export async function postJson(url: string, body: unknown): Promise<JsonAnswer> {
  const res = await fetch(url, {
    method: "POST",
    headers: { "authorization": `Bearer ${benchToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const text = await res.text();
  let json: unknown = text;
  try {
    json = text ? JSON.parse(text) : null;
  } catch { /* not JSON */ }
  return { status: res.status, json };
}

/** Sends `signal`, then SIGKILL if the process has not exited within `graceMs`; waits for it. */
export async function stopProcess(
  proc: Deno.ChildProcess,
  signal: Deno.Signal,
  graceMs = 5000,
): Promise<void> {
  try {
    proc.kill(signal);
  } catch { /* gone */ }
  const kill = setTimeout(() => {
    try {
      proc.kill("SIGKILL");
    } catch { /* gone */ }
  }, graceMs);
  await proc.status;
  clearTimeout(kill);
}

/**
 * CPU time each process has used so far, in ms, split into user and system time, read from /proc
 * with `cat` (Deno refuses /proc reads without --allow-all). Clock ticks are taken as 100 per
 * second, the Linux default (`getconf CLK_TCK`).
 */
export async function cpuTimes(
  pids: readonly number[],
): Promise<{ user: number; system: number }[]> {
  const out = await new Deno.Command("cat", {
    args: pids.map((pid) => `/proc/${pid}/stat`),
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`reading /proc/<pid>/stat failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return new TextDecoder().decode(out.stdout).trim().split("\n").map((line) => {
    // Fields after the command name, which is in parentheses and may hold spaces.
    const fields = line.slice(line.lastIndexOf(")") + 2).split(" ");
    return { user: Number(fields[11]) * 10, system: Number(fields[12]) * 10 };
  });
}

/** The machine's CPU time so far over all its cores, in ms (see {@linkcode machineTimes}). */
export interface MachineTimes {
  /** Time the cores ran anything: user, nice, system, irq and softirq. */
  busy: number;
  /** Time they had nothing to run (idle and iowait). */
  idle: number;
  /** Time the hypervisor ran something else while this machine had work (steal). */
  steal: number;
}

/**
 * The `cpu` line of `/proc/stat` as {@linkcode MachineTimes}, clock ticks taken as 100 a second.
 *
 * @example
 * ```ts
 * import { parseProcStat } from "./fixtures.ts";
 * parseProcStat("cpu  10 0 5 80 5 0 0 2 0 0\ncpu0 ..."); // { busy: 150, idle: 850, steal: 20 }
 * ```
 */
export function parseProcStat(text: string): MachineTimes {
  const line = text.split("\n").find((l) => /^cpu\s/.test(l));
  const f = line?.trim().split(/\s+/).slice(1).map(Number) ?? [];
  if (f.length < 8 || f.some((n) => !Number.isFinite(n))) {
    throw new Error(`Cannot read the cpu line of /proc/stat: '${(line ?? text).slice(0, 120)}'`);
  }
  const [user, nice, system, idle, iowait, irq, softirq, steal] = f;
  return {
    busy: (user + nice + system + irq + softirq) * 10,
    idle: (idle + iowait) * 10,
    steal: steal * 10,
  };
}

/** The machine's CPU time so far (`/proc/stat`, read with `cat` as {@linkcode cpuTimes} does). */
export async function machineTimes(): Promise<MachineTimes> {
  const out = await new Deno.Command("cat", {
    args: ["/proc/stat"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`reading /proc/stat failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return parseProcStat(new TextDecoder().decode(out.stdout));
}

/** CPU time (user + system) each process has used so far, in ms (see {@linkcode cpuTimes}). */
export async function cpuMs(pids: readonly number[]): Promise<number[]> {
  return (await cpuTimes(pids)).map((t) => t.user + t.system);
}

/**
 * The path of a bench/ file in `tree`, a checkout of this repository: `path` (under bench/), or
 * `before` in a checkout from before bench/ had folders, so the probes compare trees either side.
 */
export function treeBenchFile(tree: string, path: string, before: string): string {
  const now = `${tree}/bench/${path}`;
  try {
    Deno.statSync(now);
    return now;
  } catch {
    return `${tree}/bench/${before}`;
  }
}
