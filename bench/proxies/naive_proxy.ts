/**
 * The floor of a Deno proxy, for the forwarding benchmark: `Deno.serve` answering each request
 * through one HTTP client to one upstream, the response passed back as it is. No routing, no
 * body parsing, no lookup, no header filtering: what any gateway written on this runtime costs
 * at least with that client. The client is the second argument, one of bench/proxies/clients.ts
 * (`fetch` by default, `node-http`, `undici`, `h1`, `h2`); every one streams the request body
 * on. Prints `{"port":N}` once listening.
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/proxies/naive_proxy.ts http://127.0.0.1:3676 [client]
 *
 * @module
 */
import { type ClientName, clientNames, makeClient } from "./clients.ts";

const upstream = Deno.args[0];
const name = (Deno.args[1] ?? "fetch") as ClientName;
if (!clientNames.includes(name)) {
  console.error(`Unknown client '${name}': give one of ${clientNames.join(", ")}`);
  Deno.exit(2);
}
const client = makeClient(name);
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
  const url = new URL(req.url);
  return client.fetch(upstream + url.pathname + url.search, {
    method: req.method,
    headers: req.headers,
    body: req.body,
  });
});
console.log(JSON.stringify({ port: (server.addr as Deno.NetAddr).port }));
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
