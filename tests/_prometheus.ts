/**
 * A strict parser of the Prometheus text exposition format (0.0.4), for tests: every line must be
 * a `# HELP`, a `# TYPE` or a sample of a family whose TYPE came first, names and label names
 * must be legal, label values properly quoted, and values numbers. It throws naming the line
 * that breaks a rule, so a test fails on an exposition Prometheus would refuse.
 *
 * @module
 */

/** One sample line. */
export interface Sample {
  /** The sample's name (a histogram's `_bucket`, `_sum`, `_count` included). */
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** A parsed exposition. */
export interface Exposition {
  samples: Sample[];
  /** Family name → its TYPE. */
  types: Map<string, string>;
  /** Family name → its HELP. */
  help: Map<string, string>;
  /** The value of the one sample named `name` whose labels include `labels`; 0 when none. */
  value(name: string, labels?: Record<string, string>): number;
  /** Every label value in the exposition. */
  labelValues(): string[];
}

const metricName = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const labelName = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/** Parses `text`, throwing on the first line that breaks the format. */
export function parsePrometheus(text: string): Exposition {
  const samples: Sample[] = [];
  const types = new Map<string, string>();
  const help = new Map<string, string>();
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const where = `line ${i + 1} '${line}'`;
    if (line.trim() === "") continue;
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) (\S+) (.*)$/.exec(line);
      if (!m) continue; // a plain comment
      if (!metricName.test(m[2])) throw new Error(`Bad metric name at ${where}`);
      if (m[1] === "TYPE") {
        if (!["counter", "gauge", "histogram", "summary", "untyped"].includes(m[3])) {
          throw new Error(`Bad TYPE at ${where}`);
        }
        if (types.has(m[2])) throw new Error(`Second TYPE for ${m[2]} at ${where}`);
        types.set(m[2], m[3]);
      } else help.set(m[2], m[3]);
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)( -?\d+)?$/.exec(line);
    if (!m) throw new Error(`Not a sample at ${where}`);
    const labels = m[3] === undefined ? {} : parseLabels(m[3], where);
    const value = parseValue(m[4], where);
    const family = familyOf(m[1], types);
    if (family === undefined) throw new Error(`Sample before its TYPE at ${where}`);
    samples.push({ name: m[1], labels, value });
  }
  return {
    samples,
    types,
    help,
    value(name, want = {}) {
      const found = samples.filter((s) =>
        s.name === name && Object.entries(want).every(([k, v]) => s.labels[k] === v)
      );
      return found.reduce((sum, s) => sum + s.value, 0);
    },
    labelValues() {
      return samples.flatMap((s) => Object.values(s.labels));
    },
  };
}

function familyOf(name: string, types: Map<string, string>): string | undefined {
  if (types.has(name)) return name;
  for (const suffix of ["_bucket", "_sum", "_count"]) {
    if (name.endsWith(suffix)) {
      const base = name.slice(0, -suffix.length);
      const t = types.get(base);
      if (t === "histogram" || t === "summary") return base;
    }
  }
  return undefined;
}

function parseValue(raw: string, where: string): number {
  if (raw === "+Inf") return Infinity;
  if (raw === "-Inf") return -Infinity;
  if (raw === "NaN") return NaN;
  const n = Number(raw);
  if (raw === "" || Number.isNaN(n)) throw new Error(`Bad value at ${where}`);
  return n;
}

function parseLabels(body: string, where: string): Record<string, string> {
  const labels: Record<string, string> = {};
  let i = 0;
  while (i < body.length) {
    const eq = body.indexOf("=", i);
    if (eq === -1) throw new Error(`Bad labels at ${where}`);
    const name = body.slice(i, eq);
    if (!labelName.test(name)) throw new Error(`Bad label name '${name}' at ${where}`);
    if (body[eq + 1] !== '"') throw new Error(`Unquoted label value at ${where}`);
    let j = eq + 2;
    let value = "";
    for (; j < body.length && body[j] !== '"'; j++) {
      if (body[j] === "\\") {
        const next = body[++j];
        if (next === "n") value += "\n";
        else if (next === "\\" || next === '"') value += next;
        else throw new Error(`Bad escape in a label value at ${where}`);
      } else value += body[j];
    }
    if (body[j] !== '"') throw new Error(`Unterminated label value at ${where}`);
    if (name in labels) throw new Error(`Label '${name}' twice at ${where}`);
    labels[name] = value;
    i = j + 1;
    if (body[i] === ",") i++;
    else if (i < body.length) throw new Error(`Bad label separator at ${where}`);
  }
  return labels;
}
