import assert from "node:assert/strict";
import { loadNodeConfig } from "./config.ts";
import { formatPools, parsePools } from "./config_capabilities.ts";

const token = "t".repeat(32);

function refusals(env: Record<string, string | undefined>): string[] {
  const r = loadNodeConfig(env);
  assert.equal(r.ok, false);
  return r.ok ? [] : r.refusals;
}

Deno.test("loadNodeConfig() fills the documented defaults", () => {
  const r = loadNodeConfig({ DORMICE_API_TOKEN: token });
  assert.ok(r.ok);
  assert.deepEqual(r.config, {
    apiToken: token,
    host: "127.0.0.1",
    port: 3676,
    dataDir: ".dormice/node",
    executor: "docker",
    templates: null,
    dockerSocket: "/var/run/docker.sock",
    sandboxDefaults: {},
    sandboxHostFirewall: true,
    e2bDefaultEgress: false,
    gatewayEndpoint: null,
    gatewayEndpoints: [],
    gatewayCheckInHeader: null,
    nodeEndpoint: "http://127.0.0.1:3676",
    nodeId: "node-1",
    checkInIntervalSeconds: 15,
    scanIntervalSeconds: 60,
    logLevel: "info",
    pools: [],
    poolsRefillDelayMs: 1000,
    volumes: [],
    volumeRoot: null,
    volumeSizeBytes: 10e9,
    sandboxDomain: null,
    websockets: true,
    jsonBodyLimitBytes: 32 * 1024 * 1024,
    uploadLimitBytes: 1024 * 1024 * 1024,
    snapshotMinDiskBytes: 1e9,
    templateBuilds: 2,
    templateBuildTimeoutMs: 1_800_000,
    templateContextLimitBytes: 256 * 1024 * 1024,
    snapshotHealMaxBytes: 20e9,
    snapshotHealTimeoutMs: 600_000,
    snapshotTtlMs: 720 * 3_600_000,
    snapshotHeal: true,
    uploadGzipMaxRatio: 100,
    jsonMessageLimitBytes: 1024 * 1024,
  });
});

Deno.test("loadNodeConfig() reads DORMICE_POOLS_REFILL_DELAY_MS, 0 to 60000", () => {
  const r = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_POOLS_REFILL_DELAY_MS: "0" });
  assert.ok(r.ok);
  assert.equal(r.config.poolsRefillDelayMs, 0);
  assert.deepEqual(
    refusals({ DORMICE_API_TOKEN: token, DORMICE_POOLS_REFILL_DELAY_MS: "90000" }),
    [
      "DORMICE_POOLS_REFILL_DELAY_MS='90000' is not a whole number from 0 to 60000: write one " +
      "such as 1000",
    ],
  );
});

Deno.test("loadNodeConfig() reads DORMICE_POOLS and DORMICE_VOLUMES", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_POOLS: "minimal=2, base:1:512=1,base::1024=3",
    DORMICE_VOLUMES: "data=/srv/data:ro,cache=dormice-cache",
  });
  assert.ok(r.ok);
  assert.deepEqual(r.config.pools, [
    { template: "minimal", spec: {}, warm: 2 },
    { template: "base", spec: { cpus: 1, memoryMB: 512 }, warm: 1 },
    { template: "base", spec: { memoryMB: 1024 }, warm: 3 },
  ]);
  assert.deepEqual(r.config.volumes, [
    { name: "data", source: "/srv/data", readOnly: true },
    { name: "cache", source: "dormice-cache", readOnly: false },
  ]);
  // The boot log writes pools back in the variable's syntax, so a line can be pasted into it.
  const written = formatPools([...r.config.pools, { template: "x", spec: { cpus: 0.5 }, warm: 0 }]);
  assert.equal(written, "minimal=2,base:1:512=1,base::1024=3,x:0.5=0");
  assert.deepEqual(parsePools(written), [
    ...r.config.pools,
    { template: "x", spec: { cpus: 0.5 }, warm: 0 },
  ]);
});

Deno.test("loadNodeConfig() refuses a bad pool or volume, naming the part", () => {
  const [pool] = refusals({ DORMICE_API_TOKEN: token, DORMICE_POOLS: "base=lots" });
  assert.match(pool, /DORMICE_POOLS: 'base=lots' is not a pool: write template/);
  const [twice] = refusals({ DORMICE_API_TOKEN: token, DORMICE_POOLS: "base=1,base=2" });
  assert.match(twice, /'base=2' is listed twice/);
  const [volume] = refusals({ DORMICE_API_TOKEN: token, DORMICE_VOLUMES: "data=rel/path" });
  assert.match(volume, /DORMICE_VOLUMES: 'data=rel\/path' is not a volume/);
});

Deno.test("loadNodeConfig() reads the body caps in MiB and refuses one out of range", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_JSON_BODY_LIMIT_MB: "8",
    DORMICE_UPLOAD_LIMIT_MB: "2048",
  });
  assert.ok(r.ok);
  assert.equal(r.config.jsonBodyLimitBytes, 8 * 1024 * 1024);
  assert.equal(r.config.uploadLimitBytes, 2048 * 1024 * 1024);
  const [json, upload] = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_JSON_BODY_LIMIT_MB: "700",
    DORMICE_UPLOAD_LIMIT_MB: "0",
  });
  assert.match(json, /DORMICE_JSON_BODY_LIMIT_MB='700' is not a whole number from 1 to 256/);
  assert.match(upload, /DORMICE_UPLOAD_LIMIT_MB='0' is not a whole number from 1 to 8191/);
});

Deno.test("loadNodeConfig() reads the snapshot disk floor in GB and refuses one out of range", () => {
  const r = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_SNAPSHOT_MIN_DISK_GB: "0" });
  assert.ok(r.ok);
  assert.equal(r.config.snapshotMinDiskBytes, 0);
  const [floor] = refusals({ DORMICE_API_TOKEN: token, DORMICE_SNAPSHOT_MIN_DISK_GB: "-1" });
  assert.match(floor, /DORMICE_SNAPSHOT_MIN_DISK_GB='-1' is not a whole number from 0 to 100000/);
});

Deno.test("loadNodeConfig() reads the template build settings and refuses ones out of range", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_TEMPLATE_BUILDS: "0",
    DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS: "60",
    DORMICE_TEMPLATE_CONTEXT_LIMIT_MB: "1",
  });
  assert.ok(r.ok);
  assert.equal(r.config.templateBuilds, 0);
  assert.equal(r.config.templateBuildTimeoutMs, 60_000);
  assert.equal(r.config.templateContextLimitBytes, 1024 * 1024);
  const [builds, timeout, context] = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_TEMPLATE_BUILDS: "x",
    DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS: "0",
    DORMICE_TEMPLATE_CONTEXT_LIMIT_MB: "70000",
  });
  assert.match(builds, /DORMICE_TEMPLATE_BUILDS='x' is not a whole number from 0 to 64/);
  assert.match(timeout, /DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS='0' is not a whole number/);
  assert.match(context, /DORMICE_TEMPLATE_CONTEXT_LIMIT_MB='70000' is not a whole number/);
});

Deno.test("loadNodeConfig() reads DORMICE_UPLOAD_GZIP_MAX_RATIO, 100 by default, 1 to 1032", () => {
  const plain = loadNodeConfig({ DORMICE_API_TOKEN: token });
  assert.ok(plain.ok);
  assert.equal(plain.config.uploadGzipMaxRatio, 100);
  const off = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_UPLOAD_GZIP_MAX_RATIO: "1032" });
  assert.ok(off.ok);
  assert.equal(off.config.uploadGzipMaxRatio, 1032);
  for (const bad of ["0", "1033", "5.5"]) {
    const [refusal] = refusals({ DORMICE_API_TOKEN: token, DORMICE_UPLOAD_GZIP_MAX_RATIO: bad });
    assert.match(
      refusal,
      new RegExp(`DORMICE_UPLOAD_GZIP_MAX_RATIO='${bad}' is not a whole number from 1 to 1032`),
    );
  }
});

Deno.test("loadNodeConfig() reads DORMICE_JSON_MESSAGE_LIMIT_KB, 1024 by default", () => {
  const r = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_JSON_MESSAGE_LIMIT_KB: "64" });
  assert.ok(r.ok);
  assert.equal(r.config.jsonMessageLimitBytes, 64 * 1024);
  const [refusal] = refusals({ DORMICE_API_TOKEN: token, DORMICE_JSON_MESSAGE_LIMIT_KB: "0" });
  assert.match(refusal, /DORMICE_JSON_MESSAGE_LIMIT_KB='0' is not a whole number from 1 to 262144/);
});

Deno.test("loadNodeConfig() leaves the executor default to its caller", () => {
  const r = loadNodeConfig({ DORMICE_API_TOKEN: token }, { defaultExecutor: "fake" });
  assert.ok(r.ok);
  assert.equal(r.config.executor, "fake");
  const explicit = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_EXECUTOR: "fake" });
  assert.ok(explicit.ok);
  assert.equal(explicit.config.executor, "fake");
});

Deno.test("loadNodeConfig() refuses a short token without printing it", () => {
  const [sentence] = refusals({ DORMICE_API_TOKEN: "s3cret-short" });
  assert.match(sentence, /DORMICE_API_TOKEN is 12 characters long/);
  assert.ok(!sentence.includes("s3cret-short"));
  assert.match(refusals({})[0], /DORMICE_API_TOKEN is not set/);
});

Deno.test("loadNodeConfig() names the variable, the value and the fix", () => {
  const all = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_PORT: "99999",
    DORMICE_EXECUTOR: "podman",
    DORMICE_GATEWAY_ENDPOINT: "http://127.0.0.1:3677/api?x=1",
    DORMICE_NODE_ID: "bad id!",
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "1.5",
    DORMICE_LOG_LEVEL: "loud",
  });
  assert.equal(all.length, 6);
  assert.match(all[0], /DORMICE_PORT='99999'.*from 1 to 65535/);
  assert.match(all[1], /DORMICE_EXECUTOR='podman'.*docker.*fake/);
  assert.match(
    all[2],
    /DORMICE_GATEWAY_ENDPOINT: 'http:\/\/127.0.0.1:3677\/api\?x=1' has a query or fragment/,
  );
  assert.match(all[3], /DORMICE_NODE_ID='bad id!'/);
  assert.match(all[4], /DORMICE_CHECK_IN_INTERVAL_SECONDS='1.5'/);
  assert.match(all[5], /DORMICE_LOG_LEVEL='loud'/);
});

Deno.test("loadNodeConfig() refuses a check-in interval the gateway would refuse", () => {
  const [sentence] = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "301",
  });
  assert.match(
    sentence,
    /DORMICE_CHECK_IN_INTERVAL_SECONDS='301' is not a whole number from 1 to 300/,
  );
});

Deno.test("loadNodeConfig() refuses a remote gateway without an endpoint and an id", () => {
  const all = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "http://10.0.0.1:3677",
  });
  assert.equal(all.length, 2);
  assert.match(all[0], /DORMICE_NODE_ENDPOINT is not set/);
  assert.match(all[1], /DORMICE_NODE_ID is not set/);
  const ok = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "http://10.0.0.1:3677/",
    DORMICE_NODE_ENDPOINT: "http://10.0.0.5:3676",
    DORMICE_NODE_ID: "node-a",
  });
  assert.ok(ok.ok);
  assert.equal(ok.config.gatewayEndpoint, "http://10.0.0.1:3677");
});

Deno.test("loadNodeConfig() takes a gateway mounted under a path and one more check-in header", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "https://host.example/fleet/, http://127.0.0.1:3677",
    DORMICE_GATEWAY_CHECK_IN_HEADER: "X-Host-Auth: s3cret: with colon",
    DORMICE_NODE_ENDPOINT: "http://10.0.0.5:3676",
    DORMICE_NODE_ID: "node-a",
  });
  assert.ok(r.ok, r.ok ? "" : r.refusals.join("\n"));
  assert.equal(r.config.gatewayEndpoint, "https://host.example/fleet");
  assert.deepEqual(r.config.gatewayEndpoints, [
    "https://host.example/fleet",
    "http://127.0.0.1:3677",
  ]);
  assert.deepEqual(r.config.gatewayCheckInHeader, {
    name: "x-host-auth",
    value: "s3cret: with colon",
  });
  for (
    const [text, why] of [
      ["s3cret-only", /write it as name: value/],
      ["authorization: Bearer s3cret", /authorization is a header the check-in sets itself/],
      ["x-host-auth:", /the value of x-host-auth is empty/],
    ] as const
  ) {
    const all = refusals({ DORMICE_API_TOKEN: token, DORMICE_GATEWAY_CHECK_IN_HEADER: text });
    assert.equal(all.length, 1, all.join("\n"));
    assert.match(all[0], /^DORMICE_GATEWAY_CHECK_IN_HEADER: /);
    assert.match(all[0], why);
    assert.ok(!all[0].includes("s3cret"), "the value is never repeated");
  }
});

Deno.test("loadNodeConfig() accepts a loopback gateway with the defaults", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "http://localhost:3677",
    DORMICE_HOST: "::1",
    DORMICE_PORT: "4000",
  });
  assert.ok(r.ok);
  assert.equal(r.config.nodeEndpoint, "http://[::1]:4000");
});

Deno.test("loadNodeConfig() reads the Docker settings and node-wide sandbox limits", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_TEMPLATES: "base=dormice-base:latest,python=py:3",
    DOCKER_HOST: "unix:///run/user/1000/docker.sock",
    DORMICE_SANDBOX_CPUS: "0.5",
    DORMICE_SANDBOX_MEMORY_MB: "256",
    DORMICE_SANDBOX_PIDS: "100",
    DORMICE_SANDBOX_DISK_MB: "2048",
  });
  assert.ok(r.ok);
  assert.equal(r.config.templates, "base=dormice-base:latest,python=py:3");
  assert.equal(r.config.dockerSocket, "/run/user/1000/docker.sock");
  assert.deepEqual(r.config.sandboxDefaults, {
    cpus: 0.5,
    memoryMB: 256,
    pids: 100,
    diskMB: 2048,
  });
  const explicit = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_DOCKER_SOCKET: "/tmp/d.sock",
    DOCKER_HOST: "tcp://10.0.0.1:2375",
  });
  assert.ok(explicit.ok);
  assert.equal(explicit.config.dockerSocket, "/tmp/d.sock");
  // A TCP engine matters only to the Docker executor.
  assert.ok(
    loadNodeConfig({
      DORMICE_API_TOKEN: token,
      DORMICE_EXECUTOR: "fake",
      DOCKER_HOST: "tcp://10.0.0.1:2375",
    }).ok,
  );
});

Deno.test("loadNodeConfig() refuses bad Docker settings naming variable, value and fix", () => {
  const all = refusals({
    DORMICE_API_TOKEN: token,
    DOCKER_HOST: "tcp://10.0.0.1:2375",
    DORMICE_SANDBOX_CPUS: "two",
    DORMICE_SANDBOX_MEMORY_MB: "1",
    DORMICE_SANDBOX_PIDS: "0",
    DORMICE_SANDBOX_DISK_MB: "8",
  });
  assert.equal(all.length, 5);
  assert.match(all[0], /DOCKER_HOST='tcp:\/\/10.0.0.1:2375'.*DORMICE_DOCKER_SOCKET=/);
  assert.match(all[1], /DORMICE_SANDBOX_CPUS='two'.*such as 1/);
  assert.match(all[2], /DORMICE_SANDBOX_MEMORY_MB='1'.*from 6 to/);
  assert.match(all[3], /DORMICE_SANDBOX_PIDS='0'.*from 1 to/);
  assert.match(all[4], /DORMICE_SANDBOX_DISK_MB='8'.*from 16 to/);
  assert.match(
    refusals({ DORMICE_API_TOKEN: token, DORMICE_DOCKER_SOCKET: "docker.sock" })[0],
    /DORMICE_DOCKER_SOCKET='docker.sock' is not an absolute path.*\/var\/run\/docker.sock/,
  );
});

Deno.test("loadNodeConfig() reads several gateways, comma-separated, and checks each one", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "http://127.0.0.1:3677, http://127.0.0.1:3678/",
  });
  assert.ok(r.ok);
  assert.deepEqual(r.config.gatewayEndpoints, ["http://127.0.0.1:3677", "http://127.0.0.1:3678"]);
  assert.equal(r.config.gatewayEndpoint, "http://127.0.0.1:3677");
  const bad = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "http://127.0.0.1:3677,ftp://x",
  });
  assert.ok(bad.some((s) => s.startsWith("DORMICE_GATEWAY_ENDPOINT:")), bad.join("\n"));
  // One gateway on another machine is enough to need the node's own endpoint and id.
  const remote = refusals({
    DORMICE_API_TOKEN: token,
    DORMICE_GATEWAY_ENDPOINT: "http://127.0.0.1:3677,http://10.0.0.2:3677",
  });
  assert.ok(
    remote.some((s) => s.startsWith("DORMICE_NODE_ENDPOINT is not set")),
    remote.join("\n"),
  );
});

Deno.test("DORMICE_WEBSOCKETS: the port door takes upgrades unless off; anything else is refused", () => {
  const unset = loadNodeConfig({ DORMICE_API_TOKEN: token });
  assert.ok(unset.ok);
  assert.equal(unset.config.websockets, true, "on by default: the gateway relays through it");
  const auto = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_WEBSOCKETS: "auto" });
  assert.ok(auto.ok);
  assert.equal(auto.config.websockets, true);
  const off = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_WEBSOCKETS: "Off" });
  assert.ok(off.ok);
  assert.equal(off.config.websockets, false);
  const on = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_WEBSOCKETS: "ON" });
  assert.ok(on.ok);
  assert.equal(on.config.websockets, true);
  assert.match(
    refusals({ DORMICE_API_TOKEN: token, DORMICE_WEBSOCKETS: "1" }).join("\n"),
    /DORMICE_WEBSOCKETS='1' is not a switch: .*unset for the default \(on here\)/,
  );
});

Deno.test("loadNodeConfig() turns the host firewall off only when DORMICE_SANDBOX_HOST_FIREWALL=off", () => {
  const config = (value: string | undefined) => {
    const r = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_SANDBOX_HOST_FIREWALL: value });
    assert.ok(r.ok, JSON.stringify(r));
    return r.config.sandboxHostFirewall;
  };
  assert.equal(config(undefined), true);
  assert.equal(config("on"), true);
  assert.equal(config("off"), false);
  // Anything else is a refusal, never a silent "off": a typo must not open the host.
  const [refusal] = refusals({ DORMICE_API_TOKEN: token, DORMICE_SANDBOX_HOST_FIREWALL: "no" });
  assert.match(refusal, /^DORMICE_SANDBOX_HOST_FIREWALL='no' is not a switch: write on .* or off/);
});

Deno.test("loadNodeConfig() refuses a relative DORMICE_VOLUME_ROOT and a volume cap out of range", () => {
  const r = loadNodeConfig({
    DORMICE_API_TOKEN: "t".repeat(32),
    DORMICE_VOLUME_ROOT: "shared/volumes",
    DORMICE_VOLUME_SIZE_GB: "0",
  });
  assert.equal(r.ok, false);
  if (r.ok) return;
  assert.ok(
    r.refusals.some((s) => /DORMICE_VOLUME_ROOT='shared\/volumes' is not an absolute path/.test(s)),
  );
  assert.ok(r.refusals.some((s) => /DORMICE_VOLUME_SIZE_GB='0'/.test(s)));
  const ok = loadNodeConfig({
    DORMICE_API_TOKEN: "t".repeat(32),
    DORMICE_VOLUME_ROOT: "/mnt/volumes",
    DORMICE_VOLUME_SIZE_GB: "2",
  });
  assert.ok(ok.ok);
  if (!ok.ok) return;
  assert.equal(ok.config.volumeRoot, "/mnt/volumes");
  assert.equal(ok.config.volumeSizeBytes, 2e9);
});

Deno.test("loadNodeConfig() reads DORMICE_SNAPSHOT_REGISTRY as host:port and refuses anything else", () => {
  const ok = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_SNAPSHOT_REGISTRY: "127.0.0.1:5000",
  });
  assert.ok(ok.ok);
  assert.equal(ok.config.snapshotRegistry, "127.0.0.1:5000");
  const [bad] = refusals({ DORMICE_API_TOKEN: token, DORMICE_SNAPSHOT_REGISTRY: "http://r:5000/" });
  assert.match(bad, /DORMICE_SNAPSHOT_REGISTRY must be host:port .* received 'http:\/\/r:5000\/'/);
});

Deno.test("loadNodeConfig() reads DORMICE_SNAPSHOT_HEAL and refuses heals with no TTL and no registry", () => {
  const off = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_SNAPSHOT_HEAL: "off" });
  assert.ok(off.ok);
  assert.equal(off.config.snapshotHeal, false);
  assert.equal(off.config.snapshotTtlMs, 720 * 3_600_000);
  // No TTL: refused with heals on (the default, or written), whatever else is right.
  for (const heal of [undefined, "on"]) {
    const [noTtl, ...rest] = refusals({
      DORMICE_API_TOKEN: token,
      DORMICE_SNAPSHOT_TTL_HOURS: "0",
      DORMICE_SNAPSHOT_HEAL: heal,
    });
    assert.deepEqual(rest, []);
    assert.match(noTtl, /^DORMICE_SNAPSHOT_TTL_HOURS=0 .*DORMICE_SNAPSHOT_HEAL=on/);
    assert.match(noTtl, /DORMICE_SNAPSHOT_TTL_HOURS to 1–87600 \(the default is 720, 30 days\)/);
    assert.match(noTtl, /write DORMICE_SNAPSHOT_HEAL=off$/);
  }
  // No TTL is fine with heals off, or with a registry (a registry pull replaces the heal).
  const offNoTtl = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_SNAPSHOT_TTL_HOURS: "0",
    DORMICE_SNAPSHOT_HEAL: "off",
  });
  assert.ok(offNoTtl.ok);
  assert.equal(offNoTtl.config.snapshotTtlMs, 0);
  const registryNoTtl = loadNodeConfig({
    DORMICE_API_TOKEN: token,
    DORMICE_SNAPSHOT_TTL_HOURS: "0",
    DORMICE_SNAPSHOT_REGISTRY: "127.0.0.1:5000",
  });
  assert.ok(registryNoTtl.ok);
  assert.equal(registryNoTtl.config.snapshotHeal, true);
  assert.deepEqual(refusals({ DORMICE_API_TOKEN: token, DORMICE_SNAPSHOT_HEAL: "no" }), [
    "DORMICE_SNAPSHOT_HEAL must be 'on' or 'off': received 'no'",
  ]);
});

Deno.test("loadNodeConfig() reads DORMICE_EGRESS_E2B_DEFAULT as off unless switched on, and refuses anything else", () => {
  const config = (value: string | undefined) => {
    const r = loadNodeConfig({ DORMICE_API_TOKEN: token, DORMICE_EGRESS_E2B_DEFAULT: value });
    assert.ok(r.ok, JSON.stringify(r));
    return r.config.e2bDefaultEgress;
  };
  assert.equal(config(undefined), false);
  assert.equal(config(""), false);
  assert.equal(config("off"), false);
  assert.equal(config("on"), true);
  assert.equal(config(" on "), true);
  // A typo is a refusal, never a guess: which sandboxes reach the internet is the operator's word.
  for (const value of ["true", "yes", "ON", "1"]) {
    const [refusal] = refusals({ DORMICE_API_TOKEN: token, DORMICE_EGRESS_E2B_DEFAULT: value });
    assert.match(
      refusal,
      new RegExp(`^DORMICE_EGRESS_E2B_DEFAULT='${value}' is not a switch: write off .* or on `),
    );
    assert.match(refusal, /allowInternetAccess/);
  }
});
