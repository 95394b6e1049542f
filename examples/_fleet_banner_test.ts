import assert from "node:assert/strict";
import { fleetBanner, type FleetBannerOptions } from "./_fleet_banner.ts";

const base: FleetBannerOptions = {
  gatewayUrl: "http://127.0.0.1:3677",
  gatewayDb: ".dormice/fleet/gateway/gateway.db",
  nodes: [
    { id: "node-a", url: "http://127.0.0.1:3676", dir: ".dormice/fleet/node-a" },
    { id: "node-b", url: "http://127.0.0.1:3678", dir: ".dormice/fleet/node-b" },
  ],
  executor: "docker",
  team: "dev",
  apiKey: "e2b_" + "0".repeat(40),
  fleetToken: "t".repeat(48),
};

const certs = {
  caFile: "/repo/.dormice/fleet/tls/dormice.test/ca.pem",
  certFile: "/repo/.dormice/fleet/tls/dormice.test/cert.pem",
  keyFile: "/repo/.dormice/fleet/tls/dormice.test/key.pem",
  madeCa: false,
  madeCert: false,
};

/** Every `export NAME=value` line, by name (a name printed twice keeps both values). */
function exports(lines: string[]): Map<string, string[]> {
  const found = new Map<string, string[]>();
  for (const line of lines) {
    const m = /^\s*export ([A-Z0-9_]+)=(.*)$/.exec(line);
    if (m) found.set(m[1], [...(found.get(m[1]) ?? []), m[2]]);
  }
  return found;
}

Deno.test("fleetBanner() without a domain points the SDK at the gateway's two URLs", () => {
  const found = exports(fleetBanner(base));
  assert.deepEqual(found.get("E2B_API_URL"), ["http://127.0.0.1:3677/e2b/api"]);
  assert.deepEqual(found.get("E2B_SANDBOX_URL"), ["http://127.0.0.1:3677/e2b/envd"]);
  assert.deepEqual(found.get("E2B_VOLUME_API_URL"), ["http://127.0.0.1:3677/e2b/api"]);
  assert.deepEqual(found.get("E2B_API_KEY"), [base.apiKey]);
  assert.equal(found.get("E2B_DOMAIN"), undefined);
});

Deno.test("fleetBanner() with a domain prints the domain's settings only, and what TLS needs", () => {
  const lines = fleetBanner({
    ...base,
    gatewayUrl: "https://127.0.0.1:3677",
    domain: { name: "dormice.test", port: 3677, not443: "binding port 443 needs root", certs },
  });
  const found = exports(lines);
  // With E2B_API_URL set as well the SDK builds its URLs from it, and a signed file URL is a
  // 501: one set, the one that routes everything.
  assert.equal(found.get("E2B_API_URL"), undefined, lines.join("\n"));
  assert.equal(found.get("E2B_SANDBOX_URL"), undefined, lines.join("\n"));
  assert.deepEqual(found.get("E2B_DOMAIN"), ["dormice.test:3677"]);
  assert.deepEqual(found.get("E2B_API_KEY"), [base.apiKey]);
  assert.deepEqual(found.get("NODE_EXTRA_CA_CERTS"), [certs.caFile]);
  assert.deepEqual(found.get("SSL_CERT_FILE"), [certs.caFile]);
  assert.deepEqual(found.get("DENO_CERT"), [certs.caFile]);
  // The fleet token still has its line, apart from the client's.
  assert.deepEqual(found.get("DORMICE_API_TOKEN"), [base.fleetToken]);
  assert.ok(lines.some((l) => l.includes("leave E2B_API_URL and E2B_SANDBOX_URL unset")));
});

Deno.test("fleetBanner() lists every node and both gateways in shared mode", () => {
  const text = fleetBanner({
    ...base,
    shared: { gateway2Url: "http://127.0.0.1:3678", etcdUrl: "http://127.0.0.1:2379" },
    nodes: [...base.nodes, { id: "node-c", url: "http://127.0.0.1:3680", dir: "c" }],
  }).join("\n");
  assert.match(text, /gateway {2}http:\/\/127\.0\.0\.1:3678 .*etcd at http:\/\/127\.0\.0\.1:2379/);
  assert.match(text, /node-c {3}http:\/\/127\.0\.0\.1:3680/);
  assert.match(text, /Ctrl-C stops them all/);
});
