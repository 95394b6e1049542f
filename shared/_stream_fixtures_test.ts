/**
 * Stream helpers for tests (a `_…_test.ts` module: not part of the package).
 *
 * @module
 */

/** `bytes` as a stream cut into chunks of `size` bytes (the last one shorter). */
export function chunked(bytes: Uint8Array, size: number): ReadableStream<Uint8Array> {
  let at = 0;
  return new ReadableStream({
    pull(c) {
      if (at >= bytes.length) return c.close();
      c.enqueue(bytes.slice(at, at + size));
      at += size;
    },
  });
}
