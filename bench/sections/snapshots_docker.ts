/**
 * Snapshots, fork and the filesystem pause on Docker through a gateway, against a cold create
 * in the same iteration: the time to take a snapshot, to start a sandbox from it, to fork four
 * copies, to pause a sandbox to disk and to resume it from there. Speaks E2B's HTTP API itself
 * (the SDK's calls, without the SDK's child process); starts a gateway and one Docker node, and
 * removes whatever a failed run left. Skipped with the reason when no engine answers.
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

/** Options of the snapshot benchmark. */
export interface SnapshotsDockerOptions {
  /** Iterations (each makes one cold sandbox, one snapshot, one copy, a fork, a pause). */
  runs: number;
}

const title = "Snapshots, fork and the filesystem pause on Docker through the gateway";
const FORK_COUNT = 4;

/** One E2B call, timed to its whole answer; a status other than `want` is an error. */
async function call(
  api: string,
  method: string,
  path: string,
  body: unknown,
  want: number,
): Promise<{ ms: number; json: unknown }> {
  const started = performance.now();
  const res = await fetch(`${api}${path}`, {
    method,
    headers: { "x-api-key": benchToken, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(120_000),
  });
  const text = await res.text();
  const ms = performance.now() - started;
  if (res.status !== want) {
    throw new Error(`${method} ${path}: HTTP ${res.status} ${text.slice(0, 300)}`);
  }
  return { ms, json: text === "" ? null : JSON.parse(text) };
}

/** Measures each verb against a cold create of the same iteration; skipped when it cannot. */
export async function runSnapshotsDocker({ runs }: SnapshotsDockerOptions): Promise<Section> {
  const reference = "a cold create (`POST /v2/sandboxes`, template minimal) in the same " +
    "iteration: each ratio is what the verb costs against starting a sandbox from nothing";
  let gateway: Daemon | undefined;
  let node: Daemon | undefined;
  const nodeId = `bench-snap-${Date.now().toString(36)}`;
  try {
    gateway = await startGateway([], {
      DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      DORMICE_GATEWAY_NODE_MIN_DISK_GB: "0",
    });
    try {
      node = await startDockerNode(nodeId, gateway.url, {
        DORMICE_SNAPSHOT_MIN_DISK_GB: "0",
      });
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      return { title, reference, rows: [], notes: [], skipped: why.slice(-400) };
    }
    await waitForNodeUp(gateway.url, nodeId);
    const api = `${gateway.url}/e2b/api`;
    const s: Record<string, number[]> = {
      cold: [],
      snapshot: [],
      fromSnapshot: [],
      fork: [],
      pause: [],
      resume: [],
    };
    // One warm-up iteration, not counted: the first commit and create on an engine pay once.
    for (let i = -1; i < runs; i++) {
      const made: string[] = [];
      let snapshotId: string | undefined;
      try {
        const cold = await call(api, "POST", "/v2/sandboxes", { templateID: "minimal" }, 201);
        const source = (cold.json as { sandboxID: string }).sandboxID;
        made.push(source);
        const snap = await call(api, "POST", `/sandboxes/${source}/snapshots`, {}, 201);
        snapshotId = (snap.json as { snapshotID: string }).snapshotID;
        const copy = await call(api, "POST", "/v2/sandboxes", { templateID: snapshotId }, 201);
        made.push((copy.json as { sandboxID: string }).sandboxID);
        const fork = await call(api, "POST", `/sandboxes/${source}/fork`, {
          count: FORK_COUNT,
        }, 201);
        for (const entry of fork.json as { sandbox?: { sandboxID: string }; error?: unknown }[]) {
          if (!entry.sandbox) throw new Error(`a fork copy failed: ${JSON.stringify(entry.error)}`);
          made.push(entry.sandbox.sandboxID);
        }
        const pause = await call(api, "POST", `/sandboxes/${source}/pause`, { memory: false }, 204);
        const resume = await call(api, "POST", `/v2/sandboxes/${source}/connect`, {}, 201);
        if (i >= 0) {
          s.cold.push(cold.ms);
          s.snapshot.push(snap.ms);
          s.fromSnapshot.push(copy.ms);
          s.fork.push(fork.ms);
          s.pause.push(pause.ms);
          s.resume.push(resume.ms);
        }
      } finally {
        for (const id of made) {
          await call(api, "DELETE", `/sandboxes/${id}`, undefined, 204).catch(() => {});
        }
        if (snapshotId) {
          await call(api, "DELETE", `/templates/${snapshotId}`, undefined, 204).catch(() => {});
        }
      }
    }
    return {
      title,
      reference,
      rows: [
        row("cold create, minimal (reference)", "ms", s.cold, s.cold),
        row("createSnapshot of that sandbox (docker commit)", "ms", s.snapshot, s.cold),
        row("create from the snapshot", "ms", s.fromSnapshot, s.cold),
        row(`fork of ${FORK_COUNT} (the whole answer)`, "ms", s.fork, s.cold),
        row(
          `fork of ${FORK_COUNT}, per copy`,
          "ms",
          s.fork.map((ms) => ms / FORK_COUNT),
          s.cold,
        ),
        row("pause({ keepMemory: false }) (commit, then remove)", "ms", s.pause, s.cold),
        row("connect() after it (create from its image)", "ms", s.resume, s.cold),
      ],
      notes: [
        "E2B's HTTP API with the fleet token, against a gateway process in front of one node " +
        "process on the Docker executor; template minimal (busybox + bash), whose writable " +
        "layer is nearly empty, so the commits copy little: a sandbox with more written pays " +
        "more for a snapshot and a pause.",
        `A fork takes one snapshot, builds ${FORK_COUNT} copies from it 4 at a time on the ` +
        "source's node, then drops the snapshot. One warm-up iteration is not counted.",
        "The data-disk floors are off (DORMICE_SNAPSHOT_MIN_DISK_GB=0) so a small disk does not " +
        "refuse the snapshots.",
      ],
    };
  } finally {
    await node?.stop();
    await gateway?.stop();
    // A run that failed half-way leaves containers and images: each carries the node's label.
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
