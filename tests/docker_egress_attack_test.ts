/**
 * A hostile tenant against the egress proxy on Docker, through a gateway with the official SDK:
 * what a sandbox with domain rules (so steered through the proxy, which connects from the host)
 * could reach that its own packets could not.
 *
 * Checked: a neighbour sandbox's web server, reached direct, is refused by the engine's
 * isolation (the precondition), and named as the Host of a steered request, by address, is
 * refused by the proxy too (it connects from the host, where that isolation does not apply);
 * a node restarted over a sandbox with domain rules enforces them again once it is back (the
 * steering in the kernel points at the new proxy), and the neighbour stays out of reach; the
 * sandbox has no IPv6 address, link-local included, to go around the IPv4 rules with.
 *
 * Needs root, iptables, an engine and the base image (its curl and python3): with `CI=true` a
 * missing one fails the suite; off CI it skips with a printed reason. Names start with `ega`.
 */
import assert from "node:assert/strict";
import { CommandExitError, Sandbox, type SandboxOpts } from "e2b";
import { startGateway } from "./_gateway.ts";
import { netnsReadiness } from "./support/netns.ts";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const docker = await dockerGate("docker egress attack test");
const why = docker.skip ? null : await netnsReadiness(false);
const onCi = Deno.env.get("CI") === "true";
if (why !== null && !onCi) console.log(`docker egress attack test skipped: ${why}`);

Deno.test({
  name: "docker egress attack: the proxy reaches no neighbour sandbox, and rules hold across a " +
    "node restart",
  ignore: docker.skip || (why !== null && !onCi),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (docker.failure) throw new Error(docker.failure);
  if (why !== null) {
    throw new Error(`CI=true, so the docker egress attack test must run, but ${why}`);
  }
  const nodeId = `ega-${crypto.randomUUID().slice(0, 6)}`;
  const dir = await Deno.makeTempDir({ prefix: "ega-" });
  const nonce = `ega-${crypto.randomUUID()}`;
  let node: DockerNodeProcess | undefined;
  let gw: Awaited<ReturnType<typeof startGateway>> | undefined;
  const sandboxes: Sandbox[] = [];
  try {
    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    const dataDir = `${dir}/node`;
    await Deno.mkdir(dataDir);
    const boot = async () => {
      node = await startDockerNode({ token: gw!.token, gatewayUrl: gw!.url, nodeId, dataDir });
      await until("the docker node to be up at the gateway, enforcing rules", async () => {
        const { body } = await gw!.json("listNodes");
        return body.nodes.some((n: { id: string; state: string; egressRules: boolean }) =>
          n.id === nodeId && n.state === "up" && n.egressRules === true
        );
      }, 30_000);
    };
    await boot();
    const opts = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey: gw.token,
      timeoutMs: 120_000,
    };
    const create = async (options: Partial<SandboxOpts>) => {
      const sandbox = await Sandbox.create({ ...opts, ...options });
      sandboxes.push(sandbox);
      return sandbox;
    };
    /** What `sandbox`'s curl gets for `url` (with `extra` arguments), or `refused: <code>`. */
    const curl = async (sandbox: Sandbox, extra: string, url: string): Promise<string> => {
      try {
        const r = await sandbox.commands.run(`curl -sS --max-time 5 ${extra} ${url}`, {
          timeoutMs: 20_000,
        });
        return r.stdout.trim();
      } catch (error) {
        if (error instanceof CommandExitError) return `refused: ${error.exitCode}`;
        throw error;
      }
    };

    // The neighbour: another tenant's web server on port 80, answering with the nonce.
    const victim = await create({ allowInternetAccess: true });
    await victim.files.write("/tmp/www/index.html", `${nonce}\n`);
    await victim.commands.run("cd /tmp/www && exec python3 -m http.server 80", {
      background: true,
      user: "root",
    });
    const victimIp = (await victim.commands.run("hostname -i")).stdout.trim().split(/\s+/)[0];
    assert.match(victimIp, /^\d+\.\d+\.\d+\.\d+$/);
    await until(
      "the neighbour's server to answer inside it",
      async () => (await curl(victim, "", "http://127.0.0.1/")) === nonce,
      20_000,
    );

    // A tenant with one domain rule: steered through the proxy, every address otherwise open.
    const attacker = await create({ network: { denyOut: ["other.test"] } });

    await t.step("precondition: the neighbour's server, reached direct, is refused", async () => {
      const open = await create({ allowInternetAccess: true });
      assert.notEqual(await curl(open, "", `http://${victimIp}:80/`), nonce);
    });

    await t.step(
      "the neighbour as the Host of a steered request is refused by the proxy",
      async () => {
        const got = await curl(attacker, "", `http://${victimIp}/`);
        assert.match(got, /^dormice egress: .*an address of this host or its sandboxes/, got);
        const forged = await curl(attacker, `-H 'Host: ${victimIp}'`, "http://192.0.2.77/");
        assert.match(forged, /^dormice egress: .*an address of this host or its sandboxes/);
      },
    );

    await t.step("no IPv6 at all: the rules judge IPv4, and nothing goes around them", async () => {
      // Not even a link-local address to reach a neighbour by (the engine's ICC rules are IPv4).
      const r = await attacker.commands.run("cat /proc/net/if_inet6; echo end");
      assert.equal(
        r.stdout.split("\n").filter((l) => /\beth\d+$/.test(l.trim())).length,
        0,
        r.stdout,
      );
      assert.match(r.stdout, /end/);
    });

    await t.step("a node restarted over the sandbox enforces its domain rules again", async () => {
      const denied = () =>
        curl(attacker, "--resolve other.test:80:192.0.2.77", "http://other.test/");
      assert.match(await denied(), /^dormice egress: .*deny other\.test/);
      await node!.stop();
      await boot();
      // Served again by the new proxy (before, steered to a port nothing listens on: refused),
      // once the gateway routes to the node's new address (until then a call fails).
      await until("the attacker's domain rule to be judged again", async () => {
        const got = await denied().catch(() => "");
        return /^dormice egress: .*deny other\.test/.test(got);
      }, 60_000);
      const got = await curl(attacker, "", `http://${victimIp}/`);
      assert.match(got, /^dormice egress: .*an address of this host or its sandboxes/, got);
    });
  } finally {
    for (const sandbox of sandboxes) await sandbox.kill().catch(() => {});
    await node?.stop();
    await gw?.stop();
    await removeContainersOf([nodeId]);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
