/**
 * The benchmark harness: runs every benchmark and rewrites bench/RESULTS.md (after
 * each section, so an interrupted run still leaves what it measured).
 *
 * Usage: `deno task bench` (installs wrk and nginx first, through setup.sh, once the arguments
 * are understood), or directly
 * `deno run <permissions> bench/run.ts [--only=placement,lookup,...] [--runs=5]`; with `--only`
 * the other sections of RESULTS.md are kept as the last full run wrote them. `--help` prints
 * the usage; an argument or a section it does not know is refused before anything runs.
 * Sections: placement, lookup, lookup-scale, scale, scale-soak, syn-drop, memory, bursts, shared,
 * shared-digests,
 * bursts-inprocess, forwarding, forwarding-rules, ports, streaming, docker, docker-parallel,
 * e2b-docker, code-interpreter, pools-two-gateways, pools-claim-node, pools-claim-docker, pools-first-command,
 * liveness, soak-shared (5 minutes; `--quick` 20 s), snapshots-docker, templates-docker,
 * egress-docker, volume-images.
 *
 * @module
 */
import { benchUsage, parseBenchArgs, unknownSections } from "./lib/args.ts";
import { mergeReport, renderReport, type Section } from "./lib/stats.ts";
import { runPlacement } from "./sections/placement.ts";
import { runLookup, runSynDrop } from "./sections/lookup.ts";
import { runLookupScale } from "./sections/lookup_scale.ts";
import { runMemory } from "./sections/memory.ts";
import { gatewayTarget, inProcessTarget, runBursts } from "./sections/bursts.ts";
import { startGateway } from "./lib/fixtures.ts";
import { runForwarding } from "./sections/forwarding.ts";
import { runForwardingRules } from "./sections/forwarding_rules.ts";
import { runPorts } from "./sections/ports.ts";
import { runStreaming } from "./sections/streaming.ts";
import { runDocker } from "./sections/docker.ts";
import { runDockerParallel } from "./sections/docker_parallel.ts";
import { runE2bDocker } from "./sections/e2b_docker.ts";
import { runCodeInterpreter } from "./sections/code_interpreter.ts";
import {
  runClaimLatency,
  runFirstCommand,
  runNodeClaim,
  runTwoGateways,
} from "./sections/pools.ts";
import { runShared } from "./sections/shared_mode.ts";
import { runSharedDigests } from "./sections/shared_digests.ts";
import { runLiveness } from "./sections/liveness.ts";
import { runSoakShared } from "./sections/soak_shared.ts";
import { runScale } from "./sections/scale.ts";
import { runScaleSoak } from "./sections/scale_soak.ts";
import { runSnapshotsDocker } from "./sections/snapshots_docker.ts";
import { runTemplatesDocker } from "./sections/templates_docker.ts";
import { runEgressDocker } from "./sections/egress_docker.ts";
import { runVolumeImages } from "./sections/volume_images.ts";

const args = parseBenchArgs(Deno.args);
if (args instanceof Error) {
  console.error(args.message);
  Deno.exit(2);
}
const runs = args.runs;
const only = args.only;
// A quick smoke run's figures are not a measurement: they never overwrite RESULTS.md.
const out = args.out ??
  (args.quick
    ? await Deno.makeTempFile({ prefix: "dormice-bench-quick-", suffix: ".md" })
    : new URL("./RESULTS.md", import.meta.url).pathname);

const benchmarks: [string, () => Promise<Section> | Section][] = [
  ["placement", () => runPlacement({ runs })],
  ["lookup", () => runLookup({ runs })],
  ["lookup-scale", () => runLookupScale({ runs })],
  ["scale", () => runScale({ runs, quick: args.quick })],
  ["scale-soak", () => runScaleSoak({ quick: args.quick })],
  ["syn-drop", () => runSynDrop({ runs })],
  ["memory", () => runMemory({ runs })],
  ["bursts", () =>
    runBursts({
      runs,
      target: async () => {
        const gw = await startGateway();
        const t = gatewayTarget(
          gw.url,
          "through a gateway process (gateway/main.ts), fresh per run",
        );
        return { ...t, close: () => gw.stop() };
      },
    })],
  ["shared", () => runShared({ runs })],
  ["shared-digests", () => runSharedDigests({ runs })],
  ["bursts-inprocess", async () => {
    const s = await runBursts({ runs, target: () => Promise.resolve(inProcessTarget()) });
    return { ...s, title: "Bursts, in-process (the library pieces without the HTTP face)" };
  }],
  ["forwarding", () => runForwarding({ runs })],
  ["forwarding-rules", () => runForwardingRules({ runs })],
  ["ports", () => runPorts({ runs })],
  ["streaming", () => runStreaming({ runs })],
  ["docker", () => runDocker({ runs: Math.max(runs, 7) })],
  ["docker-parallel", () => runDockerParallel({ runs: Math.max(runs, 3) })],
  ["e2b-docker", () => runE2bDocker({ runs: Math.max(runs, 7) })],
  ["code-interpreter", () => runCodeInterpreter({ runs: Math.max(runs, 5) })],
  ["pools-two-gateways", () => runTwoGateways({ runs })],
  ["pools-claim-node", () => runNodeClaim({ runs })],
  ["pools-claim-docker", () => runClaimLatency({ runs: Math.max(runs, 7) })],
  ["pools-first-command", () => runFirstCommand({ runs: Math.max(runs, 7) })],
  ["liveness", () => runLiveness({ runs })],
  ["soak-shared", () => runSoakShared({ durationMs: args.quick ? 20_000 : 5 * 60_000 })],
  ["snapshots-docker", () => runSnapshotsDocker({ runs: Math.max(runs, 5) })],
  ["templates-docker", () => runTemplatesDocker({ runs: Math.max(runs, 5) })],
  ["egress-docker", () => runEgressDocker({ runs: Math.max(runs, 7) })],
  ["volume-images", () => runVolumeImages({ runs: Math.max(runs, 7) })],
];

const names = benchmarks.map(([name]) => name);
if (args.help) {
  console.log(benchUsage(names));
  Deno.exit(0);
}
const refusal = unknownSections(only, names);
if (refusal !== undefined) {
  console.error(refusal);
  Deno.exit(2);
}

// Only now, with the arguments understood: setup.sh may apt-get install as root, which a
// --help or a typo must never set off.
const setup = await new Deno.Command("sh", {
  args: [new URL("./setup.sh", import.meta.url).pathname],
  stdout: "inherit",
  stderr: "inherit",
}).output();
if (!setup.success) {
  console.error(`bench: bench/setup.sh failed (exit ${setup.code}); nothing was measured`);
  Deno.exit(1);
}

// A partial run keeps the sections it did not run, as the last full run measured them.
const previous = only ? await Deno.readTextFile(out).catch(() => null) : null;

/** Output of a command, trimmed; Deno refuses to read /proc/cpuinfo without --allow-all. */
async function shell(command: string): Promise<string> {
  try {
    const out = await new Deno.Command("sh", { args: ["-c", command], stderr: "null" }).output();
    return new TextDecoder().decode(out.stdout).trim() || "unknown";
  } catch {
    return "unknown";
  }
}

const machine: Record<string, string> = {
  date: new Date().toISOString(),
  nproc: await shell("nproc"),
  cpu: await shell("sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1"),
  deno: `${Deno.version.deno} (V8 ${Deno.version.v8})`,
  os: `${Deno.build.os} ${Deno.osRelease()}`,
  "load average at start": Deno.loadavg().map((x) => x.toFixed(2)).join(" "),
  runs: String(runs),
};

const sections: Section[] = [];
const t0 = performance.now();
for (const [name, run] of benchmarks) {
  if (only && !only.includes(name)) continue;
  const started = performance.now();
  console.error(`bench: ${name}…`);
  try {
    sections.push(await run());
  } catch (error) {
    const message = error instanceof Error ? error.message : String(error);
    console.error(`bench: ${name} failed: ${message}`);
    sections.push({
      title: name,
      reference: "",
      rows: [],
      notes: [],
      skipped: `failed in this run: ${message.slice(0, 600)}`,
    });
  }
  console.error(`bench: ${name} took ${((performance.now() - started) / 1000).toFixed(1)} s`);
  machine["total time"] = `${((performance.now() - t0) / 1000).toFixed(0)} s`;
  await Deno.writeTextFile(
    out,
    previous ? mergeReport(previous, machine, sections) : renderReport(machine, sections),
  );
}
console.log(renderReport(machine, sections));
