/**
 * The E2B life of a sandbox on the Debian base image, through a gateway: create, the
 * first command and kill with the official `e2b` SDK, against the same three on the busybox
 * minimal image in the same iteration. Starts a gateway and one node on the Docker executor,
 * runs bench/children/e2b_docker_bench.ts as the client (it needs --allow-env, which the harness does not
 * hold), and removes whatever a failed run left. Skipped with the reason when no engine or image
 * answers.
 *
 * @module
 */
import {
  benchToken,
  type Daemon,
  startDockerNode,
  startGateway,
  waitForNodeUp,
} from "../lib/fixtures.ts";
import { row, type Section } from "../lib/stats.ts";

/** Options of the E2B-on-Docker benchmark. */
export interface E2bDockerOptions {
  /** Iterations (each creates and kills one sandbox of each image). */
  runs: number;
}

const title = "E2B on Docker through the gateway: create / first command / kill, Debian base";

/** Measures the SDK's create, first command and kill on both images; skipped when it cannot. */
export async function runE2bDocker({ runs }: E2bDockerOptions): Promise<Section> {
  const reference = "the same verb on the busybox `minimal` image in the same iteration, so " +
    "each base row's ratio is what the Debian root costs (python3 -c is divided by the minimal " +
    "image's first command)";
  let gateway: Daemon | undefined;
  let node: Daemon | undefined;
  const nodeId = `bench-e2b-${Date.now().toString(36)}`;
  try {
    gateway = await startGateway([], {
      DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      DORMICE_GATEWAY_NODE_MIN_DISK_GB: "0",
    });
    try {
      node = await startDockerNode(nodeId, gateway.url);
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      return { title, reference, rows: [], notes: [], skipped: why.slice(-400) };
    }
    await waitForNodeUp(gateway.url, nodeId);
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-net=127.0.0.1",
        "--allow-env",
        "--allow-read",
        new URL("../children/e2b_docker_bench.ts", import.meta.url).pathname,
        gateway.url,
        benchToken,
        String(runs),
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    if (!out.success) {
      const why = new TextDecoder().decode(out.stderr).trim().split("\n").slice(-3).join(" ");
      return { title, reference, rows: [], notes: [], skipped: why.slice(0, 400) };
    }
    const samples: Record<string, number[]> = JSON.parse(new TextDecoder().decode(out.stdout));
    const minimal = (verb: string) => samples[`${verb}, minimal`];
    const rows = [
      row(
        "gateway round trip, GET /healthz",
        "ms",
        samples["gateway round trip, GET /healthz (reference)"],
        null,
      ),
    ];
    for (const verb of ["create", "first command (echo)", "kill"]) {
      rows.push(row(`${verb}, minimal (reference)`, "ms", minimal(verb), minimal(verb)));
      rows.push(row(`${verb}, base`, "ms", samples[`${verb}, base`], minimal(verb)));
    }
    rows.push(
      row(
        "python3 -c 'print(1+1)', base",
        "ms",
        samples["python3 -c, base"],
        minimal("first command (echo)"),
      ),
    );
    return {
      title,
      reference,
      rows,
      notes: [
        "The official e2b SDK (npm:e2b, in a child process) against a gateway process in front " +
        "of one node process on the Docker executor: Sandbox.create(template), " +
        "commands.run('echo hi') (the SDK's /bin/bash -l -c, over envd's Connect stream), kill().",
        "base is dormice-base:latest, the Debian bookworm root of deploy/images/build-base.sh " +
        "(python3, pip, git, curl, sudo); minimal is dormice-minimal:latest, busybox + bash. " +
        "Each iteration runs both, alternating which goes first.",
        "create includes the container's create and start and the gateway's placement; kill is " +
        "a forced remove.",
      ],
    };
  } finally {
    await node?.stop();
    await gateway?.stop();
    // A run that failed half-way leaves containers: every one of them carries the node's label.
    await new Deno.Command("sh", {
      args: ["-c", `docker ps -aq --filter label=dormice.node=${nodeId} | xargs -r docker rm -f`],
      stdout: "null",
      stderr: "null",
    }).output().catch(() => {});
  }
}
