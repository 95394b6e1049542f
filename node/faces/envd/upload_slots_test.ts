import assert from "node:assert/strict";
import { HttpError } from "../../../shared/http_error.ts";
import { UploadSlots } from "./upload_slots.ts";

Deno.test("UploadSlots.acquire() hands a freed slot to the first waiter, never past the bound", async () => {
  const slots = new UploadSlots({ concurrent: 2, queued: 5 });
  const a = await slots.acquire();
  const b = await slots.acquire();
  const order: string[] = [];
  const c = slots.acquire().then((release) => (order.push("c"), release));
  const d = slots.acquire().then((release) => (order.push("d"), release));
  assert.equal(slots.active, 2);
  assert.equal(slots.waiting, 2);
  a();
  a(); // a second call gives back nothing more
  const releaseC = await c;
  assert.deepEqual(order, ["c"]);
  assert.equal(slots.active, 2);
  b();
  (await d)();
  releaseC();
  assert.equal(slots.active, 0);
  assert.equal(slots.waiting, 0);
});

Deno.test("UploadSlots.acquire() refuses with a 503 past the queue, past the wait, and a 499 when the client leaves", async () => {
  const slots = new UploadSlots({ concurrent: 1, queued: 1, waitMs: 10 });
  const held = await slots.acquire();
  const client = new AbortController();
  const waiting = slots.acquire(client.signal);
  const full = await slots.acquire().catch((e) => e);
  assert.ok(full instanceof HttpError);
  assert.equal(full.status, 503);
  assert.equal(full.headers["retry-after"], "2");
  client.abort();
  const left = await waiting.catch((e) => e);
  assert.equal(left.status, 499);
  assert.equal(slots.waiting, 0, "a waiter that left must not keep its place");
  const late = await slots.acquire().catch((e) => e);
  assert.equal(late.status, 503, "the wait ran out");
  assert.equal(slots.waiting, 0);
  held();
  assert.equal(slots.active, 0);
  assert.throws(() => new UploadSlots({ concurrent: 0 }), RangeError);
});
