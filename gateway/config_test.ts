import assert from "node:assert/strict";
import { loadGatewayConfig, NODE_CLIENT_IDLE_MS } from "./config.ts";
import { guardBounds } from "../shared/http1/_guard.ts";

const token = "t".repeat(32);

Deno.test("loadGatewayConfig() applies the documented defaults", () => {
  const r = loadGatewayConfig({ DORMICE_API_TOKEN: token });
  assert.ok(r.ok);
  assert.equal(r.config.port, 3677);
  assert.equal(r.config.host, "127.0.0.1");
  assert.equal(r.config.nodeCpuLimitPct, 70);
  assert.equal(r.config.nodeActiveLimit, 400);
  assert.equal(r.config.nodeMinDiskGb, 10);
  assert.equal(r.config.lookupTimeoutMs, 2000);
  assert.equal(r.config.lookupConcurrency, 128);
  assert.equal(r.config.headTimeoutMs, 120_000);
  assert.equal(r.config.nodeDeadAfterSeconds, 600);
  assert.equal(r.config.jsonBodyLimitBytes, 32 * 1024 * 1024);
  const set = loadGatewayConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_JSON_BODY_LIMIT_MB: "4",
  });
  assert.ok(set.ok);
  assert.equal(set.config.jsonBodyLimitBytes, 4 * 1024 * 1024);
  assert.equal(r.config.lookupDigests, "on");
  assert.equal(r.config.nodeClient, "h1");
  const viaFetch = loadGatewayConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_NODE_CLIENT: "fetch",
  });
  assert.ok(viaFetch.ok);
  assert.equal(viaFetch.config.nodeClient, "fetch");
});

Deno.test("the gateway serves with the bytes engine unless DORMICE_GATEWAY_ENGINE=deno", () => {
  const r = loadGatewayConfig({ DORMICE_API_TOKEN: token });
  assert.ok(r.ok);
  assert.equal(r.config.engine, "bytes");
  const deno = loadGatewayConfig({ DORMICE_API_TOKEN: token, DORMICE_GATEWAY_ENGINE: "deno" });
  assert.ok(deno.ok);
  assert.equal(deno.config.engine, "deno");
});

Deno.test("DORMICE_GATEWAY_LOOKUP_DIGESTS=sole-writer turns digest skipping on", () => {
  const r = loadGatewayConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_LOOKUP_DIGESTS: "sole-writer",
  });
  assert.ok(r.ok);
  assert.equal(r.config.lookupDigests, "sole-writer");
});

Deno.test("DORMICE_GATEWAY_LOOKUP_DIGESTS is on by default", () => {
  const r = loadGatewayConfig({ DORMICE_API_TOKEN: token });
  assert.ok(r.ok);
  assert.equal(r.config.lookupDigests, "on");
});

Deno.test("DORMICE_GATEWAY_LOOKUP_DIGESTS=on is a mode, with or without etcd", () => {
  for (const etcd of [{}, { DORMICE_GATEWAY_ETCD: "http://127.0.0.1:2379" }]) {
    const r = loadGatewayConfig({
      DORMICE_API_TOKEN: token,
      DORMICE_GATEWAY_LOOKUP_DIGESTS: "on",
      ...etcd,
    });
    assert.ok(r.ok, JSON.stringify(r));
    assert.equal(r.config.lookupDigests, "on");
  }
});

Deno.test("loadGatewayConfig() refuses bad values naming the variable, the value and the fix", () => {
  const cases: [Record<string, string>, RegExp][] = [
    [{ DORMICE_API_TOKEN: "" }, /DORMICE_API_TOKEN is not set/],
    [{ DORMICE_API_TOKEN: "short" }, /DORMICE_API_TOKEN is 5 characters long: write at least 32/],
    [{ DORMICE_GATEWAY_PORT: "http" }, /DORMICE_GATEWAY_PORT='http'.*port number/],
    [{ DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "150" }, /DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT='150'/],
    [{ DORMICE_GATEWAY_NODE_ACTIVE_LIMIT: "1.5" }, /DORMICE_GATEWAY_NODE_ACTIVE_LIMIT='1.5'/],
    [{ DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS: "5" }, /DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS='5'/],
    [
      { DORMICE_GATEWAY_LOOKUP_CONCURRENCY: "0" },
      /DORMICE_GATEWAY_LOOKUP_CONCURRENCY='0'.*from 1 to 4096/,
    ],
    [{ DORMICE_GATEWAY_HEAD_TIMEOUT_MS: "0" }, /DORMICE_GATEWAY_HEAD_TIMEOUT_MS='0'.*100 to/],
    [
      { DORMICE_GATEWAY_NODE_DEAD_AFTER_S: "30" },
      /DORMICE_GATEWAY_NODE_DEAD_AFTER_S='30'.*0 \(never\) or .* 60 to/,
    ],
    [{ DORMICE_LOG_LEVEL: "loud" }, /DORMICE_LOG_LEVEL='loud'/],
    [
      { DORMICE_GATEWAY_JSON_BODY_LIMIT_MB: "1000" },
      /DORMICE_GATEWAY_JSON_BODY_LIMIT_MB='1000'.*MiB from 1 to 256/,
    ],
    [
      { DORMICE_GATEWAY_LOOKUP_DIGESTS: "yes" },
      /DORMICE_GATEWAY_LOOKUP_DIGESTS='yes'.*'on'.*'off'/,
    ],
    [
      { DORMICE_GATEWAY_NODE_CLIENT: "undici" },
      /DORMICE_GATEWAY_NODE_CLIENT='undici'.*'h1'.*'fetch'/,
    ],
    [{ DORMICE_GATEWAY_ENGINE: "hyper" }, /DORMICE_GATEWAY_ENGINE='hyper'.*'bytes'.*'deno'/],
    [
      {
        DORMICE_GATEWAY_LOOKUP_DIGESTS: "sole-writer",
        DORMICE_GATEWAY_ETCD: "http://127.0.0.1:2379",
      },
      /'sole-writer' cannot go with DORMICE_GATEWAY_ETCD/,
    ],
  ];
  for (const [env, expected] of cases) {
    const r = loadGatewayConfig({ DORMICE_API_TOKEN: token, ...env });
    assert.equal(r.ok, false, JSON.stringify(env));
    if (!r.ok) assert.match(r.errors.join("\n"), expected);
  }
  const r = loadGatewayConfig({ DORMICE_API_TOKEN: "s3cret-but-short" });
  assert.ok(!r.ok && !r.errors.join().includes("s3cret"), "the token itself is never printed");
});

Deno.test("loadGatewayConfig() reads the webhook pair and refuses half of it", () => {
  const ok = loadGatewayConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_WEBHOOK_URL: "https://hooks.example.com/dormice",
    DORMICE_WEBHOOK_SECRET: "w".repeat(24),
  });
  assert.ok(ok.ok);
  assert.equal(ok.config.webhookUrl, "https://hooks.example.com/dormice");
  const none = loadGatewayConfig({ DORMICE_API_TOKEN: token });
  assert.ok(none.ok && none.config.webhookUrl === null);
  const cases: [Record<string, string>, RegExp][] = [
    [
      { DORMICE_WEBHOOK_URL: "https://h.example.com/x" },
      /DORMICE_WEBHOOK_URL is set but DORMICE_WEBHOOK_SECRET is not/,
    ],
    [
      { DORMICE_WEBHOOK_URL: "https://h.example.com/x", DORMICE_WEBHOOK_SECRET: "short" },
      /DORMICE_WEBHOOK_SECRET is 5 characters long/,
    ],
    [{ DORMICE_WEBHOOK_SECRET: "w".repeat(24) }, /DORMICE_WEBHOOK_URL is not/],
    [
      { DORMICE_WEBHOOK_URL: "ftp://h/x", DORMICE_WEBHOOK_SECRET: "w".repeat(24) },
      /DORMICE_WEBHOOK_URL='ftp:\/\/h\/x' is not an http\(s\) URL/,
    ],
  ];
  for (const [env, expected] of cases) {
    const r = loadGatewayConfig({ DORMICE_API_TOKEN: token, ...env });
    assert.equal(r.ok, false, JSON.stringify(env));
    if (!r.ok) assert.match(r.errors.join("\n"), expected);
    if (!r.ok) assert.ok(!r.errors.join().includes("w".repeat(24)), "the secret is never printed");
  }
});

Deno.test("loadGatewayConfig() reads shared mode's etcd members, prefix and lease", () => {
  const t = "x".repeat(32);
  const off = loadGatewayConfig({ DORMICE_API_TOKEN: t });
  assert.ok(off.ok);
  assert.equal(off.config.etcdEndpoints, null);
  assert.equal(off.config.etcdPrefix, "/dormice/");
  const on = loadGatewayConfig({
    DORMICE_API_TOKEN: t,
    DORMICE_GATEWAY_ETCD: "http://10.0.0.1:2379/, http://10.0.0.2:2379",
    DORMICE_GATEWAY_ETCD_PREFIX: "/fleets/eu/",
    DORMICE_GATEWAY_ETCD_LEASE_SECONDS: "4",
  });
  assert.ok(on.ok);
  assert.deepEqual(on.config.etcdEndpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
  assert.equal(on.config.etcdPrefix, "/fleets/eu/");
  assert.equal(on.config.etcdLeaseSeconds, 4);
  const bad = loadGatewayConfig({
    DORMICE_API_TOKEN: t,
    DORMICE_GATEWAY_ETCD: "10.0.0.1:2379",
    DORMICE_GATEWAY_ETCD_PREFIX: "dormice",
    DORMICE_GATEWAY_ETCD_LEASE_SECONDS: "1",
  });
  assert.ok(!bad.ok);
  assert.equal(bad.errors.length, 3, bad.errors.join("\n"));
});

Deno.test("loadGatewayConfig() reads the sandbox domain and refuses a bad one naming the variable", () => {
  const base = { DORMICE_API_TOKEN: "x".repeat(32) };
  const ok = loadGatewayConfig({ ...base, DORMICE_SANDBOX_DOMAIN: "Sbx.Example.com:8443" });
  assert.ok(ok.ok);
  assert.equal(ok.config.sandboxDomain, "sbx.example.com:8443");
  const bad = loadGatewayConfig({ ...base, DORMICE_SANDBOX_DOMAIN: "http://sbx.example.com" });
  assert.ok(!bad.ok);
  assert.match(bad.errors.join("\n"), /DORMICE_SANDBOX_DOMAIN='http:\/\/sbx.example.com'/);
});

Deno.test("loadGatewayConfig() wants both TLS files or neither", () => {
  const base = { DORMICE_API_TOKEN: "x".repeat(32) };
  assert.equal((loadGatewayConfig(base) as { config: { tls: unknown } }).config.tls, null);
  const both = loadGatewayConfig({
    ...base,
    DORMICE_GATEWAY_TLS_CERT: "/etc/dormice/cert.pem",
    DORMICE_GATEWAY_TLS_KEY: "/etc/dormice/key.pem",
  });
  assert.ok(both.ok);
  assert.deepEqual(both.config.tls, {
    certFile: "/etc/dormice/cert.pem",
    keyFile: "/etc/dormice/key.pem",
  });
  const half = loadGatewayConfig({ ...base, DORMICE_GATEWAY_TLS_CERT: "/etc/dormice/cert.pem" });
  assert.ok(!half.ok);
  assert.match(half.errors[0], /DORMICE_GATEWAY_TLS_KEY is not/);
});

Deno.test("DORMICE_GATEWAY_WEBSOCKETS: on by default with a sandbox domain; anything but on/off/auto is refused", () => {
  const plain = loadGatewayConfig({ DORMICE_API_TOKEN: token });
  assert.ok(plain.ok);
  assert.equal(plain.config.websockets, false, "no domain: the faster engine");
  const domain = { DORMICE_API_TOKEN: token, DORMICE_SANDBOX_DOMAIN: "sbx.example.com" };
  const withDomain = loadGatewayConfig(domain);
  assert.ok(withDomain.ok);
  assert.equal(withDomain.config.websockets, true, "a domain: getHost() URLs take WebSockets");
  const forcedOff = loadGatewayConfig({ ...domain, DORMICE_GATEWAY_WEBSOCKETS: "off" });
  assert.ok(forcedOff.ok);
  assert.equal(forcedOff.config.websockets, false);
  const on = loadGatewayConfig({ DORMICE_API_TOKEN: token, DORMICE_GATEWAY_WEBSOCKETS: "on" });
  assert.ok(on.ok);
  assert.equal(on.config.websockets, true);
  const bad = loadGatewayConfig({ DORMICE_API_TOKEN: token, DORMICE_GATEWAY_WEBSOCKETS: "yes" });
  assert.ok(!bad.ok);
  assert.match(
    bad.errors.join("\n"),
    /DORMICE_GATEWAY_WEBSOCKETS='yes' is not a switch: set 'on'.*\(off here\)/,
  );
});

Deno.test("DORMICE_GATEWAY_NODE_DEAD_AFTER_S=0 never declares a node dead", () => {
  const r = loadGatewayConfig({ DORMICE_API_TOKEN: token, DORMICE_GATEWAY_NODE_DEAD_AFTER_S: "0" });
  assert.ok(r.ok);
  assert.equal(r.config.nodeDeadAfterSeconds, 0);
});

Deno.test("the gateway keeps a node connection idle for rounds seconds apart, and closes it before the node does", () => {
  // A lookup miss a few seconds after the last one finds the connections open (a cold round at
  // 10,000 nodes cost twice the CPU of a warm one), and the node's server never closes first.
  assert.ok(NODE_CLIENT_IDLE_MS >= 15_000, `${NODE_CLIENT_IDLE_MS} ms`);
  assert.ok(
    NODE_CLIENT_IDLE_MS <= guardBounds({}).idleTimeoutMs / 2,
    `${NODE_CLIENT_IDLE_MS} ms against the node's ${guardBounds({}).idleTimeoutMs} ms`,
  );
});
