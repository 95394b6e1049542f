import assert from "node:assert/strict";
import { HttpError } from "./http_error.ts";
import {
  formatBytes,
  readBodyBytes,
  readBodyText,
  readFlatJsonObject,
  readJsonObject,
} from "./json_body.ts";

const post = (body: BodyInit | null, headers: Record<string, string> = {}) =>
  new Request("http://x/", { method: "POST", body, headers });

async function refusal(p: Promise<unknown>): Promise<HttpError> {
  try {
    await p;
  } catch (error) {
    assert.ok(error instanceof HttpError, String(error));
    return error;
  }
  assert.fail("expected an HttpError");
}

Deno.test("readJsonObject() reads one object and keeps its text", async () => {
  const body = await readJsonObject(post('{"name":"a"}'));
  assert.deepEqual(body, { value: { name: "a" }, text: '{"name":"a"}' });
});

Deno.test("readJsonObject() reads an empty body as {} unless told to refuse it", async () => {
  assert.deepEqual(await readJsonObject(post(null)), { value: {}, text: "{}" });
  const e = await refusal(readJsonObject(post(""), { empty: "refuse" }));
  assert.equal(e.status, 400);
  assert.match(e.message, /empty: send a JSON object/);
});

Deno.test("readJsonObject() refuses what is not one JSON object with a 400 sentence", async () => {
  for (const text of ["{", "[1]", "null", "3"]) {
    const e = await refusal(readJsonObject(post(text)));
    assert.equal(e.status, 400, text);
    assert.match(e.message, /JSON object such as/, text);
  }
});

Deno.test("readBodyText() refuses a declared length past the cap without reading it", async () => {
  let pulled = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(c) {
      pulled++;
      c.enqueue(new Uint8Array(10));
    },
  });
  const e = await refusal(
    readBodyText(post(stream, { "content-length": "2000" }), {
      maxBytes: 1000,
      tooLargeHint: "use /files",
    }),
  );
  assert.equal(e.status, 413);
  assert.equal(
    e.message,
    "The request body is larger than this face's cap of 1000 bytes: use /files",
  );
  assert.ok(pulled <= 1, `read ${pulled} chunks of a body it should have refused unread`);
});

Deno.test("readBodyText() stops reading a chunked body at the cap", async () => {
  let pulled = 0;
  const stream = new ReadableStream<Uint8Array>({
    pull(c) {
      pulled++;
      c.enqueue(new Uint8Array(1024));
    },
  });
  const e = await refusal(readBodyText(post(stream), { maxBytes: 4096 }));
  assert.equal(e.status, 413);
  assert.match(e.message, /cap of 4 KiB/);
  assert.ok(pulled <= 6, `read ${pulled} KiB of an endless body capped at 4 KiB`);
});

Deno.test("readBodyText() reads a body exactly at the cap", async () => {
  assert.equal(await readBodyText(post("x".repeat(100)), { maxBytes: 100 }), "x".repeat(100));
});

Deno.test("readJsonObject() answers a body past the cap with a 413 naming the cap, its variable and /files", async () => {
  const e = await refusal(
    readJsonObject(post("x".repeat(2048)), {
      maxBytes: 1024,
      capVariable: "DORMICE_JSON_BODY_LIMIT_MB",
    }),
  );
  assert.equal(e.status, 413);
  assert.match(e.message, /cap of 1 KiB \(DORMICE_JSON_BODY_LIMIT_MB\)/);
  assert.match(e.message, /POST \/files.*streams/);
});

Deno.test("readBodyBytes() keeps the bytes as they came and stops a chunked body at the cap", async () => {
  const bytes = new Uint8Array([0, 255, 7]);
  assert.deepEqual(await readBodyBytes(post(bytes), { maxBytes: 3 }), bytes);
  const endless = new ReadableStream<Uint8Array>({
    pull: (c) => c.enqueue(new Uint8Array(512)),
  });
  const e = await refusal(readBodyBytes(post(endless), { maxBytes: 2048 }));
  assert.equal(e.status, 413);
});

Deno.test("formatBytes() names whole units", () => {
  assert.equal(formatBytes(32 * 1024 * 1024), "32 MiB");
  assert.equal(formatBytes(2 * 1024 ** 3), "2 GiB");
  assert.equal(formatBytes(1536), "1536 bytes");
});

Deno.test("readFlatJsonObject() reads a large one-string body in slices, yielding between them", async () => {
  const content = "x".repeat(3 * 1024 * 1024);
  let now = 0, yields = 0;
  const { value } = await readFlatJsonObject(post(JSON.stringify({ name: "a", content })), {
    maxBytes: 8 * 1024 * 1024,
    budget: { sliceMs: 1, now: () => now++, yieldToLoop: () => (yields++, Promise.resolve()) },
  });
  assert.equal(value.content, content);
  assert.ok(yields >= 5, `${yields} yields`);
  // Escaped quotes and structure inside strings are part of the string.
  const tricky = { content: '\\"{[,:]}"'.repeat(100), name: "a" };
  assert.deepEqual((await readFlatJsonObject(post(JSON.stringify(tricky)))).value, tricky);
});

Deno.test("readFlatJsonObject() refuses a body with more structure than a few fields, before parsing it", async () => {
  const nested = JSON.stringify({ name: "a", extra: Array.from({ length: 100 }, () => [1]) });
  const e = await refusal(readFlatJsonObject(post(nested), { verb: "writeFile" }));
  assert.equal(e.status, 400);
  assert.match(e.message, /body of writeFile must be one JSON object of a few fields/);
  const over = await refusal(readFlatJsonObject(post("x".repeat(2048)), { maxBytes: 1024 }));
  assert.equal(over.status, 413);
  assert.equal((await refusal(readFlatJsonObject(post("[1]")))).status, 400);
});
