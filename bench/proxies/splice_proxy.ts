/**
 * The runtime's own floor, for the forwarding benchmark: a TCP splice written on Deno. Each
 * accepted connection gets one connection to the upstream, and bytes are copied both ways with
 * `read`/`write` into one reused buffer per direction. No HTTP at all: no parsing, no routing,
 * no pool (a client's kept-alive connection is the upstream's kept-alive connection). Anything
 * that forwards HTTP on this runtime does at least this work per request (two reads, two writes)
 * and more; nginx does this and parses HTTP too. So its throughput bounds any Deno gateway's
 * from above, and its added latency bounds it from below. Prints `{"port":N}` once listening.
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/proxies/splice_proxy.ts 127.0.0.1:3676
 *
 * @module
 */
const [hostname, portText] = (Deno.args[0] ?? "").split(":");
const upstreamPort = Number(portText);
if (!hostname || !Number.isInteger(upstreamPort)) {
  console.error("Give the upstream as host:port, e.g. 127.0.0.1:3676");
  Deno.exit(2);
}

/** Copies `from` to `to` until `from` ends, then closes `to`'s write side. */
async function pump(from: Deno.TcpConn, to: Deno.TcpConn): Promise<void> {
  const buffer = new Uint8Array(64 * 1024);
  try {
    for (;;) {
      const n = await from.read(buffer);
      if (n === null) break;
      let at = 0;
      while (at < n) at += await to.write(buffer.subarray(at, n));
    }
  } catch {
    // Either side reset: the splice ends.
  }
  try {
    await to.closeWrite();
  } catch {
    // Already closed.
  }
}

async function splice(client: Deno.TcpConn): Promise<void> {
  let upstream: Deno.TcpConn;
  try {
    upstream = await Deno.connect({ hostname, port: upstreamPort });
  } catch {
    client.close();
    return;
  }
  client.setNoDelay(true);
  upstream.setNoDelay(true);
  await Promise.all([pump(client, upstream), pump(upstream, client)]);
  for (const c of [client, upstream]) {
    try {
      c.close();
    } catch {
      // Closed by the other pump.
    }
  }
}

const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
console.log(JSON.stringify({ port: (listener.addr as Deno.NetAddr).port }));
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
for await (const conn of listener) void splice(conn);
