import assert from "node:assert/strict";
import { fitLine, mergeReport, renderReport, row, type Section } from "./stats.ts";

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
  assert.match(b, /Measured on its own .*now, load average at start 0\.50 0\.40 0\.30, 1 run;/);
  assert.match(c, /\| x \| ms \| 4\.00 \|/);
  assert.equal(mergeReport(merged, machine, [section("B", 3), section("C", 4)]), merged);
});

Deno.test("mergeReport() says the runs a section made, not the runs asked for", () => {
  const full = renderReport({ date: "then", runs: "5" }, [section("A", 1)]);
  const machine = { date: "now", "load average at start": "0.50 0.40 0.30", runs: "5" };
  const seven: Section = {
    title: "A",
    reference: "a reference",
    rows: [row("x", "ms", [1, 2, 3, 4, 5, 6, 7], [1, 1, 1, 1, 1, 1, 1])],
    notes: [],
  };
  assert.match(mergeReport(full, machine, [seven]), /Measured on its own .*, 7 runs;/);
  assert.match(mergeReport(full, machine, [section("A", 1)]), /Measured on its own .*, 1 run;/);
});

Deno.test("fitLine() finds the least-squares line, and a flat one through equal xs", () => {
  const exact = fitLine([0, 1, 2], [1, 3, 5]);
  assert.equal(exact.a, 1);
  assert.equal(exact.b, 2);
  // Residuals +1, -2, +1 around y = 2 - x: the fit is that line, not one through two points.
  const fitted = fitLine([0, 1, 2], [3, -1, 1]);
  assert.ok(
    Math.abs(fitted.a - 2) < 1e-12 && Math.abs(fitted.b + 1) < 1e-12,
    JSON.stringify(fitted),
  );
  assert.deepEqual(fitLine([4, 4], [1, 3]), { a: 2, b: 0 });
});
