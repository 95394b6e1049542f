/**
 * `deno task fleet`: a whole fleet on one machine. Starts a gateway and two nodes (real Docker
 * containers when the engine answers and has the base image, built here when it is missing,
 * otherwise the fake executor with a loud line saying sandboxes are simulated;
 * `DORMICE_EXECUTOR` decides when set) as child processes on loopback, each with its own
 * data under `.dormice/fleet/`, prints where they listen and how to point a client at the
 * gateway, and stops them all cleanly, nodes first, on Ctrl-C, SIGTERM, or when the command
 * that launched it (say `npx`) is gone (`_fleet_children.ts` says how and why).
 *
 * The nodes run with the permissions of `deno task node` (deno.json), so they reach sandbox
 * ports wherever the engine put the containers; the gateways only need loopback.
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
 * `--verbose` shows every part's log (`info`) and Deno's own progress lines; by default the
 * parts log warnings and errors only.
 *
 * `DORMICE_API_TOKEN` is the fleet token; when unset a development token is generated and
 * printed. `DORMICE_GATEWAY_PORT` moves the gateway (default 3677; with `--domain`, 443 is tried
 * first), `DORMICE_FLEET_NODE_IDS` names the nodes (default `node-a,node-b`), which take the
 * next free ports from `DORMICE_FLEET_NODE_PORT` (3676) up, and `--shared`'s etcd the next free
 * ones from `DORMICE_FLEET_ETCD_PORT` (2379). `DORMICE_FLEET_DIR` moves the data (default
 * `.dormice/fleet`; the task may write only under `.dormice`). The gateway's CPU and disk
 * filters are off by default here (`DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT=100`,
 * `DORMICE_GATEWAY_NODE_MIN_DISK_GB=0`): the nodes report the same machine, so those readings
 * cannot tell them apart.
 *
 * With Docker the nodes keep their sandboxes off this machine with iptables, which needs root:
 * run the task as root, or, for a demo on loopback, `DORMICE_SANDBOX_HOST_FIREWALL=off deno task
 * fleet` (the nodes then let sandboxes reach every service listening on this machine).
 *
 * @module
 */
import { fileURLToPath } from "node:url";
import denoConfig from "../deno.json" with { type: "json" };
import { gatewayEnvVariables } from "../gateway/config.ts";
import { fleetBanner } from "./_fleet_banner.ts";
import {
  type Child,
  startDeno,
  startEtcd,
  stopInOrder,
  watchLaunchChain,
} from "./_fleet_children.ts";
import { fleetEgressCa } from "./_fleet_egress_ca.ts";
import { fleetSettings } from "./_fleet_settings.ts";
import {
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
if (
  import.meta.main &&
  (!dataRoot.startsWith(".dormice/") || dataRoot.split("/").includes(".."))
) {
  console.error(
    `DORMICE_FLEET_DIR='${dataRoot}' must be a path under the repository's .dormice (the only ` +
      "place the task may write), such as .dormice/fleet-2",
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

/**
 * The flags of one of deno.json's tasks (`deno run <flags> <script>`): the nodes get exactly
 * what `deno task node` grants, so the two cannot drift apart.
 */
function taskFlags(name: "node"): string[] {
  const words = denoConfig.tasks[name].split(/\s+/);
  return words.slice(words.indexOf("run") + 1, -1);
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
  {
    image: "dormice-code-interpreter:latest",
    script: "deploy/images/build-code-interpreter.sh",
    takes: "about 3 min the first time: Jupyter, matplotlib, numpy and pandas from Debian's mirror",
    required: false,
    // Three minutes is too long to hold a first run for a template most people do not use.
    onRequest: true,
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
  for (const { image, script, takes, required, onRequest } of images) {
    let state = await dockerState(image);
    if (!state.ok && state.imageMissing && onRequest) {
      console.error(
        `The Docker engine has no ${image}: its templates are refused until 'bash ${script}' ` +
          `builds it (${takes}).`,
      );
      continue;
    }
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
  const settings = fleetSettings(Deno.env, Deno.args);
  if ("refusals" in settings) {
    for (const r of settings.refusals) console.error(r);
    Deno.exit(2);
  }
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
  const sandboxDns = Deno.env.get("DORMICE_SANDBOX_DNS") ?? "";
  const e2bDefaultEgress = Deno.env.get("DORMICE_EGRESS_E2B_DEFAULT") ?? "";
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
  // Shared mode's second gateway and its etcd, on the next free ports.
  const gateway2Port = shared ? nextFreePort(gatewayPort + 1, taken) : 0;
  const gateway2Url = `http://127.0.0.1:${gateway2Port}`;
  const db2Dir = `${dataRoot}/gateway-2`;
  const etcdClientPort = shared ? nextFreePort(settings.etcdPort, taken) : 0;
  const etcdPeerPort = shared ? nextFreePort(etcdClientPort + 1, taken) : 0;
  const etcdUrl = `http://127.0.0.1:${etcdClientPort}`;
  const gatewayUrls = shared ? [gatewayUrl, gateway2Url] : [gatewayUrl];
  const childEnv: Record<string, string> = {
    // The parts' info lines (listening, placer ready, check-ins) repeat what the banner says.
    DORMICE_LOG_LEVEL: settings.verbose ? "info" : "warn",
  };
  for (const name of passThrough) {
    const value = Deno.env.get(name);
    if (value !== undefined) childEnv[name] = value;
  }
  const startOptions = (env: Record<string, string>) => ({
    cwd: root,
    env: { ...childEnv, ...env },
    verbose: settings.verbose,
  });

  const etcds: Child[] = [];
  const gateways: Child[] = [];
  const nodeChildren: Child[] = [];
  /** Every part, in the order they stop. */
  const all = () => [...nodeChildren, ...gateways, ...etcds];
  let stopping = false;
  const stop = async (code: number) => {
    if (stopping) return;
    stopping = true;
    console.error("\nStopping the fleet: nodes, then gateways" + (shared ? ", then etcd…" : "…"));
    // Each part after the ones that call it, so none logs the others' disappearance.
    await stopInOrder([nodeChildren, gateways, etcds]);
    const parts = all().map((c) => c.label);
    console.error(parts.length > 0 ? `Stopped: ${parts.join(", ")}.` : "Nothing had started.");
    Deno.exit(code);
  };
  // The children sit in sessions of their own, out of reach of the terminal's signals: every
  // way this process can be asked to stop must stop them. SIGHUP is a closed terminal.
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    Deno.addSignalListener(signal, () => void stop(0));
  }
  await watchLaunchChain((pid) => {
    console.error(`\nThe command that started the fleet (process ${pid}) is gone.`);
    void stop(0);
  });

  try {
    if (shared) {
      const etcd = startEtcd({
        dataDir: `${root}/${dataRoot}/etcd`,
        clientPort: etcdClientPort,
        peerPort: etcdPeerPort,
        verbose: settings.verbose,
      });
      etcds.push(etcd);
      await waitForHealth(etcd, 15_000, "/health");
    }
    for (const [i, url] of gatewayUrls.entries()) {
      const dir = i === 0 ? dbDir : db2Dir;
      Deno.mkdirSync(`${root}/${dir}`, { recursive: true });
      const gateway = startDeno(
        i === 0 ? "gateway" : "gateway-2",
        url,
        "gateway/main.ts",
        [
          "--unstable-no-legacy-abort",
          "--allow-net=127.0.0.1",
          `--allow-env=${gatewayEnvVariables.join(",")}`,
          `--allow-read=${dir}${certs ? `,${dataRoot}/tls/${domain}` : ""}`,
          `--allow-write=${dir}`,
        ],
        startOptions({
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
              // A fleet with ports serves their WebSockets too (Jupyter, dev servers); the cost
              // of the switch is in the README's domain section.
              DORMICE_GATEWAY_WEBSOCKETS: "on",
            }
            : {}),
          // The nodes report this one machine's CPU, so it cannot tell them apart, and a busy
          // laptop must not refuse demo sandboxes; the active-sandbox count still spreads them.
          DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: Deno.env.get("DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT") ||
            "100",
          // The same disk too: a nearly full dev disk should not stop a demo either.
          DORMICE_GATEWAY_NODE_MIN_DISK_GB: Deno.env.get("DORMICE_GATEWAY_NODE_MIN_DISK_GB") ||
            "0",
        }),
      );
      gateways.push(gateway);
      await waitForHealth(gateway);
    }

    // One egress CA for every node: its fingerprint is in the config digest, and a CA each
    // node made for itself would set the nodes apart (the gateway's digest-mismatch warning).
    let egressCaEnv: Record<string, string> = {};
    if (executor === "docker") {
      const ca = await fleetEgressCa(dataRoot);
      if ("env" in ca) egressCaEnv = ca.env;
      else console.error(`No fleet egress CA (${ca.why}): the nodes refuse domain rules`);
    }
    const nodes: { id: string; url: string; dir: string }[] = [];
    let from = settings.nodePort;
    for (const id of settings.nodeIds) {
      const port = nextFreePort(from, taken);
      from = port + 1;
      const dir = `${dataRoot}/${id}`;
      Deno.mkdirSync(`${root}/${dir}`, { recursive: true });
      const url = `http://127.0.0.1:${port}`;
      nodes.push({ id, url, dir });
      // Exactly `deno task node`'s permissions: a node connects to sandbox addresses the
      // engine picks from its pools (ports, the code interpreter), which no host list names.
      nodeChildren.push(startDeno(
        id,
        url,
        "node/main.ts",
        taskFlags("node"),
        startOptions({
          DORMICE_API_TOKEN: token,
          DORMICE_HOST: "127.0.0.1",
          DORMICE_PORT: String(port),
          DORMICE_DATA_DIR: dir,
          DORMICE_EXECUTOR: executor,
          DORMICE_GATEWAY_ENDPOINT: gatewayUrls.join(","),
          DORMICE_NODE_ID: id,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "5",
          ...egressCaEnv,
          // Only when the operator set it: a non-root demo's explicit off (not root, the nodes
          // refuse to start with the firewall on).
          ...(hostFirewall ? { DORMICE_SANDBOX_HOST_FIREWALL: hostFirewall } : {}),
          // The resolvers sandboxes ask, when the operator names them (the SDK tests' stand-in).
          ...(sandboxDns ? { DORMICE_SANDBOX_DNS: sandboxDns } : {}),
          // E2B's default egress, when the operator asks for it (the SDK tests run under it).
          ...(e2bDefaultEgress ? { DORMICE_EGRESS_E2B_DEFAULT: e2bDefaultEgress } : {}),
          // The nodes check in over https, trusting the fleet's CA as any client must.
          ...(certs ? { DENO_CERT: certs.caFile, DORMICE_WEBSOCKETS: "on" } : {}),
        }),
      ));
    }
    await Promise.all(nodeChildren.map((c) => waitForHealth(c)));
    const apiKey = await mintDevKey(gatewayUrl, token);
    console.log(
      fleetBanner({
        gatewayUrl,
        gatewayDb: `${dbDir}/gateway.db`,
        shared: shared ? { gateway2Url, etcdUrl } : undefined,
        nodes,
        executor,
        team: DEV_TEAM,
        apiKey,
        fleetToken: token,
        domain: certs && domain
          ? { name: domain, port: gatewayPort, not443: not443 ?? undefined, certs }
          : undefined,
      }).join("\n"),
    );
    // A child that dies on its own takes the fleet down with it, so nothing half-runs unnoticed.
    const first = await Promise.race(all().map((c) => c.process.status.then(() => c)));
    if (!stopping) {
      console.error(`${first.label} exited on its own; stopping the others`);
      await stop(1);
    }
  } catch (error) {
    console.error((error as Error).message);
    await stop(1);
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
