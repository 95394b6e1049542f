import assert from "node:assert/strict";
import { KeyedLimiter } from "./node_limit.ts";

function gate() {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

Deno.test("KeyedLimiter.run() holds a key to its limit and admits waiters in order", async () => {
  const limiter = new KeyedLimiter(2);
  const gates = [gate(), gate(), gate(), gate()];
  const order: number[] = [];
  const runs = gates.map((g, i) =>
    limiter.run("a", undefined, async () => {
      order.push(i);
      await g.promise;
    })
  );
  await Promise.resolve();
  assert.deepEqual(order, [0, 1]);
  assert.equal(limiter.running("a"), 2);
  assert.equal(limiter.waiting("a"), 2);
  gates[1].open();
  await runs[1];
  await Promise.resolve();
  assert.deepEqual(order, [0, 1, 2]);
  for (const g of gates) g.open();
  await Promise.all(runs);
  assert.equal(limiter.running("a"), 0);
  assert.equal(limiter.waiting("a"), 0);
});

Deno.test("KeyedLimiter.run() keeps keys independent", async () => {
  const limiter = new KeyedLimiter(1);
  const g = gate();
  const held = limiter.run("a", undefined, () => g.promise);
  let other = false;
  await limiter.run("b", undefined, () => {
    other = true;
    return Promise.resolve();
  });
  assert.equal(other, true);
  g.open();
  await held;
});

Deno.test("KeyedLimiter.run() lets a waiter whose signal aborts leave the queue", async () => {
  const limiter = new KeyedLimiter(1);
  const g = gate();
  const held = limiter.run("a", undefined, () => g.promise);
  const leaving = new AbortController();
  let ran = false;
  const waiter = limiter.run("a", leaving.signal, () => {
    ran = true;
    return Promise.resolve();
  });
  leaving.abort(new Error("deadline"));
  await assert.rejects(waiter, /deadline/);
  assert.equal(limiter.waiting("a"), 0);
  g.open();
  await held;
  assert.equal(ran, false);
  assert.equal(limiter.running("a"), 0);
});

Deno.test("KeyedLimiter.run() releases the slot when a task throws", async () => {
  const limiter = new KeyedLimiter(1);
  await assert.rejects(limiter.run("a", undefined, () => Promise.reject(new Error("x"))), /x/);
  assert.equal(await limiter.run("a", undefined, () => Promise.resolve(7)), 7);
});

Deno.test("new KeyedLimiter() refuses a limit that is not a positive integer", () => {
  assert.throws(() => new KeyedLimiter(0), /'limit' must be a positive integer: received 0/);
});
