import assert from "node:assert/strict";
import { writeFileRequestSchema, writeFileShapeSchema } from "./native_schemas.ts";

Deno.test("writeFileRequestSchema checks 24 MiB of contentBase64 without overflowing", () => {
  // A regex of base64 quanta threw RangeError (Maximum call stack size exceeded) from 8 MiB on.
  const text = "QUJD".repeat(6 * 1024 * 1024);
  assert.ok(
    writeFileRequestSchema.safeParse({ name: "a", path: "/x", contentBase64: text }).success,
  );
  const bad = writeFileRequestSchema.safeParse({
    name: "a",
    path: "/x",
    contentBase64: text.slice(0, -4) + "QU!D",
  });
  assert.ok(!bad.success);
  assert.match(bad.error.issues[0].message, /is not standard base64/);
});

Deno.test("writeFileShapeSchema checks only contentBase64's length, the node decodes the rest", () => {
  const r = (contentBase64: string) =>
    writeFileShapeSchema.safeParse({ name: "a", path: "/x", contentBase64 }).success;
  assert.ok(r("!!!!"));
  assert.ok(!r("!!"));
});
