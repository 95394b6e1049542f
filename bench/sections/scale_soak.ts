/**
 * The gateway's memory under a large fleet over time: one gateway in front of 10,000
 * simulated nodes (`children/scale_nodes.ts`) checking in every 15 s, with one lookup miss and one
 * listSandboxes every 10 s, its RSS read every 10 s for 5 minutes, and beside it its own heap
 * (`Deno.memoryUsage()` through the inspector, before and after a full collection) and its
 * ArrayBuffers. The slope of the fitted line says whether memory keeps growing; the slope of the
 * second half, whether it settled; the heap after a collection, whether anything is kept.
 *
 * @module
 */
import { benchToken, type Child, freePort, startChild, startGateway } from "../lib/fixtures.ts";
import { fitLine, type Row, row, type Section } from "../lib/stats.ts";
import { Inspector } from "../lib/inspector.ts";

/** Options of the soak. */
export interface ScaleSoakOptions {
  /** Simulated nodes (10,000 by default). */
  nodes?: number;
  /** How long, ms (5 minutes by default). */
  durationMs?: number;
  /** Small and short: a smoke run, not a measurement. */
  quick?: boolean;
}

const NODES_PER_PROCESS = 5_000;

async function rssMb(pid: number): Promise<number> {
  const out = await new Deno.Command("cat", { args: [`/proc/${pid}/status`], stdout: "piped" })
    .output();
  const m = /VmRSS:\s+(\d+) kB/.exec(new TextDecoder().decode(out.stdout));
  if (!m) throw new Error(`no VmRSS in /proc/${pid}/status`);
  return Number(m[1]) / 1024;
}

async function call(url: string, verb: string, body: unknown): Promise<void> {
  const res = await fetch(`${url}/${verb}`, {
    method: "POST",
    headers: { authorization: `Bearer ${benchToken}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  await res.body?.cancel();
}

/** Runs the soak. */
export async function runScaleSoak(options: ScaleSoakOptions = {}): Promise<Section> {
  const quick = options.quick ?? false;
  const n = options.nodes ?? (quick ? 100 : 10_000);
  const durationMs = options.durationMs ?? (quick ? 20_000 : 300_000);
  // The inspector reads the gateway's own heap beside its RSS. Digests off: every miss asks
  // every node, so every node's connection is in use every 10 s (the most the pools hold).
  const inspectPort = freePort();
  const gw = await startGateway(
    [`--inspect=127.0.0.1:${inspectPort}`],
    { DORMICE_GATEWAY_LOOKUP_DIGESTS: "off" },
    "--allow-net",
  );
  const children: Child<{ failed: number; lastFailure: string }>[] = [];
  const at: number[] = [], rss: number[] = [];
  const heap: number[] = [], heapAfterGc: number[] = [], external: number[] = [];
  let inspector: Inspector | undefined;
  try {
    for (let first = 0; first < n; first += NODES_PER_PROCESS) {
      children.push(
        await startChild(
          [
            "run",
            "--frozen",
            "--allow-net",
            new URL("../children/scale_nodes.ts", import.meta.url).pathname,
            String(Math.min(NODES_PER_PROCESS, n - first)),
            gw.url,
            String(freePort()),
            "15",
            String(first),
          ],
          {},
          300_000,
        ),
      );
    }
    inspector = await Inspector.connect(inspectPort);
    const mb = (bytes: number) => bytes / 1024 / 1024;
    const t0 = performance.now();
    for (let k = 0;; k++) {
      const t = performance.now() - t0;
      at.push(t / 60_000);
      rss.push(await rssMb(gw.pid));
      const now = await inspector.memory(false);
      heap.push(mb(now.heapUsed));
      external.push(mb(now.external));
      heapAfterGc.push(mb((await inspector.memory(true)).heapUsed));
      if (t >= durationMs) break;
      await call(gw.url, "lookupSandbox", { name: `soak-miss-${k}` });
      await call(gw.url, "listSandboxes", {});
      await new Promise((r) =>
        setTimeout(r, Math.max(0, (k + 1) * 10_000 - (performance.now() - t0)))
      );
    }
  } finally {
    inspector?.close();
    for (const c of children) await c.stop();
    await gw.stop();
  }
  const half = Math.floor(at.length / 2);
  const all = fitLine(at, rss).b;
  const late = fitLine(at.slice(half), rss.slice(half)).b;
  const start = [rss[0]];
  const rows: Row[] = [
    row("gateway RSS once every node joined (reference)", "MB", start, start),
    row("gateway RSS at the end", "MB", [rss[rss.length - 1]], start),
    row("gateway RSS, highest sample", "MB", [Math.max(...rss)], start),
    row("RSS slope, fitted over the whole soak", "MB/min", [all], null),
    row("RSS slope, fitted over the second half", "MB/min", [late], null),
    row("gateway heap used after a full GC, first sample", "MB", [heapAfterGc[0]], null),
    row("gateway heap used after a full GC, last sample", "MB", [heapAfterGc.at(-1)!], [
      heapAfterGc[0],
    ]),
    row(
      "heap after GC slope, fitted over the second half",
      "MB/min",
      [fitLine(at.slice(half), heapAfterGc.slice(half)).b],
      null,
    ),
    row("gateway external (ArrayBuffers), highest sample", "MB", [Math.max(...external)], null),
  ];
  const samples = at.map((t, i) =>
    `${t.toFixed(1)} min: ${rss[i].toFixed(0)} / ${heap[i].toFixed(0)} / ` +
    `${heapAfterGc[i].toFixed(0)} / ${external[i].toFixed(0)}`
  );
  return {
    title: quick
      ? "Scale soak (quick smoke run, not a measurement)"
      : "Scale soak: gateway RSS at 10,000 nodes",
    reference: "the gateway's RSS once every node joined, same run",
    rows,
    notes: [
      `${
        n.toLocaleString("en-US")
      } simulated nodes checking in every 15 s (bench/children/scale_nodes.ts), ` +
      `one lookup miss and one listSandboxes every 10 s, RSS (/proc/<pid>/status VmRSS) every ` +
      `10 s for ${Math.round(durationMs / 1000)} s: ${rss.map((x) => x.toFixed(0)).join(", ")} MB.`,
      "Every 10 s, in MB: RSS / heap used / heap used after a full GC (forced through the " +
      "inspector, --inspect) / external (ArrayBuffers, the connections' read buffers among " +
      `them): ${samples.join("; ")}.`,
      "DORMICE_GATEWAY_LOOKUP_DIGESTS=off, so each miss asks every node: every 10 s a miss " +
      "and a list open or reuse a connection to each of the 10,000 nodes, and the client " +
      "closes them 4 s idle, so the connections open rise and fall with each turn.",
      "One run: the figure is the shape over time, and the slope's sign is what matters.",
    ],
  };
}
