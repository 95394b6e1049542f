/**
 * The Docker executor's life-cycle latency as a section of RESULTS.md: create, exec,
 * a 64 KiB write and read, and destroy, each against one engine round trip measured in the same
 * iteration. Runs bench/children/docker_bench.ts in a child with the socket permissions the harness
 * itself does not hold; skipped with the reason when no engine or image answers.
 *
 * @module
 */
import { row, type Section } from "../lib/stats.ts";

/** Options of the Docker benchmark. */
export interface DockerBenchOptions {
  /** Iterations (each creates and destroys one container). */
  runs: number;
}

const socket = "/var/run/docker.sock";

/** Measures the Docker executor; a skipped section names why it could not run. */
export async function runDocker({ runs }: DockerBenchOptions): Promise<Section> {
  const title = "Docker executor: create / exec / files / destroy";
  const reference = "one engine round trip (GET /_ping) in the same iteration: each ratio is how " +
    "many round trips the verb costs";
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--allow-env",
      `--allow-read=${socket}`,
      `--allow-write=${socket}`,
      `--allow-net=unix:${socket}`,
      // The executor guards each sandbox network with an iptables rule.
      "--allow-run=iptables",
      new URL("../children/docker_bench.ts", import.meta.url).pathname,
      String(Math.max(3, runs)),
      "--json",
    ],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    const why = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-2).join(" ");
    return { title, reference, rows: [], notes: [], skipped: why.slice(0, 400) };
  }
  const samples: Record<string, number[]> = JSON.parse(new TextDecoder().decode(out.stdout));
  const [refLabel, ...labels] = Object.keys(samples);
  const ref = samples[refLabel];
  return {
    title,
    reference,
    rows: [
      row(refLabel, "ms", ref, ref),
      ...labels.map((label) => row(label, "ms", samples[label], ref)),
    ],
    notes: [
      "Through DockerExecutor (dockerode over the engine's unix socket), the minimal template " +
      "(dormice-minimal:latest, busybox-static + bash), one container created and destroyed per run. The Debian base image is " +
      "measured through the gateway in the E2B-on-Docker section.",
      "exec runs to the command's exit and collects both streams; create includes start.",
    ],
  };
}
