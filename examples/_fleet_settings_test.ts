import assert from "node:assert/strict";
import { fleetSettings } from "./_fleet_settings.ts";

const env = (entries: Record<string, string>) => new Map(Object.entries(entries));

Deno.test("fleetSettings() defaults to node-a and node-b from 3676, etcd from 2379, quiet", () => {
  assert.deepEqual(fleetSettings(env({}), []), {
    nodeIds: ["node-a", "node-b"],
    nodePort: 3676,
    etcdPort: 2379,
    verbose: false,
  });
});

Deno.test("fleetSettings() takes node ids, ports and --verbose", () => {
  const settings = fleetSettings(
    env({
      DORMICE_FLEET_NODE_IDS: "laptop-a, laptop-b,laptop-c",
      DORMICE_FLEET_NODE_PORT: "4676",
      DORMICE_FLEET_ETCD_PORT: "4379",
    }),
    ["--shared", "--verbose"],
  );
  assert.deepEqual(settings, {
    nodeIds: ["laptop-a", "laptop-b", "laptop-c"],
    nodePort: 4676,
    etcdPort: 4379,
    verbose: true,
  });
});

Deno.test("fleetSettings() refuses bad ids, a repeated id, bad ports and unknown arguments", () => {
  const refused = fleetSettings(
    env({
      DORMICE_FLEET_NODE_IDS: "node-a,-bad,node-a",
      DORMICE_FLEET_NODE_PORT: "80",
      DORMICE_FLEET_ETCD_PORT: "two",
    }),
    ["--domain", "dormice.test"],
  );
  assert.ok("refusals" in refused);
  const text = refused.refusals.join("\n");
  assert.match(text, /holds '-bad', which is not a node id: .*starts with a letter or digit/);
  assert.match(text, /names 'node-a' twice/);
  assert.match(text, /DORMICE_FLEET_NODE_PORT='80' is not a port from 1024 to 65000/);
  assert.match(text, /DORMICE_FLEET_ETCD_PORT='two' is not a port/);
  // `--domain dormice.test` with a space would otherwise start a fleet without the domain.
  assert.match(text, /does not know '--domain': it takes --shared, --domain=<domain>/);
  assert.equal(refused.refusals.length, 6);
});
