import assert from "node:assert/strict";
import { readEgressSettings } from "./config_egress.ts";

const PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

Deno.test("readEgressSettings() reads the CA pair, the extra CA as a path or PEM text, and the hosts", async () => {
  const env = (vars: Record<string, string>) => (name: string) => vars[name];
  assert.deepEqual(readEgressSettings(env({})), {
    ca: null,
    extraCa: [],
    hosts: new Map(),
    sandboxDns: [],
  });
  const file = await Deno.makeTempFile({ suffix: ".pem" });
  try {
    await Deno.writeTextFile(file, PEM + PEM);
    const r = readEgressSettings(env({
      DORMICE_EGRESS_CA_CERT: "/etc/dormice/ca.crt",
      DORMICE_EGRESS_CA_KEY: "/etc/dormice/ca.key",
      DORMICE_EGRESS_EXTRA_CA: file,
      DORMICE_EGRESS_HOSTS: "Api.Internal.=10.0.0.7, b.test=198.18.0.2",
    }));
    assert.ok(!Array.isArray(r), String(r));
    assert.deepEqual(r.ca, { certFile: "/etc/dormice/ca.crt", keyFile: "/etc/dormice/ca.key" });
    assert.equal(r.extraCa.length, 2);
    assert.deepEqual([...r.hosts], [["api.internal", "10.0.0.7"], ["b.test", "198.18.0.2"]]);
    const inline = readEgressSettings(env({ DORMICE_EGRESS_EXTRA_CA: PEM }));
    assert.ok(!Array.isArray(inline));
    assert.equal(inline.extraCa.length, 1);
  } finally {
    await Deno.remove(file);
  }
});

Deno.test("readEgressSettings() refuses a lone CA half, an unreadable extra CA and a bad host entry", () => {
  const r = readEgressSettings((name) =>
    ({
      DORMICE_EGRESS_CA_CERT: "/x.crt",
      DORMICE_EGRESS_EXTRA_CA: "/nonexistent/ca.pem",
      DORMICE_EGRESS_HOSTS: "a.test=10.0.0.0/8",
    })[name as "DORMICE_EGRESS_CA_CERT"]
  );
  assert.ok(Array.isArray(r));
  assert.equal(r.length, 3);
  assert.match(r[0], /DORMICE_EGRESS_CA_CERT and DORMICE_EGRESS_CA_KEY go together/);
  assert.match(r[1], /DORMICE_EGRESS_EXTRA_CA='\/nonexistent\/ca\.pem' cannot be used/);
  assert.match(r[2], /DORMICE_EGRESS_HOSTS entry 'a\.test=10\.0\.0\.0\/8' is not name=IPv4/);
});

Deno.test("readEgressSettings() reads DORMICE_SANDBOX_DNS as IPv4 addresses and refuses anything else", () => {
  const env = (vars: Record<string, string>) => (name: string) => vars[name];
  const r = readEgressSettings(env({ DORMICE_SANDBOX_DNS: " 198.18.0.53, 10.0.0.2 " }));
  assert.ok(!Array.isArray(r), String(r));
  assert.deepEqual(r.sandboxDns, ["198.18.0.53", "10.0.0.2"]);
  const none = readEgressSettings(env({}));
  assert.ok(!Array.isArray(none));
  assert.deepEqual(none.sandboxDns, []);
  const bad = readEgressSettings(env({ DORMICE_SANDBOX_DNS: "dns.google,10.0.0.0/8" }));
  assert.ok(Array.isArray(bad));
  assert.equal(bad.length, 2);
  assert.match(bad[0], /DORMICE_SANDBOX_DNS entry 'dns\.google' is not an IPv4 address/);
  assert.match(bad[1], /DORMICE_SANDBOX_DNS entry '10\.0\.0\.0\/8' is not an IPv4 address/);
});
