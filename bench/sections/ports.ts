/**
 * The port benchmark: a sandbox port reached through both hops (gateway → the node's
 * port door → the listener standing in for the sandbox's server, bench/children/port_node.ts on the fake
 * executor) against the same port through the node's door alone, in one run. Bulk transfer both
 * ways (64 MiB streamed) and WebSocket echo round trips; the listener reached straight is shown
 * too, so the door's own share is visible.
 *
 * @module
 */
import { type Child, cpuMs, startGateway, startScript } from "../lib/fixtures.ts";
import { waitForNode } from "../lib/wrk.ts";
import { median, type Row, row, type Section } from "../lib/stats.ts";

/** Options of {@linkcode runPorts}. */
export interface PortsOptions {
  /** Runs (five or more). */
  runs: number;
  /** MiB per bulk transfer. Default 64. */
  mib?: number;
  /** WebSocket round trips per measurement. Default 300. */
  trips?: number;
}

/** Where a transfer goes: a base URL and the headers that route it. */
export interface Route {
  url: string;
  headers: Record<string, string>;
}

/** Downloads `mib` MiB from the port's /bulk; returns MiB/s. */
export async function download(route: Route, mib: number): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${route.url}/bulk?mib=${mib}`, { headers: route.headers });
  if (res.status !== 200) throw new Error(`bulk answered ${res.status}: ${await res.text()}`);
  let n = 0;
  for await (const part of res.body!) n += part.length;
  const s = (performance.now() - t0) / 1000;
  if (n !== mib * 2 ** 20) throw new Error(`bulk sent ${n} bytes, not ${mib} MiB`);
  return mib / s;
}

/** Uploads `mib` MiB to the port's /sink in 256 KiB blocks; returns MiB/s. */
export async function upload(route: Route, mib: number): Promise<number> {
  const block = new Uint8Array(256 * 1024).fill(121);
  let left = mib * 2 ** 20;
  const body = new ReadableStream<Uint8Array>({
    pull(c) {
      if (left <= 0) return c.close();
      left -= block.length;
      c.enqueue(block.slice());
    },
  }, { highWaterMark: 0 });
  const t0 = performance.now();
  const res = await fetch(`${route.url}/sink`, {
    method: "POST",
    headers: route.headers,
    body,
    duplex: "half",
  } as RequestInit);
  const got = await res.json() as { bytes: number };
  const s = (performance.now() - t0) / 1000;
  if (got.bytes !== mib * 2 ** 20) throw new Error(`sink got ${got.bytes} bytes, not ${mib} MiB`);
  return mib / s;
}

/** p50 of `trips` sequential echo round trips of 32 bytes, in ms. */
async function roundTrips(route: Route, trips: number): Promise<number> {
  const ws = new WebSocket(route.url.replace(/^http/, "ws") + "/", {
    headers: route.headers,
  } as unknown as string[]);
  ws.binaryType = "arraybuffer";
  let failed: ((e: Error) => void) | undefined;
  const fail = (e: Event) => {
    const error = new Error((e as ErrorEvent).message || `WebSocket to ${route.url} failed`);
    failed?.(error);
  };
  ws.onerror = fail;
  await new Promise<void>((resolve, reject) => {
    failed = reject;
    ws.onopen = () => resolve();
  });
  const took: number[] = [];
  const payload = new Uint8Array(32);
  try {
    for (let i = 0; i < trips + 20; i++) {
      const t0 = performance.now();
      const echoed = new Promise<void>((resolve, reject) => {
        failed = reject;
        const timer = setTimeout(() => reject(new Error("no echo within 5 s")), 5000);
        ws.onmessage = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      ws.send(payload);
      await echoed;
      if (i >= 20) took.push(performance.now() - t0); // the first ones warm the path
    }
  } finally {
    if (ws.readyState < WebSocket.CLOSING) {
      const closed = new Promise((r) => ws.onclose = r);
      ws.close();
      await closed;
    }
  }
  return median(took);
}

/**
 * Starts bench/children/port_node.ts checking in to `gateway`: the node app on the fake executor with one
 * sandbox whose port 8000 is a listener in the same process.
 */
export function startPortNode(
  gateway: string,
): Promise<Child<{ port: number; sandboxId: string; listener: number }>> {
  return startScript("children/port_node.ts", [gateway], ["--allow-env", "--allow-read"]);
}

/** Runs the port benchmark. */
export async function runPorts(options: PortsOptions): Promise<Section> {
  const { runs, mib = 64, trips = 300 } = options;
  // WebSockets on both hops, as an operator serving sandbox ports with them runs the fleet.
  const gw = await startGateway([], { DORMICE_GATEWAY_WEBSOCKETS: "on" });
  const stops: (() => Promise<void>)[] = [() => gw.stop()];
  const keys = ["listener", "node", "gateway", "splice"] as const;
  type Key = typeof keys[number];
  const lists = () =>
    ({ listener: [], node: [], gateway: [], splice: [] }) as Record<Key, number[]>;
  const down = lists(), up = lists();
  let rtt = lists();
  // CPU of each process over the measured transfers, per route and direction: [client, gateway,
  // node process (door and listener), splice], in ms, and the transfers' wall time.
  const usage = () =>
    Object.fromEntries(keys.map((k) => [k, { ms: [0, 0, 0, 0], wallMs: 0 }])) as Record<
      Key,
      { ms: number[]; wallMs: number }
    >;
  const cpu = { down: usage(), up: usage() };
  let pids: number[] = [];
  const measured = async (dir: "down" | "up", k: Key, transfer: () => Promise<number>) => {
    const before = await cpuMs(pids);
    const t0 = performance.now();
    const rate = await transfer();
    cpu[dir][k].wallMs += performance.now() - t0;
    const after = await cpuMs(pids);
    after.forEach((v, i) => cpu[dir][k].ms[i] += v - before[i]);
    return rate;
  };
  // A route whose WebSocket fails is left out of the echo rows, with its error in the notes.
  const wsFailed = new Map<Key, string>();
  const echo = async (k: Key, route: Route, n: number) => {
    if (wsFailed.has(k)) return;
    try {
      rtt[k].push(await roundTrips(route, n));
    } catch (error) {
      wsFailed.set(k, (error as Error).message);
    }
  };
  try {
    const child = await startPortNode(gw.url);
    stops.unshift(() => child.stop());
    // The runtime's floor for a hop: a TCP splice on Deno in front of the node's door.
    const splice = await startScript<{ port: number }>("proxies/splice_proxy.ts", [
      `127.0.0.1:${child.ready.port}`,
    ]);
    stops.unshift(() => splice.stop());
    pids = [Deno.pid, gw.pid, child.pid, splice.pid];
    await waitForNode(gw.url, "bench-port-node");
    const id = child.ready.sandboxId;
    const routes: Record<Key, Route> = {
      listener: { url: `http://127.0.0.1:${child.ready.listener}`, headers: {} },
      node: {
        url: `http://127.0.0.1:${child.ready.port}/e2b/ports/8000`,
        headers: { "e2b-sandbox-id": id },
      },
      gateway: {
        url: `${gw.url}/e2b/envd`,
        headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8000" },
      },
      splice: {
        url: `http://127.0.0.1:${splice.ready.port}/e2b/ports/8000`,
        headers: { "e2b-sandbox-id": id },
      },
    };
    for (const k of keys) {
      await download(routes[k], 4); // warm-up: pools, JIT
      await upload(routes[k], 4);
      await echo(k, routes[k], 20);
    }
    rtt = lists();
    for (let r = 0; r < runs; r++) {
      // Alternating the order spreads the machine's drift over both hops.
      const order = r % 2 === 0 ? keys : [...keys].reverse();
      for (const k of order) {
        down[k].push(await measured("down", k, () => download(routes[k], mib)));
      }
      for (const k of order) up[k].push(await measured("up", k, () => upload(routes[k], mib)));
      for (const k of order) await echo(k, routes[k], trips);
    }
  } finally {
    for (const stop of stops) await stop();
  }
  const ratio = (a: number[], b: number[]) => median(a.map((v, i) => v / b[i]));
  const rows: Row[] = [
    row("download, through the node's door (reference)", "MiB/s", down.node, down.node),
    row("download, through the gateway and the node's door", "MiB/s", down.gateway, down.node, {
      target: "≥ 0.9× the node's door",
      met: ratio(down.gateway, down.node) >= 0.9,
    }),
    row("download, straight to the listener", "MiB/s", down.listener, down.node),
    row("upload, through the node's door (reference)", "MiB/s", up.node, up.node),
    row("upload, through the gateway and the node's door", "MiB/s", up.gateway, up.node, {
      target: "≥ 0.9× the node's door",
      met: ratio(up.gateway, up.node) >= 0.9,
    }),
    row("upload, straight to the listener", "MiB/s", up.listener, up.node),
    row("download, through a Deno TCP splice and the node's door", "MiB/s", down.splice, down.node),
    row("upload, through a Deno TCP splice and the node's door", "MiB/s", up.splice, up.node),
  ];
  // What each hop costs in CPU: on a machine whose cores the transfer keeps busy, the extra
  // hop's share of all CPU per MiB is the share of throughput it must take away.
  const total = mib * runs;
  const perMiB = (dir: "down" | "up", k: Key) => cpu[dir][k].ms.map((v) => v / total);
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const ceilings: string[] = [];
  /** One figure over all runs (no per-run values, no reference). */
  const single = (label: string, unit: string, v: number, extra: Partial<Row> = {}) =>
    rows.push(row(label, unit, [v], null, extra));
  for (const [dir, word] of [["down", "download"], ["up", "upload"]] as const) {
    const ref = perMiB(dir, "node"), via = perMiB(dir, "gateway"), spliced = perMiB(dir, "splice");
    const busy = sum(cpu[dir].gateway.ms) / cpu[dir].gateway.wallMs;
    const ceiling = sum(ref) / sum(via);
    const spliceCeiling = sum(ref) / sum(spliced);
    single(
      `${word} CPU per MiB through the node's door: client + node process`,
      "ms/MiB",
      sum(ref),
    );
    single(`${word} CPU per MiB through the gateway: client`, "ms/MiB", via[0]);
    single(`${word} CPU per MiB through the gateway: gateway`, "ms/MiB", via[1]);
    single(
      `${word} CPU per MiB through the gateway: node process (door and listener)`,
      "ms/MiB",
      via[2],
    );
    single(`${word} through the gateway: cores busy (2 on this machine)`, "cores", busy, {
      digits: 2,
    });
    single(`${word} CPU per MiB through the splice: the splice`, "ms/MiB", spliced[3]);
    single(
      `${word}: CPU-bound ceiling of the two-hop ratio (reference CPU ÷ two-hop CPU per MiB)`,
      "×",
      ceiling,
      { digits: 2 },
    );
    single(`${word}: the same ceiling with a TCP splice as the extra hop`, "×", spliceCeiling, {
      digits: 2,
    });
    ceilings.push(
      `${word} ${ceiling.toFixed(2)} (the gateway's share ${
        (via[1] / sum(via) * 100).toFixed(0)
      }% of the two-hop CPU, ${busy.toFixed(2)} cores busy; with a TCP splice as the extra hop ${
        spliceCeiling.toFixed(2)
      }, the splice ${spliced[3].toFixed(2)} ms/MiB against the gateway's ${via[1].toFixed(2)})`,
    );
  }
  const echoRef = wsFailed.has("node") ? rtt.listener : rtt.node;
  const echoRows: [Key, string][] = [
    ["node", "WebSocket echo p50, through the node's door"],
    ["gateway", "WebSocket echo p50, through the gateway and the node's door"],
    ["listener", "WebSocket echo p50, straight to the listener"],
    ["splice", "WebSocket echo p50, through a Deno TCP splice and the node's door"],
  ];
  for (const [k, label] of echoRows) {
    if (!wsFailed.has(k)) rows.push(row(label, "ms", rtt[k], echoRef));
  }
  const wsNote = wsFailed.size === 0
    ? `WebSocket echo ${ratio(rtt.gateway, rtt.node).toFixed(2)}× the node door's round trip.`
    : `WebSocket echo failed through: ${
      [...wsFailed].map(([k, m]) => `${k} ('${m}')`).join(", ")
    }; the echo rows that remain divide by ${
      wsFailed.has("node") ? "the listener's" : "the node door's"
    } round trip.`;
  return {
    title: "Sandbox ports: bulk transfer and WebSocket echo through both hops",
    reference: "the same port through the node's port door alone (one hop), same run",
    rows,
    notes: [
      `${mib} MiB per transfer, streamed in 256 KiB blocks both ways; ${trips} sequential ` +
      "WebSocket echoes of 32 bytes per measurement (20 more first, not counted), p50 within " +
      "the run. Gateway (gateway/main.ts) and node (bench/children/port_node.ts: the node app on the fake " +
      "executor, serveGuarded as node/main.ts) are processes of their own, both with WebSockets " +
      "on (DORMICE_GATEWAY_WEBSOCKETS / DORMICE_WEBSOCKETS): the gateway on its bytes engine, " +
      "which splices an upgrade to the node, the node on Deno.serveHttp; the port's listener " +
      "is a Deno.serve in the node's process, as the fake executor serves ports. The gateway " +
      "route is /e2b/envd with E2b-Sandbox-Id and E2b-Sandbox-Port (what E2B_SANDBOX_URL users " +
      "send); by Host it is the same forward. Each run alternates the order of the routes.",
      `Ratios (medians of per-run ratios): download ${
        ratio(down.gateway, down.node).toFixed(2)
      }, upload ${ratio(up.gateway, up.node).toFixed(2)} of the node's door. Both hops ` +
      "share this machine's 2 cores with the client and the listener, so a bulk transfer's " +
      "extra hop costs CPU the one-hop path does not pay.",
      "CPU per MiB is user + system time from /proc/<pid>/stat over all measured transfers of " +
      "a route (10 ms ticks), for the client (this process), the gateway and the node's process " +
      "(its door and the listener). When the transfer keeps every core busy, throughput goes " +
      "as 1 ÷ CPU per MiB, so the reference path's CPU per MiB ÷ the two-hop path's is the " +
      `highest two-hop ratio this machine allows: ${ceilings.join("; ")}.`,
      wsNote,
    ],
  };
}
