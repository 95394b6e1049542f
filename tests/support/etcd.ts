/**
 * Real etcd for tests: a one- or three-member cluster of Debian's `etcd` (package
 * `etcd-server`) on free loopback ports with its own temp data dirs, never a system one.
 * Members can be killed and started again with their data.
 *
 * @module
 */
import { freePort } from "../_processes.ts";

/** Where the etcd binary is, or `null` when it is not installed. */
export function etcdBinary(): string | null {
  for (const dir of (Deno.env.get("PATH") ?? "/usr/bin").split(":").concat("/usr/bin")) {
    try {
      if (Deno.statSync(`${dir}/etcd`).isFile) return `${dir}/etcd`;
    } catch { /* not here */ }
  }
  return null;
}

/**
 * Why the etcd tests cannot run here, or `null` when they can. With `CI=true` a missing etcd is
 * a failure, not a skip: CI installs it (`.ci/run`).
 */
export function etcdMissing(): string | null {
  if (etcdBinary() !== null) return null;
  const why = "etcd is not installed (apt-get install etcd-server)";
  if (Deno.env.get("CI") === "true") throw new Error(`${why}, and CI must run the etcd tests`);
  return why;
}

/** One member of a test cluster. */
export interface EtcdMember {
  name: string;
  clientUrl: string;
  peerUrl: string;
  dataDir: string;
  /** Whether its process runs now. */
  readonly running: boolean;
}

/** A running test cluster. */
export interface EtcdCluster {
  members: EtcdMember[];
  /** The members' client URLs, comma-separated: a `DORMICE_GATEWAY_ETCD` value. */
  endpoints: string;
  /** Kills member `i` with SIGKILL. */
  kill(i: number): Promise<void>;
  /** Starts member `i` again on its data and waits until the cluster answers through it. */
  restart(i: number): Promise<void>;
  /** Starts every stopped member again (a lone member of three has no quorum to wait for). */
  restartAll(): Promise<void>;
  /** Kills every member and removes the data dirs. */
  stop(): Promise<void>;
}

interface Running {
  child: Deno.ChildProcess;
  exited: Promise<unknown>;
  log: () => string;
}

/**
 * Starts `size` etcd members on loopback and waits until each one reports healthy.
 *
 * @example
 * ```ts ignore
 * const etcd = await startEtcd(3);
 * // DORMICE_GATEWAY_ETCD: etcd.endpoints
 * await etcd.stop();
 * ```
 */
export async function startEtcd(size = 1): Promise<EtcdCluster> {
  for (let attempt = 1;; attempt++) {
    try {
      return await startEtcdOnce(size);
    } catch (error) {
      // A port picked free can be taken before etcd binds it (another test's socket, measured in
      // CI once): the cluster is tried again on new ports.
      if (attempt < 3 && /address already in use/.test((error as Error).message)) continue;
      throw error;
    }
  }
}

async function startEtcdOnce(size: number): Promise<EtcdCluster> {
  const binary = etcdBinary();
  if (binary === null) throw new Error("etcd is not installed (apt-get install etcd-server)");
  const token = `t-${crypto.randomUUID().slice(0, 8)}`;
  const members: (EtcdMember & { running: boolean })[] = [];
  for (let i = 0; i < size; i++) {
    members.push({
      name: `m${i}`,
      clientUrl: `http://127.0.0.1:${freePort()}`,
      peerUrl: `http://127.0.0.1:${freePort()}`,
      dataDir: await Deno.makeTempDir({ prefix: "dormice-etcd-" }),
      running: false,
    });
  }
  const initialCluster = members.map((m) => `${m.name}=${m.peerUrl}`).join(",");
  const processes: (Running | null)[] = members.map(() => null);
  /** The processes that have exited. */
  const ended = new WeakSet<Running>();
  /** Set when one member failed to start: the others' waits stop. */
  let abandoned = false;

  const spawn = (i: number) => {
    const m = members[i];
    const child = new Deno.Command(binary, {
      args: [
        `--name=${m.name}`,
        `--data-dir=${m.dataDir}`,
        `--listen-client-urls=${m.clientUrl}`,
        `--advertise-client-urls=${m.clientUrl}`,
        `--listen-peer-urls=${m.peerUrl}`,
        `--initial-advertise-peer-urls=${m.peerUrl}`,
        `--initial-cluster=${initialCluster}`,
        `--initial-cluster-token=${token}`,
        "--initial-cluster-state=new",
        // Quick elections on loopback: a killed leader is replaced within a second.
        "--heartbeat-interval=50",
        "--election-timeout=500",
        "--log-level=error",
      ],
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).spawn();
    let log = "";
    const drained = (async () => {
      for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
        log = (log + chunk).slice(-20_000);
      }
    })();
    const running: Running = {
      child,
      exited: Promise.all([child.status, drained]),
      log: () => log,
    };
    processes[i] = running;
    void child.status.then(() => ended.add(running));
    m.running = true;
  };

  const healthy = async (i: number, timeoutMs = 20_000) => {
    const deadline = Date.now() + timeoutMs;
    while (Date.now() < deadline && !abandoned) {
      const p = processes[i];
      // A member that exited (a port it could not bind) will not become healthy: said at once.
      if (p !== null && ended.has(p)) {
        await p.exited;
        throw new Error(`etcd member ${members[i].name} exited before it was healthy:\n${p.log()}`);
      }
      try {
        const res = await fetch(`${members[i].clientUrl}/health`, {
          signal: AbortSignal.timeout(1000),
        });
        const body = await res.json();
        if (res.ok && body.health === "true") return;
      } catch { /* not yet */ }
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(
      `etcd member ${members[i].name} did not report healthy in ${timeoutMs} ms:\n` +
        (processes[i]?.log() ?? ""),
    );
  };

  const kill = async (i: number) => {
    const p = processes[i];
    if (p === null) return;
    try {
      p.child.kill("SIGKILL");
    } catch { /* already gone */ }
    await p.exited;
    processes[i] = null;
    members[i].running = false;
  };

  for (let i = 0; i < size; i++) spawn(i);
  try {
    await Promise.all(members.map((_, i) => healthy(i)));
  } catch (error) {
    // The other members' waits end too, and nothing of this attempt is left behind.
    abandoned = true;
    for (let i = 0; i < size; i++) await kill(i);
    for (const m of members) await Deno.remove(m.dataDir, { recursive: true }).catch(() => {});
    throw error;
  }
  return {
    members,
    endpoints: members.map((m) => m.clientUrl).join(","),
    kill,
    async restart(i) {
      if (processes[i] !== null) return;
      spawn(i);
      await healthy(i);
    },
    async restartAll() {
      const stopped = members.map((_, i) => i).filter((i) => processes[i] === null);
      for (const i of stopped) spawn(i);
      await Promise.all(stopped.map((i) => healthy(i)));
    },
    async stop() {
      for (let i = 0; i < size; i++) await kill(i);
      for (const m of members) await Deno.remove(m.dataDir, { recursive: true }).catch(() => {});
    },
  };
}
