import assert from "node:assert/strict";
import { BodyMemo } from "./body_memo.ts";

const bytes = (text: string) => new TextEncoder().encode(text);

Deno.test("BodyMemo gives back what was remembered for the same verb and the same bytes", () => {
  const memo = new BodyMemo<{ name: string; env?: Record<string, string> }>();
  const body = bytes('{"name":"a","env":{"K":"v"}}');
  assert.equal(memo.get("exec", body), undefined);
  const value = { name: "a", env: { K: "v" } };
  memo.remember("exec", body, value);
  // A copy of the bytes, as the next request's body is.
  assert.equal(memo.get("exec", body.slice()), value);
  // Frozen with everything in it: the next request gets the same object.
  assert.ok(Object.isFrozen(value) && Object.isFrozen(value.env));
  assert.throws(() => {
    (value.env as Record<string, string>).K = "changed";
  }, TypeError);
});

Deno.test("BodyMemo: bodies in one slot are compared whole, and another verb's is not taken", () => {
  // Every body in slot 0: the slot says where to look, never that it is the same body.
  const memo = new BodyMemo<{ name: string }>({ slotOf: () => 0 });
  memo.remember("exec", bytes('{"name":"a"}'), { name: "a" });
  assert.equal(memo.get("exec", bytes('{"name":"b"}')), undefined, "one byte off");
  assert.equal(memo.get("exec", bytes('{"name":"a" }')), undefined, "one byte longer");
  assert.equal(memo.get("metrics", bytes('{"name":"a"}')), undefined, "another verb");
  assert.deepEqual(memo.get("exec", bytes('{"name":"a"}')), { name: "a" });
  // The slot holds one body: the last remembered replaces it.
  memo.remember("exec", bytes('{"name":"b"}'), { name: "b" });
  assert.equal(memo.get("exec", bytes('{"name":"a"}')), undefined);
  assert.deepEqual(memo.get("exec", bytes('{"name":"b"}')), { name: "b" });
});

Deno.test("BodyMemo keeps only small ASCII bodies, in at most its slots", () => {
  const memo = new BodyMemo<{ name: string }>({ slots: 4, maxBytes: 16 });
  const long = bytes(`{"name":"${"x".repeat(20)}"}`);
  memo.remember("exec", long, { name: "x" });
  assert.equal(memo.get("exec", long), undefined, "past maxBytes");
  const accented = bytes('{"name":"é"}');
  memo.remember("exec", accented, { name: "é" });
  assert.equal(memo.get("exec", accented), undefined, "not ASCII");
  memo.remember("exec", new Uint8Array(0), { name: "" });
  assert.equal(memo.get("exec", new Uint8Array(0)), undefined, "empty");
  // Ten bodies in four slots: at most four are found again.
  const bodies = Array.from({ length: 10 }, (_, i) => bytes(`{"name":"${i}"}`));
  bodies.forEach((b, i) => memo.remember("exec", b, { name: String(i) }));
  const found = bodies.filter((b) => memo.get("exec", b) !== undefined).length;
  assert.ok(found >= 1 && found <= 4, `found ${found}`);
  assert.throws(() => new BodyMemo({ slots: 1000 }), /power of two, received 1000/);
});
