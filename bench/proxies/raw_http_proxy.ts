/**
 * The floor of an HTTP-aware proxy on Deno, for the forwarding benchmark: each request and each
 * answer is framed on its bytes (the head's end and its Content-Length found by scanning, no
 * string, no Headers, no Request or Response object), and passed on as the bytes that came,
 * over one upstream connection per client connection. A gateway must do at least this per
 * request (find where a message ends, to route the next one) on top of what the TCP splice
 * does; what it adds over this row is its own work. A measuring stick: Content-Length bodies
 * only, no chunked messages, no limits beyond a 64 KiB head. Prints `{"port":N}` once listening.
 *
 * With an argument `work=<µs>` it also spins that much CPU per request (counted in loop turns
 * calibrated at start, so it is work, not waiting): the same floor with a gateway's cost of
 * logic added, which shows what a microsecond of a proxy's CPU is worth in throughput here.
 * With `timer=<ms>` it keeps an empty interval of that period running, and with `armed=<ms>` a
 * timeout of that delay that never fires (set again a few ms before it would): what a timer
 * costs a loaded proxy (`bench/probes/head_to_head.ts --floor`, docs/forwarding-engine.md).
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/proxies/raw_http_proxy.ts 127.0.0.1:3676 [work=5]
 *   [timer=10] [armed=10]
 *
 * @module
 */
let sink = 0;
/** `turns` turns of a loop the compiler cannot drop. */
function spin(turns: number): void {
  let x = sink;
  for (let i = 0; i < turns; i++) x = (x * 1103515245 + 12345) | 0;
  sink = x;
}
/** Loop turns a microsecond: the fastest of nine 20 ms samples, the least disturbed. */
function turnsPerUs(): number {
  let best = 0;
  for (let k = 0; k < 9; k++) {
    const turns = 200_000;
    const t0 = performance.now();
    let n = 0;
    while (performance.now() - t0 < 20) {
      spin(turns);
      n += turns;
    }
    best = Math.max(best, n / ((performance.now() - t0) * 1000));
  }
  return best;
}
const CAPACITY = 64 * 1024;
const NEEDLE = new TextEncoder().encode("content-length:");

/** What the floor reads from and writes to: a socket (or `bench/probes/lane_js.ts`'s stand-in). */
export interface Wire {
  read(p: Uint8Array): Promise<number | null>;
  write(p: Uint8Array): Promise<number>;
}

/** Bytes read from one side of the proxy, with the unframed ones kept in front. */
class Side {
  readonly conn: Wire;
  buf = new Uint8Array(CAPACITY);
  start = 0;
  end = 0;
  constructor(conn: Wire) {
    this.conn = conn;
  }
  async fill(): Promise<boolean> {
    if (this.start === this.end) this.start = this.end = 0;
    else if (this.end === this.buf.length) {
      this.buf.copyWithin(0, this.start, this.end);
      this.end -= this.start;
      this.start = 0;
    }
    if (this.end === this.buf.length) return false;
    const n = await this.conn.read(this.buf.subarray(this.end));
    if (n === null) return false;
    this.end += n;
    return true;
  }
  /** The length of the next message's head (through its blank line), or -1 at the end. */
  async head(): Promise<number> {
    for (;;) {
      const b = this.buf;
      for (let i = this.start; i + 3 < this.end; i++) {
        if (b[i] === 13 && b[i + 1] === 10 && b[i + 2] === 13 && b[i + 3] === 10) {
          return i + 4 - this.start;
        }
      }
      if (!(await this.fill())) return -1;
    }
  }
  /** The Content-Length in the head of `headLength` bytes at `start` (0 when there is none). */
  contentLength(headLength: number): number {
    const b = this.buf, stop = this.start + headLength;
    for (let i = this.start; i + NEEDLE.length < stop; i++) {
      if (b[i - 1] !== 10) continue;
      let j = 0;
      while (j < NEEDLE.length && (b[i + j] | 0x20) === NEEDLE[j]) j++;
      if (j < NEEDLE.length) continue;
      let n = 0;
      for (let k = i + j; k < stop && b[k] !== 13; k++) {
        if (b[k] >= 48 && b[k] <= 57) n = n * 10 + b[k] - 48;
      }
      return n;
    }
    return 0;
  }
  /** Writes the next `n` bytes (read as they come) to `to`. */
  async pass(n: number, to: Wire): Promise<boolean> {
    while (n > 0) {
      if (this.start === this.end && !(await this.fill())) return false;
      const take = Math.min(n, this.end - this.start);
      let at = 0;
      while (at < take) at += await to.write(this.buf.subarray(this.start + at, this.start + take));
      this.start += take;
      n -= take;
    }
    return true;
  }
}

/**
 * Relays requests from `client` to `upstream` and their answers back, one at a time, until
 * either ends; `workTurns` turns of the spin loop and a call of `onRequest` a request.
 */
export async function relayFloor(
  client: Wire,
  upstream: Wire,
  workTurns = 0,
  onRequest?: () => void,
): Promise<void> {
  const down = new Side(client), up = new Side(upstream);
  for (;;) {
    const requestHead = await down.head();
    if (requestHead < 0) return;
    if (workTurns > 0) spin(workTurns);
    onRequest?.();
    if (!(await down.pass(requestHead + down.contentLength(requestHead), upstream))) return;
    const answerHead = await up.head();
    if (answerHead < 0) return;
    if (!(await up.pass(answerHead + up.contentLength(answerHead), client))) return;
  }
}

if (import.meta.main) {
  const [hostname, portText] = (Deno.args[0] ?? "").split(":");
  const upstreamPort = Number(portText);
  if (!hostname || !Number.isInteger(upstreamPort)) {
    console.error("Give the upstream as host:port, e.g. 127.0.0.1:3676");
    Deno.exit(2);
  }
  const options = new Map<string, number>();
  for (const arg of Deno.args.slice(1)) {
    const m = /^(work|timer|armed)=([\d.]+)$/.exec(arg);
    if (m === null || !(Number(m[2]) > 0)) {
      console.error(`Give work=<µs>, timer=<ms> or armed=<ms>, e.g. work=5: received ${arg}`);
      Deno.exit(2);
    }
    options.set(m[1], Number(m[2]));
  }
  const workUs = options.get("work") ?? 0;
  const workTurns = workUs > 0 ? Math.round(workUs * turnsPerUs()) : 0;
  const timerMs = options.get("timer");
  if (timerMs !== undefined) setInterval(() => {}, timerMs);
  // A timeout set again, on a request, once it is within 2 ms of firing: pending, never run.
  const armedMs = options.get("armed");
  let armed: ReturnType<typeof setTimeout> | undefined, armedAt = 0;
  const onRequest = armedMs === undefined ? undefined : () => {
    const now = performance.now();
    if (armed !== undefined && now - armedAt < armedMs - 2) return;
    clearTimeout(armed);
    armed = setTimeout(() => {}, armedMs);
    armedAt = now;
  };
  const proxy = async (client: Deno.TcpConn) => {
    const upstream = await Deno.connect({ hostname, port: upstreamPort });
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    try {
      await relayFloor(client, upstream, workTurns, onRequest);
    } finally {
      upstream.close();
    }
  };
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  console.log(JSON.stringify({ port: (listener.addr as Deno.NetAddr).port }));
  Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
  for await (const conn of listener) {
    proxy(conn).catch(() => {}).finally(() => {
      try {
        conn.close();
      } catch {
        // Closed already.
      }
    });
  }
}
