/**
 * Template builds on Docker through the gateway, as E2B's SDK drives them (`POST /v3/templates`,
 * `POST /v2/templates/{id}/builds/{buildID}`, status polled every 100 ms): a build from `base`
 * with three steps, then the same build with only its last step changed, which reruns that step
 * from the cached image of the first two. The reference is the first build of the same
 * iteration. Starts a gateway and one Docker node; skipped with the reason when no engine
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

/** Options of the template build benchmark. */
export interface TemplatesDockerOptions {
  /** Iterations (each one build and one rebuild). */
  runs: number;
}

const title = "Template builds on Docker through the gateway";

async function call(api: string, method: string, path: string, body?: unknown): Promise<unknown> {
  const res = await fetch(`${api}${path}`, {
    method,
    headers: { "x-api-key": benchToken, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(300_000),
  });
  const text = await res.text();
  if (res.status >= 300) throw new Error(`${method} ${path}: HTTP ${res.status} ${text}`);
  return text === "" ? null : JSON.parse(text);
}

/** One build of `name` with `steps`, timed from the request to the status `ready`. */
async function build(api: string, name: string, steps: string[]): Promise<number> {
  const started = performance.now();
  const { templateID, buildID } = await call(api, "POST", "/v3/templates", { name }) as {
    templateID: string;
    buildID: string;
  };
  await call(api, "POST", `/v2/templates/${templateID}/builds/${buildID}`, {
    fromTemplate: "base",
    steps: steps.map((cmd) => ({ type: "RUN", args: [cmd, "root"] })),
    force: false,
  });
  const deadline = Date.now() + 300_000;
  while (Date.now() < deadline) {
    const status = await call(
      api,
      "GET",
      `/templates/${templateID}/builds/${buildID}/status?logsOffset=0`,
    ) as { status: string; reason?: { message: string } };
    if (status.status === "ready") return performance.now() - started;
    if (status.status === "error") throw new Error(`the build failed: ${status.reason?.message}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`the build of ${name} did not finish within 300 s`);
}

/** A build and its rebuild with the last step changed, per iteration. */
export async function runTemplatesDocker({ runs }: TemplatesDockerOptions): Promise<Section> {
  const reference = "the first build of the same template in the same iteration (three RUN " +
    "steps from base, none cached)";
  let gateway: Daemon | undefined;
  let node: Daemon | undefined;
  const nodeId = `bench-tpl-${Date.now().toString(36)}`;
  try {
    gateway = await startGateway([], {
      DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      DORMICE_GATEWAY_NODE_MIN_DISK_GB: "0",
    });
    try {
      node = await startDockerNode(nodeId, gateway.url, { DORMICE_SNAPSHOT_MIN_DISK_GB: "0" });
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      return { title, reference, rows: [], notes: [], skipped: why.slice(-400) };
    }
    await waitForNodeUp(gateway.url, nodeId);
    const api = `${gateway.url}/e2b/api`;
    const first: number[] = [];
    const again: number[] = [];
    // One warm-up iteration, not counted.
    for (let i = -1; i < runs; i++) {
      const nonce = crypto.randomUUID().slice(0, 8);
      const name = `bench-${nonce}`;
      const steps = [
        `dd if=/dev/urandom of=/opt/blob-${nonce} bs=1M count=32 2>/dev/null`,
        "python3 -c 'import json; print(json.dumps({\"ok\": True}))' > /opt/ok.json",
        "echo v1 > /etc/template-version",
      ];
      const a = await build(api, name, steps);
      const b = await build(api, name, [...steps.slice(0, 2), "echo v2 > /etc/template-version"]);
      if (i >= 0) {
        first.push(a);
        again.push(b);
      }
      const { templateID } = await call(api, "GET", `/templates/aliases/${name}`) as {
        templateID: string;
      };
      await call(api, "DELETE", `/templates/${templateID}`);
    }
    return {
      title,
      reference,
      rows: [
        row("build from base, 3 steps (reference)", "ms", first, first),
        row("rebuild, last step changed (steps 1-2 cached)", "ms", again, first),
      ],
      notes: [
        "E2B's build protocol with the fleet token against a gateway process in front of one " +
        "node process on the Docker executor; the steps: write 32 MB of random bytes, run " +
        "python3, write a version file. Each step runs in a build container committed to a " +
        "cache image; the rebuild finds steps 1-2 by their hash and runs step 3 only.",
        "Both builds end with one more commit (the template's own image, labelled as the " +
        "team's snapshot). Status is polled every 100 ms, as the SDK's default 200 ms would " +
        "add up to that much to each figure. One warm-up iteration is not counted.",
      ],
    };
  } finally {
    await node?.stop();
    await gateway?.stop();
    await new Deno.Command("sh", {
      args: [
        "-c",
        `docker ps -aq --filter label=dormice.node=${nodeId} | xargs -r docker rm -f; ` +
        `docker images -aq --filter label=dormice.node=${nodeId} | xargs -r docker rmi -f`,
      ],
      stdout: "null",
      stderr: "null",
    }).output().catch(() => {});
  }
}
