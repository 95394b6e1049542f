import assert from "node:assert/strict";
import { parseProcStat } from "./fixtures.ts";

Deno.test("parseProcStat reads the machine's busy, idle and steal time from the cpu line", () => {
  const text = "cpu  100 3 50 800 20 4 6 17 0 0\ncpu0 50 1 25 400 10 2 3 9 0 0\nintr 1 2\n";
  // busy = user + nice + system + irq + softirq; idle = idle + iowait; ticks of 10 ms.
  assert.deepEqual(parseProcStat(text), { busy: 1630, idle: 8200, steal: 170 });
});

Deno.test("parseProcStat refuses a text without a whole cpu line, naming what it read", () => {
  assert.throws(() => parseProcStat("cpu0 1 2 3\n"), /cpu0 1 2 3/);
  assert.throws(() => parseProcStat("cpu  1 2 x 4 5 6 7 8\n"), /Cannot read the cpu line/);
});
