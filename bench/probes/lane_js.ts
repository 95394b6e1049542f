/**
 * What a routed verb costs the gateway's JavaScript, without a socket: the bytes engine and its
 * lane (`gateway/faces/bytes_lane.ts`) serve wrk's request to connections that are objects in this
 * process, and the HTTP/1.1 client reaches a node that is one too (`Deno.connect` is replaced),
 * so no op, no syscall and no other process is timed. The same run times the bytes-framed floor
 * (`bench/proxies/raw_http_proxy.ts`'s relay loop) over the same stand-ins: the ratio is how much more
 * of a request's JavaScript the gateway runs than a proxy that only frames bytes.
 *
 * The wire benchmark (`bench/sections/forwarding.ts`) is what the targets are read from; on these noisy
 * machines its CPU figures move by a few microseconds a request between runs, which hides most
 * single changes. This one moves by a few percent, so a change to the lane is priced here first.
 * Not a section of RESULTS.md: a tool for before/after figures.
 *
 * `deno run --allow-env --allow-read bench/probes/lane_js.ts [--requests=20000] [--connections=32]
 * [--runs=7] [--only=lane|floor] [--promises]`
 *
 * @module
 */
import { buildGateway } from "../../gateway/app.ts";
import { createH1Client, serveH1 } from "../../shared/http1/mod.ts";
import { checkIn } from "../lib/fixtures.ts";
import { relayFloor, type Wire } from "../proxies/raw_http_proxy.ts";
import { median } from "../lib/stats.ts";

const flag = (name: string, fallback: number) =>
  Number(Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback);
const connections = flag("connections", 32);
const requests = Math.ceil(flag("requests", 20000) / connections) * connections;
const runs = flag("runs", 7);
// `--only=lane` times the lane alone (for `--cpu-prof`: every sample is then the lane's), and
// `--only=floor` the floor alone; each after one run of its own as a warm-up.
const only = Deno.args.find((a) => a.startsWith("--only="))?.slice(7);

const encoder = new TextEncoder();
const TOKEN = "b".repeat(40);
const NAME = "bench-fwd";
const body = JSON.stringify({ name: NAME });
/** wrk's request, as bench/lib/post.lua makes it. */
const REQUEST = encoder.encode(
  `POST /getSandboxMetrics HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: ${body.length}\r\n` +
    `Content-Type: application/json\r\nAuthorization: Bearer ${TOKEN}\r\n\r\n${body}`,
);
/** A node's answer as Deno's server writes it. */
function answer(json: string): Uint8Array {
  return encoder.encode(
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nvary: Accept-Encoding\r\n" +
      `content-length: ${encoder.encode(json).length}\r\n` +
      `date: Tue, 01 Dec 2026 23:00:00 GMT\r\n\r\n${json}`,
  );
}
const METRICS = answer(JSON.stringify({
  name: NAME,
  cpuUsedPct: 1.5,
  memUsedBytes: 12_582_912,
  memTotalBytes: 536_870_912,
  diskUsedBytes: 4096,
  diskTotalBytes: 1_073_741_824,
}));
const FOUND = answer(JSON.stringify({
  found: true,
  sandbox: { id: `id-${NAME}`, name: NAME, state: "active" },
}));

/** A read waiting for bytes. */
interface Waiting {
  p: Uint8Array;
  resolve: (n: number | null) => void;
}

/** A node's connection: each request written is answered at once, as one read. */
class NodeWire implements Wire {
  #ready: Uint8Array | undefined;
  #at = 0;
  #waiting: Waiting | undefined;
  #closed = false;
  write(p: Uint8Array): Promise<number> {
    // `POST /lookupSandbox` or any routed verb: the seventh byte tells them apart.
    this.#ready = p[6] === 108 ? FOUND : METRICS;
    this.#at = 0;
    const w = this.#waiting;
    if (w !== undefined) {
      this.#waiting = undefined;
      w.resolve(this.#copy(w.p));
    }
    return Promise.resolve(p.length);
  }
  read(p: Uint8Array): Promise<number | null> {
    if (this.#closed) return Promise.resolve(null);
    if (this.#ready !== undefined) return Promise.resolve(this.#copy(p));
    return new Promise((resolve) => this.#waiting = { p, resolve });
  }
  #copy(p: Uint8Array): number {
    const ready = this.#ready!;
    const n = Math.min(ready.length - this.#at, p.length);
    p.set(ready.subarray(this.#at, this.#at + n));
    this.#at += n;
    if (this.#at === ready.length) this.#ready = undefined;
    return n;
  }
  setNoDelay(): void {}
  close(): void {
    this.#closed = true;
    this.#waiting?.resolve(null);
  }
}

/** A client's connection: `left` requests, each sent once the answer before it was written. */
class ClientWire implements Wire {
  left: number;
  answers = 0;
  #send = true;
  #waiting: Waiting | undefined;
  readonly remoteAddr = { transport: "tcp", hostname: "127.0.0.1", port: 1 } as const;
  constructor(left: number) {
    this.left = left;
  }
  read(p: Uint8Array): Promise<number | null> {
    if (this.#send) {
      this.#send = false;
      p.set(REQUEST);
      return Promise.resolve(REQUEST.length);
    }
    if (this.left === 0) return Promise.resolve(null);
    return new Promise((resolve) => this.#waiting = { p, resolve });
  }
  /** Each write is one whole answer (both proxies write a small one so). */
  write(p: Uint8Array): Promise<number> {
    this.answers++;
    this.left--;
    const w = this.#waiting;
    this.#waiting = undefined;
    if (this.left > 0) {
      if (w !== undefined) {
        w.p.set(REQUEST);
        w.resolve(REQUEST.length);
      } else this.#send = true;
    } else w?.resolve(null);
    return Promise.resolve(p.length);
  }
  close(): void {
    this.#waiting?.resolve(null);
  }
}

// The node is reached through this process's stand-in.
(Deno as { connect: unknown }).connect = () => Promise.resolve(new NodeWire());

const client = createH1Client();
const gateway = buildGateway({ token: TOKEN, nodeClient: client });
const lane = gateway.lane!;
const auth = { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" };
const post = async (path: string, value: unknown) => {
  const res = await gateway.fetch(
    new Request(`http://gateway${path}`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify(value),
    }),
  );
  const text = await res.text();
  if (res.status !== 200) throw new Error(`${path} answered ${res.status}: ${text}`);
  return text;
};
// The longest interval a node may state: a run slowed down (`bench/probes/lane_ir.ts` runs this under
// valgrind, some 200 times slower) never sees the node fall silent and its requests handed back.
await post("/checkIn", {
  ...checkIn(1, "http://127.0.0.1:3676"),
  nodeId: "n1",
  intervalSeconds: 300,
});
const looked = JSON.parse(await post("/lookupSandbox", { name: NAME }));
if (looked.found !== true) throw new Error(`the sandbox was not found: ${JSON.stringify(looked)}`);

const stop = new AbortController().signal;
/** µs per request of the gateway serving `requests` over `connections`. */
async function gatewayRun(): Promise<number> {
  const before = lane.served;
  const wires = Array.from({ length: connections }, () => new ClientWire(requests / connections));
  const t0 = performance.now();
  await Promise.all(wires.map((w) =>
    serveH1(w as unknown as Deno.Conn, {
      handler: gateway.fetch,
      onError: (error) => {
        console.error(error);
        return new Response(null, { status: 500 });
      },
      scheme: "http",
      stop,
      begun() {},
      ended() {},
      lane,
    })
  ));
  const us = (performance.now() - t0) * 1000 / requests;
  const served = lane.served - before;
  if (served !== requests) throw new Error(`the lane served ${served} of ${requests} requests`);
  return us;
}
/** µs per request of the floor relaying the same. */
async function floorRun(): Promise<number> {
  const wires = Array.from({ length: connections }, () => new ClientWire(requests / connections));
  const t0 = performance.now();
  await Promise.all(wires.map((w) => relayFloor(w, new NodeWire())));
  const us = (performance.now() - t0) * 1000 / requests;
  const answered = wires.reduce((n, w) => n + w.answers, 0);
  if (answered !== requests) throw new Error(`the floor answered ${answered} of ${requests}`);
  return us;
}

if (only !== "floor") await gatewayRun();
if (Deno.args.includes("--promises")) {
  // Promises made a request, counted by the runtime's promise hook: a figure no noise moves.
  // deno-lint-ignore no-explicit-any
  const core = (Deno as any)[(Deno as any).internal].core;
  let made = 0;
  core.setPromiseHooks(() => made++, undefined, undefined, undefined);
  const count = async (run: () => Promise<number>) => {
    made = 0;
    await run();
    return made / requests;
  };
  const lanePromises = await count(gatewayRun), floorPromises = await count(floorRun);
  core.setPromiseHooks(undefined, undefined, undefined, undefined);
  console.log(
    `promises a request: lane ${lanePromises.toFixed(2)}, floor ${floorPromises.toFixed(2)}`,
  );
}
if (only === "lane") {
  const lanes: number[] = [];
  for (let i = 0; i < runs; i++) lanes.push(await gatewayRun());
  console.log(
    `lane ${median(lanes).toFixed(2)} µs/request (${runs * requests} requests after one run)`,
  );
  Deno.exit(0);
}
if (only === "floor") {
  const floors: number[] = [];
  for (let i = 0; i < runs + 1; i++) floors.push(await floorRun());
  console.log(
    `floor ${median(floors.slice(1)).toFixed(2)} µs/request (${runs * requests} requests ` +
      "after one run)",
  );
  Deno.exit(0);
}
await floorRun();
const floor: number[] = [], lanes: number[] = [], ratios: number[] = [];
for (let i = 0; i < runs; i++) {
  const f = await floorRun();
  const g = await gatewayRun();
  floor.push(f);
  lanes.push(g);
  ratios.push(g / f);
}
console.log(
  `lane ${median(lanes).toFixed(2)} µs/request, floor ${median(floor).toFixed(2)}, ` +
    `lane × floor ${median(ratios).toFixed(2)} (runs: ${
      ratios.map((r) => r.toFixed(2)).join(" ")
    })`,
);
client.close();
gateway.close();
