import assert from "node:assert/strict";
import { mergeReport, renderReport, row, type Section } from "./_stats.ts";

const section = (title: string, value: number): Section => ({
  title,
  reference: "a reference",
  rows: [row("x", "ms", [value], [value])],
  notes: [],
});

Deno.test("mergeReport() replaces the sections that ran, keeps the rest, appends new ones", () => {
  const full = renderReport({ date: "then", runs: "5" }, [section("A", 1), section("B", 2)]);
  const machine = { date: "now", "load average at start": "0.50 0.40 0.30", runs: "7" };
  const merged = mergeReport(full, machine, [section("B", 3), section("C", 4)]);
  assert.deepEqual(merged.match(/^## .*/gm), ["## A", "## B", "## C"]);
  assert.match(merged, /\| date \| then \|/, "the full run's machine table stays");
  const [, a, b, c] = merged.split(/^## /m);
  assert.match(a, /\| x \| ms \| 1\.00 \|/);
  assert.doesNotMatch(a, /on its own/);
  assert.match(b, /\| x \| ms \| 3\.00 \|/);
  assert.match(b, /Measured on its own .*now, load average at start 0\.50 0\.40 0\.30, 7 runs/);
  assert.match(c, /\| x \| ms \| 4\.00 \|/);
  assert.equal(mergeReport(merged, machine, [section("B", 3), section("C", 4)]), merged);
});
