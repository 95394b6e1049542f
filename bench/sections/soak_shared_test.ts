import assert from "node:assert/strict";
import { causeOf, existedThroughout } from "./soak_shared.ts";

Deno.test("existedThroughout() counts a 404 as stale only when the name lived for the whole exchange", () => {
  const windows = [{ since: 10, until: 20 }, { since: 30, until: Infinity }];
  assert.equal(existedThroughout(windows, 12, 18), true);
  assert.equal(existedThroughout(windows, 31, 1000), true, "the name's current life");
  assert.equal(existedThroughout(windows, 8, 12), false, "sent before the name was made");
  assert.equal(existedThroughout(windows, 18, 22), false, "answered after its destroy was sent");
  assert.equal(existedThroughout(windows, 18, 32), false, "across a destroy and a new make");
  assert.equal(existedThroughout([], 1, 2), false);
});

Deno.test("causeOf() blanks names and numbers so alike 503s add up", () => {
  assert.equal(
    causeOf("Node 'soak-node-1' did not answer a health check within 2000 ms"),
    "Node '…' did not answer a health check within N ms",
  );
  assert.equal(causeOf({ code: 503 }), '{"code":N}');
  assert.equal(causeOf(undefined), '""');
});
