/**
 * Instructions a request, counted by valgrind's callgrind: `bench/probes/lane_js.ts`'s lane (the bytes
 * engine and lane over in-process stand-ins for the sockets) and its floor, each run twice with a
 * different number of requests, the difference over the requests between. A count of
 * instructions does not move with the host: on these machines the wall-clock tools read a change
 * of a few percent as noise (`bench/probes/lane_js.ts`'s runs of one tree spread from 1.9 to 4.8× the
 * floor on one host, measured on 2026-12-02), where three counts of one tree here spread by about
 * 5 % (the lane 76,950 to 80,819 instructions a request): enough for a change of several percent,
 * not for one op call.
 * What it cannot see is what instructions do not say: cache misses, the kernel, the other
 * processes. So a change is priced here first, then on the wire (`bench/probes/head_to_head.ts`).
 *
 * Not a section of RESULTS.md: a tool for before/after figures. Needs valgrind; each
 * tree takes a few minutes, valgrind running the runtime some 200 times slower.
 *
 * `deno run -A bench/probes/lane_ir.ts [<tree> ...] [--requests=2000,20000]`
 *
 * @module
 */
import { treeBenchFile } from "../lib/fixtures.ts";
const flag = (name: string, fallback: string) =>
  Deno.args.find((a) => a.startsWith(`--${name}=`))?.slice(name.length + 3) ?? fallback;
const [few, many] = flag("requests", "2000,20000").split(",").map(Number);
const trees = Deno.args.filter((a) => !a.startsWith("--"));
if (!(few > 0 && many > few)) {
  console.error("Give --requests=<fewer>,<more>, e.g. --requests=2000,20000");
  Deno.exit(2);
}

/** What callgrind printed as the instructions it counted (`Collected : <n>`), or NaN. */
export function collected(text: string): number {
  const m = /Collected\s*:\s*(\d+)/.exec(text);
  return m ? Number(m[1]) : NaN;
}

/** Instructions of one `lane_js.ts` run of `tree` with `requests` a run (one warm-up, one run). */
async function count(tree: string, only: string, requests: number): Promise<number> {
  const out = await new Deno.Command("valgrind", {
    args: [
      "--tool=callgrind",
      "--callgrind-out-file=/dev/null",
      // V8 writes the code it runs: callgrind must see each write to it.
      "--smc-check=all-non-file",
      Deno.execPath(),
      "run",
      // No compiler or collector thread: what is optimized, and when, follows the work done, not
      // how the threads were scheduled (without it two counts of one tree differed by 2x).
      "--v8-flags=--predictable",
      "--allow-env",
      "--allow-read",
      treeBenchFile(tree, "probes/lane_js.ts", "_lane_js.ts"),
      `--only=${only}`,
      "--runs=1",
      `--requests=${requests}`,
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stderr) + new TextDecoder().decode(out.stdout);
  const n = collected(text);
  if (!out.success || !Number.isFinite(n)) {
    throw new Error(`callgrind of ${tree} (${only}, ${requests}) failed: ${text.slice(-1500)}`);
  }
  return n;
}

if (import.meta.main) {
  try {
    await new Deno.Command("valgrind", { args: ["--version"], stdout: "null" }).output();
  } catch {
    console.log("Not measured: valgrind is not installed (apt-get install valgrind)");
    Deno.exit(0);
  }
  const here = new URL("../..", import.meta.url).pathname.replace(/\/$/, "");
  for (const tree of trees.length > 0 ? trees : [here]) {
    const per: Record<string, number> = {};
    for (const only of ["lane", "floor"]) {
      // The connections' share of requests rounds each count up to a multiple of 32.
      const [a, b] = await Promise.all([count(tree, only, few), count(tree, only, many)]);
      const requests = 2 * (Math.ceil(many / 32) - Math.ceil(few / 32)) * 32;
      per[only] = (b - a) / requests;
    }
    console.log(
      `${tree}: lane ${per.lane.toFixed(0)} instructions a request, floor ` +
        `${per.floor.toFixed(0)}, lane × floor ${(per.lane / per.floor).toFixed(3)}`,
    );
  }
}
