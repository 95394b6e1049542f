/**
 * Lookup misses at scale, one by one: a gateway (`gateway/main.ts`, lookup digests off so a miss
 * asks every node) in front of `--nodes` simulated nodes (`bench/children/scale_nodes.ts`,
 * checking in every 15 s), then `--misses` lookups of new names per delay in `--delays` (each
 * node answering that many ms late), `--gap` seconds apart (`--gap=16-20`: a random gap in that
 * range). Per miss it prints one JSON line: time, HTTP status, nodes heard, new sockets the nodes
 * accepted, nodes not asked, the gateway's CPU over the round, its open descriptors at most
 * (sampled every 50 ms) and the simulated nodes' CPU; then the medians per delay and the load
 * average.
 *
 * Not a section of RESULTS.md: the tool behind the scale section's notes on slow networks and
 * on a miss long after the last one.
 *
 * `deno run -A bench/probes/scale_rounds.ts [--nodes=10000] [--misses=5] [--delays=0,40]
 * [--gap=3] [--port=26100] [--env=NAME=VALUE ...] [--pace=1] [--cycle=1] [--nice=0]`
 *
 * `roundMs` is the gateway's own time for the round (its lookup round histogram's sum), beside
 * `ms`, the client's.
 *
 * @module
 */
import { benchToken, cpuMs, startChild, startGateway } from "../lib/fixtures.ts";
import { median } from "../lib/stats.ts";

const flag = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const nodes = Number(flag("nodes", "10000"));
const misses = Number(flag("misses", "5"));
const delays = flag("delays", "0,40").split(",").map(Number);
const [gapLo, gapHi = gapLo] = flag("gap", "3").split("-").map(Number);
const portBase = Number(flag("port", "26100"));
const pace = flag("pace", "1") !== "0";
/** With `--cycle=1`, each miss is followed by what the scale section does after its miss: a
 * second miss, a list, a miss with every node 40 ms late, then a 3 s burst of check-ins. */
const cycle = flag("cycle", "0") === "1";
/** `--nice=10`: the simulated nodes run at that niceness (lower priority); 0 by default. */
const nice = Number(flag("nice", "0"));
const env: Record<string, string> = { DORMICE_GATEWAY_LOOKUP_DIGESTS: "off" };
for (const a of Deno.args.filter((a) => a.startsWith("--env="))) {
  const [k, ...v] = a.slice(6).split("=");
  env[k] = v.join("=");
}
const PER_PROCESS = 5_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * A process's main thread (its event loop) from /proc/<pid>/schedstat: ms run on a core, and ms
 * spent runnable but waiting for one (the machine's other work ahead of it).
 */
function schedMs(pid: number): { run: number; wait: number } {
  const [run, wait] = Deno.readTextFileSync(`/proc/${pid}/schedstat`).split(" ").map(Number);
  return { run: run / 1e6, wait: wait / 1e6 };
}

interface Stats {
  lookups: number;
  connections: number;
}

const gw = await startGateway([], env, "--allow-net", portBase);
const children: { pid: number; stop(): Promise<void> }[] = [];
const ports: number[] = [];
try {
  for (let p = 0, first = 0; first < nodes; p++, first += PER_PROCESS) {
    const port = portBase + 1 + p;
    ports.push(port);
    children.push(
      await startChild<{ ready: boolean }>(
        [
          "run",
          "--frozen",
          "--allow-net",
          new URL("../children/scale_nodes.ts", import.meta.url).pathname,
          String(Math.min(PER_PROCESS, nodes - first)),
          gw.url,
          String(port),
          "15",
          String(first),
        ],
        {},
        300_000,
        nice === 0 ? undefined : nice,
      ),
    );
  }
  const stats = async (): Promise<Stats> => {
    const all = await Promise.all(
      ports.map((p) =>
        fetch(`http://127.0.0.1:${p}/stats`).then((r) => r.json() as Promise<Stats>)
      ),
    );
    return {
      lookups: all.reduce((n, s) => n + s.lookups, 0),
      connections: all.reduce((n, s) => n + s.connections, 0),
    };
  };
  const post = (path: string) =>
    Promise.all(ports.map((p) => fetch(`http://127.0.0.1:${p}${path}`, { method: "POST" })))
      .then((rs) => Promise.all(rs.map((r) => r.body?.cancel())));
  await post(`/pace?on=${pace ? 1 : 0}`);
  const fds = () => {
    let n = 0;
    for (const _ of Deno.readDirSync(`/proc/${gw.pid}/fd`)) n++;
    return n;
  };
  const auth = { authorization: `Bearer ${benchToken}`, "content-type": "application/json" };
  const roundSeconds = async () => {
    const text = await (await fetch(`${gw.url}/metrics`, { headers: auth })).text();
    let sum = 0;
    for (
      const m of text.matchAll(/^dormice_gateway_lookup_round_duration_seconds_sum\S* (\S+)$/gm)
    ) {
      sum += Number(m[1]);
    }
    return sum;
  };
  const call = async (verb: string, body: unknown) => {
    const res = await fetch(`${gw.url}/${verb}`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify(body),
    });
    return { status: res.status, json: await res.json().catch(() => ({})) };
  };
  console.log(
    JSON.stringify({
      gatewayPid: gw.pid,
      nodes,
      env,
      cycle,
      load: Deno.loadavg(),
      at: new Date().toISOString(),
    }),
  );
  let seq = 0;
  for (const delay of delays) {
    await post(`/delay?ms=${delay}`);
    const rows: Record<string, number>[] = [];
    for (let k = 0; k < misses; k++) {
      await sleep(1000 * (gapLo + Math.random() * (gapHi - gapLo)));
      const rs0 = await roundSeconds();
      const s0 = await stats();
      const [c0, ...n0] = await cpuMs([gw.pid, ...children.map((c) => c.pid)]);
      const q0 = schedMs(gw.pid);
      const nq0 = children.map((c) => schedMs(c.pid));
      let peak = fds();
      const sampler = setInterval(() => {
        peak = Math.max(peak, fds());
      }, 50);
      const t0 = performance.now();
      const { status, json } = await call("lookupSandbox", { name: `probe-${++seq}` });
      const ms = performance.now() - t0;
      clearInterval(sampler);
      const q1 = schedMs(gw.pid);
      const nq1 = children.map((c) => schedMs(c.pid));
      const [c1, ...n1] = await cpuMs([gw.pid, ...children.map((c) => c.pid)]);
      const s1 = await stats();
      const rs1 = await roundSeconds();
      const notAsked = /(\d+) nodes? (?:was|were) not asked/.exec(String(json?.message ?? ""));
      const r = {
        delay,
        at: Date.now(),
        ms: Math.round(ms),
        roundMs: Math.round((rs1 - rs0) * 1000),
        status,
        heard: s1.lookups - s0.lookups,
        newSockets: s1.connections - s0.connections,
        notAsked: notAsked ? Number(notAsked[1]) : 0,
        gatewayCpuMs: c1 - c0,
        // The gateway's event loop: ran, and waited for a core while runnable.
        loopRunMs: Math.round(q1.run - q0.run),
        loopWaitMs: Math.round(q1.wait - q0.wait),
        nodesLoopWaitMs: Math.round(
          nq1.reduce((a, q) => a + q.wait, 0) - nq0.reduce((a, q) => a + q.wait, 0),
        ),
        nodesCpuMs: n1.reduce((a, b) => a + b, 0) - n0.reduce((a, b) => a + b, 0),
        peakFds: peak,
        load1: Deno.loadavg()[0],
      };
      rows.push(r);
      console.log(JSON.stringify(r));
      if (cycle) {
        await call("lookupSandbox", { name: `probe-warm-${seq}` });
        await call("listSandboxes", {});
        await post("/delay?ms=40");
        const ss0 = await stats();
        const ts0 = performance.now();
        const slow = await call("lookupSandbox", { name: `probe-slow-${seq}` });
        const slowMs = Math.round(performance.now() - ts0);
        const slowHeard = (await stats()).lookups - ss0.lookups;
        await post(`/delay?ms=${delay}`);
        await post("/pace?on=0");
        await sleep(500);
        await Promise.all(
          ports.map((p) =>
            fetch(`http://127.0.0.1:${p}/burst?ms=3000&concurrency=32`, { method: "POST" })
          ),
        );
        await post(`/pace?on=${pace ? 1 : 0}`);
        console.log(JSON.stringify({
          cycle: seq,
          slowStatus: slow.status,
          slowMs,
          slowHeard,
          load1: Deno.loadavg()[0],
        }));
      }
    }
    const med = (k: string) => median(rows.slice(1).map((r) => r[k]));
    console.log(JSON.stringify({
      summary: `delay ${delay} ms, runs 2..${misses} (the first is cold)`,
      ms: med("ms"),
      heard: med("heard"),
      all200: rows.slice(1).filter((r) => r.status === 200).length,
      gatewayCpuMs: med("gatewayCpuMs"),
      peakFds: med("peakFds"),
      newSockets: med("newSockets"),
    }));
  }
} finally {
  for (const c of children) await c.stop();
  await gw.stop();
}
