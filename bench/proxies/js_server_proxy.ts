/**
 * The naive proxy without Deno's HTTP server, for the forwarding benchmark: a minimal HTTP/1.1
 * server written in JS over `Deno.listen` (request heads parsed here, bodies by Content-Length
 * only) in front of shared/http1/client.ts. It answers the question the Deno.serve rows cannot:
 * how much of a Deno proxy's added latency is Deno's HTTP server. It is a measuring stick, not a
 * server to deploy: no chunked requests, no pipelining, no limits beyond a 64 KiB head.
 * Prints `{"port":N}` once listening.
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/proxies/js_server_proxy.ts http://127.0.0.1:3676
 *
 * @module
 */
import { createH1Client } from "../../shared/http1/mod.ts";

const upstream = Deno.args[0];
if (!upstream?.startsWith("http://")) {
  console.error("Give the upstream as a URL, e.g. http://127.0.0.1:3676");
  Deno.exit(2);
}
const client = createH1Client();
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const HEAD_MAX = 64 * 1024;
const hopByHop = new Set(["connection", "keep-alive", "transfer-encoding", "content-length"]);

/** Index of the blank line ending a head in `b[from, to)`, or -1. */
function headEnd(b: Uint8Array, from: number, to: number): number {
  for (let i = from; i + 3 < to; i++) {
    if (b[i] === 13 && b[i + 1] === 10 && b[i + 2] === 13 && b[i + 3] === 10) return i;
  }
  return -1;
}

async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let at = 0;
  while (at < bytes.length) at += await conn.write(bytes.subarray(at));
}

async function serve(conn: Deno.TcpConn): Promise<void> {
  conn.setNoDelay(true);
  const buf = new Uint8Array(HEAD_MAX);
  let start = 0, end = 0;
  const fill = async (): Promise<boolean> => {
    if (start > 0) {
      buf.copyWithin(0, start, end);
      end -= start;
      start = 0;
    }
    if (end === buf.length) return false;
    const n = await conn.read(buf.subarray(end));
    if (n === null) return false;
    end += n;
    return true;
  };
  for (;;) {
    let at = headEnd(buf, start, end);
    while (at < 0) {
      if (!(await fill())) return;
      at = headEnd(buf, start, end);
    }
    const lines = decoder.decode(buf.subarray(start, at)).split("\r\n");
    start = at + 4;
    const [method, target] = lines[0].split(" ");
    const headers = new Headers();
    for (let i = 1; i < lines.length; i++) {
      const colon = lines[i].indexOf(":");
      const name = lines[i].slice(0, colon).trim().toLowerCase();
      if (!hopByHop.has(name) && name !== "host") {
        headers.append(name, lines[i].slice(colon + 1).trim());
      }
    }
    const length = Number(lines.find((l) => /^content-length:/i.test(l))?.split(":")[1] ?? 0);
    let body: Uint8Array<ArrayBuffer> | undefined;
    if (length > 0) {
      body = new Uint8Array(length);
      let got = 0;
      while (got < length) {
        if (start === end && !(await fill())) return;
        const take = Math.min(length - got, end - start);
        body.set(buf.subarray(start, start + take), got);
        got += take;
        start += take;
      }
    }
    const res = await client.fetch(upstream + target, { method, headers, body });
    const answer = new Uint8Array(await res.arrayBuffer());
    let head = `HTTP/1.1 ${res.status} ${res.statusText || "OK"}\r\n`;
    for (const [k, v] of res.headers) if (!hopByHop.has(k)) head += `${k}: ${v}\r\n`;
    head += `content-length: ${answer.length}\r\n\r\n`;
    const headBytes = encoder.encode(head);
    const out = new Uint8Array(headBytes.length + answer.length);
    out.set(headBytes);
    out.set(answer, headBytes.length);
    await writeAll(conn, out);
  }
}

const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
console.log(JSON.stringify({ port: (listener.addr as Deno.NetAddr).port }));
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
for await (const conn of listener) {
  serve(conn).catch(() => {}).finally(() => {
    try {
      conn.close();
    } catch {
      // Closed already.
    }
  });
}
