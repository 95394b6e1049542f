import assert from "node:assert/strict";
import type { HttpError } from "../shared/http_error.ts";
import { checkContext } from "./template_context.ts";

const enc = new TextEncoder();

/** One raw ustar header block (checksum included) and its padded data. */
function entry(
  name: string,
  type: string,
  data: Uint8Array<ArrayBuffer> = new Uint8Array(0),
  link = "",
): Uint8Array<ArrayBuffer>[] {
  const h = new Uint8Array(512);
  h.set(enc.encode(name).subarray(0, 100), 0);
  h.set(enc.encode("0000644\0"), 100);
  h.set(enc.encode(data.length.toString(8).padStart(11, "0") + "\0"), 124);
  h.set(enc.encode("00000000000\0"), 136);
  h[156] = type.charCodeAt(0);
  h.set(enc.encode(link), 157);
  h.set(enc.encode("ustar\x0000"), 257);
  h.fill(32, 148, 156);
  const sum = h.reduce((a, b) => a + b, 0);
  h.set(enc.encode(sum.toString(8).padStart(6, "0") + "\0 "), 148);
  const pad = new Uint8Array(Math.ceil(data.length / 512) * 512);
  pad.set(data);
  return [h, pad];
}

function tar(...entries: Uint8Array<ArrayBuffer>[][]): ReadableStream<Uint8Array> {
  return new Blob([...entries.flat(), new Uint8Array(1024)]).stream();
}

function gz(stream: ReadableStream<Uint8Array>): ReadableStream<Uint8Array> {
  return stream.pipeThrough(
    new CompressionStream("gzip") as TransformStream<Uint8Array, Uint8Array>,
  );
}

const bounds = { maxBytes: 1 << 20, maxEntries: 100 };

function refused(status: number, pattern: RegExp) {
  return (e: HttpError) => {
    assert.equal(e.status, status, e.message);
    assert.match(e.message, pattern);
    return true;
  };
}

Deno.test("checkContext takes the SDK's kind of context: files, directories, links inside it, gzipped or not", async () => {
  const ok = () =>
    tar(
      entry("app/", "5"),
      entry("app/hello.txt", "0", enc.encode("hi\n")),
      entry("app/link", "2", new Uint8Array(0), "hello.txt"),
      entry("app/hard", "1", new Uint8Array(0), "app/hello.txt"),
    );
  await checkContext(ok(), bounds);
  await checkContext(gz(ok()), bounds);
});

Deno.test("checkContext refuses entries that leave the context, with a 400 naming them", async () => {
  await assert.rejects(
    checkContext(gz(tar(entry("../../etc/cron.d/x", "0", enc.encode("x")))), bounds),
    refused(400, /'\.\.\/\.\.\/etc\/cron\.d\/x'.*leaves the context/),
  );
  await assert.rejects(
    checkContext(tar(entry("/etc/passwd", "0", enc.encode("x"))), bounds),
    refused(400, /'\/etc\/passwd'/),
  );
  await assert.rejects(
    checkContext(tar(entry("a/b/../../../x", "5")), bounds),
    refused(400, /leaves the context/),
  );
  await assert.rejects(
    checkContext(tar(entry("h", "1", new Uint8Array(0), "/etc/shadow")), bounds),
    refused(400, /hard link 'h' to '\/etc\/shadow'/),
  );
  await assert.rejects(
    checkContext(tar(entry("h", "1", new Uint8Array(0), "../outside")), bounds),
    refused(400, /hard link/),
  );
});

Deno.test("checkContext refuses device files and fifos", async () => {
  for (const type of ["3", "4", "6"]) {
    await assert.rejects(
      checkContext(tar(entry("dev/sda", type)), bounds),
      refused(400, new RegExp(`special file \\(tar type '${type}'\\)`)),
    );
  }
});

Deno.test("checkContext bounds the unpacked bytes and the entries (a tar bomb is a 413)", async () => {
  // 4 MB of zeros gzip to a few KB: small upload, big disk.
  await assert.rejects(
    checkContext(gz(tar(entry("zeros", "0", new Uint8Array(4 << 20)))), bounds),
    refused(413, /unpacks to over 1 MB.*DORMICE_TEMPLATE_CONTEXT_LIMIT_MB/),
  );
  const many = Array.from({ length: 101 }, (_, i) => entry(`f${i}`, "0"));
  await assert.rejects(
    checkContext(gz(tar(...many)), bounds),
    refused(413, /over 100 entries/),
  );
});

Deno.test("checkContext refuses a gzip stream that is broken", async () => {
  const bytes = new Uint8Array([0x1f, 0x8b, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
  await assert.rejects(checkContext(new Blob([bytes]).stream(), bounds), refused(400, /no gzip/));
});
