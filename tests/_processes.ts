/**
 * Helpers for black-box tests: spawn real Deno processes (nodes, later gateways) on free loopback
 * ports with their own temp data dirs and narrow permissions, wait until they answer, collect
 * their output, and stop them cleanly.
 *
 * @module
 */
import { fileURLToPath as fromFileUrl } from "node:url";
import { nodeEnvVariables } from "../node/config.ts";

/** The repository root (where deno.json lives). */
export const repoRoot: string = fromFileUrl(new URL("..", import.meta.url));

/** The node daemon's entry point. */
export const nodeMain: string = fromFileUrl(new URL("../node/main.ts", import.meta.url));

/** Variables a child keeps from the test's environment so Deno finds its cache. */
const passThrough = ["HOME", "PATH", "DENO_DIR", "XDG_CACHE_HOME", "TMPDIR", "NO_COLOR"];

/** A spawned Deno process with its output collected as it comes. */
export interface SpawnedProcess {
  readonly child: Deno.ChildProcess;
  /** Everything the process wrote to stderr so far. */
  stderr(): string;
  /** Everything the process wrote to stdout so far. */
  stdout(): string;
  /** Resolves when the process has exited and its output is fully read. */
  readonly exited: Promise<Deno.CommandStatus>;
  /** Sends SIGTERM, then SIGKILL after `graceMs`; resolves with the exit status. */
  stop(graceMs?: number): Promise<Deno.CommandStatus>;
}

/** Options of {@linkcode spawnDeno}. */
export interface SpawnDenoOptions {
  /** The child's whole environment besides HOME/PATH/DENO_DIR (nothing else leaks in). */
  env?: Record<string, string>;
  /** Permission flags, e.g. `["--allow-net=127.0.0.1"]`; never `-A`. */
  permissions?: string[];
  cwd?: string;
  /** Run under this open-file limit (soft and hard), through `prlimit`: a flood test's ceiling. */
  maxOpenFiles?: number;
  /** Arguments after the script (`Deno.args` in the child). */
  args?: string[];
}

/**
 * Runs `deno run <permissions> <script>` with a clean environment, collecting its output.
 *
 * @example
 * ```ts ignore
 * const p = spawnDeno("node/main.ts", { env: { DORMICE_API_TOKEN: token }, permissions: [] });
 * const status = await p.exited;
 * ```
 */
export function spawnDeno(script: string, options: SpawnDenoOptions = {}): SpawnedProcess {
  const env: Record<string, string> = {};
  for (const name of passThrough) {
    const value = Deno.env.get(name);
    if (value !== undefined) env[name] = value;
  }
  Object.assign(env, { NO_COLOR: "1" }, options.env);
  const deno = ["run", "--quiet", ...(options.permissions ?? []), script, ...(options.args ?? [])];
  const limited = options.maxOpenFiles !== undefined;
  const child = new Deno.Command(limited ? "prlimit" : Deno.execPath(), {
    args: limited
      ? [`--nofile=${options.maxOpenFiles}:${options.maxOpenFiles}`, Deno.execPath(), ...deno]
      : deno,
    cwd: options.cwd ?? repoRoot,
    env,
    clearEnv: true,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  let out = "";
  let err = "";
  const drain = async (stream: ReadableStream<Uint8Array>, add: (s: string) => void) => {
    for await (const chunk of stream.pipeThrough(new TextDecoderStream())) add(chunk);
  };
  const reading = Promise.all([
    drain(child.stdout, (s) => out += s),
    drain(child.stderr, (s) => err += s),
  ]);
  const exited = Promise.all([child.status, reading]).then(([status]) => status);
  return {
    child,
    stderr: () => err,
    stdout: () => out,
    exited,
    async stop(graceMs = 10_000) {
      try {
        child.kill("SIGTERM");
      } catch { /* already exited */ }
      let timer: ReturnType<typeof setTimeout> | undefined;
      const forced = new Promise<void>((resolve) => {
        timer = setTimeout(() => {
          try {
            child.kill("SIGKILL");
          } catch { /* exited meanwhile */ }
          resolve();
        }, graceMs);
      });
      await Promise.race([exited, forced]);
      clearTimeout(timer);
      return await exited;
    },
  };
}

/** A loopback port nothing listens on right now. */
export function freePort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const { port } = listener.addr;
  listener.close();
  return port;
}

/**
 * Polls `GET <url>/healthz` until it answers 200; throws with the process's stderr when the
 * process exits first or `timeoutMs` passes.
 */
export async function waitForHealth(
  url: string,
  process: SpawnedProcess,
  timeoutMs = 20_000,
): Promise<void> {
  let exited = false;
  process.exited.then(() => exited = true);
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (exited) {
      throw new Error(`The process exited before answering ${url}/healthz:\n${process.stderr()}`);
    }
    try {
      const res = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1000) });
      await res.body?.cancel();
      if (res.ok) return;
    } catch { /* not listening yet */ }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(`${url}/healthz did not answer within ${timeoutMs} ms:\n${process.stderr()}`);
}

/** The narrow permissions a node needs with its data dir at `dataDir`. */
export function nodePermissions(dataDir: string): string[] {
  return [
    "--allow-net=127.0.0.1",
    `--allow-env=${nodeEnvVariables.join(",")}`,
    `--allow-read=${dataDir}`,
    `--allow-write=${dataDir}`,
    "--allow-sys=cpus,systemMemoryInfo,statfs",
    // The volume content API's confined renames (node/volume_confined.ts).
    "--allow-run=sh",
  ];
}

/** A running node process. */
export interface NodeProcess {
  /** `http://127.0.0.1:<port>`. */
  url: string;
  port: number;
  token: string;
  dataDir: string;
  process: SpawnedProcess;
  /** Stops the process (SIGTERM) and removes the data dir unless it was given. */
  stop(): Promise<Deno.CommandStatus>;
}

/** Options of {@linkcode startNode}. */
export interface StartNodeOptions {
  /** Extra or overriding `DORMICE_*` variables. */
  env?: Record<string, string>;
  /** Use this data dir (kept on stop); a fresh temp dir otherwise (removed on stop). */
  dataDir?: string;
  token?: string;
  /** Wait for `/healthz` (default true). */
  waitForHealth?: boolean;
  /** How long to wait for `/healthz` (default 20 s). */
  healthTimeoutMs?: number;
  /** Listen on this port; a free one otherwise. */
  port?: number;
  /** The node's permissions for its data dir; the fake executor's narrow set by default. */
  permissions?: (dataDir: string) => string[];
  /** Run under this open-file limit (see {@linkcode SpawnDenoOptions.maxOpenFiles}). */
  maxOpenFiles?: number;
}

/** A fresh random fleet token. */
export function newToken(): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(24)),
    (b) => b.toString(16).padStart(2, "0"),
  )
    .join("");
}

/**
 * Starts `node/main.ts` with the fake executor on a free loopback port and its own data dir, and
 * waits until `/healthz` answers.
 *
 * @example
 * ```ts ignore
 * const node = await startNode();
 * await fetch(`${node.url}/healthz`);
 * await node.stop();
 * ```
 */
export async function startNode(options: StartNodeOptions = {}): Promise<NodeProcess> {
  const dataDir = options.dataDir ?? await Deno.makeTempDir({ prefix: "dormice-node-" });
  const token = options.token ?? newToken();
  const port = options.port ?? freePort();
  const process = spawnDeno(nodeMain, {
    env: {
      DORMICE_API_TOKEN: token,
      DORMICE_HOST: "127.0.0.1",
      DORMICE_PORT: String(port),
      DORMICE_DATA_DIR: dataDir,
      DORMICE_EXECUTOR: "fake",
      ...options.env,
    },
    permissions: (options.permissions ?? nodePermissions)(dataDir),
    maxOpenFiles: options.maxOpenFiles,
  });
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    const status = await process.stop();
    if (options.dataDir === undefined) await Deno.remove(dataDir, { recursive: true });
    return status;
  };
  if (options.waitForHealth !== false) {
    try {
      await waitForHealth(url, process, options.healthTimeoutMs);
    } catch (error) {
      await stop();
      throw error;
    }
  }
  return { url, port, token, dataDir, process, stop };
}
