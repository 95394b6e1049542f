/**
 * Sandbox isolation on Docker, spoken to only over HTTP: no sandbox reaches another (with egress
 * or without, same team or another, same node or another) and no sandbox of a node reaches the
 * host (its network's gateway address, or any other address of the machine), while the node
 * still reaches every sandbox's ports through its ports door. A second node run with
 * `DORMICE_SANDBOX_HOST_FIREWALL=off` is the control: its sandboxes do reach the host listener,
 * so a "blocked" elsewhere is the rule's doing and not a probe that cannot connect at all. Then
 * the host rules themselves: one per network, kept across a restart, gone with their network;
 * and a node that cannot manage them refuses to boot, naming the fix.
 *
 * Every probe is a `nc` from one of the test's own containers to another of them, or to a host
 * listener (the guarded node, bound to 0.0.0.0 as `DORMICE_HOST=0.0.0.0` does); nothing leaves
 * the machine. The guarded node runs with `deno task node`'s own flags, so they are proved to
 * suffice.
 *
 * Needs an engine, the images, root and iptables (`.ci/docker.sh`, `.ci/run`): with `CI=true` a
 * missing one fails the suite; off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import {
  dockerGate,
  dockerNodePermissions,
  type DockerNodeProcess,
  hostRules,
  networkOf,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";
import { type GatewayProcess, postJson, startGateway } from "./_gateway.ts";
import { freePort, type NodeProcess, repoRoot, startNode } from "./_processes.ts";

const gate = await dockerGate("docker isolation suite");

/** deno.json's `node` task flags, so the guarded node runs as `deno task node` would. */
function nodeTaskPermissions(): string[] {
  const config = JSON.parse(Deno.readTextFileSync(`${repoRoot}/deno.json`));
  return (config.tasks.node as string).split(/\s+/)
    .filter((w) => w.startsWith("--allow-") || w === "--ignore-env");
}

/** Whether the engine has a network by this name. */
async function networkExists(name: string): Promise<boolean> {
  try {
    await new Docker({ socketPath: DEFAULT_DOCKER_SOCKET }).getNetwork(name).inspect();
    return true;
  } catch (error) {
    if ((error as { statusCode?: number }).statusCode === 404) return false;
    throw error;
  }
}

/** The first address of a network (its gateway, the host's address on the bridge). */
function gatewayOf(cidr: string): string {
  const [ip, bits] = cidr.split("/");
  const n = ip.split(".").reduce((a, b) => a * 256 + Number(b), 0);
  const size = 2 ** (32 - Number(bits));
  const first = Math.floor(n / size) * size + 1;
  return [24, 16, 8, 0].map((s) => Math.floor(first / 2 ** s) % 256).join(".");
}

/** A sandbox under test: who it belongs to, how to drive it, and what it serves on port 8000. */
interface Box {
  label: string;
  node: NodeProcess;
  /** Drives a native verb for this sandbox's owner (a team key at the gateway, or the node). */
  // deno-lint-ignore no-explicit-any
  verb: (name: string, body: Record<string, unknown>) => Promise<any>;
  name: string;
  id: string;
  nonce: string;
  /** Its address on its network, with the prefix length. */
  cidr: string;
}

/**
 * One command that tries every target at once, each bounded to 3 s by `nc -w` (4 s by
 * `timeout`), and prints `label|response on one line`. busybox's nc, as its wget crashes here.
 */
function probes(targets: { label: string; host: string; port: number; path: string }[]): string {
  return targets.map(({ label, host, port, path }) =>
    `( r=$( (printf 'GET ${path} HTTP/1.0\\r\\n\\r\\n'; sleep 2) | timeout 4 nc -w 3 ${host} ${port} 2>&1); ` +
    `echo "${label}|$?|$(printf %s "$r" | tr -d '\\r' | tr '\\n' ' ')" ) &`
  ).join("\n") + "\nwait";
}

/** Runs `probes` in `box`; label → what came back. */
async function probeFrom(
  box: Box,
  targets: { label: string; host: string; port: number; path: string }[],
): Promise<Map<string, string>> {
  const r = await box.verb("execCommand", {
    name: box.name,
    command: probes(targets),
    timeoutSeconds: 30,
  });
  return new Map(
    r.stdout.trim().split("\n").filter(Boolean).map((line: string) => {
      const bar = line.indexOf("|");
      return [line.slice(0, bar), line.slice(bar + 1)];
    }),
  );
}

Deno.test({
  name:
    "docker isolation: sandboxes reach neither each other nor the host; the node reaches their ports",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const tag = crypto.randomUUID().slice(0, 6);
  const guardedId = `dkiso-${tag}`;
  const openId = `dkiso-${tag}-off`;
  const dataDir = `.dormice/isolation-test-${tag}`;
  const port = freePort();
  let gw: GatewayProcess | undefined;
  let guarded: NodeProcess | undefined;
  let open: DockerNodeProcess | undefined;
  try {
    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    const g = gw;
    const startGuarded = () =>
      startNode({
        token: g.token,
        dataDir,
        port,
        permissions: nodeTaskPermissions,
        healthTimeoutMs: 30_000,
        env: {
          DORMICE_EXECUTOR: "docker",
          DORMICE_NODE_ID: guardedId,
          // Every address of the machine: the host listener the sandboxes must not reach.
          DORMICE_HOST: "0.0.0.0",
          DORMICE_NODE_ENDPOINT: `http://127.0.0.1:${port}`,
          DORMICE_GATEWAY_ENDPOINT: g.url,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
        },
      });
    guarded = await startGuarded();
    open = await startDockerNode({
      nodeId: openId,
      env: { DORMICE_SANDBOX_HOST_FIREWALL: "off" },
    });
    const openNode = open;
    const until = async (check: () => Promise<boolean>) => {
      for (let i = 0; i < 100 && !(await check()); i++) {
        await new Promise((r) => setTimeout(r, 100));
      }
    };
    await until(async () =>
      (await g.json("listNodes")).body.nodes.some((n: { id: string; state: string }) =>
        n.id === guardedId && n.state === "up"
      )
    );

    const keys: Record<string, string> = {};
    for (const team of ["team-a", "team-b"]) {
      const r = await g.json("createApiKey", { team });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      keys[team] = r.body.key;
    }
    const viaGateway = (team: string) => async (name: string, body: Record<string, unknown>) => {
      const r = await postJson(g.url, keys[team], name, body);
      assert.equal(r.status, 200, `${name}: ${JSON.stringify(r.body)}`);
      return r.body;
    };
    const viaOpenNode = async (name: string, body: Record<string, unknown>) => {
      const r = await postJson(openNode.url, openNode.token, name, body);
      assert.equal(r.status, 200, `${name}: ${JSON.stringify(r.body)}`);
      return r.body;
    };

    // Each sandbox serves a nonce on port 8000 and reports its address.
    const make = async (
      label: string,
      node: NodeProcess,
      verb: Box["verb"],
      egress: boolean,
    ): Promise<Box> => {
      const name = `iso-${label}`;
      const created = await verb("acquireSandbox", {
        name,
        template: "minimal",
        spec: { network: egress },
      });
      const nonce = `${label}-${crypto.randomUUID()}`;
      const r = await verb("execCommand", {
        name,
        command: `mkdir -p /tmp/www && echo ${nonce} > /tmp/www/index.html && ` +
          "httpd -p 8000 -h /tmp/www && ip -4 addr show eth0 | " +
          "sed -n 's/.*inet \\([0-9.]*\\/[0-9]*\\).*/\\1/p'",
        timeoutSeconds: 30,
      });
      assert.equal(r.exitCode, 0, JSON.stringify(r));
      return { label, node, verb, name, id: created.sandbox.id, nonce, cidr: r.stdout.trim() };
    };
    const guardedBoxes = await Promise.all([
      make("a-closed", guarded, viaGateway("team-a"), false),
      make("a-open", guarded, viaGateway("team-a"), true),
      make("b-closed", guarded, viaGateway("team-b"), false),
      make("b-open", guarded, viaGateway("team-b"), true),
    ]);
    const openBoxes = await Promise.all([
      make("off-closed", openNode, viaOpenNode, false),
      make("off-open", openNode, viaOpenNode, true),
    ]);
    const boxes = [...guardedBoxes, ...openBoxes];
    console.log(`  sandboxes: ${boxes.map((b) => `${b.label} ${b.cidr}`).join(", ")}`);

    await t.step(
      "the node reaches port 8000 of every sandbox, with egress or without",
      async () => {
        for (const box of boxes) {
          const res = await fetch(`${box.node.url}/e2b/ports/8000/`, {
            headers: { "e2b-sandbox-id": box.id },
          });
          assert.equal(res.status, 200, box.label);
          assert.equal((await res.text()).trim(), box.nonce, box.label);
        }
      },
    );

    await t.step(
      "no sandbox reaches another: egress or not, same team or other, any node",
      async () => {
        const results = await Promise.all(boxes.map((from) =>
          probeFrom(
            from,
            boxes.map((to) => ({
              label: to.label,
              host: to.cidr.split("/")[0],
              port: 8000,
              path: "/",
            })),
          )
        ));
        const reached: string[] = [];
        boxes.forEach((from, i) => {
          for (const to of boxes) {
            const answer = results[i].get(to.label) ?? "";
            if (from === to) {
              // The control: the probe itself works (its own server, by its own address).
              assert.ok(answer.includes(to.nonce), `${from.label} -> itself: ${answer}`);
            } else if (answer.split("|")[0] === "0" || answer.includes("HTTP/1.")) {
              // A connect that succeeded counts, whatever came back.
              reached.push(`${from.label} -> ${to.label}`);
            }
          }
        });
        console.log(
          `  ${boxes.length * (boxes.length - 1)} ordered pairs, reached: ${reached.length}`,
        );
        assert.deepEqual(reached, []);
      },
    );

    await t.step(
      "no sandbox of the guarded node reaches the host; with the firewall off all do",
      async () => {
        const machine = Deno.networkInterfaces()
          .filter((i) => i.family === "IPv4" && !i.address.startsWith("127."))
          .map((i) => i.address);
        const hostTargets = (box: Box) =>
          [...new Set([gatewayOf(box.cidr), ...machine])].map((host) => ({
            label: host,
            host,
            port,
            path: "/healthz",
          }));
        const results = await Promise.all(boxes.map((box) => probeFrom(box, hostTargets(box))));
        boxes.forEach((box, i) => {
          const answers = [...results[i]];
          const summary = answers.map(([host, a]) => `${host} ${a.split("|")[0]}`).join(", ");
          console.log(`  ${box.label} (nc's exit code per address): ${summary}`);
          assert.equal(answers.length, hostTargets(box).length, box.label);
          for (const [host, answer] of answers) {
            if (guardedBoxes.includes(box)) {
              // Dropped, so the connect itself fails (never "connected, then nothing").
              assert.notEqual(answer.split("|")[0], "0", `${box.label} -> ${host}: ${answer}`);
              assert.ok(!answer.includes("HTTP/1."), `${box.label} -> ${host}: ${answer}`);
            } else {
              // The control: without the rule the same listener answers on every address, so a
              // failure above is the rule's doing, not a probe that cannot connect.
              assert.match(answer, /HTTP\/1\.[01] 200/, `${box.label} -> ${host}`);
            }
          }
        });
      },
    );

    await t.step(
      "one host rule per network, kept across a restart, gone with the network",
      async () => {
        const internal = await networkOf(guardedId, "internal");
        const egress = await networkOf(guardedId, "egress");
        assert.deepEqual([await hostRules(internal), await hostRules(egress)], [1, 1]);
        await guarded!.stop();
        // The sandboxes live on, so do their networks and the rules guarding them.
        assert.deepEqual([await hostRules(internal), await hostRules(egress)], [1, 1]);
        guarded = await startGuarded();
        await until(async () =>
          (await g.json("listNodes")).body.nodes.some((n: { id: string; state: string }) =>
            n.id === guardedId && n.state === "up"
          )
        );
        await viaGateway("team-a")("acquireSandbox", { name: "iso-again", template: "minimal" });
        await viaGateway("team-a")("acquireSandbox", {
          name: "iso-again-open",
          template: "minimal",
          spec: { network: true },
        });
        assert.deepEqual([await hostRules(internal), await hostRules(egress)], [1, 1]);
        for (const box of guardedBoxes) await box.verb("destroySandbox", { name: box.name });
        for (const name of ["iso-again", "iso-again-open"]) {
          await viaGateway("team-a")("destroySandbox", { name });
        }
        await guarded!.stop();
        guarded = undefined;
        assert.deepEqual([await hostRules(internal), await hostRules(egress)], [0, 0]);
        assert.deepEqual([await networkExists(internal), await networkExists(egress)], [
          false,
          false,
        ]);
      },
    );
  } finally {
    await guarded?.stop();
    await open?.stop();
    await gw?.stop();
    await removeContainersOf([guardedId, openId]);
    await Deno.remove(`${repoRoot}/${dataDir}`, { recursive: true }).catch(() => {});
  }
});

Deno.test({
  name:
    "docker isolation: a node that cannot manage its host firewall refuses to boot; off boots it",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const nodeId = `dkiso-boot-${crypto.randomUUID().slice(0, 6)}`;
  const withoutRun = (dataDir: string) =>
    dockerNodePermissions(dataDir).filter((flag) => !flag.startsWith("--allow-run"));
  const refusal = async (permissions: (dir: string) => string[], env: Record<string, string>) => {
    const node = await startNode({
      permissions,
      waitForHealth: false,
      env: { DORMICE_EXECUTOR: "docker", DORMICE_NODE_ID: nodeId, ...env },
    });
    const status = await node.process.exited;
    await node.stop();
    return { code: status.code, said: node.process.stderr() };
  };
  try {
    await t.step(
      "without --allow-run=iptables: exit 2, naming the flag and the switch",
      async () => {
        const { code, said } = await refusal(withoutRun, {});
        assert.equal(code, 2, said);
        assert.match(said, /^The node cannot manage the firewall rule that keeps sandboxes from/m);
        assert.match(said, /this process may not run it: .*--allow-run=iptables/);
        assert.match(said, /or set DORMICE_SANDBOX_HOST_FIREWALL=off to run without it/);
      },
    );

    await t.step("without iptables on PATH: exit 2, naming the package", async () => {
      const { code, said } = await refusal(dockerNodePermissions, { PATH: "/nonexistent" });
      assert.equal(code, 2, said);
      assert.match(said, /iptables is not installed \(Debian: apt-get install iptables\)/);
    });

    await t.step("DORMICE_SANDBOX_HOST_FIREWALL=off boots without either, and warns", async () => {
      const node = await startNode({
        permissions: withoutRun,
        healthTimeoutMs: 30_000,
        env: {
          DORMICE_EXECUTOR: "docker",
          DORMICE_NODE_ID: nodeId,
          DORMICE_SANDBOX_HOST_FIREWALL: "off",
        },
      });
      await node.stop();
      assert.match(
        node.process.stderr(),
        /"The host firewall is off: sandboxes reach every service listening on this machine"/,
      );
    });
  } finally {
    await removeContainersOf([nodeId]);
  }
});
