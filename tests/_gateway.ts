/**
 * Helpers for black-box tests of the gateway: spawn `gateway/main.ts` on a free loopback port
 * with its own database and narrow permissions, and talk to it with `fetch`.
 *
 * @module
 */
import { fileURLToPath as fromFileUrl } from "node:url";
import { gatewayEnvVariables } from "../gateway/config.ts";
import { freePort, newToken, spawnDeno, type SpawnedProcess, waitForHealth } from "./_processes.ts";

/** The gateway daemon's entry point. */
export const gatewayMain: string = fromFileUrl(new URL("../gateway/main.ts", import.meta.url));

/** The narrow permissions a gateway needs with its database in `dir`. */
export function gatewayPermissions(dir: string): string[] {
  return [
    // As deno task gateway runs it: request.signal aborts only when a client hangs up.
    "--unstable-no-legacy-abort",
    "--allow-net=127.0.0.1",
    `--allow-env=${gatewayEnvVariables.join(",")}`,
    `--allow-read=${dir}`,
    `--allow-write=${dir}`,
  ];
}

/** A running gateway process. */
export interface GatewayProcess {
  /** `http://127.0.0.1:<port>`. */
  url: string;
  port: number;
  token: string;
  /** The directory holding its database. */
  dir: string;
  /** Its database file. */
  dbPath: string;
  process: SpawnedProcess;
  /** POSTs `body` to `/<verb>` with the fleet token. */
  call(verb: string, body?: unknown, init?: RequestInit): Promise<Response>;
  /** POSTs and returns status, headers and the parsed JSON body. */
  json(
    verb: string,
    body?: unknown,
    init?: RequestInit,
    // deno-lint-ignore no-explicit-any
  ): Promise<{ status: number; headers: Headers; body: any }>;
  /** Stops the process (SIGTERM) and removes its directory unless it was given. */
  stop(): Promise<Deno.CommandStatus>;
}

/** Options of {@linkcode startGateway}. */
export interface StartGatewayOptions {
  token?: string;
  /** Extra or overriding `DORMICE_*` variables. */
  env?: Record<string, string>;
  /** Use this directory (kept on stop); a fresh temp dir otherwise (removed on stop). */
  dir?: string;
  /** Listen on this port; a free one otherwise. */
  port?: number;
  /** Wait for `/healthz` (default true). */
  waitForHealth?: boolean;
  /** Run under this open-file limit (see `SpawnDenoOptions.maxOpenFiles`). */
  maxOpenFiles?: number;
}

/** POSTs a native verb to `base` with `token`. */
export function post(
  base: string,
  token: string,
  verb: string,
  body: unknown = {},
  init: RequestInit = {},
): Promise<Response> {
  return fetch(`${base}/${verb}`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify(body),
    ...init,
  });
}

/** POSTs and reads the JSON answer. */
export async function postJson(
  base: string,
  token: string,
  verb: string,
  body: unknown = {},
  init: RequestInit = {},
  // deno-lint-ignore no-explicit-any
): Promise<{ status: number; headers: Headers; body: any }> {
  const res = await post(base, token, verb, body, init);
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = { text };
  }
  return { status: res.status, headers: res.headers, body: parsed };
}

/**
 * The settings of a gateway in shared mode on `etcd`: its endpoints, a key prefix of this run's
 * own (runs on one etcd never see each other's keys) and no CPU limit on the nodes (the host's
 * real CPU use is noise from whatever else runs on the machine); `more` adds or overrides.
 */
export function sharedModeEnv(
  etcd: { endpoints: string },
  more: Record<string, string> = {},
): Record<string, string> {
  return {
    DORMICE_GATEWAY_ETCD: etcd.endpoints,
    DORMICE_GATEWAY_ETCD_PREFIX: `/t-${crypto.randomUUID().slice(0, 8)}/`,
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
    ...more,
  };
}

/**
 * Starts `gateway/main.ts` on a free loopback port with its database in a temp dir and waits
 * until `/healthz` answers.
 *
 * @example
 * ```ts ignore
 * const gw = await startGateway();
 * const { body } = await gw.json("listNodes");
 * await gw.stop();
 * ```
 */
export async function startGateway(options: StartGatewayOptions = {}): Promise<GatewayProcess> {
  const dir = options.dir ?? await Deno.makeTempDir({ prefix: "dormice-gateway-" });
  const token = options.token ?? newToken();
  const port = options.port ?? freePort();
  const dbPath = `${dir}/gateway.db`;
  const process = spawnDeno(gatewayMain, {
    env: {
      DORMICE_API_TOKEN: token,
      DORMICE_GATEWAY_HOST: "127.0.0.1",
      DORMICE_GATEWAY_PORT: String(port),
      DORMICE_GATEWAY_DB: dbPath,
      ...options.env,
    },
    permissions: gatewayPermissions(dir),
    maxOpenFiles: options.maxOpenFiles,
  });
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    const status = await process.stop();
    if (options.dir === undefined) await Deno.remove(dir, { recursive: true }).catch(() => {});
    return status;
  };
  if (options.waitForHealth !== false) {
    try {
      await waitForHealth(url, process);
    } catch (error) {
      await stop();
      throw error;
    }
  }
  return {
    url,
    port,
    token,
    dir,
    dbPath,
    process,
    call: (verb, body, init) => post(url, token, verb, body, init),
    json: (verb, body, init) => postJson(url, token, verb, body, init),
    stop,
  };
}
