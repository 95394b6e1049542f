/**
 * The node's configuration, read from the environment with refusals an operator can act on.
 *
 * | variable | default | meaning |
 * |---|---|---|
 * | `DORMICE_API_TOKEN` | (required) | the fleet token, at least 32 characters |
 * | `DORMICE_HOST` | `127.0.0.1` | the address to listen on |
 * | `DORMICE_PORT` | `3676` | the port to listen on |
 * | `DORMICE_DATA_DIR` | `.dormice/node` | the ledger (and its lock) |
 * | `DORMICE_EXECUTOR` | `docker` | `docker` (containers; the node refuses to boot when the engine does not answer) or `fake` (in memory, for tests and demos) |
 * | `DORMICE_TEMPLATES` | `base=dormice-base:latest,minimal=dormice-minimal:latest,code-interpreter=dormice-code-interpreter:latest,code-interpreter-v1=dormice-code-interpreter:latest` | template name to Docker image, comma-separated; `base` is required (checked at boot): the Debian image with python3, git, curl and sudo, `minimal` the busybox one, `code-interpreter` (and `code-interpreter-v1`, `@e2b/code-interpreter`'s default) the base with Jupyter's Python kernel and its server on port 49999; the fake executor accepts the same names |
 * | `DORMICE_DOCKER_SOCKET` | from `DOCKER_HOST` (`unix://…`), else `/var/run/docker.sock` | the Docker engine's unix socket |
 * | `DORMICE_SANDBOX_CPUS` | `1` | cores of a Docker sandbox whose spec sets none (fractions allowed) |
 * | `DORMICE_SANDBOX_MEMORY_MB` | `512` | memory of a Docker sandbox whose spec sets none, MiB |
 * | `DORMICE_SANDBOX_PIDS` | `512` | processes of a Docker sandbox whose spec sets none |
 * | `DORMICE_SANDBOX_DISK_MB` | unset (unbounded) | bound of each Docker sandbox's writable layer, MiB; the engine's storage driver must support it (the node refuses to start otherwise) |
 * | `DORMICE_SANDBOX_HOST_FIREWALL` | `on` | `on`: an iptables rule per sandbox network drops every connection a Docker sandbox opens to this machine (the node refuses to start when it cannot manage it: root, iptables and `--allow-run=iptables`); `off`: no rule, sandboxes reach every service listening on the host |
 * | `DORMICE_EGRESS_E2B_DEFAULT` | `off` | what an E2B create that does not say `allowInternetAccess` gets: `off`, no egress (a sandbox has egress only when it asks); `on`, egress as if it said `true` (E2B's cloud default); part of the config digest, so a node set apart is reported |
 * | `DORMICE_GATEWAY_ENDPOINT` | unset (standalone) | the gateway's URL to check in with: its origin, or the path a host app mounts it at (`https://host/fleet`: check-ins go to `https://host/fleet/checkIn`); several gateways of one fleet comma-separated (checked in with one at a time, the next when one fails) |
 * | `DORMICE_GATEWAY_CHECK_IN_HEADER` | unset (none) | one more header on every check-in, `name: value`, for the auth of a host service the gateway is mounted in (never logged; `authorization`, `content-type`, `content-length` and `host` are the node's own) |
 * | `DORMICE_NODE_ENDPOINT` | `http://<host>:<port>` | the origin the gateway reaches this node at |
 * | `DORMICE_NODE_ID` | `node-1` | this node's id in the fleet (also labels its containers) |
 * | `DORMICE_CHECK_IN_INTERVAL_SECONDS` | `15` | seconds between check-ins (1–300) |
 * | `DORMICE_SCAN_INTERVAL_SECONDS` | `60` | seconds between safety sweeps (deadlines fire on their own timer; this is the longest it sleeps) |
 * | `DORMICE_JSON_BODY_LIMIT_MB` | `32` | cap of a JSON body that carries a file's bytes (native `writeFile`, envd's `SendInput`), MiB, 1 to 256 |
 * | `DORMICE_JSON_MESSAGE_LIMIT_KB` | `1024` | cap of every other JSON body (native verbs, the E2B control plane, Connect RPCs), KiB, 1 to 262144 |
 * | `DORMICE_UPLOAD_LIMIT_MB` | `1024` | cap of one `POST /files` upload after decompression, MiB, 1 to 8191 |
 * | `DORMICE_UPLOAD_GZIP_MAX_RATIO` | `100` | the most a `Content-Encoding: gzip` upload may grow when inflated, times its compressed size, 1 to 1032 (deflate's own most: no cap); the first MiB of output is allowed whatever the ratio |
 * | `DORMICE_LOG_LEVEL` | `info` | `debug`, `info`, `warn` or `error` |
 * | `DORMICE_POOLS` | unset (no pools) | warm pools, `template[:cpus[:memoryMB]]=warm,…`; `<DORMICE_DATA_DIR>/pools.json` (written by `setPools`) wins while it exists, and the boot log warns when they differ |
 * | `DORMICE_POOLS_REFILL_DELAY_MS` | `1000` | how long a pool's refill after a claim waits, ms (0 to 60000), so the claimed sandbox's first commands do not share the engine with a container being built |
 * | `DORMICE_SANDBOX_DOMAIN` | unset | the fleet's sandbox domain; part of the config digest, so a node set apart is reported |
 *
 * The snapshot, template-build and volume variables (`DORMICE_SNAPSHOT_*`, `DORMICE_TEMPLATE_*`,
 * `DORMICE_VOLUME*`) are read by config_state.ts, which lists them; the egress proxy's
 * (`DORMICE_EGRESS_CA_*`, `_EXTRA_CA`, `_HOSTS`, `DORMICE_SANDBOX_DNS`) by config_egress.ts.
 *
 * The `DORMICE_SANDBOX_*` limits apply to the Docker executor only; a sandbox's own spec
 * (`cpus`, `memoryMB`, `pids`) wins over them.
 *
 * The body caps: a JSON body is read whole (a node holds about three times the cap while it
 * parses one), so its cap stays in the tens of MB and under V8's longest string; a JSON body
 * that is a message, not a file's bytes, is parsed in one step on the event loop, so its cap is
 * a MiB; an upload streams (staged under `<DORMICE_DATA_DIR>/uploads` past 1 MiB), so its cap
 * bounds what one request may put in a sandbox and on the data disk, and the tar header Docker
 * needs (under 8 GiB); its gzip is inflated in slices, bounded by the ratio cap.
 *
 * @module
 */
import { type LogLevel, parseLogLevel } from "../shared/log.ts";
import { parseWebSocketSwitch } from "../shared/http1/mod.ts";
import type { PoolTarget } from "../shared/pools.ts";
import { maxCheckInIntervalSeconds, nodeIdSchema, parseEndpoint } from "../shared/schemas.ts";
import { parsePools, type VolumeDecl } from "./config_capabilities.ts";
import { integer, readStateSettings, readVolumeSettings } from "./config_state.ts";
import {
  type CheckInHeader,
  isLoopbackOrigin,
  parseCheckInHeader,
  parseGatewayEndpoint,
} from "./config_gateway.ts";

export {
  type CheckInHeader,
  isLoopbackOrigin,
  parseCheckInHeader,
  parseGatewayEndpoint,
} from "./config_gateway.ts";

/** The executors a node can run. */
export type ExecutorKind = "docker" | "fake";

/** Everything a node needs from its environment. */
export interface NodeConfig {
  /** The fleet token (`DORMICE_API_TOKEN`), at least 32 characters. */
  apiToken: string;
  /** The address to listen on (`DORMICE_HOST`). */
  host: string;
  /** The port to listen on (`DORMICE_PORT`). */
  port: number;
  /** Ledger and sandbox files (`DORMICE_DATA_DIR`). */
  dataDir: string;
  /** Which executor runs the sandboxes (`DORMICE_EXECUTOR`). */
  executor: ExecutorKind;
  /**
   * Template name to image (`DORMICE_TEMPLATES`), as written; `null` leaves the Docker
   * executor's default (`DEFAULT_TEMPLATES`: base, minimal, code-interpreter and
   * code-interpreter-v1; DESIGN §4).
   * Parsed by the Docker executor's `parseTemplates`, so a bad map is refused when the Docker
   * executor is built.
   */
  templates: string | null;
  /** The Docker engine's unix socket (`DORMICE_DOCKER_SOCKET`, else `DOCKER_HOST`'s path). */
  dockerSocket: string;
  /**
   * Node-wide limits of a Docker sandbox whose spec does not set them (`DORMICE_SANDBOX_CPUS`,
   * `DORMICE_SANDBOX_MEMORY_MB`, `DORMICE_SANDBOX_PIDS`); an unset one keeps the executor's
   * default (1 core, 512 MiB, 512 processes).
   */
  sandboxDefaults: SandboxDefaults;
  /**
   * Whether the Docker executor keeps sandboxes from connecting to this machine with an iptables
   * rule per sandbox network (`DORMICE_SANDBOX_HOST_FIREWALL`, on by default). Absent: on.
   */
  sandboxHostFirewall?: boolean;
  /**
   * Whether an E2B create that does not say `allowInternetAccess` gets egress as if it said
   * `true` (`DORMICE_EGRESS_E2B_DEFAULT=on`, E2B's cloud default). Absent: off, no egress.
   */
  e2bDefaultEgress?: boolean;
  /**
   * The first gateway's URL (`DORMICE_GATEWAY_ENDPOINT`): its origin, or with the path a host app
   * mounts it at; `null` runs standalone.
   */
  gatewayEndpoint: string | null;
  /**
   * One more header on every check-in (`DORMICE_GATEWAY_CHECK_IN_HEADER`), for a host service's
   * own auth in front of the gateway; never logged. Absent or `null`: none.
   */
  gatewayCheckInHeader?: CheckInHeader | null;
  /**
   * Every gateway's origin, in the order given (`DORMICE_GATEWAY_ENDPOINT` is comma-separated
   * in shared mode); empty when standalone. Absent: `gatewayEndpoint` alone.
   */
  gatewayEndpoints?: string[];
  /** The origin the gateway reaches this node at (`DORMICE_NODE_ENDPOINT`). */
  nodeEndpoint: string;
  /** This node's id in the fleet (`DORMICE_NODE_ID`). */
  nodeId: string;
  /** Seconds between check-ins (`DORMICE_CHECK_IN_INTERVAL_SECONDS`). */
  checkInIntervalSeconds: number;
  /** Seconds between deadline safety sweeps (`DORMICE_SCAN_INTERVAL_SECONDS`). */
  scanIntervalSeconds: number;
  /** The log floor (`DORMICE_LOG_LEVEL`). */
  logLevel: LogLevel;
  /** Warm pools before any `setPools` (`DORMICE_POOLS`). */
  pools: PoolTarget[];
  /** How long the refill after a claim waits, ms (`DORMICE_POOLS_REFILL_DELAY_MS`). */
  poolsRefillDelayMs: number;
  /** Named volumes (`DORMICE_VOLUMES`). */
  volumes: VolumeDecl[];
  /** The sandbox domain (`DORMICE_SANDBOX_DOMAIN`), or `null`. */
  sandboxDomain: string | null;
  /** Whether the port door takes WebSocket upgrades (`DORMICE_WEBSOCKETS`; on by default). */
  websockets: boolean;
  /** Cap of a JSON body that carries a file, bytes (`DORMICE_JSON_BODY_LIMIT_MB`). */
  jsonBodyLimitBytes: number;
  /** Cap of every other JSON body, bytes (`DORMICE_JSON_MESSAGE_LIMIT_KB`). */
  jsonMessageLimitBytes: number;
  /** Cap of one `POST /files` upload after decompression, bytes (`DORMICE_UPLOAD_LIMIT_MB`). */
  uploadLimitBytes: number;
  /** Free bytes a snapshot must leave on the data disk (`DORMICE_SNAPSHOT_MIN_DISK_GB`). */
  snapshotMinDiskBytes?: number;
  /** The shared volume root (`DORMICE_VOLUME_ROOT`), or `null`: volumes under the data dir. */
  volumeRoot?: string | null;
  /** The cap of a new managed volume, bytes (`DORMICE_VOLUME_SIZE_GB`). */
  volumeSizeBytes?: number;
  /** Template builds at once on this node (`DORMICE_TEMPLATE_BUILDS`). */
  templateBuilds?: number;
  /** One template build's bound, ms (`DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS`). */
  templateBuildTimeoutMs?: number;
  /** Cap of one uploaded template file context, bytes (`DORMICE_TEMPLATE_CONTEXT_LIMIT_MB`). */
  templateContextLimitBytes?: number;
  /** The most a gzip upload may grow, times its size (`DORMICE_UPLOAD_GZIP_MAX_RATIO`). */
  uploadGzipMaxRatio: number;
  /** `host:port` of the snapshots' OCI registry (`DORMICE_SNAPSHOT_REGISTRY`); none when absent. */
  snapshotRegistry?: string;
  /** One heal's time budget, ms (`DORMICE_SNAPSHOT_HEAL_TIMEOUT_SECONDS`). */
  snapshotHealTimeoutMs?: number;
  /** The most bytes one heal reads (`DORMICE_SNAPSHOT_HEAL_MAX_GB`). */
  snapshotHealMaxBytes?: number;
  /** How long a snapshot lives, ms (`DORMICE_SNAPSHOT_TTL_HOURS`); 0 keeps it until deleted. */
  snapshotTtlMs?: number;
  /**
   * Whether this node heals from other nodes and serves its snapshots to their heals
   * (`DORMICE_SNAPSHOT_HEAL`); absent: it does.
   */
  snapshotHeal?: boolean;
}

/** Node-wide sandbox limits; each is the executor's own default when absent. */
export interface SandboxDefaults {
  /** Cores (fractions allowed). */
  cpus?: number;
  /** Memory, MiB. */
  memoryMB?: number;
  /** Processes and threads. */
  pids?: number;
  /** Bound of the writable layer, MiB; unbounded when absent. */
  diskMB?: number;
}

/** The Docker socket when neither `DORMICE_DOCKER_SOCKET` nor a unix `DOCKER_HOST` names one. */
export const defaultDockerSocket: string = "/var/run/docker.sock";

/** The outcome of {@linkcode loadNodeConfig}: a config, or every refusal at once. */
export type NodeConfigResult =
  | { ok: true; config: NodeConfig }
  | { ok: false; refusals: string[] };

/** Every variable the node reads (`DOCKER_HOST` too: the Docker socket's conventional place) (so `main.ts` can ask for exactly these with `--allow-env`). */
export const nodeEnvVariables: readonly string[] = [
  "DORMICE_API_TOKEN",
  "DORMICE_HOST",
  "DORMICE_PORT",
  "DORMICE_DATA_DIR",
  "DORMICE_EXECUTOR",
  "DORMICE_TEMPLATES",
  "DORMICE_DOCKER_SOCKET",
  "DOCKER_HOST",
  "DORMICE_SANDBOX_CPUS",
  "DORMICE_SANDBOX_MEMORY_MB",
  "DORMICE_SANDBOX_PIDS",
  "DORMICE_SANDBOX_DISK_MB",
  "DORMICE_SANDBOX_HOST_FIREWALL",
  "DORMICE_EGRESS_CA_CERT",
  "DORMICE_EGRESS_CA_KEY",
  "DORMICE_EGRESS_EXTRA_CA",
  "DORMICE_EGRESS_HOSTS",
  "DORMICE_SANDBOX_DNS",
  "DORMICE_EGRESS_E2B_DEFAULT",
  "DORMICE_GATEWAY_ENDPOINT",
  "DORMICE_GATEWAY_CHECK_IN_HEADER",
  "DORMICE_NODE_ENDPOINT",
  "DORMICE_NODE_ID",
  "DORMICE_CHECK_IN_INTERVAL_SECONDS",
  "DORMICE_SCAN_INTERVAL_SECONDS",
  "DORMICE_JSON_BODY_LIMIT_MB",
  "DORMICE_JSON_MESSAGE_LIMIT_KB",
  "DORMICE_UPLOAD_LIMIT_MB",
  "DORMICE_SNAPSHOT_MIN_DISK_GB",
  "DORMICE_TEMPLATE_BUILDS",
  "DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS",
  "DORMICE_TEMPLATE_CONTEXT_LIMIT_MB",
  "DORMICE_SNAPSHOT_REGISTRY",
  "DORMICE_SNAPSHOT_HEAL_TIMEOUT_SECONDS",
  "DORMICE_SNAPSHOT_HEAL_MAX_GB",
  "DORMICE_SNAPSHOT_TTL_HOURS",
  "DORMICE_SNAPSHOT_HEAL",
  "DORMICE_UPLOAD_GZIP_MAX_RATIO",
  "DORMICE_LOG_LEVEL",
  "DORMICE_POOLS",
  "DORMICE_POOLS_REFILL_DELAY_MS",
  "DORMICE_VOLUMES",
  "DORMICE_VOLUME_ROOT",
  "DORMICE_VOLUME_SIZE_GB",
  "DORMICE_SANDBOX_DOMAIN",
  "DORMICE_WEBSOCKETS",
];

/** Options of {@linkcode loadNodeConfig}. */
export interface LoadNodeConfigOptions {
  /** The executor when `DORMICE_EXECUTOR` is unset. */
  defaultExecutor?: ExecutorKind;
  /** The data dir when `DORMICE_DATA_DIR` is unset. */
  defaultDataDir?: string;
}

/**
 * Reads the node's configuration from `env`. Pure: it never reads `Deno.env` itself. A bad value
 * is a refusal naming the variable, the value (never the token itself) and what to write instead;
 * every refusal is returned at once so an operator fixes them in one go.
 *
 * @example
 * ```ts
 * import { loadNodeConfig } from "@dormice/cluster/node";
 * const r = loadNodeConfig({ DORMICE_API_TOKEN: "x".repeat(32), DORMICE_EXECUTOR: "fake" });
 * if (r.ok) console.log(r.config.nodeEndpoint); // http://127.0.0.1:3676
 * ```
 */
export function loadNodeConfig(
  env: Record<string, string | undefined>,
  { defaultExecutor = "docker", defaultDataDir = ".dormice/node" }: LoadNodeConfigOptions = {},
): NodeConfigResult {
  const refusals: string[] = [];
  const get = (name: string): string | undefined => {
    const v = env[name];
    return v === undefined || v.trim() === "" ? undefined : v.trim();
  };

  const apiToken = env.DORMICE_API_TOKEN ?? "";
  if (apiToken === "") {
    refusals.push(
      "DORMICE_API_TOKEN is not set: set it to a secret of at least 32 characters shared by the " +
        "gateway and every node, e.g. the output of `openssl rand -hex 32`",
    );
  } else if (apiToken.length < 32) {
    refusals.push(
      `DORMICE_API_TOKEN is ${apiToken.length} characters long: write a secret of at least 32 ` +
        "characters, e.g. the output of `openssl rand -hex 32`",
    );
  }

  const host = get("DORMICE_HOST") ?? "127.0.0.1";
  if (/[\s/]/.test(host)) {
    refusals.push(
      `DORMICE_HOST='${host}' is not a host name or address: write one such as 127.0.0.1 or 0.0.0.0`,
    );
  }

  const port = integer(get("DORMICE_PORT"), 3676, 1, 65535, "DORMICE_PORT", refusals);
  const dataDir = get("DORMICE_DATA_DIR") ?? defaultDataDir;

  let executor: ExecutorKind = defaultExecutor;
  const executorText = get("DORMICE_EXECUTOR");
  if (executorText !== undefined) {
    if (executorText === "docker" || executorText === "fake") executor = executorText;
    else {
      refusals.push(
        `DORMICE_EXECUTOR='${executorText}' is not an executor: write docker (containers) or ` +
          "fake (in memory, for tests and demos)",
      );
    }
  }

  const templates = get("DORMICE_TEMPLATES") ?? null;

  let dockerSocket = defaultDockerSocket;
  const socketText = get("DORMICE_DOCKER_SOCKET");
  const dockerHost = get("DOCKER_HOST");
  if (socketText !== undefined) {
    if (socketText.startsWith("/")) dockerSocket = socketText;
    else {
      refusals.push(
        `DORMICE_DOCKER_SOCKET='${socketText}' is not an absolute path: write the engine's unix ` +
          `socket, e.g. ${defaultDockerSocket}`,
      );
    }
  } else if (dockerHost?.startsWith("unix:///")) {
    dockerSocket = dockerHost.slice("unix://".length);
  } else if (dockerHost !== undefined && executor === "docker") {
    refusals.push(
      `DOCKER_HOST='${dockerHost}' is not a unix socket, and the Docker executor speaks only to ` +
        `the local engine's socket: set DORMICE_DOCKER_SOCKET=${defaultDockerSocket} (or unset ` +
        "DOCKER_HOST)",
    );
  }

  const sandboxDefaults: SandboxDefaults = {};
  const cpusText = get("DORMICE_SANDBOX_CPUS");
  if (cpusText !== undefined) {
    const cpus = Number(cpusText);
    if (/^\d+(\.\d+)?$|^\.\d+$/.test(cpusText) && cpus > 0 && cpus <= 256) {
      sandboxDefaults.cpus = cpus;
    } else {
      refusals.push(
        `DORMICE_SANDBOX_CPUS='${cpusText}' is not a number of cores above 0 and at most 256: ` +
          "write one such as 1 or 0.5",
      );
    }
  }
  const memoryText = get("DORMICE_SANDBOX_MEMORY_MB");
  if (memoryText !== undefined) {
    // Docker refuses a memory limit under 6 MiB.
    sandboxDefaults.memoryMB = integer(
      memoryText,
      512,
      6,
      1_048_576,
      "DORMICE_SANDBOX_MEMORY_MB",
      refusals,
    );
  }
  const pidsText = get("DORMICE_SANDBOX_PIDS");
  if (pidsText !== undefined) {
    sandboxDefaults.pids = integer(pidsText, 512, 1, 1_000_000, "DORMICE_SANDBOX_PIDS", refusals);
  }
  const diskText = get("DORMICE_SANDBOX_DISK_MB");
  if (diskText !== undefined) {
    // Below 16 MiB a sandbox cannot even unpack a pip wheel; 1 TiB is past any sandbox disk.
    sandboxDefaults.diskMB = integer(
      diskText,
      4096,
      16,
      1_048_576,
      "DORMICE_SANDBOX_DISK_MB",
      refusals,
    );
  }

  // On unless switched off by name: a typo must not open the host to every sandbox.
  let sandboxHostFirewall = true;
  const firewallText = get("DORMICE_SANDBOX_HOST_FIREWALL");
  if (firewallText !== undefined) {
    if (firewallText === "on" || firewallText === "off") {
      sandboxHostFirewall = firewallText === "on";
    } else {
      refusals.push(
        `DORMICE_SANDBOX_HOST_FIREWALL='${firewallText.slice(0, 20)}' is not a switch: write on ` +
          "(the default: sandboxes may not connect to this machine; needs root and iptables) or " +
          "off (sandboxes reach every service listening on this machine)",
      );
    }
  }

  // Off unless switched on by name: a sandbox has egress only when its create asks for it.
  let e2bDefaultEgress = false;
  const e2bEgressText = get("DORMICE_EGRESS_E2B_DEFAULT");
  if (e2bEgressText !== undefined) {
    if (e2bEgressText === "on" || e2bEgressText === "off") {
      e2bDefaultEgress = e2bEgressText === "on";
    } else {
      refusals.push(
        `DORMICE_EGRESS_E2B_DEFAULT='${e2bEgressText.slice(0, 20)}' is not a switch: write off ` +
          "(the default: an E2B create that does not say allowInternetAccess gets no egress) or " +
          "on (it gets egress as if it said allowInternetAccess: true, as on E2B's cloud)",
      );
    }
  }

  const endpointVar = (name: string): string | null => {
    const text = get(name);
    if (text === undefined) return null;
    const r = parseEndpoint(text);
    if (r.ok) return r.value;
    refusals.push(`${name}: ${r.error}`);
    return null;
  };
  const gatewayEndpoints: string[] = [];
  const gatewayText = get("DORMICE_GATEWAY_ENDPOINT");
  for (const part of (gatewayText ?? "").split(",").map((p) => p.trim()).filter(Boolean)) {
    const r = parseGatewayEndpoint(part);
    if (!r.ok) refusals.push(`DORMICE_GATEWAY_ENDPOINT: ${r.error}`);
    else if (!gatewayEndpoints.includes(r.value)) gatewayEndpoints.push(r.value);
  }
  const gatewayEndpoint = gatewayEndpoints.find((e) => !isLoopbackOrigin(e)) ??
    gatewayEndpoints[0] ?? null;
  let gatewayCheckInHeader: CheckInHeader | null = null;
  const headerText = get("DORMICE_GATEWAY_CHECK_IN_HEADER");
  if (headerText !== undefined) {
    const r = parseCheckInHeader(headerText);
    if (r.ok) gatewayCheckInHeader = r.value;
    else refusals.push(`DORMICE_GATEWAY_CHECK_IN_HEADER: ${r.error}`);
  }
  const explicitEndpoint = endpointVar("DORMICE_NODE_ENDPOINT");
  const hostInUrl = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  const nodeEndpoint = explicitEndpoint ?? `http://${hostInUrl}:${port}`;

  const nodeIdText = get("DORMICE_NODE_ID");
  let nodeId = "node-1";
  if (nodeIdText !== undefined) {
    const r = nodeIdSchema.safeParse(nodeIdText);
    if (r.success) nodeId = r.data;
    else {
      refusals.push(
        `DORMICE_NODE_ID='${nodeIdText}' is not a node id: ${r.error.issues[0].message} ` +
          "(e.g. node-a or worker-03)",
      );
    }
  }

  if (gatewayEndpoint !== null && !isLoopbackOrigin(gatewayEndpoint)) {
    if (get("DORMICE_NODE_ENDPOINT") === undefined) {
      refusals.push(
        `DORMICE_NODE_ENDPOINT is not set while DORMICE_GATEWAY_ENDPOINT='${gatewayEndpoint}' is ` +
          `on another machine: the default ${nodeEndpoint} would name the gateway's own machine; ` +
          "set it to the origin the gateway reaches this node at, e.g. http://10.0.0.5:3676",
      );
    }
    if (nodeIdText === undefined) {
      refusals.push(
        `DORMICE_NODE_ID is not set while DORMICE_GATEWAY_ENDPOINT='${gatewayEndpoint}' is on ` +
          "another machine: every unconfigured node would check in as node-1; set a unique id " +
          "per node, e.g. node-a",
      );
    }
  }

  const checkInIntervalSeconds = integer(
    get("DORMICE_CHECK_IN_INTERVAL_SECONDS"),
    15,
    1,
    // The gateway refuses a longer interval (checkInSchema): refuse it here, at boot, instead.
    maxCheckInIntervalSeconds,
    "DORMICE_CHECK_IN_INTERVAL_SECONDS",
    refusals,
  );
  const scanIntervalSeconds = integer(
    get("DORMICE_SCAN_INTERVAL_SECONDS"),
    60,
    1,
    86400,
    "DORMICE_SCAN_INTERVAL_SECONDS",
    refusals,
  );

  const mib = 1024 * 1024;
  const jsonBodyLimitBytes = mib * integer(
    get("DORMICE_JSON_BODY_LIMIT_MB"),
    32,
    1,
    256,
    "DORMICE_JSON_BODY_LIMIT_MB",
    refusals,
  );
  const jsonMessageLimitBytes = 1024 * integer(
    get("DORMICE_JSON_MESSAGE_LIMIT_KB"),
    1024,
    1,
    262144,
    "DORMICE_JSON_MESSAGE_LIMIT_KB",
    refusals,
  );
  const uploadLimitBytes = mib * integer(
    get("DORMICE_UPLOAD_LIMIT_MB"),
    1024,
    1,
    8191,
    "DORMICE_UPLOAD_LIMIT_MB",
    refusals,
  );
  const uploadGzipMaxRatio = integer(
    get("DORMICE_UPLOAD_GZIP_MAX_RATIO"),
    100,
    1,
    1032,
    "DORMICE_UPLOAD_GZIP_MAX_RATIO",
    refusals,
  );

  const state = readStateSettings(get, refusals);

  const level = parseLogLevel(get("DORMICE_LOG_LEVEL"));
  if (level instanceof Error) refusals.push(level.message);

  const pools = parsePools(get("DORMICE_POOLS"));
  if (typeof pools === "string") refusals.push(pools);
  const poolsRefillDelayMs = integer(
    get("DORMICE_POOLS_REFILL_DELAY_MS"),
    1000,
    0,
    60_000,
    "DORMICE_POOLS_REFILL_DELAY_MS",
    refusals,
  );
  const volumeSettings = readVolumeSettings(get, refusals);
  const sandboxDomain = get("DORMICE_SANDBOX_DOMAIN")?.toLowerCase() ?? null;
  // On by default: the gateway relays sandbox ports' WebSockets through this door, and a node's
  // request rate is bound by its sandboxes long before the slower engine's (shared/http1/serve.ts).
  const websockets = parseWebSocketSwitch("DORMICE_WEBSOCKETS", get("DORMICE_WEBSOCKETS"), true);
  if (websockets instanceof Error) refusals.push(websockets.message);

  if (refusals.length > 0) return { ok: false, refusals };
  return {
    ok: true,
    config: {
      apiToken,
      host,
      port,
      dataDir,
      executor,
      templates,
      dockerSocket,
      sandboxDefaults,
      sandboxHostFirewall,
      e2bDefaultEgress,
      gatewayEndpoint: gatewayEndpoints[0] ?? null,
      gatewayEndpoints,
      gatewayCheckInHeader,
      nodeEndpoint,
      nodeId,
      checkInIntervalSeconds,
      scanIntervalSeconds,
      logLevel: level as LogLevel,
      pools: pools as PoolTarget[],
      poolsRefillDelayMs,
      ...volumeSettings,
      sandboxDomain,
      websockets: websockets === true,
      jsonBodyLimitBytes,
      jsonMessageLimitBytes,
      uploadLimitBytes,
      uploadGzipMaxRatio,
      ...state,
    },
  };
}
