import assert from "node:assert/strict";
import { MAX_LINE_CHARS, readLines } from "./template_build.ts";

Deno.test("readLines hands on a step's output line by line, and a line without end in bounded pieces", async () => {
  const chunks = ["one\ntw", "o\n", "x".repeat(10 * MAX_LINE_CHARS), "y".repeat(100), "\nlast"];
  const stream = new ReadableStream<Uint8Array>({
    start(c) {
      for (const chunk of chunks) c.enqueue(new TextEncoder().encode(chunk));
      c.close();
    },
  });
  const lines: string[] = [];
  await readLines(stream, (l) => lines.push(l));
  assert.deepEqual(lines.slice(0, 2), ["one", "two"]);
  assert.equal(lines.at(-1), "last");
  assert.ok(lines.every((l) => l.length <= MAX_LINE_CHARS), "no line past the cap");
  assert.equal(lines.slice(2, -1).join(""), "x".repeat(10 * MAX_LINE_CHARS) + "y".repeat(100));
});
