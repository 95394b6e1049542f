/**
 * `relayWebSocket` on the bytes engine: the upgrade spliced to the next hop (`_splice.ts`).
 * A real next hop (Deno.serve, which terminates the WebSocket), the bytes engine in front, and a
 * client `WebSocket`; every wait is bounded.
 */
import assert from "node:assert/strict";
import { RelayOpenError, relayWebSocket } from "./port_proxy.ts";
import { serveGuarded } from "./http1/mod.ts";
import { within } from "./http1/_server_fixtures_test.ts";

/** A next hop that echoes, picks the `chat` subprotocol, and records what it saw. */
function nextHop() {
  const seen = { headers: new Headers(), path: "", closes: [] as string[] };
  const closed = Promise.withResolvers<void>();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    if (request.headers.get("x-refuse") !== null || new URL(request.url).pathname === "/no") {
      return new Response("no such socket", { status: 403 });
    }
    seen.headers = new Headers(request.headers);
    seen.path = new URL(request.url).pathname + new URL(request.url).search;
    const asked = request.headers.get("sec-websocket-protocol") ?? "";
    const { socket, response } = Deno.upgradeWebSocket(request, {
      protocol: asked.includes("chat") ? "chat" : undefined,
    });
    socket.binaryType = "arraybuffer";
    socket.onmessage = (e) => {
      socket.send(typeof e.data === "string" ? `echo ${e.data}` : e.data);
    };
    socket.onclose = (e) => {
      seen.closes.push(`${e.code} ${e.reason}`);
      closed.resolve();
    };
    return response;
  });
  return { server, seen, closed: closed.promise, url: `ws://127.0.0.1:${server.addr.port}` };
}

/** The bytes engine with upgrades, relaying every request to `target`. */
function front(target: string) {
  return serveGuarded({
    hostname: "127.0.0.1",
    port: 0,
    engine: "bytes",
    upgrades: true,
    handler: async (request) => {
      try {
        return await relayWebSocket(request, target + new URL(request.url).pathname, {
          headers: new Headers({ "x-hop": "front" }),
          openTimeoutMs: 2000,
        });
      } catch (error) {
        if (!(error instanceof RelayOpenError)) throw error;
        return Response.json({ message: error.message }, { status: 502 });
      }
    },
  });
}

/** A client socket to `url`, open. */
async function opened(url: string, protocols?: string[]): Promise<WebSocket> {
  const ws = new WebSocket(url, protocols);
  ws.binaryType = "arraybuffer";
  await within(
    new Promise<void>((resolve, reject) => {
      ws.onopen = () => resolve();
      ws.onerror = () => reject(new Error("the client's WebSocket did not open"));
    }),
    3000,
    "the client's socket opening",
  );
  return ws;
}

function nextMessage(ws: WebSocket): Promise<string | ArrayBuffer> {
  return within(new Promise((r) => ws.onmessage = (e) => r(e.data)), 3000, "a message");
}

Deno.test("relayWebSocket on the bytes engine splices: frames, subprotocol and close code pass through", async () => {
  const hop = nextHop();
  const server = front(hop.url);
  try {
    const ws = await opened(`ws://127.0.0.1:${server.addr.port}/socket?x=1`, ["chat", "other"]);
    assert.equal(ws.protocol, "chat", "the next hop's choice reaches the client");
    ws.send("hi");
    assert.equal(await nextMessage(ws), "echo hi");
    ws.send(new Uint8Array([1, 2, 3, 250]));
    assert.deepEqual(
      new Uint8Array(await nextMessage(ws) as ArrayBuffer),
      new Uint8Array([1, 2, 3, 250]),
    );
    const big = "z".repeat(300_000);
    ws.send(big);
    assert.equal(await nextMessage(ws), `echo ${big}`);
    // The next hop saw the client's path and query, the hop's header, its own Host.
    assert.equal(hop.seen.path, "/socket");
    assert.equal(hop.seen.headers.get("x-hop"), "front");
    assert.equal(hop.seen.headers.get("host"), `127.0.0.1:${hop.server.addr.port}`);
    ws.close(4001, "bye");
    await within(hop.closed, 3000, "the next hop hearing the close");
    assert.deepEqual(hop.seen.closes, ["4001 bye"]);
  } finally {
    await server.shutdown();
    await hop.server.shutdown();
  }
});

Deno.test("relayWebSocket on the bytes engine: a next hop that refuses the upgrade is the handler's answer", async () => {
  const hop = nextHop();
  const server = front(hop.url);
  try {
    const res = await fetch(`http://127.0.0.1:${server.addr.port}/no`, {
      headers: {
        connection: "Upgrade",
        upgrade: "websocket",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": "13",
      },
      signal: AbortSignal.timeout(3000),
    });
    assert.equal(res.status, 502);
    assert.match((await res.json()).message, /answered 403, not 101/);
  } finally {
    await server.shutdown();
    await hop.server.shutdown();
  }
});

Deno.test("relayWebSocket on the bytes engine: shutdown ends the splices", async () => {
  const hop = nextHop();
  const server = front(hop.url);
  try {
    const ws = await opened(`ws://127.0.0.1:${server.addr.port}/socket`);
    const clientClosed = new Promise<void>((r) => ws.onclose = () => r());
    await within(server.shutdown(), 3000, "the shutdown");
    await within(clientClosed, 3000, "the client's socket closing");
    await within(hop.closed, 3000, "the next hop's socket closing");
  } finally {
    await server.shutdown();
    await hop.server.shutdown();
  }
});
