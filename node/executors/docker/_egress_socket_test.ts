import assert from "node:assert/strict";
import { createServer, type Socket } from "node:net";
import { MAX_QUEUED, SocketConn } from "./_egress_socket.ts";

/** A node socket accepted on loopback, and the Deno connection at its other end. */
async function pair(): Promise<{ socket: Socket; peer: Deno.TcpConn; close: () => void }> {
  const accepted = Promise.withResolvers<Socket>();
  const server = createServer((s) => accepted.resolve(s));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const port = (server.address() as { port: number }).port;
  const peer = await Deno.connect({ hostname: "127.0.0.1", port });
  const socket = await accepted.promise;
  return { socket, peer, close: () => server.close() };
}

Deno.test("SocketConn writes to the peer, reads what it sent in order into small buffers, then null at its end", async () => {
  const { socket, peer, close } = await pair();
  const conn = new SocketConn(socket);
  try {
    assert.equal(conn.remoteAddr.port, (peer.localAddr as Deno.NetAddr).port);
    assert.equal(await conn.write(new TextEncoder().encode("bye")), 3);
    await conn.closeWrite();
    const back = new Uint8Array(8);
    let have = 0;
    for (let n = await peer.read(back); n !== null; n = await peer.read(back.subarray(have))) {
      have += n;
    }
    assert.equal(new TextDecoder().decode(back.subarray(0, have)), "bye");
    await peer.write(new TextEncoder().encode("hello, "));
    await peer.write(new TextEncoder().encode("world"));
    await peer.closeWrite();
    const buf = new Uint8Array(3);
    let text = "";
    for (let n = await conn.read(buf); n !== null; n = await conn.read(buf)) {
      text += new TextDecoder().decode(buf.subarray(0, n));
    }
    assert.equal(text, "hello, world");
  } finally {
    peer.close();
    conn.close();
    close();
  }
});

Deno.test("SocketConn pauses the socket once MAX_QUEUED bytes wait unread, resumes as they are read", async () => {
  const { socket, peer, close } = await pair();
  const conn = new SocketConn(socket);
  try {
    const sent = MAX_QUEUED * 4;
    const writing = peer.write(new Uint8Array(sent)).then(async (n) => {
      let at = n;
      while (at < sent) at += await peer.write(new Uint8Array(sent - at));
    });
    // Nothing read: the socket is paused before everything sent has been taken in.
    for (let i = 0; i < 1000 && !socket.isPaused(); i++) await new Promise((r) => setTimeout(r, 5));
    assert.ok(socket.isPaused(), "the socket was never paused");
    let got = 0;
    const buf = new Uint8Array(64 * 1024);
    while (got < sent) got += (await conn.read(buf))!;
    await writing;
    assert.equal(got, sent);
    assert.ok(!socket.isPaused(), "the socket stayed paused after its bytes were read");
  } finally {
    peer.close();
    conn.close();
    close();
  }
});

Deno.test("SocketConn rejects a write after close with BrokenPipe, and reads null", async () => {
  const { socket, peer, close } = await pair();
  const conn = new SocketConn(socket);
  try {
    conn.close();
    await assert.rejects(conn.write(new Uint8Array(1)), Deno.errors.BrokenPipe);
    assert.equal(await conn.read(new Uint8Array(1)), null);
  } finally {
    peer.close();
    close();
  }
});
