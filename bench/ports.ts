/**
 * Issue 13's port benchmark: a sandbox port reached through both hops (gateway → the node's
 * port door → the listener standing in for the sandbox's server, bench/_port_node.ts on the fake
 * executor) against the same port through the node's door alone, in one run. Bulk transfer both
 * ways (64 MiB streamed) and WebSocket echo round trips; the listener reached straight is shown
 * too, so the door's own share is visible.
 *
 * @module
 */
import { startChild, startGateway } from "./_fixtures.ts";
import { waitForNode } from "./forwarding.ts";
import { median, type Row, row, type Section } from "./_stats.ts";

/** Options of {@linkcode runPorts}. */
export interface PortsOptions {
  /** Runs (five or more). */
  runs: number;
  /** MiB per bulk transfer. Default 64. */
  mib?: number;
  /** WebSocket round trips per measurement. Default 300. */
  trips?: number;
}

interface Route {
  url: string;
  headers: Record<string, string>;
}

async function download(route: Route, mib: number): Promise<number> {
  const t0 = performance.now();
  const res = await fetch(`${route.url}/bulk?mib=${mib}`, { headers: route.headers });
  if (res.status !== 200) throw new Error(`bulk answered ${res.status}: ${await res.text()}`);
  let n = 0;
  for await (const part of res.body!) n += part.length;
  const s = (performance.now() - t0) / 1000;
  if (n !== mib * 2 ** 20) throw new Error(`bulk sent ${n} bytes, not ${mib} MiB`);
  return mib / s;
}

async function upload(route: Route, mib: number): Promise<number> {
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

/** Runs the port benchmark. */
export async function runPorts(options: PortsOptions): Promise<Section> {
  const { runs, mib = 64, trips = 300 } = options;
  // WebSockets on both hops, as an operator serving sandbox ports with them runs the fleet.
  const gw = await startGateway([], { DORMICE_GATEWAY_WEBSOCKETS: "on" });
  const stops: (() => Promise<void>)[] = [() => gw.stop()];
  const keys = ["listener", "node", "gateway"] as const;
  type Key = typeof keys[number];
  const down: Record<Key, number[]> = { listener: [], node: [], gateway: [] };
  const up: Record<Key, number[]> = { listener: [], node: [], gateway: [] };
  const rtt: Record<Key, number[]> = { listener: [], node: [], gateway: [] };
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
    const child = await startChild<{ port: number; sandboxId: string; listener: number }>([
      "run",
      "--frozen",
      "--allow-net=127.0.0.1",
      "--allow-env",
      "--allow-read",
      new URL("./_port_node.ts", import.meta.url).pathname,
      gw.url,
    ]);
    stops.unshift(() => child.stop());
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
    };
    for (const k of keys) {
      await download(routes[k], 4); // warm-up: pools, JIT
      await upload(routes[k], 4);
      await echo(k, routes[k], 20);
      rtt[k] = [];
    }
    for (let r = 0; r < runs; r++) {
      // Alternating the order spreads the machine's drift over both hops.
      const order = r % 2 === 0 ? keys : [...keys].reverse();
      for (const k of order) down[k].push(await download(routes[k], mib));
      for (const k of order) up[k].push(await upload(routes[k], mib));
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
  ];
  const echoRef = wsFailed.has("node") ? rtt.listener : rtt.node;
  const echoRows: [Key, string][] = [
    ["node", "WebSocket echo p50, through the node's door"],
    ["gateway", "WebSocket echo p50, through the gateway and the node's door"],
    ["listener", "WebSocket echo p50, straight to the listener"],
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
      "the run. Gateway (gateway/main.ts) and node (bench/_port_node.ts: the node app on the fake " +
      "executor, serveGuarded as node/main.ts) are processes of their own, both with WebSockets " +
      "on (DORMICE_GATEWAY_WEBSOCKETS / DORMICE_WEBSOCKETS: the Deno.serveHttp engine); the port's listener " +
      "is a Deno.serve in the node's process, as the fake executor serves ports. The gateway " +
      "route is /e2b/envd with E2b-Sandbox-Id and E2b-Sandbox-Port (what E2B_SANDBOX_URL users " +
      "send); by Host it is the same forward. Each run alternates the order of the routes.",
      `Ratios (medians of per-run ratios): download ${
        ratio(down.gateway, down.node).toFixed(2)
      }, upload ${ratio(up.gateway, up.node).toFixed(2)} of the node's door. Both hops ` +
      "share this machine's 2 cores with the client and the listener, so a bulk transfer's " +
      "extra hop costs CPU the one-hop path does not pay.",
      wsNote,
    ],
  };
}
