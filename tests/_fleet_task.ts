/**
 * Runs `deno task fleet` itself, as a user types it (the task's own flags from deno.json, its
 * own children), in a session of its own the way a shell starts a job, with its data in a fresh
 * `.dormice/fleet-test-*` and its ports and node ids from the environment; finds every process
 * it left, whatever started it, by that data dir.
 *
 * @module
 */
import { freePort, repoRoot } from "./_processes.ts";

/** Options of {@linkcode startFleetTask}. */
export interface FleetTaskOptions {
  /** Arguments after `deno task fleet`. */
  args?: string[];
  /** Variables besides the ports, the data dir and the node ids this helper sets. */
  env?: Record<string, string>;
  /** The node ids; two fresh ones by default (the Docker suites clean up by node id). */
  nodeIds?: string[];
  /** `npx`: `npx -y deno@<this deno> task fleet`, the README's first command; `deno` by default. */
  launcher?: "deno" | "npx";
}

/** A running `deno task fleet`. */
export interface FleetTask {
  /** The launcher's process (`deno task`, or npx), leader of its own process group. */
  child: Deno.ChildProcess;
  /** Its data dir, relative to the repository. */
  dataDir: string;
  nodeIds: string[];
  /** `http://127.0.0.1:<port>`. */
  gatewayUrl: string;
  stdout(): string;
  stderr(): string;
  /** The value of a printed `export NAME=value` line. */
  exported(name: string): string | undefined;
  /** Resolves once the banner is printed; throws with the output when the task exits first. */
  up(timeoutMs?: number): Promise<void>;
  /** The pids of every process running with this fleet's data dir (the task and its parts). */
  pids(): Promise<number[]>;
  /** SIGTERM to the launcher, then SIGKILL to every process of the fleet still there after 20 s. */
  stop(): Promise<void>;
}

/** Starts the task; `up()` waits for it. */
export function startFleetTask(options: FleetTaskOptions = {}): FleetTask {
  const tag = crypto.randomUUID().slice(0, 8);
  const dataDir = `.dormice/fleet-test-${tag}`;
  const nodeIds = options.nodeIds ?? [`ft${tag}-a`, `ft${tag}-b`];
  const gatewayPort = freePort();
  const env: Record<string, string> = {
    NO_COLOR: "1",
    DORMICE_FLEET_DIR: dataDir,
    DORMICE_GATEWAY_PORT: String(gatewayPort),
    DORMICE_FLEET_NODE_PORT: String(freePort()),
    DORMICE_FLEET_ETCD_PORT: String(freePort()),
    DORMICE_FLEET_NODE_IDS: nodeIds.join(","),
    ...options.env,
  };
  for (const name of ["HOME", "PATH", "DENO_DIR", "XDG_CACHE_HOME", "TMPDIR"]) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  const task = ["task", "fleet", ...(options.args ?? [])];
  const npx = options.launcher === "npx";
  const child = new Deno.Command(npx ? "npx" : Deno.execPath(), {
    args: npx ? ["-y", `deno@${Deno.version.deno}`, ...task] : task,
    cwd: repoRoot,
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    // A session (and so a process group) of its own, as a shell runs a job: the fleet tells its
    // launch command by that group.
    detached: true,
  }).spawn();
  let out = "";
  let err = "";
  const drain = async (stream: ReadableStream<Uint8Array>, add: (s: string) => void) => {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) add(chunk);
  };
  // The parts inherit the pipes: the drains end only when the last of them exits.
  void drain(child.stdout, (s) => out += s).catch(() => {});
  void drain(child.stderr, (s) => err += s).catch(() => {});
  let exited = false;
  void child.status.then(() => exited = true);
  const pids = async () => {
    // In a file, not argv: the search must not find its own command line.
    const pattern = await Deno.makeTempFile({ prefix: "dormice-fleet-pattern-" });
    try {
      await Deno.writeTextFile(pattern, `${dataDir}\n`);
      const found = await new Deno.Command("sh", {
        args: ["-c", `grep -lsaF -f ${pattern} /proc/[0-9]*/environ /proc/[0-9]*/cmdline`],
        stdout: "piped",
        stderr: "null",
      }).output();
      const ids = new TextDecoder().decode(found.stdout).split("\n")
        .map((l) => Number(/^\/proc\/(\d+)\//.exec(l)?.[1])).filter((n) => n > 0);
      return [...new Set(ids)].sort((a, b) => a - b);
    } finally {
      await Deno.remove(pattern);
    }
  };
  const stdoutLines = () => out.split("\n").map((l) => l.trim());
  return {
    child,
    dataDir,
    nodeIds,
    gatewayUrl: `http://127.0.0.1:${gatewayPort}`,
    stdout: () => out,
    stderr: () => err,
    exported: (name) =>
      stdoutLines().find((l) => l.startsWith(`export ${name}=`))?.slice(`export ${name}=`.length),
    async up(timeoutMs = 90_000) {
      const deadline = Date.now() + timeoutMs;
      while (!out.includes("Ctrl-C stops")) {
        if (exited || Date.now() > deadline) {
          throw new Error(`deno task fleet did not come up:\n${out}\n${err}`);
        }
        await new Promise((r) => setTimeout(r, 200));
      }
    },
    pids,
    async stop() {
      try {
        child.kill("SIGTERM");
      } catch { /* exited */ }
      const deadline = Date.now() + 20_000;
      while (Date.now() < deadline && (await pids()).length > 0) {
        await new Promise((r) => setTimeout(r, 250));
      }
      for (const pid of await pids()) {
        try {
          Deno.kill(pid, "SIGKILL");
        } catch { /* gone */ }
      }
      await child.status;
      await Deno.remove(`${repoRoot}${dataDir}`, { recursive: true }).catch(() => {});
    },
  };
}
