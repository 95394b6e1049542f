import assert from "node:assert/strict";
import { compareListCursors, decodeListCursor, encodeListCursor } from "./list_cursor.ts";
import { HttpError } from "./http_error.ts";

Deno.test("encodeListCursor() round-trips through decodeListCursor() in URL-safe characters", () => {
  const cursor = { createdAt: "2026-12-01T02:07:47.513Z", id: "sbx_olf4gmih3aiuc77zzezl??>>" };
  const token = encodeListCursor(cursor);
  assert.match(token, /^[A-Za-z0-9_-]+$/);
  assert.deepEqual(decodeListCursor(token, "node"), cursor);
});

Deno.test("decodeListCursor() is a 400 naming the issuer for a token it did not issue", () => {
  for (const bad of ["%%%", btoa("[1,2]"), btoa('["not a date","x"]')]) {
    assert.throws(
      () => decodeListCursor(bad, "gateway"),
      (e: unknown) =>
        e instanceof HttpError && e.status === 400 && /this gateway issued/.test(e.message),
    );
  }
});

Deno.test("compareListCursors() orders by start time, then id", () => {
  const early = { createdAt: "2026-01-01T00:00:00Z", id: "z" };
  const late = { createdAt: "2026-01-01T00:00:01Z", id: "a" };
  assert.ok(compareListCursors(early, late) < 0);
  assert.ok(compareListCursors(late, early) > 0);
  assert.equal(compareListCursors(early, { ...early, id: "a" }), 1);
  assert.equal(compareListCursors(early, early), 0);
});
