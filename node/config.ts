/**
 * The node's configuration, read from the environment with refusals an operator can act on.
 *
 * @module
 */
import { type LogLevel, parseLogLevel } from "../shared/log.ts";
import { nodeIdSchema, parseEndpoint } from "../shared/schemas.ts";

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
  /** The gateway's origin (`DORMICE_GATEWAY_ENDPOINT`); `null` runs standalone. */
  gatewayEndpoint: string | null;
  /** The origin the gateway reaches this node at (`DORMICE_NODE_ENDPOINT`). */
  nodeEndpoint: string;
  /** This node's id in the fleet (`DORMICE_NODE_ID`). */
  nodeId: string;
  /** Seconds between check-ins (`DORMICE_CHECK_IN_INTERVAL_SECONDS`). */
  checkInIntervalSeconds: number;
  /** Seconds between deadline scans (`DORMICE_SCAN_INTERVAL_SECONDS`). */
  scanIntervalSeconds: number;
  /** The log floor (`DORMICE_LOG_LEVEL`). */
  logLevel: LogLevel;
}

/** The outcome of {@linkcode loadNodeConfig}: a config, or every refusal at once. */
export type NodeConfigResult =
  | { ok: true; config: NodeConfig }
  | { ok: false; refusals: string[] };

/** Every variable the node reads (so `main.ts` can ask for exactly these with `--allow-env`). */
export const nodeEnvVariables: readonly string[] = [
  "DORMICE_API_TOKEN",
  "DORMICE_HOST",
  "DORMICE_PORT",
  "DORMICE_DATA_DIR",
  "DORMICE_EXECUTOR",
  "DORMICE_GATEWAY_ENDPOINT",
  "DORMICE_NODE_ENDPOINT",
  "DORMICE_NODE_ID",
  "DORMICE_CHECK_IN_INTERVAL_SECONDS",
  "DORMICE_SCAN_INTERVAL_SECONDS",
  "DORMICE_LOG_LEVEL",
];

/** Options of {@linkcode loadNodeConfig}. */
export interface LoadNodeConfigOptions {
  /** The executor when `DORMICE_EXECUTOR` is unset. */
  defaultExecutor?: ExecutorKind;
  /** The data dir when `DORMICE_DATA_DIR` is unset. */
  defaultDataDir?: string;
}

const loopbackHosts = new Set(["localhost", "127.0.0.1", "[::1]", "::1"]);

/** Whether an origin's host is this machine's loopback. */
export function isLoopbackOrigin(origin: string): boolean {
  const host = new URL(origin).hostname;
  return loopbackHosts.has(host) || /^127\.\d+\.\d+\.\d+$/.test(host) ||
    host.endsWith(".localhost");
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

  const endpointVar = (name: string): string | null => {
    const text = get(name);
    if (text === undefined) return null;
    const r = parseEndpoint(text);
    if (r.ok) return r.value;
    refusals.push(`${name}: ${r.error}`);
    return null;
  };
  const gatewayEndpoint = endpointVar("DORMICE_GATEWAY_ENDPOINT");
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
    3600,
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

  const level = parseLogLevel(get("DORMICE_LOG_LEVEL"));
  if (level instanceof Error) refusals.push(level.message);

  if (refusals.length > 0) return { ok: false, refusals };
  return {
    ok: true,
    config: {
      apiToken,
      host,
      port,
      dataDir,
      executor,
      gatewayEndpoint,
      nodeEndpoint,
      nodeId,
      checkInIntervalSeconds,
      scanIntervalSeconds,
      logLevel: level as LogLevel,
    },
  };
}

function integer(
  text: string | undefined,
  fallback: number,
  min: number,
  max: number,
  name: string,
  refusals: string[],
): number {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < min || n > max) {
    refusals.push(
      `${name}='${text}' is not a whole number from ${min} to ${max}: write one such as ${fallback}`,
    );
    return fallback;
  }
  return n;
}
