import assert from "node:assert/strict";
import { ExecutorError } from "../contract.ts";
import type { DockerEngine } from "./engine.ts";
import { DockerExecutor } from "./executor.ts";

interface FakeNetwork {
  Id: string;
  Name: string;
  Internal: boolean;
  Options: Record<string, string>;
  Containers: Record<string, unknown>;
}

const engineError = (statusCode: number, message: string) =>
  Object.assign(new Error(message), { statusCode });

/** An engine with networks, recording every network and container create. */
function networkEngine() {
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
      const Id = `${++ids}`.padStart(64, "0");
      networks.set(name, {
        Id,
        Name: name,
        Internal: options.Internal === true,
        Options: options.Options as Record<string, string>,
        Containers: {},
      });
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

function executor(engine: DockerEngine) {
  return new DockerExecutor({
    nodeId: "n1",
    docker: engine,
    templates: new Map([["base", "img:1"]]),
  });
}

const create = (ex: DockerExecutor, id: string, network: boolean) =>
  ex.create({ id, name: id, template: "base", spec: { network }, env: {} });

Deno.test("DockerExecutor puts sandboxes on the node's two networks, inter-container traffic off", async () => {
  const { engine, networks, containers } = networkEngine();
  const ex = executor(engine);
  await create(ex, "closed", false);
  await create(ex, "open", true);
  await create(ex, "open2", true);

  const internal = networks.get("dormice-n1-internal")!;
  const egress = networks.get("dormice-n1-egress")!;
  assert.equal(internal.Internal, true);
  assert.equal(egress.Internal, false, "egress: a route out");
  for (const n of [internal, egress]) {
    assert.equal(n.Options["com.docker.network.bridge.enable_icc"], "false", n.Name);
  }
  // Docker's default `bridge` (inter-container traffic on) is no sandbox's network any more.
  assert.deepEqual(
    containers.map((c) => (c.HostConfig as { NetworkMode: string }).NetworkMode),
    ["dormice-n1-internal", "dormice-n1-egress", "dormice-n1-egress"],
  );
});

Deno.test("DockerExecutor makes again an empty network without isolation and refuses one with sandboxes", async () => {
  const { engine, networks } = networkEngine();
  // As an older node made it: --internal only, one sandbox on it.
  networks.set("dormice-n1-internal", {
    Id: "f".repeat(64),
    Name: "dormice-n1-internal",
    Internal: true,
    Options: {},
    Containers: { old: {} },
  });
  const ex = executor(engine);
  const refused = await create(ex, "a", false).catch((e) => e);
  assert.ok(refused instanceof ExecutorError);
  assert.match(
    refused.message,
    /^Network dormice-n1-internal lets its sandboxes reach each other \(it was made without com\.docker\.network\.bridge\.enable_icc=false or --internal\) and 1 container\(s\) still sit on it: destroy the sandboxes on it/,
  );
  networks.get("dormice-n1-internal")!.Containers = {};
  await create(ex, "a", false);
  const made = networks.get("dormice-n1-internal")!;
  assert.equal(made.Options["com.docker.network.bridge.enable_icc"], "false");
});

Deno.test("DockerExecutor.removeNetworks() removes a killed node's empty networks", async () => {
  const { engine, networks } = networkEngine();
  const killed = executor(engine);
  await create(killed, "a", false);
  await create(killed, "b", true);
  for (const n of networks.values()) n.Containers = {};
  // A cleanup helper that never created anything with this node id.
  await executor(engine).removeNetworks();
  assert.equal(networks.size, 0);
});
