import assert from "node:assert/strict";
import { HttpError } from "../../../shared/http_error.ts";
import { multipartBoundary, readMultipart } from "./multipart.ts";
import { chunked } from "../../../shared/_stream_fixtures_test.ts";

/** A FormData encoded the way fetch sends it: its boundary and its bytes. */
async function encode(form: FormData): Promise<{ boundary: string; bytes: Uint8Array }> {
  const res = new Response(form);
  const boundary = multipartBoundary(res.headers.get("content-type")!);
  return { boundary, bytes: new Uint8Array(await res.arrayBuffer()) };
}

async function collect(body: ReadableStream<Uint8Array>, boundary: string) {
  const out: { name: string; filename?: string; data: Uint8Array }[] = [];
  for await (const part of readMultipart(body, boundary)) {
    out.push({
      name: part.name,
      filename: part.filename,
      data: new Uint8Array(await new Response(part.body).arrayBuffer()),
    });
  }
  return out;
}

async function refusal(p: Promise<unknown>): Promise<HttpError> {
  try {
    await p;
  } catch (error) {
    assert.ok(error instanceof HttpError, String(error));
    return error;
  }
  assert.fail("expected an HttpError");
}

Deno.test("readMultipart() reads every part exactly, however the body is cut", async () => {
  // Bytes that look like the start of a delimiter must stay the part's.
  const tricky = new TextEncoder().encode("a\r\n--\r\n-\r\n--x\r\n\r\nend\r");
  const binary = Uint8Array.from({ length: 70_000 }, (_, i) => (i * 7919) % 251);
  const form = new FormData();
  form.append("file", new Blob([tricky]), "/tmp/tricky.txt");
  form.append("note", "a plain field");
  form.append("file", new Blob([binary]), "/home/user/ü b.bin");
  form.append("file", new Blob([]), "/tmp/empty");
  const { boundary, bytes } = await encode(form);
  for (const size of [1, 7, 64, 4096, bytes.length]) {
    const parts = await collect(chunked(bytes, size), boundary);
    assert.deepEqual(parts.map((p) => [p.name, p.filename]), [
      ["file", "/tmp/tricky.txt"],
      ["note", undefined],
      ["file", "/home/user/ü b.bin"],
      ["file", "/tmp/empty"],
    ], `chunks of ${size}`);
    assert.deepEqual(parts[0].data, tricky, `chunks of ${size}`);
    assert.equal(new TextDecoder().decode(parts[1].data), "a plain field");
    assert.deepEqual(parts[2].data, binary, `chunks of ${size}`);
    assert.equal(parts[3].data.length, 0);
  }
});

Deno.test("readMultipart() skips a part its caller did not read, and the preamble", async () => {
  const body = new TextEncoder().encode(
    'preamble to ignore\r\n--b\r\nContent-Disposition: form-data; name="file"; ' +
      'filename="/tmp/\\"q\\".txt"\r\n\r\nskipped\r\n--b\r\n' +
      "Content-Disposition: form-data; name=file; filename*=UTF-8''%2Ftmp%2F%C3%A9\r\n\r\n" +
      "read\r\n--b--\r\nepilogue",
  );
  const names: (string | undefined)[] = [];
  let text = "";
  for await (const part of readMultipart(chunked(body, 5), "b")) {
    names.push(part.filename);
    if (names.length === 2) text = await new Response(part.body).text();
  }
  assert.deepEqual(names, ['/tmp/"q".txt', "/tmp/é"]);
  assert.equal(text, "read");
});

Deno.test("readMultipart() refuses a body cut inside a part, one without its boundary, and huge headers", async () => {
  const { boundary, bytes } = await (async () => {
    const form = new FormData();
    form.append("file", new Blob([new Uint8Array(5000)]), "/tmp/a");
    return await encode(form);
  })();
  const cut = await refusal(collect(chunked(bytes.subarray(0, 3000), 512), boundary));
  assert.equal(cut.status, 400);
  assert.match(cut.message, /ends inside a part/);

  const other = await refusal(collect(chunked(bytes, 512), "not-the-boundary"));
  assert.match(other.message, /no boundary 'not-the-boundary'/);

  const huge = new TextEncoder().encode(`--b\r\nX-Pad: ${"x".repeat(20_000)}\r\n\r\ndata\r\n--b--`);
  const headers = await refusal(collect(chunked(huge, 1024), "b"));
  assert.match(headers.message, /headers run past 16384 bytes/);

  assert.throws(() => multipartBoundary("multipart/form-data"), /names no boundary/);
});

Deno.test("readMultipart() hands a large part out in chunks no larger than the source's", async () => {
  const size = 16 * 1024 * 1024;
  const form = new FormData();
  form.append("file", new Blob([new Uint8Array(size)]), "/tmp/big");
  const { boundary, bytes } = await encode(form);
  let largest = 0;
  let total = 0;
  for await (const part of readMultipart(chunked(bytes, 64 * 1024), boundary)) {
    for await (const chunk of part.body) {
      largest = Math.max(largest, chunk.length);
      total += chunk.length;
    }
  }
  assert.equal(total, size);
  assert.ok(largest <= 64 * 1024, `a chunk of ${largest} bytes`);
});
