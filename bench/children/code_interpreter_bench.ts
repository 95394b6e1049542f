/**
 * The first `runCode` after `Sandbox.create()` with the official `@e2b/code-interpreter`,
 * through a gateway: each iteration does it once cold (template `code-interpreter`, which no pool
 * holds: the container's create and start, then the start command that brings the server and its
 * Python kernel up) and once from a warm pool (`code-interpreter-v1`, the package's default, which
 * the harness pooled: a claim). Prints the samples as JSON.
 *
 * The client half of bench/sections/code_interpreter.ts, which starts the gateway and the Docker node: run
 * it through `deno task bench --only=code-interpreter`. Direct use: `deno run
 * --allow-net=127.0.0.1 --allow-env --allow-read bench/children/code_interpreter_bench.ts <gateway url>
 * <fleet token> [runs]`.
 *
 * @module
 */
import { Sandbox } from "@e2b/code-interpreter";

const [gateway, apiKey, runsArg = "5"] = Deno.args;
const runs = Number(runsArg);
if (!gateway || !apiKey || !Number.isInteger(runs) || runs < 1) {
  console.error("Usage: code_interpreter_bench.ts <gateway url> <fleet token> [runs ≥ 1]");
  Deno.exit(2);
}
const opts = { apiUrl: `${gateway}/e2b/api`, sandboxUrl: `${gateway}/e2b/envd`, apiKey };

const samples: Record<string, number[]> = {};
for (const kind of ["cold", "warm"]) {
  for (const what of ["create", "first runCode", "create + first runCode"]) {
    samples[`${what}, ${kind}`] = [];
  }
}

/** Waits until the gateway's reading shows the pool's sandbox warm again, at most 60 s. */
async function poolWarm(): Promise<void> {
  const deadline = Date.now() + 60_000;
  while (Date.now() < deadline) {
    const res = await fetch(`${gateway}/listNodes`, {
      method: "POST",
      headers: { authorization: `Bearer ${apiKey}`, "content-type": "application/json" },
      body: "{}",
    });
    const body = await res.json();
    if (body.nodes?.[0]?.pools?.[0]?.warm >= 1) return;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error("the code-interpreter-v1 pool was not warm again within 60 s");
}

async function life(kind: "cold" | "warm"): Promise<void> {
  const started = performance.now();
  const sandbox = kind === "cold"
    ? await Sandbox.create("code-interpreter", opts)
    : await Sandbox.create(opts);
  const created = performance.now();
  try {
    const run = await sandbox.runCode("1 + 1");
    if (run.text !== "2") throw new Error(`runCode answered '${run.text}'`);
    const ran = performance.now();
    samples[`create, ${kind}`].push(created - started);
    samples[`first runCode, ${kind}`].push(ran - created);
    samples[`create + first runCode, ${kind}`].push(ran - started);
  } finally {
    await sandbox.kill();
  }
}

for (let i = 0; i < runs; i++) {
  await poolWarm();
  // Alternate the order so neither always runs beside the pool's refill.
  for (const kind of i % 2 ? ["warm", "cold"] as const : ["cold", "warm"] as const) {
    if (kind === "warm") await poolWarm();
    await life(kind);
    // The gateway's reading of the pool is a check-in (one a second) old: after a claim, two
    // check-ins pass before the next wait reads it, so a stale "warm" is never taken for a refill.
    if (kind === "warm") await new Promise((resolve) => setTimeout(resolve, 2_500));
  }
}
console.log(JSON.stringify(samples));
