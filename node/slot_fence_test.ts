import assert from "node:assert/strict";
import { HttpError } from "../shared/http_error.ts";
import { slotTokenOf } from "../shared/slot_token.ts";
import { SlotFence } from "./slot_fence.ts";

Deno.test("SlotFence refuses a build whose token is older than one seen for the name", () => {
  const fence = new SlotFence();
  fence.saw("acme/agent-1", 15);
  fence.saw("acme/agent-1", 12); // an older lookup lowers nothing
  assert.throws(
    () => fence.admit("acme/agent-1", 10),
    (e) =>
      e instanceof HttpError && e.status === 409 &&
      /holds slot token 10 for 'acme\/agent-1', but another gateway took the name's slot since \(token 15\)/
        .test(e.message) &&
      /Retry/.test(e.message),
  );
  fence.admit("acme/agent-1", 15); // the take that was seen
  fence.admit("acme/agent-1", 20);
  assert.throws(() => fence.admit("acme/agent-1", 15), HttpError);
  // Other names, and creates with no token (one gateway, no etcd), are not fenced.
  fence.admit("acme/agent-2", 1);
  fence.admit("acme/agent-1", undefined);
});

Deno.test("SlotFence remembers at most maxNames, the least recently heard going first", () => {
  const fence = new SlotFence({ maxNames: 2 });
  fence.saw("a", 5);
  fence.saw("b", 5);
  fence.saw("a", 6); // heard again: now the most recent
  fence.saw("c", 5);
  assert.equal(fence.size, 2);
  assert.throws(() => fence.admit("a", 1), HttpError);
  fence.admit("b", 1); // forgotten: unfenced
});

Deno.test("slotTokenOf() reads x-dormice-slot-token, and refuses what is not a revision", () => {
  assert.equal(slotTokenOf(new Headers()), undefined);
  assert.equal(slotTokenOf(new Headers({ "x-dormice-slot-token": "42" })), 42);
  for (const bad of ["-1", "1.5", "abc", "12345678901234567"]) {
    assert.throws(
      () => slotTokenOf(new Headers({ "x-dormice-slot-token": bad })),
      (e) =>
        e instanceof HttpError && e.status === 400 &&
        /X-Dormice-Slot-Token must be a decimal integer/.test(e.message),
    );
  }
});
