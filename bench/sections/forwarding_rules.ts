/**
 * The forwarding rules, checked against every client of bench/proxies/clients.ts: a faster
 * client is only worth adopting if it keeps them all.
 * - the lookup's 2 s bound holds during connect to a node that drops SYNs (iptables on a
 *   loopback port; the rule's packet counter proves the SYN was dropped, and it is removed in a
 *   finally);
 * - a client's hang-up reaches the node: before the head (the signal) and mid-body (a cancel);
 * - the head is passed on before the first body byte;
 * - bodies stream without buffering both ways: chunks in lockstep (the next is only produced
 *   once the other side has the last), and a reader that stops holds the node back.
 * The node is a `Deno.serve` in this process, so each side can wait for the other.
 *
 * Usage: part of `deno task bench` (section `forwarding-rules`), or
 * `deno run -A bench/run.ts --only=forwarding-rules`.
 *
 * @module
 */
import { freePort } from "../lib/fixtures.ts";
import { droppedSyns, dropSyns, synDropUnavailable } from "../../tests/support/syn_drop.ts";
import { type Row, row, type Section } from "../lib/stats.ts";
import { clientLabels, type ClientName, clientNames, makeClient } from "../proxies/clients.ts";

/** Options of {@linkcode runForwardingRules}. */
export interface ForwardingRulesOptions {
  /** Runs per client (each rule once per run). */
  runs: number;
  /** The bound to hold during connect. Default 2000 ms (the lookup's). */
  boundMs?: number;
}

const STEPS = 8;
const FLOOD_WAIT_MS = 500;

/** Resolves after `ms`, or with `fallback` when `p` takes longer. */
function within<T>(p: Promise<T>, ms: number, fallback: T): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((r) => timer = setTimeout(() => r(fallback), ms)),
  ]);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A one-shot signal between the node's side and the client's side of one check. */
class Gate {
  #resolve!: () => void;
  readonly opened = new Promise<void>((r) => this.#resolve = r);
  at = NaN;
  open(): void {
    this.at = performance.now();
    this.#resolve();
  }
}

interface NodeState {
  hangUp: Gate;
  /** One gate per chunk: opened by the side that received it. */
  acks: Gate[];
  flooded: number;
  received: number;
}

function fresh(): NodeState {
  return {
    hangUp: new Gate(),
    acks: Array.from({ length: STEPS }, () => new Gate()),
    flooded: 0,
    received: 0,
  };
}

function startNode(state: () => NodeState): Deno.HttpServer<Deno.NetAddr> {
  const chunk = new Uint8Array(64 * 1024);
  return Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, async (req) => {
    const s = state();
    const path = new URL(req.url).pathname;
    if (path === "/hold") {
      // Never answers: only the client's hang-up ends it.
      await new Promise<void>((r) => req.signal.addEventListener("abort", () => r()));
      s.hangUp.open();
      return new Response(null, { status: 499 });
    }
    if (path === "/stream-hold") {
      let sent = false;
      return new Response(
        new ReadableStream<Uint8Array>({
          async pull(c) {
            if (!sent) {
              sent = true;
              c.enqueue(new Uint8Array([1]));
            } else await s.hangUp.opened;
          },
          cancel: () => s.hangUp.open(),
        }, { highWaterMark: 0 }),
      );
    }
    if (path === "/late-body") {
      return new Response(
        new ReadableStream<Uint8Array>({
          async start(c) {
            await sleep(300);
            c.enqueue(new Uint8Array([1]));
            c.close();
          },
        }),
      );
    }
    if (path === "/lockstep") {
      let i = 0;
      return new Response(
        new ReadableStream<Uint8Array>({
          async pull(c) {
            if (i > 0 && !(await within(s.acks[i - 1].opened.then(() => true), 2000, false))) {
              c.close(); // the client never got the last chunk: it holds bytes back
              return;
            }
            if (i === STEPS) return c.close();
            c.enqueue(new Uint8Array([i++]));
          },
        }, { highWaterMark: 0 }),
      );
    }
    if (path === "/upload-lockstep") {
      for await (const part of req.body!) {
        for (let k = 0; k < part.length && s.received < STEPS; k++) s.acks[s.received++].open();
      }
      return new Response(String(s.received));
    }
    if (path === "/flood") {
      return new Response(
        new ReadableStream<Uint8Array>({
          pull(c) {
            s.flooded += chunk.length;
            c.enqueue(chunk.slice());
          },
        }, { highWaterMark: 0 }),
      );
    }
    return new Response("not found", { status: 404 });
  });
}

interface Measured {
  syn: number[];
  syns: number[];
  hangUpHead: number[];
  hangUpBody: number[];
  head: number[];
  down: number[];
  up: number[];
  flood: number[];
}

async function checkClient(
  name: ClientName,
  base: string,
  setState: (s: NodeState) => void,
  blackhole: number | undefined,
  boundMs: number,
  into: Measured,
): Promise<void> {
  const client = makeClient(name);
  try {
    if (blackhole !== undefined) {
      const before = await droppedSyns(blackhole);
      const t0 = performance.now();
      await client.fetch(`http://127.0.0.1:${blackhole}/`, {
        method: "POST",
        body: "{}",
        signal: AbortSignal.timeout(boundMs),
      }).then((r) => r.body?.cancel(), () => {});
      into.syn.push(performance.now() - t0);
      into.syns.push((await droppedSyns(blackhole)) - before);
    }

    let s = fresh();
    setState(s);
    const ac = new AbortController();
    const held = client.fetch(`${base}/hold`, { method: "POST", body: "{}", signal: ac.signal })
      .then((r) => r.body?.cancel(), () => {});
    await sleep(100); // the request is at the node
    const abortedAt = performance.now();
    ac.abort();
    await within(s.hangUp.opened, 2000, undefined);
    into.hangUpHead.push(s.hangUp.at - abortedAt);
    await held;

    s = fresh();
    setState(s);
    const streaming = await client.fetch(`${base}/stream-hold`);
    const reader = streaming.body!.getReader();
    await reader.read();
    const cancelledAt = performance.now();
    await reader.cancel();
    await within(s.hangUp.opened, 2000, undefined);
    into.hangUpBody.push(s.hangUp.at - cancelledAt);

    s = fresh();
    setState(s);
    const t1 = performance.now();
    const late = await client.fetch(`${base}/late-body`);
    into.head.push(performance.now() - t1);
    await late.body?.cancel();

    s = fresh();
    setState(s);
    const lock = await client.fetch(`${base}/lockstep`);
    let got = 0;
    for await (const part of lock.body!) {
      for (let k = 0; k < part.length; k++) s.acks[got++]?.open();
    }
    into.down.push(got);

    s = fresh();
    setState(s);
    let i = 0;
    const upload = new ReadableStream<Uint8Array>({
      async pull(c) {
        if (i > 0 && !(await within(s.acks[i - 1].opened.then(() => true), 2000, false))) {
          c.close(); // the node never got the last chunk: the client holds bytes back
          return;
        }
        if (i === STEPS) return c.close();
        c.enqueue(new Uint8Array([i++]));
      },
    }, { highWaterMark: 0 });
    const up = await client.fetch(`${base}/upload-lockstep`, { method: "POST", body: upload });
    await up.text();
    into.up.push(s.received);

    s = fresh();
    setState(s);
    const flood = await client.fetch(`${base}/flood`);
    await sleep(FLOOD_WAIT_MS);
    into.flood.push(s.flooded / 2 ** 20);
    await flood.body?.cancel();
  } finally {
    client.close();
  }
}

/** Runs every rule against every client. */
export async function runForwardingRules(options: ForwardingRulesOptions): Promise<Section> {
  const runs = Math.min(options.runs, 3);
  const boundMs = options.boundMs ?? 2000;
  const title = "Forwarding rules per client (the node in process)";
  const synWhy = await synDropUnavailable();
  let state = fresh();
  const node = startNode(() => state);
  const base = `http://127.0.0.1:${node.addr.port}`;
  const blackhole = synWhy === undefined ? freePort() : undefined;
  let undrop: (() => Promise<void>) | undefined;
  const measured = Object.fromEntries(
    clientNames.map((n) => [n, {
      syn: [],
      syns: [],
      hangUpHead: [],
      hangUpBody: [],
      head: [],
      down: [],
      up: [],
      flood: [],
    }]),
  ) as unknown as Record<ClientName, Measured>;
  try {
    if (blackhole !== undefined) undrop = await dropSyns(blackhole);
    for (let r = 0; r < runs; r++) {
      for (const name of clientNames) {
        await checkClient(name, base, (s) => state = s, blackhole, boundMs, measured[name]);
      }
    }
  } finally {
    await undrop?.();
    await node.shutdown();
  }
  const rows: Row[] = [];
  const kept: string[] = [];
  for (const name of clientNames) {
    const m = measured[name];
    const label = clientLabels[name];
    const checks: [string, string, number[], string, (v: number) => boolean][] = [
      [
        "hang-up before the head reaches the node after",
        "ms",
        m.hangUpHead,
        "≤ 100 ms",
        (v) => v <= 100,
      ],
      ["hang-up mid-body reaches the node after", "ms", m.hangUpBody, "≤ 100 ms", (v) => v <= 100],
      ["head passed on (first body byte at 300 ms)", "ms", m.head, "< 150 ms", (v) => v < 150],
      [
        `answer chunks passed in lockstep (of ${STEPS})`,
        "chunks",
        m.down,
        `${STEPS}`,
        (v) => v === STEPS,
      ],
      [
        `upload chunks passed in lockstep (of ${STEPS})`,
        "chunks",
        m.up,
        `${STEPS}`,
        (v) => v === STEPS,
      ],
      [
        `sent by the node while the reader waited ${FLOOD_WAIT_MS} ms`,
        "MiB",
        m.flood,
        "≤ 16 MiB",
        (v) => v <= 16,
      ],
    ];
    if (blackhole !== undefined) {
      checks.unshift(
        [
          `connect to a SYN-dropping node ends at`,
          "ms",
          m.syn,
          `${boundMs} ms ± 5%`,
          (v) => Math.abs(v - boundMs) <= boundMs * 0.05,
        ],
        ["SYNs the iptables rule dropped meanwhile", "packets", m.syns, "≥ 1", (v) => v >= 1],
      );
    }
    let all = true;
    for (const [what, unit, values, target, ok] of checks) {
      const met = values.length === runs && values.every((v) => Number.isFinite(v) && ok(v));
      all &&= met;
      rows.push(row(`${label}: ${what}`, unit, values, null, { target, met }));
    }
    if (all) kept.push(name);
  }
  return {
    title,
    reference: "none (each rule has its own bound); met means every run",
    rows,
    notes: [
      `${runs} runs per client, each rule once per run. The node is a Deno.serve in the bench ` +
      "process: /hold never answers (its request's signal marks the hang-up), /stream-hold " +
      "sends one byte then waits (its stream's cancel marks the hang-up), /late-body sends its " +
      "head at once and its first byte 300 ms later, /lockstep and /upload-lockstep produce " +
      "each next chunk only once the other side holds the last (a client that buffers stalls " +
      "them, and the count stops short), /flood pushes 64 KiB chunks as fast as the socket " +
      "takes them while nothing reads.",
      blackhole === undefined
        ? `SYN-drop rows skipped: ${synWhy}.`
        : "SYN drop: iptables -I INPUT -p tcp --dport P --syn -j DROP on a loopback port nothing " +
          "listens on, removed in a finally; the dropped-SYN row is the rule's packet counter " +
          "over the attempt, so a connect that was refused rather than dropped shows 0. Each " +
          `client gets AbortSignal.timeout(${boundMs}) as the gateway's lookup does.`,
      `Clients that kept every rule in every run: ${kept.join(", ") || "none"}.`,
    ],
  };
}
