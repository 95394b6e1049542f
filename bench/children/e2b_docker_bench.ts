/**
 * The E2B life of one sandbox on Docker, through a gateway, as an agent lives it with the
 * official `e2b` SDK: `Sandbox.create()`, the first command, `kill()`. Each iteration does it on
 * the Debian `base` image and on the busybox `minimal` one (alternating which goes first), and
 * measures one gateway round trip (`GET /healthz`) as the reference. Prints the samples as JSON.
 *
 * The client half of bench/sections/e2b_docker.ts, which starts the gateway and the Docker node: run it
 * through `deno task bench --only=e2b-docker`. Direct use: `deno run --allow-net=127.0.0.1
 * --allow-env --allow-read bench/children/e2b_docker_bench.ts <gateway url> <fleet token> [runs]`.
 *
 * @module
 */
import { Sandbox } from "e2b";

const [gateway, apiKey, runsArg = "7"] = Deno.args;
const runs = Number(runsArg);
if (!gateway || !apiKey || !Number.isInteger(runs) || runs < 1) {
  console.error("Usage: e2b_docker_bench.ts <gateway url> <fleet token> [runs ≥ 1]");
  Deno.exit(2);
}
const opts = { apiUrl: `${gateway}/e2b/api`, sandboxUrl: `${gateway}/e2b/envd`, apiKey };
const templates = ["base", "minimal"] as const;

const samples: Record<string, number[]> = { "gateway round trip, GET /healthz (reference)": [] };
for (const label of ["create", "first command (echo)", "python3 -c", "kill"]) {
  for (const template of templates) {
    if (label === "python3 -c" && template === "minimal") continue;
    samples[`${label}, ${template}`] = [];
  }
}

async function time(label: string, fn: () => Promise<unknown>): Promise<void> {
  const started = performance.now();
  await fn();
  samples[label].push(performance.now() - started);
}

async function life(template: (typeof templates)[number]): Promise<void> {
  let sandbox!: Sandbox;
  await time(`create, ${template}`, async () => sandbox = await Sandbox.create(template, opts));
  try {
    await time(`first command (echo), ${template}`, async () => {
      const r = await sandbox.commands.run("echo hi");
      if (r.stdout !== "hi\n") throw new Error(`echo printed '${r.stdout}'`);
    });
    if (template === "base") {
      await time("python3 -c, base", async () => {
        const r = await sandbox.commands.run("python3 -c 'print(1+1)'");
        if (r.stdout !== "2\n") throw new Error(`python3 printed '${r.stdout}'`);
      });
    }
  } finally {
    await time(`kill, ${template}`, () => sandbox.kill());
  }
}

for (let i = 0; i < runs; i++) {
  await time("gateway round trip, GET /healthz (reference)", async () => {
    const res = await fetch(`${gateway}/healthz`);
    await res.body?.cancel();
  });
  // Alternate the order so neither image always pays for a cold engine cache.
  for (const template of i % 2 ? [...templates].reverse() : templates) await life(template);
}
console.log(JSON.stringify(samples));
