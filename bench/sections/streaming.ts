/**
 * Benchmark 2, streaming: 64 MiB of stdout from envd `process.Process/Start` through the gateway
 * vs straight to the node (the fake executor's shell runs `cat` of a 1 MiB file 64 times with a
 * `sleep 0` between, so the output comes as one-MiB writes, each sent as Connect envelopes of
 * base64 JSON).
 *
 * Measured at the client: time to the first response byte (the head plus the start event), and
 * the stdout throughput until the end-stream envelope. Reference: the direct path in the same run.
 * Targets: throughput ratio ≥ 0.9, time to first byte added ≤ 1 ms.
 *
 * When the envd face is not served through the gateway yet, it falls back to a 64 MiB
 * `GET /e2b/envd/files` download and says so.
 *
 * @module
 */
import {
  benchToken,
  type Daemon,
  postJson,
  startChild,
  startGateway,
  startNode,
} from "../lib/fixtures.ts";
import { waitForNode } from "../lib/wrk.ts";
import { median, type Row, row, type Section } from "../lib/stats.ts";

const MiB = 1024 * 1024;

function envelope(json: unknown, flags = 0): Uint8Array<ArrayBuffer> {
  const body = new TextEncoder().encode(JSON.stringify(json));
  const out = new Uint8Array(5 + body.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, body.length);
  out.set(body, 5);
  return out;
}

interface Sample {
  /** Time to the first body byte, ms. */
  ttfb: number;
  /** Whole transfer, ms. */
  total: number;
  /** Bytes received. */
  bytes: number;
  /** The last bytes (to check the end of the stream). */
  tail: string;
  status: number;
}

async function timedRequest(url: string, init: RequestInit): Promise<Sample> {
  const t0 = performance.now();
  const res = await fetch(url, init);
  let ttfb = NaN;
  let bytes = 0;
  let last: Uint8Array = new Uint8Array();
  const reader = res.body!.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (bytes === 0) ttfb = performance.now() - t0;
    bytes += value.length;
    // Keep the last few hundred bytes across chunks: the end event and the end-stream envelope
    // may arrive in different chunks.
    const keep = new Uint8Array(Math.min(400, last.length + value.length));
    const fromValue = Math.min(value.length, keep.length);
    keep.set(last.subarray(last.length - (keep.length - fromValue)), 0);
    keep.set(value.subarray(value.length - fromValue), keep.length - fromValue);
    last = keep;
  }
  const total = performance.now() - t0;
  const tail = new TextDecoder().decode(last);
  return { ttfb, total, bytes, tail, status: res.status };
}

interface Paths {
  headers: Record<string, string>;
  /** `process` when the gateway routes Process/Start, `files` for envd files only, else why not. */
  mode: "process" | "files" | { missing: string };
}

async function prepare(gw: Daemon, node: Daemon, name: string, copies: number): Promise<Paths> {
  const made = await postJson(`${gw.url}/acquireSandbox`, { name });
  if (made.status !== 200) throw new Error(`acquireSandbox answered ${made.status}`);
  const id: string = made.json.sandbox.id;
  const headers: Record<string, string> = {
    "E2b-Sandbox-Id": id,
    "X-API-KEY": benchToken,
    "Authorization": `Basic ${btoa("root:")}`,
  };
  // The envd access token, when the node issues them, comes from the control plane's connect.
  const connect = await fetch(`${node.url}/e2b/api/sandboxes/${id}/connect`, {
    method: "POST",
    headers: { "X-API-KEY": benchToken, "content-type": "application/json" },
    body: "{}",
  });
  const cj = await connect.json().catch(() => ({}));
  if (cj?.envdAccessToken) headers["X-Access-Token"] = cj.envdAccessToken;
  const blob = new Uint8Array(MiB);
  for (let i = 0; i < blob.length; i++) blob[i] = 32 + (i % 90);
  const big = copies === 1 ? blob : new Uint8Array(copies * MiB);
  if (copies > 1) { for (let i = 0; i < copies; i++) big.set(blob, i * MiB); }
  const uploads: [string, Uint8Array<ArrayBuffer>][] = [["/tmp/bench-1m.bin", blob], [
    "/tmp/bench-64m.bin",
    big,
  ]];
  for (const [path, data] of uploads) {
    const up = await fetch(`${node.url}/e2b/envd/files?path=${path}`, {
      method: "POST",
      headers: { ...headers, "content-type": "application/octet-stream" },
      body: data,
    });
    await up.body?.cancel();
    if (up.status !== 200) throw new Error(`Upload to envd answered ${up.status}`);
  }
  // Does the gateway route envd's Process/Start? A bad request still shows the route exists.
  const probe = await fetch(`${gw.url}/e2b/envd/process.Process/Start`, {
    method: "POST",
    headers: { ...headers, "content-type": "application/connect+json" },
    body: envelope({ process: { cmd: "/bin/bash", args: ["-l", "-c", "true"] } }),
  });
  const text = await probe.text();
  if (probe.status === 200 && text.includes("start")) return { headers, mode: "process" };
  const files = await fetch(`${gw.url}/e2b/envd/files?path=/tmp/bench-1m.bin`, { headers });
  await files.body?.cancel();
  if (files.status === 200) return { headers, mode: "files" };
  return {
    headers,
    mode: {
      missing: `the gateway does not route /e2b/envd yet (Process/Start answered ` +
        `${probe.status}, GET /e2b/envd/files ${files.status})`,
    },
  };
}

/** Options of the streaming benchmark. */
export interface StreamingOptions {
  /** Runs (at least five). */
  runs: number;
  /** MiB of stdout. */
  mib?: number;
}

/** Runs the streaming benchmark. */
export async function runStreaming(options: StreamingOptions): Promise<Section> {
  const { runs, mib = 64 } = options;
  const started: { stop(): Promise<void> }[] = [];
  const direct: Sample[] = [], gateway: Sample[] = [], naive: Sample[] = [];
  /** Median time to first byte of a small command, per run and path. */
  const small = new Map<Sample[], number[]>([[direct, []], [gateway, []], [naive, []]]);
  let mode: "process" | "files" = "process";
  let missing = "";
  try {
    const gw = await startGateway();
    started.push(gw);
    const node = await startNode("bench-stream-node", gw.url);
    started.push(node);
    await waitForNode(gw.url, "bench-stream-node");
    const proxy = await startChild<{ port: number }>([
      "run",
      "--allow-net=127.0.0.1",
      new URL("../proxies/naive_proxy.ts", import.meta.url).pathname,
      node.url,
    ]);
    started.push(proxy);
    const paths = await prepare(gw, node, "bench-stream", mib);
    if (typeof paths.mode === "object") missing = paths.mode.missing;
    else mode = paths.mode;
    const request = (origin: string): [string, RequestInit] =>
      mode === "process"
        ? [`${origin}/e2b/envd/process.Process/Start`, {
          method: "POST",
          headers: {
            ...paths.headers,
            "content-type": "application/connect+json",
            "connect-protocol-version": "1",
          },
          body: envelope({
            process: {
              cmd: "/bin/bash",
              // `sleep 0` between the chunks yields to the node's event loop: without it the fake
              // shell produces 64 MiB in one go and envd drops any client more than 16 MiB behind.
              args: ["-l", "-c", Array(mib).fill("cat /tmp/bench-1m.bin").join("; sleep 0; ")],
            },
            stdin: false,
          }),
        }]
        : [`${origin}/e2b/envd/files?path=/tmp/bench-64m.bin`, {
          method: "GET",
          headers: paths.headers,
        }];
    const origins: [Sample[], string][] = [
      [direct, node.url],
      [naive, `http://127.0.0.1:${proxy.ready.port}`],
      ...(missing ? [] : [[gateway, gw.url] as [Sample[], string]]),
    ];
    // Warm-up, and a check that every path answers the whole stream.
    for (const [, origin] of origins) {
      const s = await timedRequest(...request(origin));
      if (s.status !== 200) throw new Error(`${origin} answered ${s.status}: ${s.tail}`);
      if (mode === "process" && !s.tail.includes("exitCode")) {
        throw new Error(`The stream from ${origin} did not end with the end event: ${s.tail}`);
      }
      if (mode === "files" && s.bytes !== mib * MiB) throw new Error(`Got ${s.bytes} bytes`);
    }
    const echo = (origin: string): [string, RequestInit] => {
      const [url, init] = request(origin);
      return [url, {
        ...init,
        body: envelope({ process: { cmd: "/bin/bash", args: ["-l", "-c", "echo hi"] } }),
      }];
    };
    for (let r = 0; r < runs; r++) {
      for (const [samples, origin] of origins) {
        samples.push(await timedRequest(...request(origin)));
        if (mode === "process") {
          const t: number[] = [];
          for (let k = 0; k < 15; k++) t.push((await timedRequest(...echo(origin))).ttfb);
          small.get(samples)!.push(median(t));
        }
      }
    }
  } finally {
    for (const s of started.reverse()) await s.stop();
  }
  const complete = (s: Sample) => mode !== "process" || s.tail.includes("exitCode");
  const incomplete = [...direct, ...naive, ...gateway].filter((s) => !complete(s)).length;
  const rate = (s: Sample) => mib / (s.total / 1000);
  const dRate = direct.map(rate), gRate = gateway.map(rate), nRate = naive.map(rate);
  const dTtfb = direct.map((s) => s.ttfb), gTtfb = gateway.map((s) => s.ttfb);
  const nTtfb = naive.map((s) => s.ttfb);
  const what = mode === "process"
    ? `${mib} MiB of stdout from Process/Start`
    : `${mib} MiB file via GET /e2b/envd/files (the gateway does not route Process/Start yet)`;
  const rows: Row[] = [
    row("direct to the node (reference)", "MiB/s", dRate, dRate),
    row("through the naive Deno proxy (runtime floor)", "MiB/s", nRate, dRate),
  ];
  if (!missing) {
    const ratio = gRate.map((v, i) => v / dRate[i]);
    rows.push(row("through the gateway", "MiB/s", gRate, dRate, {
      target: "≥ 0.9× direct",
      met: median(ratio) >= 0.9 && incomplete === 0,
    }));
  }
  const sD = small.get(direct)!, sN = small.get(naive)!, sG = small.get(gateway)!;
  if (mode === "process") {
    rows.push(
      row("`echo hi`: time to first byte, direct (reference)", "ms", sD, sD),
      row(
        "`echo hi`: time to first byte added by the naive Deno proxy",
        "ms",
        sN.map((v, i) => v - sD[i]),
        sD,
      ),
    );
    if (!missing) {
      const added = sG.map((v, i) => v - sD[i]);
      rows.push(
        row("`echo hi`: time to first byte added by the gateway", "ms", added, sD, {
          target: "≤ 1 ms",
          met: median(added) <= 1,
        }),
      );
    }
  }
  rows.push(
    row(`${mib} MiB: time to first byte, direct (reference)`, "ms", dTtfb, dTtfb),
    row(
      `${mib} MiB: time to first byte added by the naive Deno proxy`,
      "ms",
      nTtfb.map((v, i) => v - dTtfb[i]),
      dTtfb,
    ),
  );
  if (!missing) {
    const added = gTtfb.map((v, i) => v - dTtfb[i]);
    rows.push(
      row(`${mib} MiB: time to first byte added by the gateway`, "ms", added, dTtfb, {
        ...(mode === "process" ? {} : { target: "≤ 1 ms", met: median(added) <= 1 }),
      }),
    );
  }
  return {
    title: "Streaming: " + what,
    reference: "the same request straight to the node, same run",
    rows,
    notes: [
      ...(missing ? [`Gateway rows missing: ${missing}.`] : []),
      `Bytes on the wire per request: ${
        (median(direct.map((s) => s.bytes)) / MiB).toFixed(1)
      } MiB` +
      (mode === "process"
        ? " (base64 in Connect JSON envelopes; the fake shell runs `cat` of a 1 MiB file " +
          `${mib} times with \`sleep 0\` between, since envd drops a client that falls 16 MiB ` +
          "behind and an unpaced fake `cat` outruns any client). "
        : ". ") +
      "Throughput is stdout MiB over the whole request; the first byte is the first body chunk " +
      "(the head and the start event). The first-byte target is judged on a small command " +
      "(`echo hi`, median of 15 per run): with the 64 MiB command the node starts pumping output " +
      "at once and the two cores are saturated, so its first-byte figure mixes in CPU contention; " +
      "both are shown.",
      `Streams that did not end with the end event (e.g. envd's resource_exhausted for a slow ` +
      `client): ${incomplete}.`,
    ],
  };
}
