import assert from "node:assert/strict";
import type { SandboxStats } from "./executors/contract.ts";
import { MetricsHistory } from "./metrics_history.ts";

const sample = (takenAt: number): SandboxStats => ({
  takenAt,
  cpuUsedPct: 1,
  cpuCount: 1,
  memoryUsedBytes: 1,
  memoryLimitBytes: 2,
  diskUsedBytes: 0,
});

Deno.test("MetricsHistory keeps the newest samples up to its cap, in time order", () => {
  const history = new MetricsHistory({ capacity: 3 });
  for (const t of [1, 2, 3, 4, 5]) history.add("a", sample(t * 1000));
  history.add("a", sample(4500)); // older than the last: ignored
  assert.deepEqual(history.range("a").map((s) => s.takenAt), [3000, 4000, 5000]);
  assert.equal(history.latest("a")?.takenAt, 5000);
  assert.deepEqual(history.range("a", 3500, 4000).map((s) => s.takenAt), [4000]);
  assert.deepEqual(history.range("b"), []);
  history.add("b", sample(1));
  assert.deepEqual(history.ids(), ["a", "b"]);
  history.drop("a");
  assert.deepEqual(history.ids(), ["b"]);
  assert.equal(history.latest("a"), undefined);
  assert.throws(() => new MetricsHistory({ capacity: 0 }), RangeError);
});
