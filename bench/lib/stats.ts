/**
 * Small statistics and the markdown report for the benchmark harness.
 *
 * @module
 */

/** One figure measured once per run, with its ratio to the section's reference in that run. */
export interface Row {
  /** What was measured. */
  label: string;
  /** The unit of `values`. */
  unit: string;
  /** One value per run. */
  values: number[];
  /** value ÷ reference, per run (the same run's reference); empty when not meaningful. */
  ratios: number[];
  /** The target as the section states it, if any. */
  target?: string;
  /** Whether the median meets the target. */
  met?: boolean;
  /** Digits after the point for values (default: chosen by magnitude). */
  digits?: number;
}

/** One benchmark: a table of rows, the reference it is measured against, and notes. */
export interface Section {
  /** The heading. */
  title: string;
  /** What every ratio in this table is divided by, and why that reference. */
  reference: string;
  /** Rows, the reference first. */
  rows: Row[];
  /** Extra lines (causes, caveats). */
  notes: string[];
  /** Set when the benchmark could not run, with the reason. */
  skipped?: string;
}

/** The median of `xs` (mean of the two middle values for an even count). */
export function median(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** The `p`-th percentile (0–100) of `xs`, nearest rank. */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * s.length);
  return s[Math.min(s.length - 1, Math.max(0, rank - 1))];
}

/** Formats a number with a precision that suits its size. */
export function fmt(x: number, digits?: number): string {
  if (!Number.isFinite(x)) return String(x);
  if (digits !== undefined) return x.toFixed(digits);
  const a = Math.abs(x);
  if (a >= 1000) return Math.round(x).toLocaleString("en-US");
  if (a >= 100) return x.toFixed(0);
  if (a >= 10) return x.toFixed(1);
  if (a >= 1) return x.toFixed(2);
  return x.toFixed(3);
}

/** A row from per-run values and the per-run reference values. */
export function row(
  label: string,
  unit: string,
  values: number[],
  reference: number[] | null,
  extra: Partial<Row> = {},
): Row {
  const ratios = reference === null ? [] : values.map((v, i) => v / reference[i]);
  return { label, unit, values, ratios, ...extra };
}

function renderSection(s: Section): string {
  const out = [`## ${s.title}`, ""];
  if (s.skipped) {
    out.push(`Skipped: ${s.skipped}`, "");
    return out.join("\n");
  }
  out.push(`Reference: ${s.reference}`, "");
  out.push(
    "| measure | unit | median | min–max | runs | ratio to reference (median, min–max) | target | met |",
    "|---|---|---:|---:|---:|---:|---|---|",
  );
  for (const r of s.rows) {
    const lo = Math.min(...r.values), hi = Math.max(...r.values);
    const ratio = r.ratios.length === 0
      ? "—"
      : `${fmt(median(r.ratios), 2)} (${fmt(Math.min(...r.ratios), 2)}–${
        fmt(Math.max(...r.ratios), 2)
      })`;
    const met = r.met === undefined ? "" : r.met ? "yes" : "**no**";
    out.push(
      `| ${r.label} | ${r.unit} | ${fmt(median(r.values), r.digits)} | ${fmt(lo, r.digits)}–${
        fmt(hi, r.digits)
      } | ${r.values.length} | ${ratio} | ${r.target ?? ""} | ${met} |`,
    );
  }
  out.push("");
  for (const n of s.notes) out.push(`- ${n}`);
  if (s.notes.length) out.push("");
  return out.join("\n");
}

/** The whole RESULTS.md: the machine, then one table per section. */
export function renderReport(machine: Record<string, string>, sections: Section[]): string {
  const out = [
    "# Benchmark results",
    "",
    "Written by `deno task bench` (bench/run.ts); do not edit by hand. Every figure is the median",
    "of the runs shown, with min–max; ratios divide each run's value by the reference measured in",
    "the same run, because absolute numbers drift between runs on shared machines and ratios hold.",
    "",
    "| machine | |",
    "|---|---|",
    ...Object.entries(machine).map(([k, v]) => `| ${k} | ${v} |`),
    "",
  ];
  for (const s of sections) out.push(renderSection(s));
  return out.join("\n");
}

/**
 * RESULTS.md after a partial run (`--only`): the previous report with the sections that ran
 * replaced (or appended), each saying when and under what load it was measured on its own, and
 * everything else, machine table included, kept as the full run wrote it.
 */
export function mergeReport(
  previous: string,
  machine: Record<string, string>,
  sections: Section[],
): string {
  const [head, ...chunks] = previous.split(/^(?=## )/m);
  // The runs a section made: its table's (a section may make more than asked, e.g. at least 7).
  const runsOf = (s: Section) => {
    const n = s.rows.length > 0 ? Math.max(...s.rows.map((r) => r.values.length)) : machine.runs;
    return `${n} run${String(n) === "1" ? "" : "s"}`;
  };
  const when = (s: Section) =>
    `Measured on its own (\`bench/run.ts --only\`): ${machine.date}, load average at ` +
    `start ${machine["load average at start"]}, ${runsOf(s)}; the machine table above is ` +
    "the last full run's.";
  const fresh = new Map(
    sections.map((s) => [s.title, renderSection({ ...s, notes: [...s.notes, when(s)] })]),
  );
  const out = [head.trimEnd() + "\n"];
  for (const chunk of chunks) {
    const title = chunk.slice(3, chunk.indexOf("\n")).trim();
    out.push(fresh.get(title) ?? chunk.trimEnd() + "\n");
    fresh.delete(title);
  }
  out.push(...fresh.values());
  return out.join("\n");
}

/**
 * The least-squares line `y = a + b x` through the points (`b` is 0 when every x is the same).
 *
 * @example
 * ```ts
 * fitLine([0, 1, 2], [1, 3, 5]); // { a: 1, b: 2 }
 * ```
 */
export function fitLine(xs: readonly number[], ys: readonly number[]): { a: number; b: number } {
  const n = xs.length;
  const mx = xs.reduce((s, x) => s + x, 0) / n, my = ys.reduce((s, y) => s + y, 0) / n;
  let sxy = 0, sxx = 0;
  for (let i = 0; i < n; i++) {
    sxy += (xs[i] - mx) * (ys[i] - my);
    sxx += (xs[i] - mx) ** 2;
  }
  const b = sxx === 0 ? 0 : sxy / sxx;
  return { a: my - b * mx, b };
}
