/**
 * The floor of a Deno proxy, for the forwarding benchmark: `Deno.serve` answering each request
 * through one HTTP client to one upstream, the response passed back as it is. No routing, no
 * body parsing, no lookup, no header filtering: what any gateway written on this runtime costs
 * at least with that client. The client is the second argument:
 * - `fetch` (the default): the global `fetch`, what the gateway uses today;
 * - `node-http`: `node:http` `request` with a keep-alive `Agent` (32 sockets);
 * - `undici`: `npm:undici`'s `Pool` (32 connections), `pool.request()`.
 * Prints `{"port":N}` once listening.
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/_naive_proxy.ts http://127.0.0.1:3676 [client]
 *
 * @module
 */
import http from "node:http";
import { Readable } from "node:stream";
import { Pool } from "undici";

const upstream = Deno.args[0];
const client = Deno.args[1] ?? "fetch";

type Proxy = (req: Request, path: string) => Promise<Response>;

const viaFetch: Proxy = (req, path) =>
  fetch(upstream + path, { method: req.method, headers: req.headers, body: req.body });

const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });
const target = new URL(upstream);
const viaNodeHttp: Proxy = async (req, path) => {
  const body = req.body ? new Uint8Array(await req.arrayBuffer()) : undefined;
  return await new Promise<Response>((resolve, reject) => {
    const out = http.request({
      agent,
      host: target.hostname,
      port: target.port,
      method: req.method,
      path,
      headers: Object.fromEntries(req.headers),
    }, (res) => {
      const headers = new Headers();
      for (const [k, v] of Object.entries(res.headers)) {
        if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(", ") : v);
      }
      resolve(
        new Response(Readable.toWeb(res) as ReadableStream<Uint8Array>, {
          status: res.statusCode,
          headers,
        }),
      );
    });
    out.on("error", reject);
    out.end(body);
  });
};

const pool = new Pool(upstream, { connections: 32 });
const viaUndici: Proxy = async (req, path) => {
  const body = req.body ? new Uint8Array(await req.arrayBuffer()) : undefined;
  const res = await pool.request({
    method: req.method as "POST",
    path,
    headers: Object.fromEntries(req.headers),
    body,
  });
  const headers = new Headers();
  for (const [k, v] of Object.entries(res.headers)) {
    if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(", ") : v);
  }
  return new Response(Readable.toWeb(res.body) as ReadableStream<Uint8Array>, {
    status: res.statusCode,
    headers,
  });
};

const proxies: Record<string, Proxy> = {
  "fetch": viaFetch,
  "node-http": viaNodeHttp,
  "undici": viaUndici,
};
const proxy = proxies[client];
if (proxy === undefined) {
  console.error(`Unknown client '${client}': give one of ${Object.keys(proxies).join(", ")}`);
  Deno.exit(2);
}
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
  const url = new URL(req.url);
  return proxy(req, url.pathname + url.search);
});
console.log(JSON.stringify({ port: (server.addr as Deno.NetAddr).port }));
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
