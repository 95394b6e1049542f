/**
 * The guard's bounds on a request in flight (bytes engine): a body that stops arriving and an
 * answer the client stops reading give their connection back; a slow handler keeps it. The
 * clock is fake; the real waits only let socket calls start or buffers fill.
 */
import assert from "node:assert/strict";
import { FakeClock } from "../clock.ts";
import { deferred, enc, sleep, within, withServer } from "./_server_fixtures_test.ts";

const BOUND = 3_000;

Deno.test('serveGuarded({ engine: "bytes" }) cuts a body that stops arriving after bodyTimeoutMs, not before', async () => {
  const clock = new FakeClock();
  const reading = deferred();
  let bodyEnded = false;
  const handler = async (request: Request) => {
    reading.resolve();
    await request.text().then(() => bodyEnded = true, () => {});
    return new Response("read");
  };
  await withServer(handler, async ({ server, connect }) => {
    const c = await connect();
    await c.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab");
    await within(reading.promise, 2000, "the handler's call");
    await sleep(20); // the handler's read of the body's rest starts
    assert.equal(server.sweep(), 0, "the sweep that first sees the read waiting cut it");
    clock.tick(BOUND - 1);
    assert.equal(server.sweep(), 0, "closed before its body timeout");
    // A piece arrives: the wait starts again from the next sweep.
    await c.write("cd");
    await sleep(20);
    assert.equal(server.sweep(), 0, "a body that moved was cut");
    clock.tick(BOUND - 1);
    assert.equal(server.sweep(), 0, "closed before its body timeout after a piece");
    clock.tick(1);
    assert.equal(server.sweep(), 1, "a body stalled for the whole bound was not cut");
    await c.closedWithin(2000);
    assert.equal(bodyEnded, false);
  }, { clock, bodyTimeoutMs: BOUND, writeTimeoutMs: 60 * BOUND });
});

/** An answer that never ends: 64 KiB pieces as fast as they are taken. */
const endless = () =>
  new Response(
    new ReadableStream<Uint8Array>({
      pull: (controller) => controller.enqueue(new Uint8Array(64 * 1024)),
    }),
  );

Deno.test('serveGuarded({ engine: "bytes" }) cuts an answer the client stops reading after writeTimeoutMs', async () => {
  const clock = new FakeClock();
  await withServer(endless, async ({ server, port }) => {
    // A client that sends its request and never reads: the server's writes fill the socket.
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    try {
      await conn.write(enc("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
      let cut = -1;
      for (let i = 0; i < 300 && cut < 0; i++) {
        await sleep(10);
        if (server.sweep() === 1) cut = i;
        clock.tick(BOUND / 3);
      }
      assert.ok(cut >= 0, "an answer nobody read kept its connection");
      // Only a whole bound with no write taken cuts: at least three sweeps a third apart.
      assert.ok(cut >= 3, `cut at sweep ${cut}`);
    } finally {
      conn.close();
    }
  }, { clock, writeTimeoutMs: BOUND, bodyTimeoutMs: 60 * BOUND });
});

/** More than the kernel can hold between the server's writes and the client's reads. */
const BUFFERED_AT_MOST = 40 * 1024 * 1024;

Deno.test('serveGuarded({ engine: "bytes" }) keeps an answer the client keeps reading', async () => {
  const clock = new FakeClock();
  await withServer(endless, async ({ server, port }) => {
    const conn = await Deno.connect({ hostname: "127.0.0.1", port });
    let read = 0;
    const reader = (async () => {
      const buf = new Uint8Array(256 * 1024);
      for (;;) {
        const n = await conn.read(buf).catch(() => null);
        if (n === null) return;
        read += n;
      }
    })();
    try {
      await conn.write(enc("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
      for (let i = 0; i < 6; i++) {
        // A write of the server's has ended since the last sweep once the client has read more
        // than every buffer between them can hold (Linux's loopback socket buffers grow to 32 MiB
        // for reading and 4 MiB for writing): waiting for those bytes, not for a wall-clock
        // pause, is what keeps a loaded host from making this a stall.
        const from = read;
        for (let waited = 0; read - from < BUFFERED_AT_MOST; waited++) {
          assert.ok(waited < 3000, `the answer stopped flowing after ${read} bytes`);
          await sleep(10);
        }
        assert.equal(server.sweep(), 0, `a client reading its answer was cut at sweep ${i}`);
        clock.tick(BOUND);
      }
    } finally {
      conn.close();
      await reader;
    }
  }, { clock, writeTimeoutMs: BOUND, bodyTimeoutMs: BOUND });
});
