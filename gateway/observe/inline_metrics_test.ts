import assert from "node:assert/strict";
import { Registry } from "prom-client";
import { InlineCounter, InlineHistogram } from "./inline_metrics.ts";

Deno.test("InlineHistogram writes cumulative buckets, +Inf, sum and count per series", async () => {
  const registry = new Registry();
  const h = new InlineHistogram(registry, { name: "t_seconds", help: "T", buckets: [0.1, 1] });
  const a = h.series({ face: "a" });
  for (const v of [0.05, 0.5, 0.5, 7]) a.observe(v);
  h.series({ face: "b" });
  const lines = (await registry.metrics()).trim().split("\n");
  assert.deepEqual(lines, [
    "# HELP t_seconds T",
    "# TYPE t_seconds histogram",
    't_seconds_bucket{face="a",le="0.1"} 1',
    't_seconds_bucket{face="a",le="1"} 3',
    't_seconds_bucket{face="a",le="+Inf"} 4',
    't_seconds_sum{face="a"} 8.05',
    't_seconds_count{face="a"} 4',
    't_seconds_bucket{face="b",le="0.1"} 0',
    't_seconds_bucket{face="b",le="1"} 0',
    't_seconds_bucket{face="b",le="+Inf"} 0',
    't_seconds_sum{face="b"} 0',
    't_seconds_count{face="b"} 0',
  ]);
});

Deno.test("InlineCounter escapes label values and refuses a second family of one name", async () => {
  const registry = new Registry();
  const c = new InlineCounter(registry, { name: "n_total", help: "N" });
  c.series({ team: 'a"b\\c' }).value += 2;
  assert.match(await registry.metrics(), /n_total\{team="a\\"b\\\\c"\} 2/);
  assert.throws(() => new InlineCounter(registry, { name: "n_total", help: "again" }));
  assert.throws(
    () => new InlineHistogram(registry, { name: "h", help: "H", buckets: [1, 1] }),
    RangeError,
  );
});
