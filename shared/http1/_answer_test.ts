import assert from "node:assert/strict";
import { CARVE_MAX, Carver } from "./_answer.ts";

Deno.test("Carver: pieces never share a byte, a full slab is left for a new one, a large piece is its own", () => {
  const carver = new Carver();
  const pieces: Uint8Array[] = [];
  // Well past one slab, in sizes that do not divide it.
  for (let i = 0; i < 200; i++) pieces.push(carver.take(300 + (i % 7)));
  const byBuffer = new Map<ArrayBufferLike, [number, number][]>();
  for (const p of pieces) {
    const spans = byBuffer.get(p.buffer) ?? [];
    spans.push([p.byteOffset, p.byteOffset + p.length]);
    byBuffer.set(p.buffer, spans);
  }
  assert.ok(byBuffer.size > 1, "more than one slab was used");
  for (const spans of byBuffer.values()) {
    spans.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < spans.length; i++) {
      assert.ok(spans[i][0] >= spans[i - 1][1], `pieces overlap: ${spans[i - 1]} and ${spans[i]}`);
    }
  }
  const large = carver.take(CARVE_MAX + 1);
  assert.equal(large.byteOffset, 0);
  assert.equal(large.buffer.byteLength, CARVE_MAX + 1, "a large piece is a buffer of its own");
});
