/**
 * Simulated nodes for the scale benchmark: `count` nodes in one process, node i listening on its
 * own loopback address 127.1.x.y (Linux routes all of 127/8 to lo) at one port, answering the
 * verbs the gateway calls (`lookupSandbox`: never found; `listSandboxes`: one sandbox each), and
 * checking in to the gateway like a real node: every `interval` seconds, with a reading, a
 * config digest and an empty lookup digest, the nodes' check-ins spread evenly over the interval.
 *
 * Prints `{"ready":true,...}` once every node has joined. A control listener on 127.0.0.1
 * answers `GET /stats` (check-ins sent and failed, the pacing's lag, lookups and lists answered,
 * connections seen: a client address and port not seen before by that node) and `POST /burst?ms=&concurrency=` (check-ins as fast as the gateway takes
 * them, for the sustained rate), `POST /pace?on=0|1` and `POST /delay?ms=` (each lookupSandbox
 * answered that much later, as a node across a slower network would).
 *
 * Usage: deno run --allow-net bench/children/scale_nodes.ts <count> <gatewayUrl> <controlPort> [interval]
 * [first]: nodes first … first + count - 1 (a process holds a listener and a socket per node, so
 * the harness splits a fleet larger than the descriptor limit allows over several processes).
 *
 * @module
 */
import { benchToken, checkIn } from "../lib/fixtures.ts";
import { LookupDigest, NODE_DIGEST_FALSE_POSITIVE_RATE } from "../../shared/lookup_digest.ts";

const count = Number(Deno.args[0] ?? "200");
const gateway = Deno.args[1];
const controlPort = Number(Deno.args[2]);
const intervalSeconds = Number(Deno.args[3] ?? "15");
const first = Number(Deno.args[4] ?? "0");
/** The port every simulated node listens on, each at its own address. */
export const NODE_PORT = 21500;

/** Node i's loopback address: 127.1.x.y with y from 1 to 250. */
export function nodeHost(i: number): string {
  return `127.1.${Math.floor(i / 250)}.${(i % 250) + 1}`;
}

const servers: Deno.HttpServer[] = [];
let lookups = 0, lists = 0, connections = 0, lookupDelayMs = 0;
const seenRemotes = new Set<string>();
for (let i = first; i < first + count; i++) {
  const host = nodeHost(i);
  servers.push(Deno.serve({ hostname: host, port: NODE_PORT, onListen() {} }, async (req, info) => {
    const remote = `${info.remoteAddr.hostname}:${info.remoteAddr.port}>${i}`;
    if (!seenRemotes.has(remote)) {
      seenRemotes.add(remote);
      connections++;
    }
    const path = new URL(req.url).pathname;
    await req.body?.cancel();
    if (path === "/lookupSandbox") {
      if (lookupDelayMs > 0) await new Promise((r) => setTimeout(r, lookupDelayMs));
      lookups++;
      return Response.json({ found: false });
    }
    if (path === "/listSandboxes") {
      lists++;
      const now = new Date(0).toISOString();
      return Response.json({
        sandboxes: [{
          id: `sbx-${i}`,
          name: `held-${i}`,
          state: "active",
          nodeId: nodeId(i),
          endpoint: `http://${host}:${NODE_PORT}`,
          template: "base",
          metadata: {},
          createdAt: now,
          lastActiveAt: now,
        }],
      });
    }
    if (path === "/healthz") return Response.json({ ok: true, nodeId: nodeId(i) });
    return Response.json({ message: `No route ${path} on this simulated node` }, { status: 404 });
  }));
}

function nodeId(i: number): string {
  return `node-${String(i).padStart(5, "0")}`;
}

const emptyDigest = LookupDigest.sized(0, NODE_DIGEST_FALSE_POSITIVE_RATE).toWire();
const bodies = Array.from({ length: count }, (_, j) => first + j).map((i) =>
  JSON.stringify({
    ...checkIn(i, `http://${nodeHost(i)}:${NODE_PORT}`),
    intervalSeconds,
    configDigest: "c".repeat(64),
    lookupDigest: emptyDigest,
  })
);
const headers = { authorization: `Bearer ${benchToken}`, "content-type": "application/json" };
let sent = 0, failed = 0, inFlight = 0, lastFailure = "";

/** Sends the check-in of this process's `j`-th node. */
async function send(j: number): Promise<void> {
  sent++;
  inFlight++;
  try {
    const res = await fetch(`${gateway}/checkIn`, { method: "POST", headers, body: bodies[j] });
    const text = await res.text();
    if (!res.ok) {
      failed++;
      lastFailure = `${res.status} ${text.slice(0, 200)}`;
    }
  } catch (error) {
    failed++;
    lastFailure = String(error).slice(0, 200);
  } finally {
    inFlight--;
  }
}

/** Sends `total` check-ins with `concurrency` in flight, node after node, for `ms` at most. */
async function pump(concurrency: number, ms: number, total = Infinity): Promise<number> {
  const t0 = performance.now();
  let next = 0;
  const worker = async () => {
    while (next < total && performance.now() - t0 < ms) await send(next++ % count);
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return performance.now() - t0;
}

const joinMs = await pump(32, 600_000, count);

// Paced check-ins: node i is due at start + i * interval / count, then every interval.
let pacing = true, lagMaxMs = 0, paceNext = 0, skipped = 0;
const spacing = intervalSeconds * 1000 / count;
let paceStart = performance.now();
const pacer = setInterval(() => {
  if (!pacing) return;
  const now = performance.now();
  while (paceStart + paceNext * spacing <= now) {
    const lag = now - (paceStart + paceNext * spacing);
    if (lag > lagMaxMs) lagMaxMs = lag;
    // A gateway that cannot keep up: the check-in is late, not piled up without bound.
    if (inFlight >= 512) skipped++;
    else void send(paceNext % count);
    paceNext++;
  }
}, 5);

Deno.serve({ hostname: "127.0.0.1", port: controlPort, onListen() {} }, async (req) => {
  const url = new URL(req.url);
  if (url.pathname === "/stats") {
    return Response.json({
      sent,
      failed,
      lastFailure,
      inFlight,
      skipped,
      lagMaxMs,
      lookups,
      lists,
      connections,
      rssBytes: Deno.memoryUsage().rss,
    });
  }
  if (url.pathname === "/burst") {
    pacing = false;
    const before = sent, failedBefore = failed;
    const ms = await pump(
      Number(url.searchParams.get("concurrency") ?? "32"),
      Number(url.searchParams.get("ms") ?? "3000"),
    );
    return Response.json({ sent: sent - before, failed: failed - failedBefore, ms });
  }
  if (url.pathname === "/delay") {
    lookupDelayMs = Math.max(0, Number(url.searchParams.get("ms") ?? "0"));
    return Response.json({ lookupDelayMs });
  }
  if (url.pathname === "/pace") {
    pacing = url.searchParams.get("on") !== "0";
    if (pacing) {
      paceStart = performance.now();
      paceNext = 0;
      lagMaxMs = 0;
      skipped = 0;
    }
    return Response.json({ pacing });
  }
  return Response.json({ message: "unknown control" }, { status: 404 });
});

console.log(JSON.stringify({ ready: true, nodes: count, joinMs, failed, lastFailure }));
const stop = () => {
  clearInterval(pacer);
  Deno.exit(0);
};
Deno.addSignalListener("SIGTERM", stop);
Deno.addSignalListener("SIGINT", stop);
