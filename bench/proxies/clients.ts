/**
 * Every HTTP client this runtime offers to reach a node, each behind the same `fetch` shape the
 * gateway injects: the naive proxy measures their speed, bench/sections/forwarding_rules.ts
 * checks the forwarding rules against each. Every adapter streams request bodies both ways and
 * passes the caller's signal on (node:http's `signal` option, undici's, fetch's own).
 *
 * @module
 */
import http from "node:http";
import { once } from "node:events";
import { Readable } from "node:stream";
import { Pool } from "undici";
import { createH1Client } from "../../shared/http1/mod.ts";

/** A client: its `fetch` and a way to close its pools. */
export interface BenchClient {
  fetch: typeof fetch;
  close(): void;
}

/** The clients by the name the bench uses. */
export const clientNames = ["fetch", "node-http", "undici", "h1", "h2"] as const;
/** One of {@linkcode clientNames}. */
export type ClientName = typeof clientNames[number];

/** What each client is, for the tables. */
export const clientLabels: Record<ClientName, string> = {
  fetch: "fetch",
  "node-http": "node:http keep-alive Agent",
  undici: "undici Pool",
  h1: "h1_client (Deno.connect HTTP/1.1)",
  h2: "fetch over h2c",
};

function nodeHeaders(init: RequestInit): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of new Headers(init.headers)) out[k] = v;
  return out;
}

function webHeaders(raw: Record<string, string | string[] | undefined>): Headers {
  const headers = new Headers();
  for (const [k, v] of Object.entries(raw)) {
    if (v !== undefined) headers.set(k, Array.isArray(v) ? v.join(", ") : v);
  }
  return headers;
}

function nodeHttp(): BenchClient {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });
  const send = (input: RequestInfo | URL, init: RequestInit = {}) =>
    new Promise<Response>((resolve, reject) => {
      const url = new URL(String(input));
      const out = http.request({
        agent,
        host: url.hostname,
        port: url.port,
        method: init.method ?? "GET",
        path: url.pathname + url.search,
        headers: nodeHeaders(init),
        signal: init.signal ?? undefined,
      }, (res) => {
        const nullBody = res.statusCode === 204 || res.statusCode === 304;
        resolve(
          new Response(nullBody ? null : Readable.toWeb(res) as ReadableStream<Uint8Array>, {
            status: res.statusCode,
            headers: webHeaders(res.headers),
          }),
        );
      });
      out.on("error", (e) => reject(init.signal?.aborted ? init.signal.reason : e));
      const body = init.body;
      if (body instanceof ReadableStream) {
        (async () => {
          for await (const chunk of body as ReadableStream<Uint8Array>) {
            if (!out.write(chunk)) await once(out, "drain");
          }
          out.end();
        })().catch((e) => out.destroy(e));
      } else out.end(body ?? undefined);
    });
  return { fetch: send as typeof fetch, close: () => agent.destroy() };
}

function undici(): BenchClient {
  const pools = new Map<string, Pool>();
  const send = async (input: RequestInfo | URL, init: RequestInit = {}) => {
    const url = new URL(String(input));
    let pool = pools.get(url.origin);
    if (pool === undefined) {
      pool = new Pool(url.origin, { connections: 32 });
      pools.set(url.origin, pool);
    }
    const body = init.body;
    const res = await pool.request({
      method: (init.method ?? "GET") as "POST",
      path: url.pathname + url.search,
      headers: nodeHeaders(init),
      body: body instanceof ReadableStream
        ? Readable.fromWeb(body as import("node:stream/web").ReadableStream)
        : body as string | Uint8Array | null,
      signal: init.signal ?? undefined,
    });
    const nullBody = res.statusCode === 204 || res.statusCode === 304;
    return new Response(
      nullBody ? null : Readable.toWeb(res.body) as ReadableStream<Uint8Array>,
      { status: res.statusCode, headers: webHeaders(res.headers) },
    );
  };
  return {
    fetch: send as typeof fetch,
    close: () => {
      for (const p of pools.values()) void p.close();
    },
  };
}

function withDuplex(client?: Deno.HttpClient): BenchClient {
  const send = (input: RequestInfo | URL, init: RequestInit = {}) =>
    fetch(input, {
      ...init,
      ...(client ? { client } : {}),
      ...(init.body instanceof ReadableStream ? { duplex: "half" } : {}),
    } as RequestInit);
  return { fetch: send as typeof fetch, close: () => client?.close() };
}

/** A fresh client by name, with its own pools. */
export function makeClient(name: ClientName): BenchClient {
  switch (name) {
    case "fetch":
      return withDuplex();
    case "node-http":
      return nodeHttp();
    case "undici":
      return undici();
    case "h1": {
      const c = createH1Client();
      return { fetch: c.fetch, close: () => c.close() };
    }
    case "h2":
      return withDuplex(Deno.createHttpClient({ http1: false, http2: true }));
  }
}
