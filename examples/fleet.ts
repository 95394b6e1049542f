/**
 * `deno task fleet`: a whole fleet on one machine. Starts a gateway and two nodes (real Docker
 * containers when the engine answers and has the base image, built here when it is missing,
 * otherwise the fake executor with a loud line saying sandboxes are simulated;
 * `DORMICE_EXECUTOR` decides when set) as child processes on loopback, each with its own
 * data under `.dormice/fleet/`, prints where they listen and how to point a client at the
 * gateway, and stops all three cleanly on Ctrl-C.
 *
 * `deno task fleet --shared` starts shared mode instead (DESIGN §9, docs/shared-mode.md): a local
 * one-member etcd (Debian's `etcd-server`; its data under `.dormice/fleet/etcd`), two gateways
 * coordinated through it, and two nodes that check in with either.
 *
 * `deno task fleet --domain=dormice.test` serves the sandbox domain (DESIGN §7) over https: it
 * makes (or reuses, under `.dormice/fleet/tls/<domain>/`) a certificate authority and a
 * wildcard certificate with openssl, starts the gateway with `DORMICE_SANDBOX_DOMAIN` and
 * `DORMICE_GATEWAY_TLS_CERT`/`_KEY` (on 443 when it may bind it, as root does; the SDK's hosts
 * carry no port), and prints how to trust the CA, which names must resolve to the gateway, and
 * the `E2B_DOMAIN` line. Without openssl it says so and starts without the domain.
 *
 * `DORMICE_API_TOKEN` is the fleet token; when unset a development token is generated and
 * printed. `DORMICE_GATEWAY_PORT` moves the gateway (default 3677; the nodes take the next free
 * ports from 3676 up; with `--domain`, 443 is tried first). `DORMICE_FLEET_DIR` moves the data
 * (default `.dormice/fleet`, relative to the repository; the task may write only under
 * `.dormice`). The gateway's CPU and disk filters are off by default here
 * (`DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT=100`, `DORMICE_GATEWAY_NODE_MIN_DISK_GB=0`): both nodes
 * report the same machine, so those readings cannot tell them apart.
 *
 * With Docker the nodes keep their sandboxes off this machine with iptables, which needs root:
 * run the task as root, or, for a demo on loopback, `DORMICE_SANDBOX_HOST_FIREWALL=off deno task
 * fleet` (the nodes then let sandboxes reach every service listening on this machine).
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import { gatewayEnvVariables } from "../gateway/config.ts";
import { nodeEnvVariables } from "../node/config.ts";
import {
  domainInstructions,
  domainRefusal,
  ensureFleetCertificates,
  type FleetCertificates,
  OpensslError,
} from "./_fleet_tls.ts";

/** The team `deno task fleet` mints its development key for. */
const DEV_TEAM = "dev";
/** The label of that key, so the next run can revoke the previous one (it cannot be shown again). */
const DEV_LABEL = "deno task fleet";

const root = fileURLToPath(new URL("..", import.meta.url));
const dataRoot = Deno.env.get("DORMICE_FLEET_DIR") || ".dormice/fleet";
if (import.meta.main && (dataRoot.startsWith("/") || dataRoot.split("/").includes(".."))) {
  console.error(
    `DORMICE_FLEET_DIR='${dataRoot}' must be a path inside the repository, such as .dormice/fleet-2`,
  );
  Deno.exit(2);
}
/** Variables a child keeps so Deno finds its cache; nothing else leaks in. */
const passThrough = ["HOME", "PATH", "DENO_DIR", "XDG_CACHE_HOME", "TMPDIR"];

/** Whether nothing listens on a loopback port. */
function portIsFree(port: number): boolean {
  return bindRefusal(port) === null;
}

/** Why this process cannot listen on a loopback port, or `null` when it can. */
function bindRefusal(port: number): string | null {
  try {
    Deno.listen({ hostname: "127.0.0.1", port }).close();
    return null;
  } catch (error) {
    return error instanceof Deno.errors.PermissionDenied
      ? `binding port ${port} needs root or CAP_NET_BIND_SERVICE`
      : `port ${port} on 127.0.0.1 is in use`;
  }
}

/** The fleet's own client for the gateway: it trusts the fleet's CA when the gateway has TLS. */
let gatewayClient: Deno.HttpClient | undefined;

/** The first free port at or after `from`, skipping `taken`. */
function nextFreePort(from: number, taken: Set<number>): number {
  for (let port = from; port < from + 200; port++) {
    if (!taken.has(port) && portIsFree(port)) {
      taken.add(port);
      return port;
    }
  }
  throw new Error(`No free loopback port from ${from} to ${from + 199}: stop something using them`);
}

interface Child {
  label: string;
  url: string;
  process: Deno.ChildProcess;
  exited: boolean;
}

/** Starts `deno run <permissions> <script>` with a clean env, prefixing its log lines. */
function start(
  label: string,
  url: string,
  script: string,
  permissions: string[],
  env: Record<string, string>,
): Child {
  const childEnv: Record<string, string> = {};
  for (const name of passThrough) {
    const value = Deno.env.get(name);
    if (value !== undefined) childEnv[name] = value;
  }
  // By name, so the task can grant exactly `--allow-run=deno`.
  const process = new Deno.Command("deno", {
    args: ["run", "--quiet", ...permissions, script],
    cwd: root,
    env: { ...childEnv, ...env },
    clearEnv: true,
    stdin: "null",
    stdout: "inherit",
    stderr: "piped",
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
      // One write per line, so the three children's lines never interleave mid-line.
      for (const line of lines) await Deno.stderr.write(encoder.encode(prefix + line + "\n"));
    }
  })();
  return child;
}

async function waitForHealth(child: Child, timeoutMs = 30_000, path = "/healthz"): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exited) {
      throw new Error(`${child.label} exited before it answered ${child.url}/healthz`);
    }
    try {
      const res = await fetch(`${child.url}${path}`, {
        signal: AbortSignal.timeout(1000),
        client: gatewayClient,
      });
      await res.body?.cancel();
      if (res.ok) return;
    } catch { /* not listening yet */ }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  throw new Error(`${child.label} did not answer ${child.url}/healthz within ${timeoutMs} ms`);
}

/** Starts a one-member etcd for `--shared` on loopback, its data under the fleet's data dir. */
function startEtcd(clientUrl: string, peerPort: number): Child {
  const peerUrl = `http://127.0.0.1:${peerPort}`;
  const dataDir = `${root}/${dataRoot}/etcd`;
  Deno.mkdirSync(dataDir, { recursive: true });
  // etcd warns at every start about a data dir that others may read; it holds the key table.
  Deno.chmodSync(dataDir, 0o700);
  let process: Deno.ChildProcess;
  try {
    process = new Deno.Command("etcd", {
      args: [
        "--name=fleet",
        `--data-dir=${dataDir}`,
        `--listen-client-urls=${clientUrl}`,
        `--advertise-client-urls=${clientUrl}`,
        `--listen-peer-urls=${peerUrl}`,
        `--initial-advertise-peer-urls=${peerUrl}`,
        `--initial-cluster=fleet=${peerUrl}`,
        "--log-level=warn",
        // etcd 3.4's default logger (capnslog) ignores --log-level for raft's INFO lines and
        // warns that it is deprecated: a dozen lines in the user's terminal at every start.
        "--logger=zap",
      ],
      stdin: "null",
      stdout: "null",
      stderr: "inherit",
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

/** Stops every child: SIGTERM (unless it is already stopping), then SIGKILL after 12 s. */
async function stopAll(children: Child[], alreadySignalled: boolean): Promise<void> {
  if (alreadySignalled) {
    // Ctrl-C reached the whole process group: the children are already stopping on their own,
    // and a second signal would make them exit at once instead of cleanly.
    await Promise.race([
      Promise.all(children.map((c) => c.process.status)),
      new Promise((resolve) => setTimeout(resolve, 1500)),
    ]);
  }
  for (const c of children) {
    if (!c.exited) {
      try {
        c.process.kill("SIGTERM");
      } catch { /* exited meanwhile */ }
    }
  }
  const timer = setTimeout(() => {
    for (const c of children) {
      if (!c.exited) {
        try {
          c.process.kill("SIGKILL");
        } catch { /* exited meanwhile */ }
      }
    }
  }, 12_000);
  await Promise.all(children.map((c) => c.process.status));
  clearTimeout(timer);
}

function devToken(): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(24)),
    (b) => b.toString(16).padStart(2, "0"),
  ).join("");
}

const dockerSocket = "/var/run/docker.sock";

/** The images of the nodes' default templates, and how long their scripts take to build them. */
const images = [
  {
    image: "dormice-base:latest",
    script: "deploy/images/build-base.sh",
    takes: "about 50 s the first time: debootstrap of a Debian root from Debian's mirror",
    required: true,
  },
  {
    image: "dormice-minimal:latest",
    script: "deploy/images/build-minimal.sh",
    takes: "a second",
    required: false,
  },
];

/** What stands between this machine and real containers: nothing, a missing image, or more. */
type DockerState = { ok: true } | { ok: false; imageMissing: boolean; why: string };

/** Asks the Docker engine over its socket whether `image` is there. */
async function dockerState(image: string): Promise<DockerState> {
  const no = (why: string, imageMissing = false): DockerState => ({ ok: false, imageMissing, why });
  let conn: Deno.UnixConn;
  try {
    conn = await Deno.connect({ transport: "unix", path: dockerSocket });
  } catch (error) {
    return no(
      `no Docker engine answers at ${dockerSocket} (${(error as Error).message}): ` +
        `install docker.io and start dockerd, then build the images with .ci/docker.sh`,
    );
  }
  try {
    const request = `GET /images/${image}/json HTTP/1.0\r\nHost: docker\r\n\r\n`;
    await conn.write(new TextEncoder().encode(request));
    const buffer = new Uint8Array(64);
    const read = await Promise.race([
      conn.read(buffer),
      new Promise<null>((resolve) => setTimeout(() => resolve(null), 3000)),
    ]);
    const statusLine = read ? new TextDecoder().decode(buffer.subarray(0, read)) : "";
    if (/^HTTP\/1\.[01] 200/.test(statusLine)) return { ok: true };
    if (/^HTTP\/1\.[01] 404/.test(statusLine)) {
      return no(`the Docker engine runs but has no ${image} image`, true);
    }
    return no(
      `the Docker engine at ${dockerSocket} did not answer as expected ` +
        `(${statusLine.split("\r\n")[0] || "no answer within 3 s"})`,
    );
  } finally {
    conn.close();
  }
}

/**
 * Builds the missing template images (an engine without them is a few seconds to a minute from
 * real containers, with no registry, which beats a fleet of simulated sandboxes), then says
 * whether the nodes can run Docker: the base image is required, the minimal one is not.
 */
async function ensureImages(): Promise<DockerState> {
  for (const { image, script, takes, required } of images) {
    let state = await dockerState(image);
    if (!state.ok && state.imageMissing) {
      console.error(`The Docker engine has no ${image}: building it with ${script} (${takes}) …`);
      // Its output goes to this terminal: progress for a minute-long build, and sudo's prompt.
      const built = await new Deno.Command("bash", {
        args: [fileURLToPath(new URL(`../${script}`, import.meta.url)), image],
        stdin: "inherit",
        stdout: "inherit",
        stderr: "inherit",
      }).output().catch(() => ({ success: false }));
      state = built.success ? await dockerState(image) : {
        ok: false,
        imageMissing: true,
        why: `the Docker engine runs but has no ${image} image, and building it failed ` +
          `(its output is above): run 'bash ${script}' as root`,
      };
    }
    if (!state.ok && (required || !state.imageMissing)) return state;
    if (!state.ok) {
      console.error(`${state.why}: the nodes refuse its template until it is built`);
    }
  }
  return { ok: true };
}

if (import.meta.main) {
  const given = Deno.env.get("DORMICE_API_TOKEN");
  const token = given && given.length >= 32 ? given : devToken();
  if (given && given.length < 32) {
    console.error(
      `DORMICE_API_TOKEN is ${given.length} characters long (at least 32 needed): using a generated development token instead`,
    );
  }
  let executor = Deno.env.get("DORMICE_EXECUTOR") || "";
  if (executor === "") {
    const state = await ensureImages();
    executor = state.ok ? "docker" : "fake";
    const why = state.ok ? null : state.why;
    if (why !== null) {
      console.error(
        [
          "",
          "!!! SANDBOXES ARE SIMULATED: the nodes run the in-memory fake executor, not containers.",
          `!!! Why: ${why}.`,
          "!!! Set DORMICE_EXECUTOR=fake to silence this, or fix the above for real containers.",
          "",
        ].join("\n"),
      );
    }
  }
  const hostFirewall = Deno.env.get("DORMICE_SANDBOX_HOST_FIREWALL") ?? "";
  const shared = Deno.args.includes("--shared");
  let domain = Deno.args.find((a) => a.startsWith("--domain="))?.slice("--domain=".length) ??
    null;
  if (domain !== null) {
    const refusal = domainRefusal(domain) ??
      (shared ? "--domain and --shared together are not supported here: pick one" : null);
    if (refusal !== null) {
      console.error(refusal);
      Deno.exit(2);
    }
  }
  let certs: FleetCertificates | undefined;
  if (domain !== null) {
    try {
      // Printed paths are copied into shells: no doubled slash.
      certs = await ensureFleetCertificates(`${root.replace(/\/$/, "")}/${dataRoot}/tls`, domain);
    } catch (error) {
      if (!(error instanceof OpensslError)) throw error;
      console.error(`${error.message}.`);
      // The loopback fleet is still useful; the domain is what cannot be served without TLS.
      console.error(`Starting the fleet without the sandbox domain ${domain}.`);
      domain = null;
    }
  }
  if (certs !== undefined) {
    gatewayClient = Deno.createHttpClient({ caCerts: [Deno.readTextFileSync(certs.caFile)] });
  }
  const taken = new Set<number>();
  const askedPort = Deno.env.get("DORMICE_GATEWAY_PORT");
  // The SDK's https URLs carry no port, so a domain wants 443 (root may bind it); another
  // port then rides in the domain, and the printed lines say so.
  const not443 = domain !== null && !askedPort ? bindRefusal(443) : null;
  const gatewayPort = Number(askedPort || (domain !== null && not443 === null ? 443 : 3677));
  const refusal = bindRefusal(gatewayPort);
  if (refusal !== null) {
    console.error(
      `Cannot start the gateway: ${refusal}: stop what listens there, or set DORMICE_GATEWAY_PORT to another port`,
    );
    Deno.exit(2);
  }
  taken.add(gatewayPort);
  const scheme = certs === undefined ? "http" : "https";
  const gatewayUrl = `${scheme}://127.0.0.1:${gatewayPort}`;
  const sandboxDomain = domain === null
    ? null
    : `${domain}${gatewayPort === 443 ? "" : `:${gatewayPort}`}`;
  const dbDir = `${dataRoot}/gateway`;
  Deno.mkdirSync(`${root}/${dbDir}`, { recursive: true });
  // Shared mode's second gateway and its etcd, on the next free ports.
  const gateway2Port = shared ? nextFreePort(gatewayPort + 1, taken) : 0;
  const gateway2Url = `http://127.0.0.1:${gateway2Port}`;
  const db2Dir = `${dataRoot}/gateway-2`;
  const etcdClientPort = shared ? nextFreePort(2379, taken) : 0;
  const etcdPeerPort = shared ? nextFreePort(etcdClientPort + 1, taken) : 0;
  const etcdUrl = `http://127.0.0.1:${etcdClientPort}`;
  const gatewayUrls = shared ? [gatewayUrl, gateway2Url] : [gatewayUrl];

  const children: Child[] = [];
  let stopping = false;
  const stop = async (signalled: boolean, code: number) => {
    if (stopping) return;
    stopping = true;
    console.error("\nStopping the fleet…");
    await stopAll(children, signalled);
    console.error(
      shared
        ? "Both gateways, etcd and both nodes stopped."
        : "The gateway and both nodes stopped.",
    );
    Deno.exit(code);
  };
  Deno.addSignalListener("SIGINT", () => void stop(true, 0));
  Deno.addSignalListener("SIGTERM", () => void stop(false, 0));

  try {
    if (shared) {
      const etcd = startEtcd(etcdUrl, etcdPeerPort);
      children.push(etcd);
      await waitForHealth(etcd, 15_000, "/health");
    }
    for (const [i, url] of gatewayUrls.entries()) {
      const dir = i === 0 ? dbDir : db2Dir;
      Deno.mkdirSync(`${root}/${dir}`, { recursive: true });
      const gateway = start(i === 0 ? "gateway" : "gateway-2", url, "gateway/main.ts", [
        "--unstable-no-legacy-abort",
        "--allow-net=127.0.0.1",
        `--allow-env=${gatewayEnvVariables.join(",")}`,
        `--allow-read=${dir}${certs ? `,${dataRoot}/tls/${domain}` : ""}`,
        `--allow-write=${dir}`,
      ], {
        DORMICE_API_TOKEN: token,
        DORMICE_GATEWAY_HOST: "127.0.0.1",
        // Not the URL's port: https://127.0.0.1:443 parses to none.
        DORMICE_GATEWAY_PORT: String(i === 0 ? gatewayPort : gateway2Port),
        DORMICE_GATEWAY_DB: `${dir}/gateway.db`,
        ...(shared ? { DORMICE_GATEWAY_ETCD: etcdUrl } : {}),
        ...(certs && sandboxDomain
          ? {
            DORMICE_SANDBOX_DOMAIN: sandboxDomain,
            DORMICE_GATEWAY_TLS_CERT: certs.certFile,
            DORMICE_GATEWAY_TLS_KEY: certs.keyFile,
            // A fleet with ports serves their WebSockets too (Jupyter, dev servers); the cost of
            // the switch is in the README's domain section.
            DORMICE_GATEWAY_WEBSOCKETS: "on",
          }
          : {}),
        // Both nodes report this one machine's CPU, so it cannot tell them apart, and a busy
        // laptop must not refuse demo sandboxes; the active-sandbox count still spreads them.
        DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: Deno.env.get("DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT") ||
          "100",
        // The same disk too: a nearly full dev disk should not stop a demo either.
        DORMICE_GATEWAY_NODE_MIN_DISK_GB: Deno.env.get("DORMICE_GATEWAY_NODE_MIN_DISK_GB") || "0",
      });
      children.push(gateway);
      await waitForHealth(gateway);
    }

    const nodes: { id: string; url: string; dir: string }[] = [];
    let from = 3676;
    for (const id of ["node-a", "node-b"]) {
      const port = nextFreePort(from, taken);
      from = port + 1;
      const dir = `${dataRoot}/${id}`;
      Deno.mkdirSync(`${root}/${dir}`, { recursive: true });
      const url = `http://127.0.0.1:${port}`;
      nodes.push({ id, url, dir });
      children.push(start(id, url, "node/main.ts", [
        `--allow-net=127.0.0.1${executor === "docker" ? `,unix:${dockerSocket}` : ""}`,
        // dockerode's dependencies read the environment, so the docker executor needs all of it.
        executor === "docker" ? "--allow-env" : `--allow-env=${nodeEnvVariables.join(",")}`,
        // The docker executor talks to the daemon over its socket.
        `--allow-read=${dir}${executor === "docker" ? `,${dockerSocket}` : ""}`,
        `--allow-write=${dir}${executor === "docker" ? `,${dockerSocket}` : ""}`,
        "--allow-sys=cpus,systemMemoryInfo,statfs",
        // The docker executor's host firewall: one iptables rule per sandbox network.
        ...(executor === "docker" ? ["--allow-run=iptables"] : []),
      ], {
        DORMICE_API_TOKEN: token,
        DORMICE_HOST: "127.0.0.1",
        DORMICE_PORT: String(port),
        DORMICE_DATA_DIR: dir,
        DORMICE_EXECUTOR: executor,
        DORMICE_GATEWAY_ENDPOINT: gatewayUrls.join(","),
        DORMICE_NODE_ID: id,
        DORMICE_CHECK_IN_INTERVAL_SECONDS: "5",
        // Only when the operator set it: a non-root demo's explicit off (not root, the nodes
        // refuse to start with the firewall on).
        ...(hostFirewall ? { DORMICE_SANDBOX_HOST_FIREWALL: hostFirewall } : {}),
        // The nodes check in over https, trusting the fleet's CA as any client must.
        ...(certs ? { DENO_CERT: certs.caFile, DORMICE_WEBSOCKETS: "on" } : {}),
      }));
    }
    await Promise.all(children.slice(-2).map((c) => waitForHealth(c)));
    const devKey = await mintDevKey(gatewayUrl, token);

    const auth = `-H "Authorization: Bearer $E2B_API_KEY"`;
    const fleetAuth = `-H "Authorization: Bearer $DORMICE_API_TOKEN"`;
    const curl = certs ? `curl -s --cacert ${certs.caFile}` : "curl -s";
    const keysEnv = [
      ...(gatewayUrl === "http://127.0.0.1:3677" ? [] : [`DORMICE_GATEWAY_URL=${gatewayUrl}`]),
      ...(certs ? [`DENO_CERT=${certs.caFile}`] : []),
    ].map((v) => `${v} `).join("");
    console.log(
      [
        "",
        "A Dormice fleet is running on loopback:",
        `  gateway  ${gatewayUrl}   (database ${dbDir}/gateway.db)`,
        ...(shared
          ? [
            `  gateway  ${gateway2Url}   (shared mode: slots, nodes and keys in etcd at ${etcdUrl})`,
          ]
          : []),
        ...nodes.map((n) =>
          `  ${n.id.padEnd(7)}  ${n.url}   (data ${n.dir}, ${executor} executor)`
        ),
        "",
        `Point a client at the gateway (an API key of team '${DEV_TEAM}', minted just now):`,
        `  export E2B_API_URL=${gatewayUrl}/e2b/api`,
        `  export E2B_SANDBOX_URL=${gatewayUrl}/e2b/envd`,
        `  export E2B_API_KEY=${devKey}`,
        "The operator's fleet token (node check-ins, listNodes, minting keys with deno task keys):",
        `  export DORMICE_API_TOKEN=${token}`,
        "",
        "Try:",
        `  ${curl} ${auth} -d '{"name":"demo"}' ${gatewayUrl}/acquireSandbox`,
        `  ${curl} ${auth} -d '{"name":"demo","command":"echo hello"}' ${gatewayUrl}/execCommand`,
        `  ${curl} ${auth} -d '{"name":"demo"}' ${gatewayUrl}/destroySandbox`,
        `  ${curl} ${fleetAuth} -d '{}' ${gatewayUrl}/listNodes`,
        `  ${curl} ${fleetAuth} ${gatewayUrl}/metrics`,
        `  open ${gatewayUrl}/ui in a browser and log in with the fleet token`,
        `  ${keysEnv}npx -y deno@2.9.6 task keys create --team another-team --max-sandboxes 5`,
        "",
        ...(certs && domain
          ? [
            ...domainInstructions({
              domain,
              port: gatewayPort,
              not443: not443 ?? undefined,
              certs,
              apiKey: devKey,
            }),
            "",
          ]
          : []),
        shared ? "Ctrl-C stops them all." : "Ctrl-C stops all three.",
        "",
      ].join("\n"),
    );
    // A child that dies on its own takes the fleet down with it, so nothing half-runs unnoticed.
    const first = await Promise.race(children.map((c) => c.process.status.then(() => c)));
    if (!stopping) {
      console.error(`${first.label} exited on its own; stopping the others`);
      await stop(false, 1);
    }
  } catch (error) {
    console.error((error as Error).message);
    await stop(false, 1);
  }
}

/**
 * Mints a fresh key for team `dev` so a client never needs the fleet token, revoking the keys
 * earlier runs minted: the database outlives a run, and a key cannot be shown twice.
 */
async function mintDevKey(gatewayUrl: string, token: string): Promise<string> {
  const call = async (verb: string, body: unknown) => {
    const res = await fetch(`${gatewayUrl}/${verb}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
      client: gatewayClient,
    });
    const answer = await res.json();
    if (!res.ok) throw new Error(`The gateway refused ${verb}: ${answer.message}`);
    return answer;
  };
  const { keys } = await call("listApiKeys", {});
  for (const k of keys as { id: string; team: string; label: string | null }[]) {
    if (k.team === DEV_TEAM && k.label === DEV_LABEL) await call("revokeApiKey", { id: k.id });
  }
  return (await call("createApiKey", { team: DEV_TEAM, label: DEV_LABEL })).key;
}
