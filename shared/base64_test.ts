import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { BASE64_SLICE_CHARS, decodeBase64InSlices, isStandardBase64 } from "./base64.ts";

Deno.test("isStandardBase64() takes padded base64 and refuses the rest", () => {
  for (const good of ["", "aGk=", "aGk/", "YQ==", "QUJD+/9z"]) {
    assert.ok(isStandardBase64(good), good);
  }
  for (
    const bad of ["a", "aGk", "aG k", "aGk=\n", "Y===", "QU=D", "QUJD!", "QUé=", "====", "aGk-"]
  ) {
    assert.ok(!isStandardBase64(bad), bad);
  }
});

Deno.test("isStandardBase64() checks 24 MiB in one go, where a quantum regex overflowed", () => {
  const big = "QUJD".repeat(6 * 1024 * 1024);
  assert.ok(isStandardBase64(big));
  assert.ok(!isStandardBase64(big.slice(0, -4) + "QU!D"));
});

Deno.test("decodeBase64InSlices() decodes across slices, yielding between them", async () => {
  const bytes = new Uint8Array((3 * BASE64_SLICE_CHARS) / 4 * 3 + 2).map((_, i) => i * 31 % 251);
  const text = Buffer.from(bytes).toString("base64");
  let now = 0, yields = 0;
  const out = await decodeBase64InSlices(text, {
    sliceMs: 1,
    now: () => now++,
    yieldToLoop: () => (yields++, Promise.resolve()),
  });
  assert.deepEqual(out, bytes);
  assert.ok(yields >= 3, `${yields} yields`);
});

Deno.test("decodeBase64InSlices() refuses padding before the end and bad characters, naming where", async () => {
  const slice = "QUJD".repeat(BASE64_SLICE_CHARS / 4);
  const midPadding = slice.slice(0, -4) + "QQ==" + "QUJD";
  await assert.rejects(decodeBase64InSlices(midPadding), /characters 0 to 524287 are not/);
  await assert.rejects(decodeBase64InSlices(slice + "QU D"), /characters 524288 to 524291/);
  await assert.rejects(decodeBase64InSlices("abc"), /length \(3\) is not a multiple of 4/);
  assert.deepEqual(await decodeBase64InSlices(""), new Uint8Array());
});
