import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { connectWebSocket, type WireWebSocket } from "./ws_client.ts";
import { RelayOpenError } from "./_splice.ts";

/** What a socket handed its listener, and its end. */
function collect(ws: WireWebSocket) {
  const messages: (string | number[])[] = [];
  let resolveEnd!: (end: { code: number; reason: string }) => void;
  const ended = new Promise<{ code: number; reason: string }>((r) => resolveEnd = r);
  const waiters: (() => void)[] = [];
  ws.listen({
    message(data) {
      messages.push(typeof data === "string" ? data : [...new Uint8Array(data)]);
      waiters.splice(0).forEach((w) => w());
    },
    close: (code, reason) => resolveEnd({ code, reason }),
  });
  const count = async (n: number) => {
    while (messages.length < n) await new Promise<void>((r) => waiters.push(r));
  };
  return { messages, ended, count };
}

Deno.test("connectWebSocket() shows its Host and relays text, binary and closes with Deno's server", async () => {
  let seenHost: string | null = null;
  let serverClose: number | undefined;
  const serverClosed = Promise.withResolvers<void>();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (r) => {
    seenHost = r.headers.get("host");
    const { socket, response } = Deno.upgradeWebSocket(r, { protocol: "hmr" });
    socket.binaryType = "arraybuffer";
    socket.onmessage = (e) => {
      if (e.data === "close please") socket.close(4001, "asked");
      else socket.send(typeof e.data === "string" ? `echo ${e.data}` : e.data);
    };
    socket.onclose = (e) => {
      serverClose = e.code;
      serverClosed.resolve();
    };
    return response;
  });
  try {
    const ws = await connectWebSocket(`ws://127.0.0.1:${server.addr.port}/hmr`, {
      host: "localhost:5173",
      protocols: ["other", "hmr"],
    });
    assert.equal(seenHost, "localhost:5173");
    assert.equal(ws.protocol, "hmr");
    const { messages, ended, count } = collect(ws);
    // 70,000 bytes take the 64-bit length both ways; 300 bytes the 16-bit one.
    const big = new Uint8Array(70_000).map((_, i) => i % 253);
    ws.send("hi");
    ws.send(big);
    ws.send("é".repeat(150));
    await count(3);
    assert.equal(messages[0], "echo hi");
    assert.deepEqual(messages[1], [...big]);
    assert.equal(messages[2], `echo ${"é".repeat(150)}`);
    ws.send("close please");
    assert.deepEqual(await ended, { code: 4001, reason: "asked" });
    await serverClosed.promise;
    assert.equal(serverClose, 4001, "the server's close was answered with its code");
    assert.equal(ws.open, false);
  } finally {
    await server.shutdown();
  }
});

Deno.test("connectWebSocket(): a close from our side reaches the server with its code", async () => {
  const closed = Promise.withResolvers<number>();
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (r) => {
    const { socket, response } = Deno.upgradeWebSocket(r);
    socket.onclose = (e) => closed.resolve(e.code);
    return response;
  });
  try {
    const ws = await connectWebSocket(`ws://127.0.0.1:${server.addr.port}/`, { host: "x" });
    const { ended } = collect(ws);
    ws.close(3005, "done");
    assert.equal(await closed.promise, 3005);
    assert.equal((await ended).code, 3005);
  } finally {
    await server.shutdown();
  }
});

/** A server frame (unmasked) of `opcode` with `payload`; `fin` false for a fragment. */
function serverFrame(opcode: number, payload: Uint8Array, fin = true, rsv = 0): Uint8Array {
  const head = payload.length < 126
    ? [payload.length]
    : [126, payload.length >> 8, payload.length & 255];
  return new Uint8Array([(fin ? 0x80 : 0) | rsv | opcode, ...head, ...payload]);
}

async function writeAllTo(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
}

/** Reads one client frame (masked) from `conn`: its opcode and unmasked payload. */
async function readClientFrame(conn: Deno.Conn): Promise<{ opcode: number; payload: Uint8Array }> {
  const buf = new Uint8Array(1024);
  let end = 0;
  for (;;) {
    if (end >= 2) {
      const len = buf[1] & 0x7f;
      assert.ok(buf[1] & 0x80, "a client frame is masked");
      assert.ok(len < 126);
      if (end >= 6 + len) {
        const key = buf.subarray(2, 6);
        return {
          opcode: buf[0] & 0x0f,
          payload: buf.slice(6, 6 + len).map((b, i) => b ^ key[i & 3]),
        };
      }
    }
    const n = await conn.read(buf.subarray(end));
    if (n === null) throw new Error("closed before a frame");
    end += n;
  }
}

/**
 * A raw server that answers one handshake (101 with the right accept, or `answer`) and then
 * runs `script` on the connection.
 */
function rawServer(
  script: (conn: Deno.Conn) => Promise<void>,
  answer?: (key: string) => string,
) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const done = (async () => {
    const conn = await listener.accept();
    try {
      const buf = new Uint8Array(4096);
      let head = "";
      while (!head.includes("\r\n\r\n")) {
        const n = await conn.read(buf);
        if (n === null) return;
        head += new TextDecoder().decode(buf.subarray(0, n));
      }
      const key = /sec-websocket-key: (\S+)/i.exec(head)![1];
      const accept = createHash("sha1").update(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
        .digest("base64");
      await conn.write(new TextEncoder().encode(
        answer?.(key) ??
          `HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n` +
            `sec-websocket-accept: ${accept}\r\n\r\n`,
      ));
      await script(conn);
    } finally {
      try {
        conn.close();
      } catch { /* closed by the client */ }
    }
  })();
  return {
    url: `ws://127.0.0.1:${(listener.addr as Deno.NetAddr).port}/`,
    done: async () => {
      await done;
      listener.close();
    },
  };
}

Deno.test("connectWebSocket() joins fragments, answers pings and fails a broken frame with 1002", async () => {
  const text = new TextEncoder();
  let pong: { opcode: number; payload: Uint8Array } | undefined;
  let closeFrame: { opcode: number; payload: Uint8Array } | undefined;
  const server = rawServer(async (conn) => {
    await conn.write(serverFrame(1, text.encode("hel"), false));
    // A control frame may come between a message's fragments.
    await conn.write(serverFrame(9, text.encode("ping!")));
    await conn.write(serverFrame(0, text.encode("lo"), true));
    pong = await readClientFrame(conn);
    // A reserved bit no extension explains.
    await conn.write(serverFrame(2, new Uint8Array([1]), true, 0x40));
    closeFrame = await readClientFrame(conn);
  });
  const ws = await connectWebSocket(server.url, { host: "h" });
  const { messages, ended, count } = collect(ws);
  await count(1);
  assert.deepEqual(messages, ["hello"]);
  const end = await ended;
  await server.done();
  assert.deepEqual([pong?.opcode, new TextDecoder().decode(pong?.payload)], [10, "ping!"]);
  assert.equal(closeFrame?.opcode, 8);
  assert.equal((closeFrame!.payload[0] << 8) | closeFrame!.payload[1], 1002);
  assert.equal(end.code, 1002);
});

Deno.test("connectWebSocket() closes with 1009 past maxBytes or too many fragments, 1006 when the server just leaves", async () => {
  const big = rawServer(async (conn) => {
    await conn.write(serverFrame(2, new Uint8Array(200)));
    await readClientFrame(conn);
  });
  const ws = await connectWebSocket(big.url, { host: "h", maxBytes: 100 });
  assert.equal((await collect(ws).ended).code, 1009);
  await big.done();

  // Empty fragments carry no bytes, so their number has its own bound.
  const fragments = rawServer(async (conn) => {
    // 5,000 fragments of one message, its last, then a close: a client without the bound
    // would take the message and answer the close with 1000.
    const first = serverFrame(1, new Uint8Array(0), false);
    const empty = serverFrame(0, new Uint8Array(0), false);
    const last = serverFrame(0, new Uint8Array(0), true);
    const close = serverFrame(8, new Uint8Array([3, 232]));
    const burst = new Uint8Array(2 * 5002 + close.length);
    burst.set(first, 0);
    for (let i = 1; i <= 5000; i++) burst.set(empty, i * 2);
    burst.set(last, 5001 * 2);
    burst.set(close, 5002 * 2);
    await writeAllTo(conn, burst);
    await readClientFrame(conn);
  });
  const fragmented = await connectWebSocket(fragments.url, { host: "h" });
  assert.equal((await collect(fragmented).ended).code, 1009);
  await fragments.done();

  const gone = rawServer(async () => {});
  const left = await connectWebSocket(gone.url, { host: "h" });
  assert.equal((await collect(left).ended).code, 1006);
  await gone.done();
});

Deno.test("connectWebSocket() refuses a handshake that is not a WebSocket's 101", async () => {
  for (
    const [answer, pattern] of [
      [() => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n", /answered 404, not 101/],
      [
        () =>
          "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nsec-websocket-accept: x\r\n\r\n",
        /not a WebSocket handshake/,
      ],
    ] as [(key: string) => string, RegExp][]
  ) {
    const server = rawServer(async () => {}, answer);
    await assert.rejects(
      connectWebSocket(server.url, { host: "h" }),
      (e) => e instanceof RelayOpenError && pattern.test(e.message),
    );
    await server.done();
  }
  await assert.rejects(connectWebSocket("wss://127.0.0.1:1/", { host: "h" }), TypeError);
});
