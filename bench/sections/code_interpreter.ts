/**
 * The code interpreter on Docker through a gateway: the first `runCode` after create, cold and
 * from a warm pool, in one run. Starts a gateway and one node on the Docker executor, pools one
 * `code-interpreter-v1` sandbox, runs bench/children/code_interpreter_bench.ts as the client (it needs
 * --allow-env, which the harness does not hold), and removes whatever a failed run left. Skipped
 * with the reason when no engine or image answers.
 *
 * @module
 */
import {
  benchToken,
  type Daemon,
  postJson,
  startDockerNode,
  startGateway,
} from "../lib/fixtures.ts";
import { row, type Section } from "../lib/stats.ts";

/** Options of the code interpreter benchmark. */
export interface CodeInterpreterOptions {
  /** Iterations (each makes one cold sandbox and claims one warm one). */
  runs: number;
}

const title =
  "Code interpreter on Docker: the first runCode after create, cold and from a warm pool";

/** Measures create and the first runCode, cold and claimed; skipped when it cannot run. */
export async function runCodeInterpreter({ runs }: CodeInterpreterOptions): Promise<Section> {
  const reference = "the same step on a cold sandbox (template code-interpreter, not pooled) " +
    "in the same iteration";
  let gateway: Daemon | undefined;
  let node: Daemon | undefined;
  const nodeId = `bench-ci-${Date.now().toString(36)}`;
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
    // The node answers before its first check-in lands, and a gateway that knows no node
    // refuses setPools (409).
    const deadline = Date.now() + 30_000;
    while ((await postJson(`${gateway.url}/listNodes`, {})).json?.nodes?.length !== 1) {
      if (Date.now() > deadline) throw new Error(`node ${nodeId} did not check in within 30 s`);
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
    const set = await postJson(`${gateway.url}/setPools`, {
      pools: [{ template: "code-interpreter-v1", warm: 1 }],
    });
    if (set.status !== 200) {
      return {
        title,
        reference,
        rows: [],
        notes: [],
        skipped: `setPools refused: ${JSON.stringify(set.json).slice(0, 300)}`,
      };
    }
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-net=127.0.0.1",
        "--allow-env",
        "--allow-read",
        new URL("../children/code_interpreter_bench.ts", import.meta.url).pathname,
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
    const rows = [];
    for (const what of ["create", "first runCode", "create + first runCode"]) {
      const cold = samples[`${what}, cold`];
      rows.push(row(`${what}, cold (reference)`, "ms", cold, cold));
      rows.push(row(`${what}, warm pool`, "ms", samples[`${what}, warm`], cold));
    }
    return {
      title,
      reference,
      rows,
      notes: [
        "The official @e2b/code-interpreter (npm, in a child process) against a gateway process " +
        "in front of one node process on the Docker executor: Sandbox.create(), then " +
        "runCode('1 + 1') in the default context, then kill().",
        "A cold create includes the container's create and start and the image's start command " +
        "(deploy/images/code-interpreter/start.sh: the server and its Python kernel up); a warm " +
        "one is a claim from a pool of one code-interpreter-v1 sandbox, refilled after each " +
        "claim. Each iteration waits until the gateway's reading shows the pool warm.",
      ],
    };
  } finally {
    await node?.stop();
    await gateway?.stop();
    await new Deno.Command("sh", {
      args: ["-c", `docker ps -aq --filter label=dormice.node=${nodeId} | xargs -r docker rm -f`],
      stdout: "null",
      stderr: "null",
    }).output().catch(() => {});
  }
}
