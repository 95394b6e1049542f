import assert from "node:assert/strict";
import { Conn, INITIAL_READ_BYTES } from "./_wire.ts";

/** A TCP connection stand-in that fills each read whole and records the sizes asked for. */
function fullReads() {
  const sizes: number[] = [];
  const tcp = {
    read(buf: Uint8Array): Promise<number | null> {
      sizes.push(buf.length);
      buf.fill(65);
      return Promise.resolve(buf.length);
    },
    close() {},
  } as unknown as Deno.TcpConn;
  return { tcp, sizes };
}

Deno.test("Conn: a new connection reads 4 KiB at first, so 10,000 idle ones hold 40 MB, not 160", async () => {
  const { tcp, sizes } = fullReads();
  const conn = new Conn(tcp, () => {});
  await conn.fill();
  assert.equal(INITIAL_READ_BYTES, 4096);
  assert.equal(sizes[0], 4096, `the first read asked for ${sizes[0]} bytes`);
  conn.destroy();
});

Deno.test("Conn: reads that fill their buffer grow it, so a bulk answer still reads large", async () => {
  const { tcp, sizes } = fullReads();
  const conn = new Conn(tcp, () => {});
  for (let i = 0; i < 12; i++) {
    await conn.fill();
    conn.consume(conn.buffered.length);
  }
  assert.equal(Math.max(...sizes), 256 * 1024, `read sizes ${sizes.join(", ")}`);
  conn.destroy();
});
