import assert from "node:assert/strict";
import { checkInSchema, describeZodError } from "./schemas.ts";

Deno.test("describeZodError() says a wrong-typed field is the wrong type, and only a missing one is required", () => {
  const r = checkInSchema.safeParse({ nodeId: "n1", snapshotRetaken: 5 });
  assert.ok(!r.success);
  const text = describeZodError(r.error);
  assert.match(text, /'snapshotRetaken': Invalid input: expected string, received number/);
  assert.match(text, /'endpoint' is required/);
  assert.doesNotMatch(text, /'snapshotRetaken' is required/);
});
