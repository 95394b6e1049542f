/**
 * The systemd units in deploy/ against the code and the README. systemd does not run in the test
 * sandbox, so the gateway's unit is exercised as far as it can be without it: its own `deno run`
 * flags and its TLS drop-in's variables, with the unit's absolute directories moved into a temp
 * dir, must boot an HTTPS gateway; the node's unit likewise must boot a Docker node that manages
 * its host firewall (where an engine answers: with `CI=true` always); `systemd-analyze verify`
 * checks the syntax where installed.
 */
import assert from "node:assert/strict";
import { makeCertificates } from "../shared/_tls_fixtures_test.ts";
import { dockerGate, hostRules, networkOf, removeContainersOf } from "./_docker.ts";
import { gatewayMain, postJson } from "./_gateway.ts";
import { freePort, newToken, nodeMain, repoRoot, spawnDeno, waitForHealth } from "./_processes.ts";

const unitPath = `${repoRoot}/deploy/dormice-gateway.service`;
const dropInPath = `${repoRoot}/deploy/dormice-gateway.service.d/tls.conf`;
/** Where systemd puts a system unit's credentials (`$CREDENTIALS_DIRECTORY`, `%d`). */
const credentialsDir = "/run/credentials/dormice-gateway.service";

/**
 * Every `Key=value` of a unit file, in order (comments and sections dropped; a line ending in a
 * backslash continues on the next, joined with a space, as systemd reads it).
 */
function settings(text: string): [string, string][] {
  return text.replace(/\\\n\s*/g, " ").split("\n")
    .filter((line) => /^[A-Za-z]+=/.test(line))
    .map((line) => [line.slice(0, line.indexOf("=")), line.slice(line.indexOf("=") + 1)]);
}

function values(text: string, key: string): string[] {
  return settings(text).filter(([k]) => k === key).map(([, v]) => v);
}

/** `Environment=NAME=value` lines as a record. */
function environment(text: string): Record<string, string> {
  return Object.fromEntries(
    values(text, "Environment").map((v) => {
      const i = v.indexOf("=");
      return [v.slice(0, i), v.slice(i + 1)];
    }),
  );
}

Deno.test("deploy/dormice-gateway.service: the TLS drop-in's files are credentials the unit's deno may read", async () => {
  const unit = await Deno.readTextFile(unitPath);
  const dropIn = await Deno.readTextFile(dropInPath);
  const readme = await Deno.readTextFile(`${repoRoot}/README.md`);

  // A DynamicUser cannot read a root-only key in /etc/dormice: the files must come as credentials.
  assert.deepEqual(values(unit, "DynamicUser"), ["yes"]);
  const credentials = Object.fromEntries(values(dropIn, "LoadCredential").map((v) => v.split(":")));
  assert.deepEqual(credentials, {
    "tls-cert.pem": "/etc/dormice/cert.pem",
    "tls-key.pem": "/etc/dormice/key.pem",
  });
  // README: "the gateway on 443", which a DynamicUser binds only with this capability.
  assert.deepEqual(values(dropIn, "AmbientCapabilities"), ["CAP_NET_BIND_SERVICE"]);
  const env = environment(dropIn);
  assert.equal(env.DORMICE_GATEWAY_TLS_CERT, `${credentialsDir}/tls-cert.pem`);
  assert.equal(env.DORMICE_GATEWAY_TLS_KEY, `${credentialsDir}/tls-key.pem`);

  const [execStart] = values(unit, "ExecStart");
  const allowRead = execStart.match(/--allow-read=(\S+)/)?.[1].split(",") ?? [];
  assert.ok(allowRead.includes(credentialsDir), `--allow-read lacks ${credentialsDir}`);

  // The README's TLS section names the same files and the drop-in that hands them over.
  for (const source of Object.values(credentials)) assert.ok(readme.includes(source), source);
  assert.ok(readme.includes("deploy/dormice-gateway.service.d/tls.conf"));
  assert.ok(readme.includes(credentialsDir));
});

Deno.test("deploy/dormice-gateway.service: its deno flags and the TLS drop-in boot an HTTPS gateway", async () => {
  const unit = await Deno.readTextFile(unitPath);
  const dropIn = await Deno.readTextFile(dropInPath);
  const root = await Deno.makeTempDir({ prefix: "dormice-unit-" });
  const certs = await makeCertificates(["gateway.test"]);
  const client = Deno.createHttpClient({ caCerts: [certs.ca] });
  // The unit's absolute directories, moved under `root`; the code is this checkout.
  const moved = (s: string) =>
    s.replaceAll(credentialsDir, `${root}/credentials`)
      .replaceAll("/var/lib/dormice-gateway", `${root}/state`)
      .replaceAll("/opt/dormice-cluster", repoRoot);
  let gateway: ReturnType<typeof spawnDeno> | undefined;
  try {
    await Deno.mkdir(`${root}/credentials`);
    await Deno.mkdir(`${root}/state`);
    // What LoadCredential does at start: each source copied under its id.
    for (const v of values(dropIn, "LoadCredential")) {
      const [id] = v.split(":");
      const pem = id === "tls-key.pem" ? certs.key : certs.cert;
      await Deno.writeTextFile(`${root}/credentials/${id}`, pem, { mode: 0o400 });
    }
    const [execStart] = values(unit, "ExecStart");
    const words = execStart.split(/\s+/);
    assert.equal(words.at(-1), "gateway/main.ts");
    const flags = words.slice(words.indexOf("run") + 1, -1).map(moved);
    const port = freePort();
    const env: Record<string, string> = { DORMICE_API_TOKEN: newToken() };
    for (const [k, v] of Object.entries({ ...environment(unit), ...environment(dropIn) })) {
      env[k] = moved(v);
    }
    gateway = spawnDeno(gatewayMain, {
      env: { ...env, DORMICE_GATEWAY_HOST: "127.0.0.1", DORMICE_GATEWAY_PORT: String(port) },
      permissions: flags,
    });
    let exited = false;
    gateway.exited.then(() => exited = true);
    const deadline = Date.now() + 20_000;
    let health: Response | undefined;
    while (health === undefined) {
      assert.ok(Date.now() < deadline, `no HTTPS answer in 20 s: ${gateway.stderr()}`);
      assert.ok(!exited, `the gateway exited: ${gateway.stderr()}`);
      health = await fetch(`https://127.0.0.1:${port}/healthz`, {
        client,
        signal: AbortSignal.timeout(2000),
      }).catch(() => undefined);
      if (health === undefined) await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(health.status, 200, gateway.stderr());
    await health.body?.cancel();
  } finally {
    await gateway?.stop();
    client.close();
    await Deno.remove(root, { recursive: true });
    await Deno.remove(certs.dir, { recursive: true });
  }
});

const docker = await dockerGate("deploy/dormice-node.service boot test");

Deno.test({
  name: "deploy/dormice-node.service: its deno flags boot a Docker node that guards the host",
  ignore: docker.skip,
  // The node process and dockerode's pooled unix sockets (in the cleanup) outlive the test body.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (docker.failure) throw new Error(docker.failure);
  const unit = await Deno.readTextFile(`${repoRoot}/deploy/dormice-node.service`);
  const root = await Deno.makeTempDir({ prefix: "dormice-node-unit-" });
  const moved = (s: string) =>
    s.replaceAll("/var/lib/dormice-node", root).replaceAll("/opt/dormice-cluster", repoRoot);
  const nodeId = `unit-${crypto.randomUUID().slice(0, 8)}`;
  let node: ReturnType<typeof spawnDeno> | undefined;
  try {
    const [execStart] = values(unit, "ExecStart");
    const words = execStart.split(/\s+/);
    assert.equal(words.at(-1), "node/main.ts");
    const port = freePort();
    const token = newToken();
    const env: Record<string, string> = {};
    for (const [k, v] of Object.entries(environment(unit))) env[k] = moved(v);
    node = spawnDeno(nodeMain, {
      env: {
        ...env,
        // What /etc/dormice/node.env would hold; loopback rather than the unit's 0.0.0.0.
        DORMICE_API_TOKEN: token,
        DORMICE_NODE_ID: nodeId,
        DORMICE_HOST: "127.0.0.1",
        DORMICE_PORT: String(port),
      },
      permissions: words.slice(words.indexOf("run") + 1, -1).map(moved),
    });
    const url = `http://127.0.0.1:${port}`;
    await waitForHealth(url, node, 30_000);
    // The first sandbox makes the network and its host rule, with the unit's permissions only.
    const made = await postJson(url, token, "acquireSandbox", { name: "u", template: "minimal" });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    const network = await networkOf(nodeId, "internal");
    assert.equal(await hostRules(network), 1);
    const gone = await postJson(url, token, "destroySandbox", { name: "u" });
    assert.equal(gone.status, 200, JSON.stringify(gone.body));
    await node.stop();
    assert.equal(await hostRules(network), 0, `the rule left with the network: ${node.stderr()}`);
  } finally {
    await node?.stop();
    await removeContainersOf([nodeId]);
    await Deno.remove(root, { recursive: true });
  }
});

Deno.test("deploy/: systemd-analyze verify finds nothing wrong with the units and the drop-in", async (t) => {
  const found = await new Deno.Command("systemd-analyze", { args: ["--version"], stdout: "null" })
    .output().then((o) => o.success, () => false);
  if (!found) {
    console.log("skipped: systemd-analyze is not installed");
    return;
  }
  const dir = await Deno.makeTempDir({ prefix: "dormice-units-" });
  try {
    await Deno.mkdir(`${dir}/dormice-gateway.service.d`);
    await Deno.copyFile(dropInPath, `${dir}/dormice-gateway.service.d/tls.conf`);
    // The node's unit requires docker.service, which a machine without Docker does not have, and
    // verify fails a unit whose requirement it cannot load. A stand-in beside the units (verify
    // looks there first) makes the check this unit's alone, with or without Docker installed.
    await Deno.writeTextFile(
      `${dir}/docker.service`,
      "[Unit]\nDescription=Stand-in for the Docker engine's unit\n\n[Service]\nExecStart=/bin/true\n",
    );
    for (const name of ["dormice-gateway.service", "dormice-node.service"]) {
      await t.step(name, async () => {
        // The deno the units name need not be installed here: this one stands in for it.
        const text = await Deno.readTextFile(`${repoRoot}/deploy/${name}`);
        await Deno.writeTextFile(
          `${dir}/${name}`,
          text.replaceAll("/usr/local/bin/deno", Deno.execPath()),
        );
        const out = await new Deno.Command("systemd-analyze", {
          args: ["verify", `${dir}/${name}`],
          stdout: "piped",
          stderr: "piped",
          signal: AbortSignal.timeout(30_000),
        }).output();
        const said = new TextDecoder().decode(out.stderr).trim();
        // A unit naming another it cannot find here (etcd's) is not this unit's fault.
        const own = said.split("\n").filter((l) => l !== "" && !/etcd/.test(l));
        assert.ok(out.success, said);
        assert.deepEqual(own, [], said);
      });
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
