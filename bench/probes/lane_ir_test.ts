import assert from "node:assert/strict";
import { collected } from "./lane_ir.ts";

Deno.test("collected reads the instructions callgrind counted, or NaN when it printed none", () => {
  const tail = "==10365== Events    : Ir\n==10365== Collected : 1406989722\n==10365== \n" +
    "==10365== I   refs:      1,406,989,722\n";
  assert.equal(collected(tail), 1406989722);
  assert.ok(Number.isNaN(collected("valgrind: the 'callgrind' tool failed")));
});
