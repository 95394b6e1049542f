/**
 * The gateway's configuration from the environment, with refusals that name the variable, the
 * bad value and what to write instead.
 *
 * @module
 */
import { type LogLevel, parseLogLevel } from "../shared/log.ts";
import { parseWebSocketSwitch } from "../shared/http1/mod.ts";

/** The gateway's settings. */
export interface GatewayConfig {
  /** The fleet token shared by the gateway, the nodes and clients. */
  apiToken: string;
  /** The address the gateway listens on (`DORMICE_GATEWAY_HOST`). */
  host: string;
  /** The port the gateway listens on (`DORMICE_GATEWAY_PORT`). */
  port: number;
  /** The Fleet's SQLite file. */
  dbPath: string;
  /** A node whose CPU use is above this percent takes no new sandbox. */
  nodeCpuLimitPct: number;
  /** A node with this many active + in-flight sandboxes takes no new one. */
  nodeActiveLimit: number;
  /** A node whose data disk has less than this many GB available takes no new sandbox. */
  nodeMinDiskGb: number;
  /** One deadline for a whole lookup round, connect included. */
  lookupTimeoutMs: number;
  /** Nodes one lookup round asks at once (`DORMICE_GATEWAY_LOOKUP_CONCURRENCY`). */
  lookupConcurrency: number;
  /** Whether a lookup miss may skip nodes by their digest (`DORMICE_GATEWAY_LOOKUP_DIGESTS`). */
  lookupDigests: "off" | "sole-writer" | "on";
  /** The longest wait for a forwarded request's head from its node, once its body is sent. */
  headTimeoutMs: number;
  /**
   * Seconds without a check-in after which a node is declared dead and the names it held are
   * free (`DORMICE_GATEWAY_NODE_DEAD_AFTER_S`); 0 never declares one.
   */
  nodeDeadAfterSeconds: number;
  /**
   * The HTTP client to the nodes (`DORMICE_GATEWAY_NODE_CLIENT`): `h1`, the gateway's own
   * HTTP/1.1 client (`shared/http1/client.ts`, https nodes still through fetch), or the runtime's `fetch`.
   */
  nodeClient: "h1" | "fetch";
  /**
   * The HTTP engine of the gateway's listener without WebSockets (`DORMICE_GATEWAY_ENGINE`):
   * `bytes`, HTTP/1.1 written on the socket (`shared/http1/server.ts`) with the routed verbs
   * answered from their bytes, or `deno`, Deno's own per-connection server.
   */
  engine: "bytes" | "deno";
  /** Cap of one JSON request body, bytes (`DORMICE_GATEWAY_JSON_BODY_LIMIT_MB`). */
  jsonBodyLimitBytes: number;
  /** The least severe level logged (`DORMICE_LOG_LEVEL`). */
  logLevel: LogLevel;
  /** Where lifecycle events are POSTed (`DORMICE_WEBHOOK_URL`); `null` sends none. */
  webhookUrl: string | null;
  /** The HMAC-SHA256 key events are signed with (`DORMICE_WEBHOOK_SECRET`). */
  webhookSecret: string | null;
  /**
   * The etcd members' client URLs (`DORMICE_GATEWAY_ETCD`): shared mode, where slots, the Fleet
   * and the key table live in etcd. `null`: the embedded default (SQLite, in-memory slots).
   */
  etcdEndpoints: string[] | null;
  /** Where this fleet's keys live in etcd (`DORMICE_GATEWAY_ETCD_PREFIX`), ending in `/`. */
  etcdPrefix: string;
  /** The gateway's lease TTL (`DORMICE_GATEWAY_ETCD_LEASE_SECONDS`): a dead holder's bound. */
  etcdLeaseSeconds: number;
  /** The sandbox domain (`DORMICE_SANDBOX_DOMAIN`), lower case, maybe with `:port`; `null` for none. */
  sandboxDomain: string | null;
  /**
   * Whether sandbox ports take WebSocket upgrades here (`DORMICE_GATEWAY_WEBSOCKETS`): on by
   * default when `DORMICE_SANDBOX_DOMAIN` is set, off otherwise.
   */
  websockets: boolean;
  /** PEM certificate and key files (`DORMICE_GATEWAY_TLS_CERT`, `_KEY`); `null` serves plain HTTP. */
  tls: { certFile: string; keyFile: string } | null;
}

/** Every variable the gateway reads, so `--allow-env` can name exactly these. */
export const gatewayEnvVariables: readonly string[] = [
  "DORMICE_API_TOKEN",
  "DORMICE_GATEWAY_HOST",
  "DORMICE_GATEWAY_PORT",
  "DORMICE_GATEWAY_DB",
  "DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT",
  "DORMICE_GATEWAY_NODE_ACTIVE_LIMIT",
  "DORMICE_GATEWAY_NODE_MIN_DISK_GB",
  "DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS",
  "DORMICE_GATEWAY_LOOKUP_CONCURRENCY",
  "DORMICE_GATEWAY_LOOKUP_DIGESTS",
  "DORMICE_GATEWAY_HEAD_TIMEOUT_MS",
  "DORMICE_GATEWAY_NODE_DEAD_AFTER_S",
  "DORMICE_GATEWAY_NODE_CLIENT",
  "DORMICE_GATEWAY_ENGINE",
  "DORMICE_GATEWAY_JSON_BODY_LIMIT_MB",
  "DORMICE_LOG_LEVEL",
  "DORMICE_WEBHOOK_URL",
  "DORMICE_WEBHOOK_SECRET",
  "DORMICE_GATEWAY_ETCD",
  "DORMICE_GATEWAY_ETCD_PREFIX",
  "DORMICE_GATEWAY_ETCD_LEASE_SECONDS",
  "DORMICE_SANDBOX_DOMAIN",
  "DORMICE_GATEWAY_TLS_CERT",
  "DORMICE_GATEWAY_TLS_KEY",
  "DORMICE_GATEWAY_WEBSOCKETS",
];

/**
 * How long the gateway's HTTP/1.1 client to the nodes keeps an idle connection: 30 s, half the
 * 60 s a node's server keeps one (`serveGuarded`'s `idleTimeoutMs`), so the gateway closes first
 * and never writes into a connection the node is closing. At 4 s (the client's own default) a
 * lookup miss more than 4 s after the last one reconnected to every node: at 10,000 nodes that
 * cold round cost the gateway about twice the CPU of a warm one (1.39 s against 0.77 s, measured
 * 2026-12-07), enough to miss the 2 s bound on 2 cores.
 */
export const NODE_CLIENT_IDLE_MS = 30_000;

/** The defaults, with the reason for each number. */
export const gatewayDefaults: Omit<GatewayConfig, "apiToken"> = {
  host: "127.0.0.1",
  port: 3677,
  dbPath: ".dormice/gateway.db",
  // Past 70% a node still runs what it has, but new sandboxes would slow everyone on it.
  nodeCpuLimitPct: 70,
  // Dormice's per-daemon ceiling: beyond it the ledger scan and the executor's bookkeeping lag.
  nodeActiveLimit: 400,
  // Images and sandbox files need room; a full disk breaks every sandbox on the node at once.
  nodeMinDiskGb: 10,
  // A lookup round waits for every node; two seconds bounds what one silent node costs a miss.
  lookupTimeoutMs: 2000,
  // A round at 10,000 nodes asked all at once opened 10,000 connections together and heard
  // none within the deadline (2026-12-07); 128 at a time keeps the sockets and the nodes' accept
  // queues small while a loopback node answers in well under a millisecond.
  lookupConcurrency: 128,
  // Skipping nodes by digest is sound only with one writer, which the gateway cannot check:
  // the operator says so (docs/lookup-digest.md).
  lookupDigests: "on",
  // A native verb answers when its work is done (a Docker create, a file read: seconds), envd
  // streams its head at once; a node that takes longer is stuck. A frozen node is cut off sooner,
  // when it misses two check-ins.
  headTimeoutMs: 120_000,
  // A node silent this long is not coming back soon: a reboot or a restart takes minutes, and
  // until then every name it may hold is refused (503). Past it, the names are worth more free
  // than waiting; a node that does return brings its ledger, and a name built twice meanwhile is
  // a 409 naming both nodes.
  nodeDeadAfterSeconds: 600,
  // Measured in one run against fetch on the routed verb (bench/RESULTS.md, forwarding): lower
  // added latency, every forwarding rule kept. `fetch` stays one variable away should a node's
  // server and this client ever disagree on HTTP/1.1.
  nodeClient: "h1",
  // Measured in one run against Deno's server on the routed verb (bench/RESULTS.md, forwarding).
  engine: "bytes",
  // The gateway reads a JSON body whole to route it and holds about three copies while it
  // forwards one, so the cap stays in the tens of MB; files stream through /files uncapped here
  // (the node that stores them caps them).
  jsonBodyLimitBytes: 32 * 1024 * 1024,
  logLevel: "info",
  webhookUrl: null,
  webhookSecret: null,
  sandboxDomain: null,
  websockets: false,
  tls: null,
  etcdEndpoints: null,
  etcdPrefix: "/dormice/",
  // A gateway that dies mid-create holds its names this long; renewed every third of it, so two
  // lost renewals in a row are survived.
  etcdLeaseSeconds: 10,
};

function etcd(
  env: Record<string, string | undefined>,
  errors: string[],
): { etcdEndpoints: string[] | null; etcdPrefix: string } {
  const prefix = env.DORMICE_GATEWAY_ETCD_PREFIX || gatewayDefaults.etcdPrefix;
  if (!prefix.startsWith("/") || !prefix.endsWith("/") || /\s/.test(prefix)) {
    errors.push(
      `DORMICE_GATEWAY_ETCD_PREFIX='${prefix}' is not a key prefix: write one that starts and ` +
        "ends with '/', e.g. /dormice/ or /fleets/eu-1/ (each fleet sharing one etcd its own)",
    );
  }
  const raw = env.DORMICE_GATEWAY_ETCD;
  if (raw === undefined || raw.trim() === "") return { etcdEndpoints: null, etcdPrefix: prefix };
  const endpoints: string[] = [];
  for (const part of raw.split(",").map((p) => p.trim()).filter((p) => p !== "")) {
    let url: URL | undefined;
    try {
      url = new URL(part);
    } catch { /* reported below */ }
    if (
      url === undefined || (url.protocol !== "http:" && url.protocol !== "https:") ||
      (url.pathname !== "/" && url.pathname !== "") || url.search || url.username
    ) {
      errors.push(
        `DORMICE_GATEWAY_ETCD has '${part}', which is not an etcd client URL: write the ` +
          "members' origins, comma-separated, e.g. http://10.0.0.1:2379,http://10.0.0.2:2379",
      );
      continue;
    }
    endpoints.push(url.origin);
  }
  return { etcdEndpoints: endpoints, etcdPrefix: prefix };
}

function sandboxDomain(raw: string | undefined, errors: string[]): string | null {
  if (raw === undefined || raw === "") return null;
  const value = raw.toLowerCase();
  // A port is allowed for a fleet not on 443: the SDK then builds https://<port>-<id>.<domain>.
  const m = /^((?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62})(?::(\d{1,5}))?$/
    .exec(value);
  if (!m || (m[2] !== undefined && (Number(m[2]) < 1 || Number(m[2]) > 65535))) {
    errors.push(
      `DORMICE_SANDBOX_DOMAIN='${raw}' is not a domain name: write one such as sbx.example.com ` +
        "(the gateway then answers api.<domain> and <port>-<id>.<domain>; a :port may follow)",
    );
    return null;
  }
  return value;
}

function tls(
  env: Record<string, string | undefined>,
  errors: string[],
): { certFile: string; keyFile: string } | null {
  const certFile = env.DORMICE_GATEWAY_TLS_CERT || null;
  const keyFile = env.DORMICE_GATEWAY_TLS_KEY || null;
  if (certFile === null && keyFile === null) return null;
  if (certFile === null || keyFile === null) {
    errors.push(
      `${certFile === null ? "DORMICE_GATEWAY_TLS_KEY" : "DORMICE_GATEWAY_TLS_CERT"} is set but ` +
        `${certFile === null ? "DORMICE_GATEWAY_TLS_CERT" : "DORMICE_GATEWAY_TLS_KEY"} is not: ` +
        "set both (PEM files: the certificate chain for *.<domain> and its private key), or neither for plain HTTP",
    );
    return null;
  }
  return { certFile, keyFile };
}

/** A webhook secret shorter than this is refused: it would be guessed. */
const minWebhookSecretLength = 16;

function webhook(
  env: Record<string, string | undefined>,
  errors: string[],
): { webhookUrl: string | null; webhookSecret: string | null } {
  const url = env.DORMICE_WEBHOOK_URL || null;
  const secret = env.DORMICE_WEBHOOK_SECRET || null;
  if (url === null) {
    if (secret !== null) {
      errors.push(
        "DORMICE_WEBHOOK_SECRET is set but DORMICE_WEBHOOK_URL is not: write the URL lifecycle " +
          "events go to (e.g. https://hooks.example.com/dormice), or unset the secret",
      );
    }
    return { webhookUrl: null, webhookSecret: null };
  }
  let parsed: URL | undefined;
  try {
    parsed = new URL(url);
  } catch { /* reported below */ }
  if (parsed === undefined || (parsed.protocol !== "http:" && parsed.protocol !== "https:")) {
    errors.push(
      `DORMICE_WEBHOOK_URL='${url}' is not an http(s) URL: write one such as ` +
        "https://hooks.example.com/dormice",
    );
  } else if (parsed.username || parsed.password) {
    errors.push(
      "DORMICE_WEBHOOK_URL carries credentials: drop them, the receiver checks the signature " +
        "made with DORMICE_WEBHOOK_SECRET instead",
    );
  }
  if (secret === null || secret.length < minWebhookSecretLength) {
    errors.push(
      secret === null
        ? "DORMICE_WEBHOOK_URL is set but DORMICE_WEBHOOK_SECRET is not: write the secret events " +
          `are signed with (at least ${minWebhookSecretLength} characters, e.g. the output of ` +
          "'openssl rand -hex 24'), the same the receiver verifies with"
        : `DORMICE_WEBHOOK_SECRET is ${secret.length} characters long: write at least ` +
          `${minWebhookSecretLength} (e.g. the output of 'openssl rand -hex 24')`,
    );
  }
  return { webhookUrl: url, webhookSecret: secret };
}

function number(
  env: Record<string, string | undefined>,
  name: string,
  fallback: number,
  check: (n: number) => boolean,
  hint: string,
  errors: string[],
): number {
  const raw = env[name];
  if (raw === undefined || raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isFinite(n) || !check(n)) {
    errors.push(`${name}='${raw}' is not valid: write ${hint} (default ${fallback})`);
    return fallback;
  }
  return n;
}

/**
 * Reads the gateway's settings from `env`. Returns the config, or every refusal sentence.
 *
 * @example
 * ```ts
 * import { loadGatewayConfig } from "./config.ts";
 * const r = loadGatewayConfig({ DORMICE_API_TOKEN: "x".repeat(32) });
 * if (r.ok) console.log(r.config.port); // 3677
 * ```
 */
export function loadGatewayConfig(
  env: Record<string, string | undefined>,
): { ok: true; config: GatewayConfig } | { ok: false; errors: string[] } {
  const errors: string[] = [];
  const apiToken = env.DORMICE_API_TOKEN ?? "";
  if (apiToken.length < 32) {
    errors.push(
      apiToken === ""
        ? "DORMICE_API_TOKEN is not set: write the fleet token (at least 32 characters), the same on the gateway and every node"
        : `DORMICE_API_TOKEN is ${apiToken.length} characters long: write at least 32 (e.g. the output of 'openssl rand -hex 24')`,
    );
  }
  const port = number(
    env,
    "DORMICE_GATEWAY_PORT",
    gatewayDefaults.port,
    (n) => Number.isInteger(n) && n >= 0 && n <= 65535,
    "a port number from 0 to 65535",
    errors,
  );
  const logLevel = parseLogLevel(env.DORMICE_LOG_LEVEL);
  const digests = env.DORMICE_GATEWAY_LOOKUP_DIGESTS ?? gatewayDefaults.lookupDigests;
  if (digests !== "off" && digests !== "sole-writer" && digests !== "on") {
    errors.push(
      `DORMICE_GATEWAY_LOOKUP_DIGESTS='${digests.slice(0, 40)}' is not a mode: set 'on' (skip ` +
        "nodes whose digest rules the name out, when they push creates made behind the " +
        "gateway's back), 'off' (ask every node on a miss) or 'sole-writer' (skip nodes by " +
        "their digest on your word that this gateway is the one way sandboxes are created)",
    );
  }
  if (digests === "sole-writer" && (env.DORMICE_GATEWAY_ETCD ?? "").trim() !== "") {
    // Another gateway's creates are invisible here until the node's next check-in: skipping by
    // digest could then build a name twice (docs/lookup-digest.md).
    errors.push(
      "DORMICE_GATEWAY_LOOKUP_DIGESTS='sole-writer' cannot go with DORMICE_GATEWAY_ETCD: in " +
        "shared mode other gateways create sandboxes too, so this one would skip nodes whose " +
        "digest predates their creates; unset DORMICE_GATEWAY_LOOKUP_DIGESTS or set it to 'off'",
    );
  }
  const nodeClient = env.DORMICE_GATEWAY_NODE_CLIENT || gatewayDefaults.nodeClient;
  if (nodeClient !== "h1" && nodeClient !== "fetch") {
    errors.push(
      `DORMICE_GATEWAY_NODE_CLIENT='${nodeClient.slice(0, 40)}' is not a client: set 'h1' (the ` +
        "gateway's HTTP/1.1 client, the default) or 'fetch' (the runtime's)",
    );
  }
  const engine = env.DORMICE_GATEWAY_ENGINE || gatewayDefaults.engine;
  if (engine !== "bytes" && engine !== "deno") {
    errors.push(
      `DORMICE_GATEWAY_ENGINE='${engine.slice(0, 40)}' is not an engine: set 'bytes' (HTTP/1.1 ` +
        "on the socket, the routed verbs served from their bytes; the default) or 'deno' " +
        "(Deno's own HTTP server)",
    );
  }
  if (logLevel instanceof Error) errors.push(logLevel.message);
  // On by default where sandbox ports face users (a sandbox domain): `getHost()` URLs then take
  // WebSockets as E2B's do; the bytes engine splices them at no cost to plain requests.
  const domain = sandboxDomain(env.DORMICE_SANDBOX_DOMAIN, errors);
  const websockets = parseWebSocketSwitch(
    "DORMICE_GATEWAY_WEBSOCKETS",
    env.DORMICE_GATEWAY_WEBSOCKETS,
    domain !== null,
  );
  if (websockets instanceof Error) errors.push(websockets.message);
  const config: GatewayConfig = {
    apiToken,
    host: env.DORMICE_GATEWAY_HOST || gatewayDefaults.host,
    port,
    dbPath: env.DORMICE_GATEWAY_DB || gatewayDefaults.dbPath,
    nodeCpuLimitPct: number(
      env,
      "DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT",
      gatewayDefaults.nodeCpuLimitPct,
      (n) => n > 0 && n <= 100,
      "a percentage above 0 and at most 100",
      errors,
    ),
    nodeActiveLimit: number(
      env,
      "DORMICE_GATEWAY_NODE_ACTIVE_LIMIT",
      gatewayDefaults.nodeActiveLimit,
      (n) => Number.isInteger(n) && n > 0,
      "a positive whole number",
      errors,
    ),
    nodeMinDiskGb: number(
      env,
      "DORMICE_GATEWAY_NODE_MIN_DISK_GB",
      gatewayDefaults.nodeMinDiskGb,
      (n) => n >= 0,
      "a number of GB, 0 or more",
      errors,
    ),
    lookupTimeoutMs: number(
      env,
      "DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS",
      gatewayDefaults.lookupTimeoutMs,
      (n) => Number.isInteger(n) && n >= 50 && n <= 60_000,
      "a whole number of milliseconds from 50 to 60000",
      errors,
    ),
    lookupConcurrency: number(
      env,
      "DORMICE_GATEWAY_LOOKUP_CONCURRENCY",
      gatewayDefaults.lookupConcurrency,
      (n) => Number.isInteger(n) && n >= 1 && n <= 4096,
      "a whole number of nodes from 1 to 4096",
      errors,
    ),
    headTimeoutMs: number(
      env,
      "DORMICE_GATEWAY_HEAD_TIMEOUT_MS",
      gatewayDefaults.headTimeoutMs,
      (n) => Number.isInteger(n) && n >= 100 && n <= 3_600_000,
      "a whole number of milliseconds from 100 to 3600000",
      errors,
    ),
    nodeDeadAfterSeconds: number(
      env,
      "DORMICE_GATEWAY_NODE_DEAD_AFTER_S",
      gatewayDefaults.nodeDeadAfterSeconds,
      (n) => Number.isInteger(n) && (n === 0 || (n >= 60 && n <= 31_536_000)),
      "0 (never) or a whole number of seconds from 60 to 31536000",
      errors,
    ),
    jsonBodyLimitBytes: 1024 * 1024 * number(
      env,
      "DORMICE_GATEWAY_JSON_BODY_LIMIT_MB",
      gatewayDefaults.jsonBodyLimitBytes / (1024 * 1024),
      (n) => Number.isInteger(n) && n >= 1 && n <= 256,
      "a whole number of MiB from 1 to 256",
      errors,
    ),
    lookupDigests: digests === "sole-writer" || digests === "on" ? digests : "off",
    nodeClient: nodeClient === "fetch" ? "fetch" : "h1",
    engine: engine === "deno" ? "deno" : "bytes",
    logLevel: logLevel instanceof Error ? "info" : logLevel,
    ...webhook(env, errors),
    ...etcd(env, errors),
    etcdLeaseSeconds: number(
      env,
      "DORMICE_GATEWAY_ETCD_LEASE_SECONDS",
      gatewayDefaults.etcdLeaseSeconds,
      (n) => Number.isInteger(n) && n >= 2 && n <= 300,
      "a whole number of seconds from 2 to 300",
      errors,
    ),
    sandboxDomain: domain,
    websockets: websockets === true,
    tls: tls(env, errors),
  };
  return errors.length ? { ok: false, errors } : { ok: true, config };
}
