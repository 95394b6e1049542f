/**
 * The node daemon: read env, build, serve, check in, scan deadlines, stop cleanly on a signal.
 *
 * Requires `--allow-net`, `--allow-env=<nodeEnvVariables> --ignore-env` (the variables the
 * README's settings table lists; `--ignore-env` makes every other variable read as unset, which
 * the Docker executor's dependencies need: they read and list the environment when they load),
 * `--allow-read` and `--allow-write` on the data dir, and
 * `--allow-sys=cpus,systemMemoryInfo,statfs`. With the Docker executor (the default) also the
 * socket: `--allow-net=unix:/var/run/docker.sock`, `--allow-read` and `--allow-write` on it, and
 * root with `--allow-run=iptables` for the host firewall (`DORMICE_SANDBOX_HOST_FIREWALL`, on by
 * default). `deno task node` runs it so; from the package it is
 * `deno run <those flags> jsr:@dormice/cluster/node/main`.
 *
 * @module
 */
import { DatabaseLockedError } from "../shared/lock.ts";
import { createLog } from "../shared/log.ts";
import { serveGuarded } from "../shared/http1/mod.ts";
import { boundedShutdown, onTerminationSignals } from "../shared/shutdown.ts";
import { createNodeApp, type NodeApp } from "./app.ts";
import { openNodeVolumes, VolumeSizeRefused } from "./volumes.ts";
import { loadNodeConfig, type NodeConfig, nodeEnvVariables } from "./config.ts";
import type { Executor } from "./executors/contract.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { isDiskFull } from "./ledger_space.ts";
import { Ledger } from "./ledger.ts";
import { join } from "node:path";
import { parseTemplates } from "./executors/docker/templates.ts";
import { EgressCa } from "./executors/docker/_egress_ca.ts";
import { readEgressSettings } from "./config_egress.ts";

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

/** The fleet egress CA's fingerprint for the config digest; `null` without one. */
let egressCaFingerprint: string | null = null;

/**
 * The executor the config names. Docker is imported only when asked for: dockerode's
 * dependencies read the environment as they load, which a narrow `--allow-env` refuses unless
 * `--ignore-env` is given too.
 */
async function openExecutor(
  config: NodeConfig,
  instanceId: string,
  managedVolumes: (name: string) => string | undefined,
): Promise<Executor> {
  if (config.executor === "fake") {
    // The fake takes the same template names as Docker would, so it refuses what Docker refuses.
    const templates = parseTemplates(config.templates ?? undefined);
    if (typeof templates === "string") refuse([templates]);
    return new FakeExecutor({
      nodeId: config.nodeId,
      templates: templates.keys(),
      defaults: config.sandboxDefaults,
      volumes: config.volumes.map((v) => v.name),
      managedVolumes,
    });
  }
  let docker: typeof import("./executors/docker/mod.ts");
  try {
    docker = await import("./executors/docker/mod.ts");
  } catch (error) {
    if (!(error instanceof Deno.errors.NotCapable)) throw error;
    refuse([
      `The Docker executor cannot load (${error.message}): add --ignore-env beside the node's ` +
      "--allow-env=<its variables> (dockerode's dependencies read and list the environment; " +
      "--ignore-env shows them only the listed variables), or set DORMICE_EXECUTOR=fake",
    ]);
  }
  const { DockerExecutor } = docker;
  const templates = parseTemplates(config.templates ?? undefined);
  if (typeof templates === "string") refuse([templates]);
  const hostFirewall = config.sandboxHostFirewall !== false;
  if (!hostFirewall) {
    log(
      "warn",
      "The host firewall is off: sandboxes reach every service listening on this machine",
      {
        fix: "unset DORMICE_SANDBOX_HOST_FIREWALL (or set it to on) and run the node as root",
      },
    );
  }
  const egress = readEgressSettings((name) => Deno.env.get(name));
  if (Array.isArray(egress)) refuse(egress);
  let egressCa: EgressCa | null = null;
  if (hostFirewall) {
    try {
      egressCa = await EgressCa.load(egress.ca, config.dataDir);
    } catch (error) {
      // A configured CA that cannot be read is a mistake to fix now; a node that merely cannot
      // make one still serves address rules, and refuses domain rules saying why.
      if (egress.ca !== null) refuse([(error as Error).message]);
      log("warn", "No egress CA: this node refuses domain rules and header transforms", {
        why: (error as Error).message,
        fix: "grant --allow-run=openssl (deno task node does), or set DORMICE_EGRESS_CA_CERT " +
          "and DORMICE_EGRESS_CA_KEY",
      });
    }
  }
  egressCaFingerprint = egressCa?.fingerprint ?? null;
  try {
    return await DockerExecutor.connect({
      egressCa,
      egressExtraCa: egress.extraCa,
      egressHosts: egress.hosts,
      sandboxDns: egress.sandboxDns,
      nodeId: config.nodeId,
      instanceId,
      socketPath: config.dockerSocket,
      templates,
      defaults: config.sandboxDefaults,
      volumes: config.volumes,
      managedVolumes,
      hostFirewall,
      log,
    });
  } catch (error) {
    // connect() says which socket, why, and how to start the engine or pick the fake.
    refuse([(error as Error).message]);
  }
}
try {
  Deno.mkdirSync(config.dataDir, { recursive: true });
} catch (error) {
  // Deno's own refusal and the OS's have different remedies: `deno task node` grants only
  // .dormice, and no flag fixes a directory this user may not write.
  const notGranted = error instanceof Deno.errors.NotCapable;
  refuse([
    `Cannot create DORMICE_DATA_DIR='${config.dataDir}' (${(error as Error).message}): ` +
    (notGranted
      ? "deno task node may read and write only under .dormice; for another directory run " +
        `node/main.ts with --allow-read=${config.dataDir} --allow-write=${config.dataDir} ` +
        "(as deploy/dormice-node.service does)"
      : "point it at a directory this user may write"),
  ]);
}

function openLedger(): Ledger {
  try {
    return Ledger.open(config.dataDir, {
      nodeId: config.nodeId,
      endpoint: config.nodeEndpoint,
      log,
    });
  } catch (error) {
    if (error instanceof DatabaseLockedError) refuse([error.message]);
    if (isDiskFull(error)) {
      refuse([
        `Cannot start: the disk of DORMICE_DATA_DIR (${config.dataDir}) is full, so the ` +
        `ledger cannot be opened for writing (${(error as Error).message}). Free space on that ` +
        "disk, or point DORMICE_DATA_DIR at a larger one, then start the node again",
      ]);
    }
    throw error;
  }
}
// The ledger first: its instance id is what the executor owns its containers by.
const ledger = openLedger();
// Before the executor: a sandbox restarted with a volume must find its image mounted.
const volumes = await openNodeVolumes(config, ledger).catch((error) => {
  if (error instanceof VolumeSizeRefused) refuse([error.message]);
  throw error;
});
await volumes.open(log);
if (volumes.caps.enforcedBy === "kernel") {
  log("info", "volume caps are kept by the kernel: each volume is a loop-mounted ext4 image");
} else {
  log(
    "warn",
    "volume caps are checked by the content API only: a sandbox writing into a mounted volume " +
      "is bounded by the disk of the volume root, not by DORMICE_VOLUME_SIZE_GB",
    {
      why: volumes.caps.why,
      fix: "run the node as root with loop devices, e2fsprogs and " +
        "--allow-run=mount,umount,mkfs.ext4,losetup (not with DORMICE_VOLUME_ROOT)",
    },
  );
}
const executor = await openExecutor(config, ledger.instanceId, (name) => volumes.dataDir(name));
const node: NodeApp = createNodeApp({
  config,
  executor,
  egressCaFingerprint,
  ledger,
  volumes,
  poolsFile: join(config.dataDir, "pools.json"),
  log,
});

// Before the first request: containers of this node without a row are removed, rows whose
// sandbox vanished (a fake executor after a restart, a container removed by hand) are marked
// stopped and logged. reconcile() logs what it finds itself.
try {
  await node.service.reconcile();
} catch (error) {
  // The engine answered the ping a moment ago; one failed listing must not keep the node from
  // serving what it can. The next boot compares again.
  log("warn", "could not compare the ledger with the executor at boot; serving anyway", {
    error,
    fix: "restart the node once the executor answers, so lost sandboxes are marked",
  });
}

// After the reconcile, which kept the containers of warm rows and dropped warm rows whose
// container is gone: the pools adopt what is left and refill the rest in the background.
try {
  await node.pools.start();
} catch (error) {
  refuse([(error as Error).message]);
}

// Not Deno.serve: it dies of a descriptor flood and never closes an idle connection
// (shared/http1/serve.ts says what was measured). Upgrades unless DORMICE_WEBSOCKETS=off.
const server = serveGuarded({
  hostname: config.host,
  port: config.port,
  upgrades: config.websockets,
  log,
  handler: node.fetch,
  onListen: ({ hostname, port }) =>
    log("info", "node listening", {
      address: `${hostname}:${port}`,
      nodeId: config.nodeId,
      endpoint: config.nodeEndpoint,
      executor: config.executor,
      gateway: config.gatewayEndpoint ?? "none (standalone)",
      dataDir: config.dataDir,
    }),
});

node.start();

onTerminationSignals((signal) => {
  log("info", "node stopping", { signal });
  void boundedShutdown(server, shutdownGraceMs, () => node.close()).then((clean) => {
    log("info", "node stopped", { clean });
    Deno.exit(0);
  });
});
