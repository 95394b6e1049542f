import assert from "node:assert/strict";
import { gzipSync } from "node:zlib";
import { gunzipBounded, GZIP_RATIO_GRACE_BYTES } from "./gunzip.ts";

const MiB = 1024 * 1024;

/** The errors the stream fails with, as plain errors the test can tell apart. */
const errors = {
  tooExpanded: (compressed: number, inflated: number) =>
    new Error(`too expanded: ${inflated} from ${compressed}`),
  unreadable: (error: unknown) => new Error(`unreadable: ${error}`),
};

/** `bytes` as a stream of 64 KiB reads, as a socket delivers a body. */
function streamOf(bytes: Uint8Array): ReadableStream<Uint8Array> {
  let at = 0;
  return new ReadableStream({
    pull(c) {
      if (at >= bytes.byteLength) return c.close();
      c.enqueue(bytes.slice(at, at + 64 * 1024));
      at += 64 * 1024;
    },
  });
}

Deno.test("gunzipBounded() inflates a gzip whole, across reads and members", async () => {
  const text = new TextEncoder().encode("a line of a log file\n".repeat(40_000));
  const random = crypto.getRandomValues(new Uint8Array(60_000));
  const both = new Uint8Array([...gzipSync(text), ...gzipSync(random)]);
  const out = gunzipBounded(streamOf(both), { maxRatio: 100, ...errors });
  assert.deepEqual(
    new Uint8Array(await new Response(out).arrayBuffer()),
    new Uint8Array([...text, ...random]),
  );
});

Deno.test("gunzipBounded() refuses a gzip bomb past the ratio once the first MiB is out", async () => {
  const bomb = gzipSync(new Uint8Array(64 * MiB));
  let seen = 0;
  const out = gunzipBounded(streamOf(bomb), { maxRatio: 100, ...errors });
  await assert.rejects(
    (async () => {
      for await (const chunk of out) seen += chunk.byteLength;
    })(),
    /too expanded/,
  );
  // Refused within a piece of the grace: not after inflating the 64 MiB.
  assert.ok(seen <= GZIP_RATIO_GRACE_BYTES + 2 * MiB, `${seen} bytes came out`);
  // Deflate's own most lets the same bomb through.
  const whole = gunzipBounded(streamOf(bomb), { maxRatio: 1032, ...errors });
  assert.equal((await new Response(whole).arrayBuffer()).byteLength, 64 * MiB);
});

Deno.test("gunzipBounded() lets the event loop run once a slice of time is used", async () => {
  const bomb = gzipSync(new Uint8Array(32 * MiB));
  // Each look at the clock is 1 ms of work: a 10 ms slice is about 10 pieces of input.
  let now = 0;
  let yields = 0;
  let mostBetweenYields = 0, sinceYield = 0;
  const out = gunzipBounded(streamOf(bomb), {
    maxRatio: 1032,
    ...errors,
    budget: {
      sliceMs: 10,
      now: () => now++,
      yieldToLoop: () => {
        yields++;
        sinceYield = 0;
        return Promise.resolve();
      },
    },
  });
  for await (const chunk of out) {
    sinceYield += chunk.byteLength;
    mostBetweenYields = Math.max(mostBetweenYields, sinceYield);
  }
  // 32 MiB from ~32 KiB of gzip: ~32 pieces of 1 KiB, a yield every ~10.
  assert.ok(yields >= 2, `${yields} yields`);
  assert.ok(mostBetweenYields <= 16 * MiB, `${mostBetweenYields} bytes between two yields`);
});

Deno.test("gunzipBounded() fails with the unreadable error on a bad or cut gzip", async () => {
  const garbage = gunzipBounded(streamOf(new Uint8Array(100).fill(7)), {
    maxRatio: 100,
    ...errors,
  });
  await assert.rejects(new Response(garbage).arrayBuffer(), /unreadable: .*header/);
  const cut = gzipSync(crypto.getRandomValues(new Uint8Array(50_000))).subarray(0, 20_000);
  const short = gunzipBounded(streamOf(cut), { maxRatio: 100, ...errors });
  await assert.rejects(new Response(short).arrayBuffer(), /unreadable: .*end of file/);
});
