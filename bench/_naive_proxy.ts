/**
 * The floor of a Deno proxy, for the forwarding benchmark: `Deno.serve` answering each request
 * with `fetch` to one upstream, the response passed back as it is. No routing, no body parsing,
 * no lookup, no header filtering: what any gateway written on this runtime costs at least.
 * Prints `{"port":N}` once listening.
 *
 * Usage: deno run --allow-net=127.0.0.1 bench/_naive_proxy.ts http://127.0.0.1:3676
 *
 * @module
 */
const upstream = Deno.args[0];
const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, (req) => {
  const url = new URL(req.url);
  return fetch(upstream + url.pathname + url.search, {
    method: req.method,
    headers: req.headers,
    body: req.body,
  });
});
console.log(JSON.stringify({ port: (server.addr as Deno.NetAddr).port }));
Deno.addSignalListener("SIGTERM", () => Deno.exit(0));
