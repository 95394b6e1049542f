/**
 * The benchmark harness's command line. A full run takes minutes and rewrites RESULTS.md, so
 * anything it does not understand (`--help`, a typo such as `--onyl=`, an unknown section) must
 * stop it before it starts measuring, never be ignored into a full run.
 *
 * @module
 */

/** What `bench/run.ts` was asked to do. */
export interface BenchArgs {
  /** `--help` (or `-h`): print the usage and measure nothing. */
  help: boolean;
  /**
   * `--quick`: the sections that have one run a short or small version (`soak-shared` 20 s,
   * `scale` and `scale-soak` 20 and 100 nodes); the figures go to a temporary file.
   */
  quick: boolean;
  /** `--runs=<n>`: runs per measurement, 5 by default. */
  runs: number;
  /** `--only=a,b`: the sections to run; the others keep what the last full run wrote. */
  only: string[] | undefined;
  /** `--out=<file>`: where the report goes, RESULTS.md beside the harness by default. */
  out: string | undefined;
}

/**
 * The usage text, with the sections the harness knows.
 *
 * @example
 * ```ts
 * import { benchUsage } from "./args.ts";
 * console.log(benchUsage(["placement", "lookup"]));
 * ```
 */
export function benchUsage(sections: readonly string[]): string {
  return [
    "Usage: deno task bench [--only=<section>,…] [--runs=<n>] [--out=<file>] [--quick]",
    "  --only   run these sections only; RESULTS.md keeps the others as the last full run wrote them",
    "  --runs   runs per measurement (default 5; the Docker sections take at least 7)",
    "  --out    write the report there instead of bench/RESULTS.md",
    "  --quick  a short run of the sections that have one (soak-shared: 20 s, not 5 min;",
    "           scale: 20 and 100 nodes); its figures are not recorded in RESULTS.md",
    `Sections: ${sections.join(", ")}`,
  ].join("\n");
}

/**
 * Reads the harness's arguments; an Error is a sentence naming what is wrong and what to write.
 * The sections `--only` names are checked by {@linkcode unknownSections} once the harness has
 * its list.
 *
 * @example
 * ```ts
 * import { parseBenchArgs } from "./args.ts";
 * parseBenchArgs(["--only=placement", "--runs=3"]);
 * // { help: false, runs: 3, only: ["placement"], out: undefined, quick: false }
 * parseBenchArgs(["--onyl=placement"]) instanceof Error; // true
 * ```
 */
export function parseBenchArgs(argv: string[]): BenchArgs | Error {
  const parsed: BenchArgs = {
    help: false,
    runs: 5,
    only: undefined,
    out: undefined,
    quick: false,
  };
  for (const arg of argv) {
    if (arg === "--help" || arg === "-h") {
      parsed.help = true;
      continue;
    }
    if (arg === "--quick") {
      parsed.quick = true;
      continue;
    }
    const eq = arg.indexOf("=");
    const key = arg.startsWith("--") && eq > 0 ? arg.slice(2, eq) : undefined;
    const value = arg.slice(eq + 1);
    if (key === "runs") {
      const runs = Number(value);
      if (value === "" || !Number.isInteger(runs) || runs < 1) {
        return new Error(`Cannot run with --runs=${value}: give a positive integer (5 or more)`);
      }
      parsed.runs = runs;
    } else if (key === "only") {
      parsed.only = value.split(",").filter((s) => s !== "");
    } else if (key === "out" && value !== "") {
      parsed.out = value;
    } else {
      return new Error(
        `Unknown argument '${arg}': deno task bench takes --only=<section>,…, --runs=<n>, ` +
          "--out=<file>, --quick and --help",
      );
    }
  }
  return parsed;
}

/**
 * The sentence refusing an `--only` that names no known section (a typo would otherwise run
 * nothing and print an empty report), or `undefined` when every name is known.
 *
 * @example
 * ```ts
 * import { unknownSections } from "./args.ts";
 * unknownSections(["placment"], ["placement", "lookup"]);
 * // "--only names no section 'placment': write some of placement, lookup"
 * ```
 */
export function unknownSections(
  only: string[] | undefined,
  sections: readonly string[],
): string | undefined {
  if (only === undefined) return undefined;
  const unknown = only.filter((s) => !sections.includes(s));
  if (only.length > 0 && unknown.length === 0) return undefined;
  const which = unknown.length > 0 ? ` '${unknown.join("', '")}'` : "";
  return `--only names no section${which}: write some of ${sections.join(", ")}`;
}
