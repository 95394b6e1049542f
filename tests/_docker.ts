/**
 * Helpers for the docker suites: decide whether they run (always on CI, off CI only when an
 * engine answers with the base image built), start node processes on the Docker executor, and
 * make sure no container outlives a test.
 *
 * @module
 */
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import Docker from "dockerode";
import { nameSafe } from "../node/executors/docker/engine.ts";
import { dockerReadiness } from "../node/executors/docker/_fixtures_test.ts";
import { type NodeProcess, startNode } from "./_processes.ts";

/** Whether a docker suite runs, and what to say when it cannot. */
export interface DockerGate {
  /** Skip the suite (off CI, no engine or no image). */
  skip: boolean;
  /** On CI without an engine: the sentence the suite must fail with. */
  failure: string | null;
}

/**
 * Decides whether a docker suite runs. With `CI=true` it never skips: a missing engine or image
 * becomes a failure sentence. Off CI it skips, printing why.
 *
 * @example
 * ```ts ignore
 * const gate = await dockerGate("docker gateway suite");
 * Deno.test({ name: "…", ignore: gate.skip, fn() { if (gate.failure) throw new Error(gate.failure); } });
 * ```
 */
export async function dockerGate(suite: string): Promise<DockerGate> {
  const readiness = await dockerReadiness();
  if (readiness.ready) return { skip: false, failure: null };
  if (Deno.env.get("CI") === "true") {
    return {
      skip: false,
      failure: `CI=true, so the ${suite} must run, but ${readiness.why} (run .ci/docker.sh)`,
    };
  }
  console.log(`${suite} skipped: ${readiness.why}`);
  return { skip: true, failure: null };
}

/** The narrow permissions of a node on the Docker executor with its data dir at `dataDir`. */
export function dockerNodePermissions(
  dataDir: string,
  socket: string = DEFAULT_DOCKER_SOCKET,
): string[] {
  return [
    // The ports door connects to sandbox addresses the engine picks from its address pools, so
    // the hosts cannot be listed (deno task node grants --allow-net too).
    "--allow-net",
    // dockerode's dependencies list the environment as they load: a name list is refused.
    "--allow-env",
    `--allow-read=${dataDir},${socket}`,
    `--allow-write=${dataDir},${socket}`,
    "--allow-sys=cpus,systemMemoryInfo,statfs,networkInterfaces",
    // The host firewall: one iptables rule per sandbox network (as deno task node grants it).
    "--allow-run=iptables,openssl,sh,mount,umount,mkfs.ext4,losetup",
  ];
}

/** Options of {@linkcode startDockerNode}. */
export interface StartDockerNodeOptions {
  token?: string;
  /** The node id, also the `dormice.node` label of its containers; a fresh one by default. */
  nodeId?: string;
  /** Check in with this gateway every second. */
  gatewayUrl?: string;
  /** Use this data dir (kept on stop); a fresh temp dir otherwise (removed on stop). */
  dataDir?: string;
  /** Listen on this port; a free one otherwise. */
  port?: number;
  /** Extra or overriding `DORMICE_*` variables. */
  env?: Record<string, string>;
  /** The engine socket the node uses (`DORMICE_DOCKER_SOCKET`); the default one otherwise. */
  socket?: string;
}

/** A node process on the Docker executor. */
export interface DockerNodeProcess extends NodeProcess {
  nodeId: string;
}

/**
 * Starts `node/main.ts` with `DORMICE_EXECUTOR=docker` on a free loopback port and waits until
 * `/healthz` answers.
 *
 * @example
 * ```ts ignore
 * const node = await startDockerNode({ gatewayUrl: gw.url, token: gw.token });
 * await node.stop();
 * ```
 */
export async function startDockerNode(
  options: StartDockerNodeOptions = {},
): Promise<DockerNodeProcess> {
  const nodeId = options.nodeId ?? `dk-${crypto.randomUUID().slice(0, 8)}`;
  const node = await startNode({
    token: options.token,
    dataDir: options.dataDir,
    port: options.port,
    permissions: (dataDir) => dockerNodePermissions(dataDir, options.socket),
    // A first container create on a cold engine takes longer than a fake node's boot.
    healthTimeoutMs: 30_000,
    env: {
      DORMICE_EXECUTOR: "docker",
      DORMICE_NODE_ID: nodeId,
      ...(options.socket ? { DORMICE_DOCKER_SOCKET: options.socket } : {}),
      ...(options.gatewayUrl
        ? {
          DORMICE_GATEWAY_ENDPOINT: options.gatewayUrl,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
        }
        : {}),
      ...options.env,
    },
  });
  return { ...node, nodeId };
}

/**
 * Removes every container labelled with one of `nodeIds` (whatever node instance made it), so a
 * failed test leaves nothing running on the engine; returns how many it removed.
 */
export async function removeContainersOf(nodeIds: string[]): Promise<number> {
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  let removed = 0;
  for (const nodeId of nodeIds) {
    for (const c of await labelled(docker, nodeId)) {
      // Gone already, or its removal in progress (the node's own stop): nothing left to do.
      const done = await docker.getContainer(c.Id).remove({ force: true, v: true }).then(
        () => true,
        (error: { statusCode?: number }) => {
          if (error.statusCode === 404 || error.statusCode === 409) return false;
          throw error;
        },
      );
      if (done) removed++;
    }
    // A node killed before its executor closed leaves its networks behind, with their host
    // firewall rules, and the engine has address pools for about thirty: once nothing sits on
    // them, they go too.
    const prefix = `dormice-${nameSafe(nodeId)}-`;
    const networks = await docker.listNetworks({ filters: { name: [prefix] } }) as {
      Name: string;
    }[];
    for (const n of networks.filter((n) => n.Name.startsWith(prefix))) {
      const gone = await docker.getNetwork(n.Name).remove().then(() => true, () => false);
      if (gone) await dropHostRules(n.Name);
    }
  }
  return removed;
}

/**
 * How many host firewall rules guard `network` (`iptables -S INPUT`; each rule's comment names
 * its network). Requires root and `--allow-run`.
 */
export async function hostRules(network: string): Promise<number> {
  const out = await new Deno.Command("iptables", { args: ["-w", "5", "-S", "INPUT"] }).output();
  if (!out.success) {
    throw new Error(`iptables -S INPUT failed: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
  return new TextDecoder().decode(out.stdout).split("\n")
    .filter((line) => line.includes(`--comment "dormice ${network}:`)).length;
}

/**
 * Deletes the host firewall rules that guard `network` (a network removed behind its node's back
 * leaves them). Quiet where iptables cannot run: the node could not have made them either.
 */
async function dropHostRules(network: string): Promise<void> {
  const listed = await new Deno.Command("iptables", { args: ["-w", "5", "-S", "INPUT"] }).output()
    .catch(() => undefined);
  if (listed === undefined || !listed.success) return;
  const rules = new TextDecoder().decode(listed.stdout).split("\n")
    .filter((line) =>
      line.startsWith("-A INPUT ") && line.includes(`--comment "dormice ${network}:`)
    );
  for (const rule of rules) {
    // The spec as iptables printed it, quotes around the comment taken off by a shell's rules.
    const args = rule.slice("-A INPUT ".length).match(/"[^"]*"|\S+/g)!.map((a) =>
      a.replace(/^"|"$/g, "")
    );
    await new Deno.Command("iptables", { args: ["-w", "5", "-D", "INPUT", ...args] }).output()
      .catch(() => undefined);
  }
}

/**
 * The name of `nodeId`'s `kind` network (`dormice-<node>-<instance>-<kind>`), of whichever
 * instance made it; throws when there is none or more than one.
 */
export async function networkOf(nodeId: string, kind: "internal" | "egress"): Promise<string> {
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  const prefix = `dormice-${nameSafe(nodeId)}-`;
  // An instance id has no '-': another node whose id starts with this one's is not matched.
  const own = new RegExp(`^${prefix.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}[a-z0-9]+-${kind}$`);
  const names = (await docker.listNetworks({ filters: { name: [prefix] } }) as { Name: string }[])
    .map((n) => n.Name).filter((n) => own.test(n));
  if (names.length !== 1) {
    throw new Error(`${names.length} ${kind} networks of ${nodeId}: ${names}`);
  }
  return names[0];
}

/** The sandbox ids the engine holds for `nodeId` (its labelled containers, any instance's). */
export async function containersOf(nodeId: string): Promise<string[]> {
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  return (await labelled(docker, nodeId)).map((c) => c.Labels["dormice.sandbox"]).filter((id) =>
    id !== undefined
  ).sort();
}

function labelled(
  docker: Docker,
  nodeId: string,
): Promise<{ Id: string; Labels: Record<string, string> }[]> {
  return docker.listContainers({ all: true, filters: { label: [`dormice.node=${nodeId}`] } });
}

/** Polls `check` every 100 ms until it returns true or `ms` passes. */
export async function until(
  what: string,
  check: () => Promise<boolean>,
  ms = 10_000,
): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

/** The image of the `code-interpreter` and `code-interpreter-v1` templates. */
export const CODE_INTERPRETER_IMAGE = "dormice-code-interpreter:latest";

/**
 * Why the code interpreter's suites cannot run on an engine that answers, or null: its image is
 * built (`deploy/images/build-code-interpreter.sh`, minutes of apt-get, so never built by a test).
 */
export async function codeInterpreterImageMissing(): Promise<string | null> {
  try {
    await new Docker({ socketPath: DEFAULT_DOCKER_SOCKET }).getImage(CODE_INTERPRETER_IMAGE)
      .inspect();
    return null;
  } catch (error) {
    return `the engine has no ${CODE_INTERPRETER_IMAGE} image (${
      (error as Error).message.split("\n")[0]
    }): build it with deploy/images/build-code-interpreter.sh (or .ci/docker.sh)`;
  }
}

/**
 * Unmounts every filesystem mounted below `dir` (volume images a failed test left), deepest
 * first, so the directory can be removed; answers how many it unmounted.
 */
export async function unmountBelow(dir: string): Promise<number> {
  const real = await Deno.realPath(dir).catch(() => dir);
  // Read by cat: Deno wants --allow-all to read /proc/self.
  const mounts = await new Deno.Command("cat", { args: ["/proc/self/mounts"] }).output();
  const points = new TextDecoder().decode(mounts.stdout).split("\n")
    .map((line) => line.split(" ")[1]?.replace(/\\040/g, " "))
    .filter((p): p is string => p !== undefined && p.startsWith(real + "/"))
    .sort((a, b) => b.length - a.length);
  let n = 0;
  for (const p of points) {
    const out = await new Deno.Command("umount", { args: ["-l", p], stderr: "null" }).output();
    if (out.success) n++;
  }
  return n;
}
