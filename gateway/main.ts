/**
 * The gateway daemon: read env, open the Fleet's database (one gateway per file), build (every
 * face, the sweep for down nodes), serve, stop cleanly on a signal.
 *
 * Requires `--allow-net` (listen, and reach every node's endpoint), `--allow-env` (the
 * `DORMICE_*` variables in `gatewayEnvVariables`), `--allow-read` and `--allow-write` on the database's directory.
 *
 * Run it with `--unstable-no-legacy-abort` (as `deno task gateway` and the systemd unit do): in
 * Deno 2.9 a request's signal otherwise also aborts after every successful response, which costs
 * an error object per request and prints a warning line that is not JSON. Forwarding reads the
 * signal only to stop a node's work when a client hangs up, which works either way.
 *
 * @module
 */
import { dirname } from "node:path";
import { DatabaseLockedError, openExclusiveDatabase } from "../shared/lock.ts";
import { createLog } from "../shared/log.ts";
import { createH1Client, serveDaemon } from "../shared/http1/mod.ts";
import { boundedShutdown, onTerminationSignals } from "../shared/shutdown.ts";
import { buildGateway } from "./app.ts";
import { gatewayEnvVariables, loadGatewayConfig, NODE_CLIENT_IDLE_MS } from "./config.ts";

/** How long in-flight requests may take to finish after SIGINT/SIGTERM. */
const shutdownGraceMs = 10_000;

function refuse(sentences: string[]): never {
  for (const s of sentences) console.error(s);
  Deno.exit(2);
}

const env: Record<string, string | undefined> = {};
for (const name of gatewayEnvVariables) env[name] = Deno.env.get(name);
const loaded = loadGatewayConfig(env);
if (!loaded.ok) refuse(loaded.errors);
const config = loaded.config;
const log = createLog({ level: config.logLevel, name: "gateway" });

let database;
try {
  Deno.mkdirSync(dirname(config.dbPath), { recursive: true });
  database = openExclusiveDatabase(config.dbPath, "DORMICE_GATEWAY_DB");
} catch (error) {
  if (error instanceof DatabaseLockedError) refuse([error.message]);
  const dir = dirname(config.dbPath);
  // Deno's refusal and the OS's have different remedies: `deno task gateway` grants only
  // .dormice (and reads /etc/dormice), and no flag fixes a directory this user may not write.
  refuse([
    `Cannot open DORMICE_GATEWAY_DB='${config.dbPath}' (${(error as Error).message}): ` +
    (error instanceof Deno.errors.NotCapable
      ? "deno task gateway may write only under .dormice; for another directory run " +
        `gateway/main.ts with --allow-read=${dir} --allow-write=${dir} ` +
        "(as deploy/dormice-gateway.service does)"
      : "point it at a file in a directory this user may write"),
  ]);
}

let tls: { cert: string; key: string } | undefined;
if (config.tls !== null) {
  const read = (file: string, variable: string) => {
    try {
      return Deno.readTextFileSync(file);
    } catch (error) {
      refuse([
        `Cannot read ${variable}='${file}' (${(error as Error).message}): ` +
        (error instanceof Deno.errors.NotCapable
          ? "deno task gateway may read only /etc/dormice and .dormice; put the PEM files " +
            `there, or run gateway/main.ts with --allow-read=${file} (under ` +
            "deploy/dormice-gateway.service, install its drop-in " +
            "dormice-gateway.service.d/tls.conf rather than setting the variable)"
          : "point it at a readable PEM file"),
      ]);
    }
  };
  tls = {
    cert: read(config.tls.certFile, "DORMICE_GATEWAY_TLS_CERT"),
    key: read(config.tls.keyFile, "DORMICE_GATEWAY_TLS_KEY"),
  };
}

// Node hops only (forwards, lookups, creates, fan-outs): the HTTP/1.1 client beat fetch's added
// latency at c1 and kept every forwarding rule (bench/RESULTS.md). An https node goes to fetch,
// which does TLS; etcd and the webhook keep fetch (their own `fetch`).
const nodeClient = config.nodeClient === "h1"
  ? createH1Client({ otherSchemes: globalThis.fetch, idleTimeoutMs: NODE_CLIENT_IDLE_MS })
  : undefined;

const gateway = buildGateway({
  token: config.apiToken,
  database,
  cpuLimitPct: config.nodeCpuLimitPct,
  activeLimit: config.nodeActiveLimit,
  minDiskGB: config.nodeMinDiskGb,
  lookupTimeoutMs: config.lookupTimeoutMs,
  lookupConcurrency: config.lookupConcurrency,
  lookupDigests: config.lookupDigests,
  headTimeoutMs: config.headTimeoutMs,
  nodeDeadAfterMs: config.nodeDeadAfterSeconds * 1000,
  listenAddress: { hostname: config.host, port: config.port },
  maxJsonBodyBytes: config.jsonBodyLimitBytes,
  log,
  nodeClient,
  sandboxDomain: config.sandboxDomain ?? undefined,
  webhook: config.webhookUrl === null
    ? undefined
    : { url: config.webhookUrl, secret: config.webhookSecret! },
  etcd: config.etcdEndpoints === null ? undefined : {
    endpoints: config.etcdEndpoints,
    prefix: config.etcdPrefix,
    leaseSeconds: config.etcdLeaseSeconds,
    fetch: globalThis.fetch,
  },
});

// Not Deno.serve: it dies of a descriptor flood and never closes an idle connection
// (shared/http1/serve.ts says what was measured). Upgrades with a sandbox domain, or as
// DORMICE_GATEWAY_WEBSOCKETS says.
const server = serveDaemon({
  hostname: config.host,
  port: config.port,
  upgrades: config.websockets,
  engine: config.engine,
  lane: gateway.lane,
  log,
  handler: gateway.fetch,
  tls,
  onListen: ({ hostname, port }) =>
    log("info", "gateway listening", {
      address: `${hostname}:${port}`,
      url: `${tls ? "https" : "http"}://${
        hostname.includes(":") ? `[${hostname}]` : hostname
      }:${port}`,
      sandboxDomain: config.sandboxDomain ?? "none",
      db: config.dbPath,
      nodes: gateway.fleet.size,
      nodeClient: config.nodeClient,
      webhook: config.webhookUrl === null ? "none" : new URL(config.webhookUrl).origin,
      mode: config.etcdEndpoints === null
        ? "embedded"
        : `shared: etcd ${config.etcdEndpoints.join(",")} under ${config.etcdPrefix}`,
    }),
});

onTerminationSignals((signal) => {
  log("info", "gateway stopping", { signal });
  void boundedShutdown(server, shutdownGraceMs, async () => {
    // A moment for events still queued (the last destroys); a receiver that is down gets no more.
    await gateway.webhooks?.idle(2000);
    // Revoking the lease frees this gateway's slots now rather than one TTL from now.
    await gateway.shared?.close();
    await gateway.close();
    nodeClient?.close();
    database.close();
  }).then((clean) => {
    log("info", "gateway stopped", { clean });
    Deno.exit(0);
  });
});
