/**
 * Latency of the Docker executor's life-cycle verbs on this machine: create (container create +
 * start), exec (`/bin/bash -l -c true` to its exit), a 64 KiB file write and read, and destroy
 * (forced remove). Prints a markdown table of the median and the spread of repeated runs.
 *
 * Run: `deno run --allow-env --allow-read --allow-write=/var/run/docker.sock
 *   --allow-net=unix:/var/run/docker.sock --allow-run=iptables bench/children/docker_bench.ts [runs]`
 * (default 15 runs) as root after `.ci/docker.sh` (engine up, images built). Runs on the
 * `minimal` template (busybox).
 *
 * @module
 */
import { DockerExecutor } from "../../node/executors/docker/mod.ts";

const json = Deno.args.includes("--json");
const runsArg = Deno.args.find((a) => !a.startsWith("--"));
const runs = Number(runsArg ?? 15);
if (!Number.isInteger(runs) || runs < 3) {
  console.error(`Cannot run the bench with '${runsArg}' runs: give an integer of 3 or more`);
  Deno.exit(2);
}

const executor = await DockerExecutor.connect({ nodeId: `bench-${Date.now().toString(36)}` });
const samples: Record<string, number[]> = {
  "engine round trip (reference)": [],
  create: [],
  "exec (bash -l -c true)": [],
  "exec (sh -c true)": [],
  "writeFile 64 KiB": [],
  "readFile 64 KiB": [],
  destroy: [],
};

async function time(label: string, fn: () => Promise<unknown>): Promise<void> {
  const started = performance.now();
  await fn();
  samples[label].push(performance.now() - started);
}

async function finish(handle: Awaited<ReturnType<typeof executor.exec>>): Promise<void> {
  await Promise.all([
    new Response(handle.stdout).arrayBuffer(),
    new Response(handle.stderr).arrayBuffer(),
    handle.exited,
  ]);
}

const data = new Uint8Array(64 * 1024).map((_, i) => i & 0xff);
try {
  for (let i = 0; i < runs; i++) {
    const id = `bench-${i}`;
    await time("engine round trip (reference)", () => executor.ping());
    await time(
      "create",
      () => executor.create({ id, name: id, template: "minimal", spec: {}, env: {} }),
    );
    await time(
      "exec (bash -l -c true)",
      async () => finish(await executor.exec(id, { cmd: ["/bin/bash", "-l", "-c", "true"] })),
    );
    await time(
      "exec (sh -c true)",
      async () => finish(await executor.exec(id, { cmd: ["/bin/sh", "-c", "true"] })),
    );
    await time("writeFile 64 KiB", () => executor.writeFile(id, "/tmp/blob", data));
    await time("readFile 64 KiB", () => executor.readFile(id, "/tmp/blob"));
    await time("destroy", () => executor.destroy(id));
  }
} finally {
  for (const id of await executor.list()) await executor.destroy(id);
  await executor.close();
}

const quantile = (values: number[], q: number): number => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
};
if (json) {
  console.log(JSON.stringify(samples));
  Deno.exit(0);
}
const ms = (value: number): string => value.toFixed(1);
console.log(
  `Docker executor, ${runs} runs, ${navigator.hardwareConcurrency} cores, ` +
    `${new Date().toISOString().slice(0, 10)}\n`,
);
console.log("| verb | median ms | min ms | p90 ms |");
console.log("|---|---:|---:|---:|");
for (const [label, values] of Object.entries(samples)) {
  console.log(
    `| ${label} | ${ms(quantile(values, 0.5))} | ${ms(Math.min(...values))} | ${
      ms(quantile(values, 0.9))
    } |`,
  );
}
