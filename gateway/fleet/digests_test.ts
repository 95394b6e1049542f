import assert from "node:assert/strict";
import { DigestCounts } from "./digests.ts";

function counts() {
  const calls: string[] = [];
  const c = new DigestCounts({
    differs: (id, digest, reference) => calls.push(`differs ${id} ${digest}/${reference}`),
    agrees: (id) => calls.push(`agrees ${id}`),
  });
  return { c, calls };
}

Deno.test("DigestCounts: a check-in that keeps its digest judges nobody", () => {
  const { c, calls } = counts();
  for (let i = 0; i < 100; i++) c.set(`n${i}`, "d1");
  calls.length = 0;
  c.set("n42", "d1");
  assert.deepEqual(calls, [], "a settled check-in is O(1): no node is judged again");
  assert.equal(c.counted, 100);
});

Deno.test("DigestCounts: the divergent node is warned of the moment it appears, and cleared", () => {
  const { c, calls } = counts();
  c.set("a", "d1");
  c.set("b", "d1");
  calls.length = 0;
  c.set("c", "d2");
  assert.deepEqual(calls, ["differs c d2/d1"]);
  assert.equal(c.mismatched("c"), true);
  assert.equal(c.mismatched("a"), false);
  c.set("c", "d1");
  assert.deepEqual(calls, ["differs c d2/d1", "agrees c"]);
  assert.equal(c.mismatched("c"), false);
  // A node that stops sending a digest is not counted and not mismatched.
  c.set("c", null);
  assert.equal(c.counted, 2);
});

Deno.test("DigestCounts: a tie keeps the reference; a majority moves it and judges everyone", () => {
  const { c, calls } = counts();
  c.set("a", "old");
  c.set("b", "new");
  assert.equal(c.reference, "old", "the first digest counted wins a tie");
  c.set("c", "new");
  assert.equal(c.reference, "new");
  assert.ok(calls.includes("differs a old/new"), "the old majority is now the one set apart");
  assert.ok(calls.includes("agrees b") && calls.includes("agrees c"));
  c.drop("c");
  assert.equal(c.reference, "new", "one each: the reference stays, nothing flaps");
  assert.equal(c.mismatched("a"), true);
});

Deno.test("DigestCounts: a node that goes down no longer counts, and its warning is cleared", () => {
  const { c, calls } = counts();
  c.set("a", "d1");
  c.set("b", "d1");
  c.set("c", "d2");
  calls.length = 0;
  c.drop("c");
  assert.deepEqual(calls, ["agrees c"]);
  assert.equal(c.mismatched("c"), false);
  c.drop("a");
  c.drop("b");
  assert.equal(c.reference, null);
  c.drop("nobody"); // an unknown id is no change
});
