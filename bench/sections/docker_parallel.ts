/**
 * Cold creates in parallel on one Docker node: at concurrency 1, 4 and 16, a batch of that many
 * `acquireSandbox` calls of distinct names sent at once to a node on the Docker executor
 * (template minimal, no pool), against a batch of as many plain `docker run -d` of the same image
 * in the same run. The figure is creates per second (batch size ÷ the batch's wall time); the
 * ratio says what share of the engine's own parallel rate the node keeps.
 *
 * @module
 */
import { median, type Row, row, type Section } from "../lib/stats.ts";
import { postJson, startDockerNode } from "../lib/fixtures.ts";

/** Options of the parallel-create benchmark. */
export interface DockerParallelOptions {
  /** Batches per concurrency level. */
  runs: number;
  /** The concurrency levels (default 1, 4, 16). */
  levels?: number[];
}

const image = "dormice-minimal:latest";

/** `docker` with `args`; throws with its stderr when it fails. */
async function docker(args: string[]): Promise<string> {
  const out = await new Deno.Command("docker", { args, stdout: "piped", stderr: "piped" })
    .output();
  if (!out.success) {
    throw new Error(`docker ${args[0]} failed: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
  return new TextDecoder().decode(out.stdout).trim();
}

/** Wall time of `count` tasks started at once, ms. */
async function batch(count: number, task: (i: number) => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  await Promise.all(Array.from({ length: count }, (_, i) => task(i)));
  return performance.now() - t0;
}

/** Measures parallel cold creates through a Docker node against `docker run -d`. */
export async function runDockerParallel(
  { runs, levels = [1, 4, 16] }: DockerParallelOptions,
): Promise<Section> {
  const title = "Cold creates in parallel on a Docker node, against docker run";
  const reference = "as many plain `docker run -d` of the same image sent at once in the same " +
    "run (creates per second): each ratio is the share of the engine's own parallel rate the " +
    "node keeps";
  try {
    await docker(["image", "inspect", "--format", "{{.Id}}", image]);
  } catch (error) {
    return { title, reference, rows: [], notes: [], skipped: (error as Error).message };
  }
  const nodeId = `bench-par-${crypto.randomUUID().slice(0, 6)}`;
  const label = `dormice.bench=${nodeId}`;
  // The reference's containers sit on a network like the node's own (a bridge with no route
  // out and inter-container traffic off), so both pay the engine the same network work.
  const network = `${nodeId}-reference`;
  await docker([
    "network",
    "create",
    "--internal",
    "-o",
    "com.docker.network.bridge.enable_icc=false",
    network,
  ]);
  const node = await startDockerNode(nodeId, null);
  const rows: Row[] = [];
  try {
    // One create first: the node makes its network and firewall rule once, not in a batch.
    const first = await postJson(`${node.url}/acquireSandbox`, {
      name: "warmup",
      template: "minimal",
    });
    if (first.status !== 200) throw new Error(`acquireSandbox: ${JSON.stringify(first.json)}`);
    await postJson(`${node.url}/destroySandbox`, { name: "warmup" });
    for (const c of levels) {
      const viaNode: number[] = [], plain: number[] = [];
      for (let r = 0; r < runs; r++) {
        const names = Array.from({ length: c }, (_, i) => `par-${c}-${r}-${i}`);
        const nodeMs = await batch(c, async (i) => {
          const a = await postJson(`${node.url}/acquireSandbox`, {
            name: names[i],
            template: "minimal",
          });
          if (a.status !== 200) throw new Error(`acquireSandbox: ${JSON.stringify(a.json)}`);
        });
        await Promise.all(
          names.map((name) => postJson(`${node.url}/destroySandbox`, { name })),
        );
        const runMs = await batch(c, () =>
          docker([
            "run",
            "-d",
            "--label",
            label,
            "--network",
            network,
            "--entrypoint",
            "sleep",
            image,
            "2147483647",
          ]));
        const ids = (await docker(["ps", "-aq", "--filter", `label=${label}`])).split("\n")
          .filter(Boolean);
        if (ids.length > 0) await docker(["rm", "-f", ...ids]);
        viaNode.push(c / (nodeMs / 1000));
        plain.push(c / (runMs / 1000));
      }
      rows.push(row(`docker run -d, ${c} at once (reference)`, "creates/s", plain, plain));
      rows.push(row(`acquireSandbox at the node, ${c} at once`, "creates/s", viaNode, plain));
    }
  } finally {
    await node.stop();
    const left = await docker(["ps", "-aq", "--filter", `label=dormice.node=${nodeId}`])
      .catch(() => "");
    const ids = left.split("\n").filter(Boolean);
    if (ids.length > 0) await docker(["rm", "-f", ...ids]).catch(() => {});
    await docker(["network", "rm", network]).catch(() => {});
  }
  const at = (prefix: string, c: number) =>
    median(rows.find((r) => r.label.startsWith(`${prefix}, ${c} `))!.values);
  const gain = (prefix: string) => (at(prefix, levels.at(-1)!) / at(prefix, levels[0])).toFixed(2);
  return {
    title,
    reference,
    rows,
    notes: [
      "A node on the Docker executor (node/main.ts, standalone, no warm pool), template minimal; " +
      "each batch is that many `acquireSandbox` of new names sent at once over loopback, timed " +
      "until the last answers; its sandboxes are destroyed before the reference batch runs.",
      "The reference is the docker CLI (`docker run -d --entrypoint sleep` on an internal bridge " +
      "made like the node's, inter-container traffic off), one process per create: it pays a " +
      "CLI start the node does not, and skips the node's limits (cpu, memory, pids, init), " +
      "image inspect, host firewall check and ledger row.",
      `Speed-up from ${levels[0]} to ${levels.at(-1)} at once: the node ${
        gain("acquireSandbox at the node")
      }×, docker run ${
        gain("docker run -d")
      }×. Where both flatten together the engine is the limit (on ` +
      `${navigator.hardwareConcurrency} cores, dockerd's own CPU), not the node.`,
    ],
  };
}
