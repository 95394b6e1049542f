/**
 * The node daemon: read env, build, serve, check in, scan deadlines, stop cleanly on a signal.
 *
 * Requires `--allow-net`, `--allow-env` (the `DORMICE_*` variables), `--allow-read` and
 * `--allow-write` on the data dir, and `--allow-sys=cpus,systemMemoryInfo,statfs`.
 *
 * @module
 */
import { DatabaseLockedError } from "../shared/lock.ts";
import { createLog } from "../shared/log.ts";
import { boundedShutdown, onTerminationSignals } from "../shared/shutdown.ts";
import { createNodeApp, type NodeApp } from "./app.ts";
import { loadNodeConfig, nodeEnvVariables } from "./config.ts";
import { FakeExecutor } from "./fake_executor.ts";

/** How long in-flight requests may take to finish after SIGINT/SIGTERM. */
const shutdownGraceMs = 10_000;

function refuse(sentences: string[]): never {
  for (const s of sentences) console.error(s);
  Deno.exit(2);
}

// Read exactly the node's variables, so `--allow-env` can name them.
const env: Record<string, string | undefined> = {};
for (const name of nodeEnvVariables) env[name] = Deno.env.get(name);

const loaded = loadNodeConfig(env);
if (!loaded.ok) refuse(loaded.refusals);
const config = loaded.config;
const log = createLog({ level: config.logLevel, name: "node" });

if (config.executor === "docker") {
  // The Docker executor lands in its own change; until then the node says so at boot.
  refuse([
    "DORMICE_EXECUTOR=docker is not available in this build yet: set DORMICE_EXECUTOR=fake to " +
    "run sandboxes in memory",
  ]);
}

try {
  Deno.mkdirSync(config.dataDir, { recursive: true });
} catch (error) {
  refuse([
    `Cannot create DORMICE_DATA_DIR='${config.dataDir}' (${(error as Error).message}): ` +
    "point it at a writable directory (and allow writing there with --allow-write)",
  ]);
}

function build(): NodeApp {
  try {
    return createNodeApp({ config, executor: new FakeExecutor(), log });
  } catch (error) {
    if (error instanceof DatabaseLockedError) refuse([error.message]);
    throw error;
  }
}
const node = build();

// Rows whose sandbox vanished (a fake executor after a restart, a container removed by hand)
// would answer found and then fail every verb: drop them before the first request.
try {
  await node.service.reconcile();
} catch (error) {
  // An engine that is down at boot must not keep the node from serving what it can.
  log("warn", "could not compare the ledger with the executor at boot; serving anyway", {
    error,
  });
}

const server = Deno.serve({
  hostname: config.host,
  port: config.port,
  onListen: ({ hostname, port }) =>
    log("info", "node listening", {
      address: `${hostname}:${port}`,
      nodeId: config.nodeId,
      endpoint: config.nodeEndpoint,
      executor: config.executor,
      gateway: config.gatewayEndpoint ?? "none (standalone)",
      dataDir: config.dataDir,
    }),
}, node.fetch);

node.start();

onTerminationSignals((signal) => {
  log("info", "node stopping", { signal });
  void boundedShutdown(server, shutdownGraceMs, () => node.close()).then((clean) => {
    log("info", "node stopped", { clean });
    Deno.exit(0);
  });
});
