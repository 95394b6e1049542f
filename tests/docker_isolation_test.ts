/**
 * Sandbox isolation on Docker, spoken to only over HTTP: no sandbox reaches another (with egress
 * or without, same team or another, same node or another), while the node still reaches every
 * sandbox's ports through its ports door.
 *
 * Every probe is a `nc` from one of the test's own containers to another of them; nothing leaves
 * the machine.
 *
 * Needs an engine and the images (`.ci/docker.sh`): with `CI=true` a missing one fails the suite;
 * off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";
import { type GatewayProcess, postJson, startGateway } from "./_gateway.ts";
import type { NodeProcess } from "./_processes.ts";

const gate = await dockerGate("docker isolation suite");

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
  name: "docker isolation: no sandbox reaches another; the node reaches their ports",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const tag = crypto.randomUUID().slice(0, 6);
  const teamsId = `dkiso-${tag}`;
  const otherId = `dkiso-${tag}-other`;
  let gw: GatewayProcess | undefined;
  let teams: DockerNodeProcess | undefined;
  let other: DockerNodeProcess | undefined;
  try {
    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    const g = gw;
    teams = await startDockerNode({ token: g.token, gatewayUrl: g.url, nodeId: teamsId });
    other = await startDockerNode({ nodeId: otherId });
    const otherNode = other;
    for (let i = 0; i < 100; i++) {
      const { body } = await g.json("listNodes");
      if (
        body.nodes.some((n: { id: string; state: string }) => n.id === teamsId && n.state === "up")
      ) break;
      await new Promise((r) => setTimeout(r, 100));
    }

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
    const viaOtherNode = async (name: string, body: Record<string, unknown>) => {
      const r = await postJson(otherNode.url, otherNode.token, name, body);
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
    const teamsNode = teams;
    const boxes = await Promise.all([
      make("a-closed", teamsNode, viaGateway("team-a"), false),
      make("a-open", teamsNode, viaGateway("team-a"), true),
      make("b-closed", teamsNode, viaGateway("team-b"), false),
      make("b-open", teamsNode, viaGateway("team-b"), true),
      make("other-closed", otherNode, viaOtherNode, false),
      make("other-open", otherNode, viaOtherNode, true),
    ]);
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
  } finally {
    await teams?.stop();
    await other?.stop();
    await gw?.stop();
    await removeContainersOf([teamsId, otherId]);
  }
});
