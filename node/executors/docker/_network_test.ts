import assert from "node:assert/strict";
import { ExecutorError } from "../contract.ts";
import type { DockerEngine } from "./engine.ts";
import { DockerExecutor } from "./executor.ts";
import { FakeIptables } from "./_fake_iptables_test.ts";

interface FakeNetwork {
  Id: string;
  Name: string;
  Internal: boolean;
  Options: Record<string, string>;
  Containers: Record<string, unknown>;
}

const engineError = (statusCode: number, message: string) =>
  Object.assign(new Error(message), { statusCode });

/**
 * An engine with networks: each create is recorded and, like dockerd with its iptables rules on,
 * a network made with enable_icc=false gets its DROP rule in the fake FORWARD chain.
 */
function networkEngine(iptables: FakeIptables, { engineRules = true } = {}) {
  const networks = new Map<string, FakeNetwork>();
  const containers: Record<string, unknown>[] = [];
  let ids = 0;
  const ok = () => Promise.resolve({});
  const engine = {
    ping: ok,
    getImage: () => ({ inspect: () => Promise.resolve({ Config: { User: "user" } }) }),
    getContainer: () => ({ start: ok, remove: ok }),
    createContainer: (options: Record<string, unknown>) => {
      containers.push(options);
      const mode = (options.HostConfig as { NetworkMode: string }).NetworkMode;
      networks.get(mode)!.Containers[String(options.name)] = {};
      return Promise.resolve({ start: ok });
    },
    listContainers: () => Promise.resolve([]),
    createNetwork: (options: Record<string, unknown>) => {
      const name = String(options.Name);
      if (networks.has(name)) return Promise.reject(engineError(409, "network exists"));
      const Options = options.Options as Record<string, string>;
      const Id = `${++ids}`.padStart(64, "0");
      networks.set(name, {
        Id,
        Name: name,
        Internal: options.Internal === true,
        Options,
        Containers: {},
      });
      const bridge = Options["com.docker.network.bridge.name"] ?? `br-${Id.slice(0, 12)}`;
      if (engineRules && Options["com.docker.network.bridge.enable_icc"] === "false") {
        iptables.chains.get("FORWARD")!.push(`-i ${bridge} -o ${bridge} -j DROP`);
      }
      return Promise.resolve({ id: Id });
    },
    getNetwork: (name: string) => ({
      inspect: () =>
        networks.has(name)
          ? Promise.resolve(structuredClone(networks.get(name)))
          : Promise.reject(engineError(404, `network ${name} not found`)),
      remove: () => {
        const network = networks.get(name);
        if (!network) return Promise.reject(engineError(404, `network ${name} not found`));
        if (Object.keys(network.Containers).length > 0) {
          return Promise.reject(engineError(403, `network ${name} has active endpoints`));
        }
        networks.delete(name);
        return ok();
      },
    }),
  } as unknown as DockerEngine;
  return { engine, networks, containers };
}

function executor(
  engine: DockerEngine,
  iptables: FakeIptables,
  log: (level: string, msg: string) => void = () => {},
) {
  return new DockerExecutor({
    nodeId: "n1",
    instanceId: "i1",
    docker: engine,
    templates: new Map([["base", "img:1"]]),
    runIptables: iptables.run,
    log,
  });
}

const create = (ex: DockerExecutor, id: string, network: boolean) =>
  ex.create({ id, name: id, template: "base", spec: { network }, env: {} });

Deno.test("DockerExecutor puts sandboxes on the node's two networks, inter-container traffic off, each bridge guarded", async () => {
  const iptables = new FakeIptables();
  const { engine, networks, containers } = networkEngine(iptables);
  const ex = executor(engine, iptables);
  await create(ex, "closed", false);
  await create(ex, "open", true);
  await create(ex, "open2", true);

  const internal = networks.get("dormice-n1-i1-internal")!;
  const egress = networks.get("dormice-n1-i1-egress")!;
  assert.equal(internal.Internal, true);
  assert.equal(egress.Internal, false, "egress: a route out");
  for (const n of [internal, egress]) {
    assert.equal(n.Options["com.docker.network.bridge.enable_icc"], "false", n.Name);
    assert.match(n.Options["com.docker.network.bridge.name"], /^dm-[0-9a-f]{10}-[ie]$/);
  }
  // Docker's default `bridge` (inter-container traffic on) is no sandbox's network any more.
  assert.deepEqual(
    containers.map((c) => (c.HostConfig as { NetworkMode: string }).NetworkMode),
    ["dormice-n1-i1-internal", "dormice-n1-i1-egress", "dormice-n1-i1-egress"],
  );
  for (const n of [internal, egress]) {
    const bridge = n.Options["com.docker.network.bridge.name"];
    assert.equal(iptables.count("INPUT", `-i ${bridge} `), 1, `${n.Name}: one host rule`);
  }
  assert.equal(iptables.chains.get("INPUT")!.length, 2);
});

Deno.test("DockerExecutor keeps one host rule per network across restarts and removes it with the network", async () => {
  const iptables = new FakeIptables();
  const { engine, networks } = networkEngine(iptables);
  const first = executor(engine, iptables);
  await create(first, "a", false);
  // The node stops while its sandbox lives on: the network stays, and so does its rule.
  await first.close();
  assert.ok(networks.has("dormice-n1-i1-internal"));
  assert.equal(iptables.chains.get("INPUT")!.length, 1);

  const second = executor(engine, iptables);
  await create(second, "b", false);
  assert.equal(iptables.chains.get("INPUT")!.length, 1, "the restarted node found its rule");
  networks.get("dormice-n1-i1-internal")!.Containers = {};
  await second.close();
  assert.equal(networks.size, 0);
  assert.deepEqual(iptables.chains.get("INPUT"), [], "the rule left with its network");
});

Deno.test("DockerExecutor installs one host rule when sandboxes are created at once", async () => {
  const iptables = new FakeIptables();
  const { engine } = networkEngine(iptables);
  const ex = executor(engine, iptables);
  // Each create checks the rule and inserts it when missing: unordered, all would insert.
  await Promise.all(["a", "b", "c"].map((id) => create(ex, id, true)));
  await Promise.all(["d", "e"].map((id) => create(ex, id, true)));
  assert.equal(iptables.chains.get("INPUT")!.length, 1);
});

Deno.test("DockerExecutor puts back a host rule a firewall reload took, and says so", async () => {
  const iptables = new FakeIptables();
  const { engine } = networkEngine(iptables);
  const logged: string[] = [];
  const ex = executor(engine, iptables, (level, msg) => logged.push(`${level}: ${msg}`));
  await create(ex, "a", false);
  iptables.chains.set("INPUT", []); // ufw reload, firewalld restart, iptables -F
  await create(ex, "b", false);
  assert.equal(iptables.chains.get("INPUT")!.length, 1);
  assert.equal(
    logged.filter((l) => l.startsWith("warn: The host firewall rule of a sandbox network was gone"))
      .length,
    1,
    logged.join("\n"),
  );
});

Deno.test("DockerExecutor makes again an empty network without isolation and refuses one with sandboxes", async () => {
  const iptables = new FakeIptables();
  const { engine, networks } = networkEngine(iptables);
  // As an older node made it: --internal only, Docker's own bridge name, one sandbox on it.
  networks.set("dormice-n1-i1-internal", {
    Id: "f".repeat(64),
    Name: "dormice-n1-i1-internal",
    Internal: true,
    Options: {},
    Containers: { old: {} },
  });
  const ex = executor(engine, iptables);
  const refused = await create(ex, "a", false).catch((e) => e);
  assert.ok(refused instanceof ExecutorError);
  assert.match(
    refused.message,
    /^Network dormice-n1-i1-internal lets its sandboxes reach each other \(it was made without com\.docker\.network\.bridge\.enable_icc=false or --internal\) and 1 container\(s\) still sit on it: destroy the sandboxes on it/,
  );
  networks.get("dormice-n1-i1-internal")!.Containers = {};
  await create(ex, "a", false);
  const made = networks.get("dormice-n1-i1-internal")!;
  assert.equal(made.Options["com.docker.network.bridge.enable_icc"], "false");
});

Deno.test("DockerExecutor refuses a network whose bridge the engine left open to its neighbours", async () => {
  const iptables = new FakeIptables();
  // An engine run with --iptables=false takes enable_icc=false and installs nothing.
  const { engine } = networkEngine(iptables, { engineRules: false });
  const error = await create(executor(engine, iptables), "a", true).catch((e) => e);
  assert.ok(error instanceof ExecutorError);
  assert.match(
    error.message,
    /installed no rule keeping the sandboxes on network dormice-n1-i1-egress/,
  );
});

Deno.test("DockerExecutor.connect() refuses when the host firewall cannot be managed, and hostFirewall: false asks nothing", async () => {
  const iptables = new FakeIptables();
  iptables.refuse = "Permission denied (you must be root)";
  const { engine } = networkEngine(iptables);
  const options = {
    nodeId: "n1",
    instanceId: "i1",
    docker: engine,
    templates: new Map([["base", "img:1"]]),
    runIptables: iptables.run,
  };
  const error = await DockerExecutor.connect(options).catch((e) => e);
  assert.ok(error instanceof ExecutorError, String(error));
  assert.equal(error.code, "unavailable");
  assert.match(error.message, /you must be root.*DORMICE_SANDBOX_HOST_FIREWALL=off/);

  iptables.runs = [];
  const open = await DockerExecutor.connect({ ...options, hostFirewall: false });
  await create(open, "a", false);
  await open.close();
  assert.deepEqual(iptables.runs, []);
});

Deno.test("DockerExecutor.removeNetworks() removes a killed node's empty networks and their rules", async () => {
  const iptables = new FakeIptables();
  const { engine, networks } = networkEngine(iptables);
  const killed = executor(engine, iptables);
  await create(killed, "a", false);
  await create(killed, "b", true);
  for (const n of networks.values()) n.Containers = {};
  // A cleanup helper that never created anything with this node id.
  await executor(engine, iptables).removeNetworks();
  assert.equal(networks.size, 0);
  assert.deepEqual(iptables.chains.get("INPUT"), []);
});

Deno.test("DockerExecutor creates at once share the host rule checks instead of each waiting for its own", async () => {
  const iptables = new FakeIptables();
  const { engine, containers } = networkEngine(iptables);
  let release = () => {};
  const gate = new Promise<void>((resolve) => release = resolve);
  let armed = false, blocked = 0;
  // The first rule check after the warm-up holds until released, as a slow iptables would.
  const run: typeof iptables.run = async (args, signal) => {
    if (armed && args.includes("-C") && args.includes("INPUT") && blocked++ === 0) await gate;
    return iptables.run(args, signal);
  };
  const ex = executor(engine, { run } as unknown as FakeIptables);
  await create(ex, "warm", false);
  armed = true;
  iptables.runs = [];
  const creates = ["a", "b", "c", "d"].map((id) => create(ex, id, false));
  for (let i = 0; i < 100 && blocked === 0; i++) await Promise.resolve();
  assert.equal(blocked, 1, "the first create's rule check started and holds");
  release();
  await Promise.all(creates);
  const checks = iptables.runs.filter((a) => a.includes("-C") && a.includes("INPUT")).length;
  // One check each in a row would be 4; the three that came while the first ran share one.
  assert.equal(checks, 2, iptables.runs.map((a) => a.join(" ")).join("\n"));
  assert.equal(containers.length, 5);
  assert.equal(iptables.chains.get("INPUT")!.length, 1);
});

Deno.test("DockerExecutor gives sandboxes with egress the resolvers sandboxDns names, and the closed ones none", async () => {
  const iptables = new FakeIptables();
  const { engine, containers } = networkEngine(iptables);
  const ex = new DockerExecutor({
    nodeId: "n1",
    instanceId: "i1",
    docker: engine,
    templates: new Map([["base", "img:1"]]),
    runIptables: iptables.run,
    sandboxDns: ["198.18.0.53", "198.18.0.54"],
  });
  await create(ex, "closed", false);
  await create(ex, "open", true);
  const dns = containers.map((c) => (c.HostConfig as { Dns?: string[] }).Dns);
  assert.deepEqual(dns, [undefined, ["198.18.0.53", "198.18.0.54"]]);
  // Without the setting, the engine's choice (the host's resolvers): no Dns at all.
  const plain = networkEngine(iptables);
  await create(executor(plain.engine, iptables), "open", true);
  assert.equal((plain.containers[0].HostConfig as { Dns?: string[] }).Dns, undefined);
});
