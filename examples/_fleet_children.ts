/**
 * `deno task fleet`'s child processes: starting each in a session of its own, stopping them in
 * the reverse of their start order, and noticing when the command that launched the fleet is
 * gone.
 *
 * Why a session of its own: a Ctrl-C reaches every process of the terminal's foreground group at
 * once, so etcd, the gateways and the nodes used to stop together, each logging the others'
 * disappearance (a gateway's etcd calls failing, etcd's "the client connection is closing", a
 * node's check-in refused). Out of that group, only this process hears the Ctrl-C, and it stops
 * the nodes first, then the gateways, then etcd, each after the ones that depend on it.
 *
 * Why the launcher is watched: `npx -y deno task fleet` is a chain of processes (npm, a shell,
 * deno task, this script), and a SIGTERM to npx ends npx alone; `deno task` forwards signals to
 * this script but nothing tells it that its own parent died. The chain shares this process's
 * group, so the ancestors in that group are the launch command: when one of them is gone, the
 * fleet stops as if it had been sent SIGTERM.
 *
 * @module
 */

/** A started child process. */
export interface Child {
  /** How its log lines are prefixed and how the fleet names it. */
  label: string;
  /** Where it answers. */
  url: string;
  process: Deno.ChildProcess;
  /** True once it exited. */
  exited: boolean;
}

/** Options of {@linkcode startDeno}. */
export interface StartDenoOptions {
  /** The repository root: the child's working directory. */
  cwd: string;
  /** The child's whole environment (nothing else leaks in). */
  env: Record<string, string>;
  /** Show Deno's own progress lines (downloads, type checks) as well. */
  verbose: boolean;
}

/**
 * Starts `deno run <flags> <script>` in a session of its own, its stderr lines prefixed with
 * the label, one write per line so the children's lines never interleave mid-line.
 */
export function startDeno(
  label: string,
  url: string,
  script: string,
  flags: string[],
  options: StartDenoOptions,
): Child {
  // By name, so the task can grant exactly `--allow-run=deno`.
  const process = new Deno.Command("deno", {
    args: ["run", ...(options.verbose ? [] : ["--quiet"]), ...flags, script],
    cwd: options.cwd,
    env: options.env,
    clearEnv: true,
    stdin: "null",
    stdout: "inherit",
    stderr: "piped",
    detached: true,
  }).spawn();
  const child: Child = { label, url, process, exited: false };
  void process.status.then(() => child.exited = true);
  const prefix = `[${label}] `.padEnd(10);
  const encoder = new TextEncoder();
  void (async () => {
    let pending = "";
    for await (const chunk of process.stderr.pipeThrough(new TextDecoderStream())) {
      pending += chunk;
      const lines = pending.split("\n");
      pending = lines.pop()!;
      for (const line of lines) await Deno.stderr.write(encoder.encode(prefix + line + "\n"));
    }
  })();
  return child;
}

/** Options of {@linkcode startEtcd}. */
export interface StartEtcdOptions {
  /** Its data directory (made here, mode 0700). */
  dataDir: string;
  clientPort: number;
  peerPort: number;
  /** Log warnings too, not errors only. */
  verbose: boolean;
}

/**
 * Starts a one-member etcd on loopback in a session of its own.
 *
 * @throws {Error} naming the package to install when etcd is not on PATH.
 */
export function startEtcd(options: StartEtcdOptions): Child {
  const clientUrl = `http://127.0.0.1:${options.clientPort}`;
  const peerUrl = `http://127.0.0.1:${options.peerPort}`;
  Deno.mkdirSync(options.dataDir, { recursive: true });
  // etcd warns at every start about a data dir that others may read; it holds the key table.
  Deno.chmodSync(options.dataDir, 0o700);
  let process: Deno.ChildProcess;
  try {
    process = new Deno.Command("etcd", {
      args: [
        "--name=fleet",
        `--data-dir=${options.dataDir}`,
        `--listen-client-urls=${clientUrl}`,
        `--advertise-client-urls=${clientUrl}`,
        `--listen-peer-urls=${peerUrl}`,
        `--initial-advertise-peer-urls=${peerUrl}`,
        `--initial-cluster=fleet=${peerUrl}`,
        // Its warnings are about etcd itself on a laptop (the simple auth token, an apply that
        // took 250 ms on a busy machine), not about the fleet: shown with --verbose only.
        `--log-level=${options.verbose ? "warn" : "error"}`,
        // etcd 3.4's default logger (capnslog) ignores --log-level for raft's INFO lines and
        // warns that it is deprecated: a dozen lines in the user's terminal at every start.
        "--logger=zap",
      ],
      stdin: "null",
      stdout: "null",
      stderr: "inherit",
      detached: true,
    }).spawn();
  } catch (error) {
    throw new Error(
      `--shared needs etcd on PATH (${(error as Error).message}): apt-get install etcd-server`,
    );
  }
  const child: Child = { label: "etcd", url: clientUrl, process, exited: false };
  void process.status.then(() => child.exited = true);
  return child;
}

/** How long a stage of children has to stop on SIGTERM before it is killed. */
const STOP_GRACE_MS = 12_000;

/**
 * Stops the children stage by stage, in the order given (nodes, then gateways, then etcd):
 * SIGTERM to a stage, SIGKILL to what is left of it after 12 s, then the next stage.
 */
export async function stopInOrder(stages: Child[][]): Promise<void> {
  for (const stage of stages) {
    for (const c of stage) signal(c, "SIGTERM");
    let timer: ReturnType<typeof setTimeout> | undefined;
    const killed = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        for (const c of stage) signal(c, "SIGKILL");
        resolve();
      }, STOP_GRACE_MS);
    });
    await Promise.race([Promise.all(stage.map((c) => c.process.status)), killed]);
    clearTimeout(timer);
    await Promise.all(stage.map((c) => c.process.status));
  }
}

function signal(child: Child, name: Deno.Signal): void {
  if (child.exited) return;
  try {
    child.process.kill(name);
  } catch { /* exited meanwhile */ }
}

/** One row of `ps`: a process, its parent, its group and when it started. */
interface PsRow {
  pid: number;
  ppid: number;
  pgid: number;
  started: string;
}

/**
 * Runs `ps -o pid=,ppid=,pgid=,lstart=` with `select` (`-A`, or `-p <pids>`), or `null` when ps
 * cannot run. Not /proc: Deno lets only `--allow-all` read other processes' entries there.
 */
async function ps(select: string[]): Promise<PsRow[] | null> {
  let out: Deno.CommandOutput;
  try {
    out = await new Deno.Command("ps", {
      args: [...select, "-o", "pid=,ppid=,pgid=,lstart="],
      stdin: "null",
      stderr: "null",
      env: { LC_ALL: "C" },
    }).output();
  } catch {
    return null;
  }
  // ps exits 1 when none of the asked pids exists: an empty answer, not a failure.
  return new TextDecoder().decode(out.stdout).split("\n").filter((l) => l.trim() !== "").map(
    (line) => {
      const [pid, ppid, pgid, ...started] = line.trim().split(/\s+/);
      return {
        pid: Number(pid),
        ppid: Number(ppid),
        pgid: Number(pgid),
        started: started.join(" "),
      };
    },
  );
}

/**
 * The processes that launched this one (see the module doc): its ancestors that share its
 * process group, nearest first. Empty where `ps` cannot run or when this process leads its own
 * group.
 */
export async function launchChain(): Promise<{ pid: number; started: string }[]> {
  const rows = await ps(["-A"]);
  if (rows === null) return [];
  const byPid = new Map(rows.map((r) => [r.pid, r]));
  const own = byPid.get(Deno.pid);
  if (own === undefined) return [];
  const chain: { pid: number; started: string }[] = [];
  for (let row = byPid.get(own.ppid); row && row.pid > 1 && chain.length < 16;) {
    if (row.pgid !== own.pgid) break;
    chain.push({ pid: row.pid, started: row.started });
    row = byPid.get(row.ppid);
  }
  return chain;
}

/**
 * Calls `onGone` once, with the process's id, when a process of {@linkcode launchChain} exits
 * (looked at every `intervalMs`, one `ps` each time); returns the function that stops watching.
 * Watches nothing where the chain is empty.
 */
export async function watchLaunchChain(
  onGone: (pid: number) => void,
  intervalMs = 1000,
): Promise<() => void> {
  const chain = await launchChain();
  if (chain.length === 0) return () => {};
  let looking = false;
  const timer = setInterval(async () => {
    if (looking) return;
    looking = true;
    try {
      const rows = await ps(["-p", chain.map((p) => p.pid).join(",")]);
      if (rows === null) return;
      // The same pid with another start time is a new process that reused the number.
      const alive = new Set(rows.map((r) => `${r.pid} ${r.started}`));
      const gone = chain.find((p) => !alive.has(`${p.pid} ${p.started}`));
      if (gone === undefined) return;
      clearInterval(timer);
      onGone(gone.pid);
    } finally {
      looking = false;
    }
  }, intervalMs);
  Deno.unrefTimer(timer);
  return () => clearInterval(timer);
}
