/**
 * A node for the port benchmark: the node app on the fake executor, served as
 * node/main.ts serves it (serveGuarded), with one sandbox whose port 8000 stands in for a server
 * started in the sandbox: `GET /bulk?mib=N` streams N MiB, `POST /sink` counts what it is sent,
 * and a WebSocket upgrade echoes every message. It checks in to the gateway given as the first
 * argument and prints `{"port":N,"sandboxId":"…","listener":N}` (the stand-in's own port) once the sandbox is up.
 *
 * Usage: deno run -A bench/children/port_node.ts http://127.0.0.1:<gateway port>
 *
 * @module
 */
import { steadySampler, testNodeApp } from "../../tests/support/node_app.ts";
import { FakeExecutor } from "../../node/executors/fake.ts";
import { serveGuarded } from "../../shared/http1/mod.ts";
import { benchToken } from "../lib/fixtures.ts";

const gateway = Deno.args[0];
const executor = new FakeExecutor();
let endpoint = "";
const server = serveGuarded({
  hostname: "127.0.0.1",
  port: 0,
  upgrades: true,
  handler: (r) => node.fetch(r),
  onListen: () => {},
});
endpoint = `http://127.0.0.1:${server.addr.port}`;
const node = testNodeApp({
  token: benchToken,
  endpoint,
  executor,
  sampler: steadySampler,
  config: { nodeId: "bench-port-node", gatewayEndpoint: gateway, checkInIntervalSeconds: 1 },
});
node.start();
const made = await node.fetch(
  new Request(`${endpoint}/acquireSandbox`, {
    method: "POST",
    headers: { authorization: `Bearer ${benchToken}`, "content-type": "application/json" },
    body: JSON.stringify({ name: "bench-ports" }),
  }),
);
const { sandbox } = await made.json() as { sandbox: { id: string } };
const block = new Uint8Array(256 * 1024).fill(120);
await executor.servePort(sandbox.id, 8000, async (r) => {
  if (r.headers.get("upgrade")?.toLowerCase() === "websocket") {
    const { socket, response } = Deno.upgradeWebSocket(r);
    socket.onmessage = (e) => socket.send(e.data);
    return response;
  }
  const url = new URL(r.url);
  if (url.pathname === "/bulk") {
    let left = Number(url.searchParams.get("mib") ?? "64") * 2 ** 20;
    return new Response(
      new ReadableStream<Uint8Array>({
        pull(c) {
          if (left <= 0) return c.close();
          const n = Math.min(left, block.length);
          left -= n;
          c.enqueue(n === block.length ? block.slice() : block.slice(0, n));
        },
      }, { highWaterMark: 0 }),
    );
  }
  if (url.pathname === "/sink") {
    let n = 0;
    for await (const part of r.body!) n += part.length;
    return Response.json({ bytes: n });
  }
  return new Response("not here", { status: 404 });
});
const listener = (await executor.portAddress(sandbox.id, 8000))!.port;
console.log(JSON.stringify({ port: server.addr.port, sandboxId: sandbox.id, listener }));
Deno.addSignalListener("SIGTERM", async () => {
  await executor.close();
  Deno.exit(0);
});
