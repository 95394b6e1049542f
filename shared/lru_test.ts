import assert from "node:assert/strict";
import { LruCache } from "./lru.ts";

Deno.test("LruCache holds at most its bound and drops the oldest entry first", () => {
  const cache = new LruCache<number, string>({ max: 3 });
  for (let i = 0; i < 10; i++) cache.set(i, `v${i}`);
  assert.equal(cache.size, 3);
  assert.deepEqual([...cache.keys()], [7, 8, 9]);
});

Deno.test("LruCache defaults to 100,000 entries", () => {
  const cache = new LruCache<number, number>();
  assert.equal(cache.max, 100_000);
  for (let i = 0; i < 100_001; i++) cache.set(i, i);
  assert.equal(cache.size, 100_000);
  assert.equal(cache.has(0), false);
  assert.equal(cache.has(100_000), true);
});

Deno.test("LruCache.get() moves a hit to the young end so it survives the next eviction", () => {
  const cache = new LruCache<string, number>({ max: 2 });
  cache.set("a", 1).set("b", 2);
  assert.equal(cache.get("a"), 1);
  cache.set("c", 3);
  assert.equal(cache.has("a"), true);
  assert.equal(cache.has("b"), false);
  assert.deepEqual([...cache.keys()], ["a", "c"]);
});

Deno.test("LruCache.peek() and has() leave recency alone", () => {
  const cache = new LruCache<string, number>({ max: 2 });
  cache.set("a", 1).set("b", 2);
  assert.equal(cache.peek("a"), 1);
  assert.equal(cache.has("a"), true);
  cache.set("c", 3);
  assert.equal(cache.has("a"), false);
});

Deno.test("LruCache.get() of the youngest key again keeps order right after a delete", () => {
  const cache = new LruCache<string, number>({ max: 2 });
  cache.set("a", 1);
  cache.get("a");
  cache.delete("a");
  cache.set("b", 2).set("a", 1);
  cache.get("b");
  cache.set("c", 3);
  assert.deepEqual([...cache.keys()], ["b", "c"]);
});

Deno.test("LruCache.evictIf() removes only when the predicate holds", () => {
  const cache = new LruCache<string, { node: string }>();
  cache.set("x", { node: "a" });
  assert.equal(cache.evictIf("x", (v) => v.node === "b"), false);
  assert.equal(cache.has("x"), true);
  assert.equal(cache.evictIf("x", (v) => v.node === "a"), true);
  assert.equal(cache.has("x"), false);
  assert.equal(cache.evictIf("missing", () => true), false);
});

Deno.test("LruCache.delete() and clear() empty it", () => {
  const cache = new LruCache<string, number>();
  cache.set("a", 1).set("b", 2);
  assert.equal(cache.delete("a"), true);
  assert.equal(cache.delete("a"), false);
  assert.equal(cache.size, 1);
  cache.clear();
  assert.equal(cache.size, 0);
});

Deno.test("LruCache refuses a bound that is not a positive integer", () => {
  assert.throws(() => new LruCache({ max: 0 }), RangeError);
  assert.throws(() => new LruCache({ max: 1.5 }), /positive integer/);
});

Deno.test("LruCache.deleteWhere() removes every matching entry and keeps the rest in order", () => {
  const cache = new LruCache<string, string>({ max: 10 });
  cache.set("a", "n1").set("b", "n2").set("c", "n1").set("d", "n2");
  assert.equal(cache.deleteWhere((node) => node === "n1"), 2);
  assert.deepEqual([...cache.keys()], ["b", "d"]);
  // The youngest was removed too: a later hit on another key still moves it.
  cache.get("b");
  assert.deepEqual([...cache.keys()], ["d", "b"]);
});
