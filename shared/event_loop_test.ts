import assert from "node:assert/strict";
import { LoopBudget, yieldToLoop } from "./event_loop.ts";

Deno.test("LoopBudget.pass() yields once a slice of time is used, and starts a new slice", async () => {
  let now = 0;
  let yields = 0;
  const budget = new LoopBudget({
    sliceMs: 10,
    now: () => now,
    yieldToLoop: () => (yields++, Promise.resolve()),
  });
  now = 9;
  await budget.pass();
  assert.equal(yields, 0);
  now = 10;
  await budget.pass();
  assert.equal(yields, 1);
  assert.equal(budget.yields, 1);
  now = 19;
  await budget.pass();
  assert.equal(yields, 1);
  now = 20;
  await budget.pass();
  assert.equal(yields, 2);
});

Deno.test("yieldToLoop() lets a timer that is due run before it resolves", async () => {
  let ran = false;
  setTimeout(() => ran = true, 0);
  await yieldToLoop();
  assert.ok(ran);
});
