/**
 * Egress address rules on Docker, end to end through a gateway with the official SDK: an address
 * allowed under a deny of every address answers and another does not; `updateNetwork` flips
 * that on a running sandbox whose earlier background process keeps running (same pid, same
 * container start); the rules of one sandbox never reach another on the same node; a sandbox
 * with egress and no rules reaches both, and one without network options reaches neither. A
 * sandbox paused to disk and resumed in a new container at a new address is held by its rules
 * again, and the sandbox the engine gave its old address meanwhile is not.
 *
 * The stand-in internet is a network namespace this test makes: one end of a veth pair holding
 * two addresses A and B from 198.18.0.0/15 (the benchmarking range, which no real service and
 * nothing in Docker's pools uses; a free /29 is picked per run), the host the other end; a Deno
 * HTTP listener inside answers on both with the address it was reached at and a per-run nonce.
 * The host must reach both first (the precondition), and so must a sandbox with egress and no
 * rules, so a refusal can only come from the rules. Names start with `dmnr`, the port is in
 * 27000-27999. Everything made is removed in `finally`.
 *
 * Needs root, `ip` (iproute2), iptables, bash, an engine and the base image (whose curl the
 * sandboxes use; the host speaks HTTP through bash's `/dev/tcp`): with `CI=true` a
 * missing one fails the suite; off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { ALL_TRAFFIC, CommandExitError, Sandbox, type SandboxOpts } from "e2b";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import { startGateway } from "./_gateway.ts";
import { freeSubnet, must, netnsReadiness, run, serveInNetns } from "./support/netns.ts";
import {
  dockerGate,
  type DockerNodeProcess,
  networkOf,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const FORWARD = "/proc/sys/net/ipv4/ip_forward";
const PORT = 27000 + Math.floor(Math.random() * 1000);

const docker = await dockerGate("docker network rules test");
const why = docker.skip ? null : await netnsReadiness();
const onCi = Deno.env.get("CI") === "true";
if (why !== null && !onCi) console.log(`docker network rules test skipped: ${why}`);

/** The body a sandbox gets from `address`, or `refused: <curl's exit>` when it gets none. */
async function fetchFrom(sandbox: Sandbox, address: string): Promise<string> {
  try {
    const r = await sandbox.commands.run(
      `curl -sS --max-time 4 http://${address}:${PORT}/`,
      { timeoutMs: 15_000 },
    );
    return r.stdout.trim();
  } catch (error) {
    if (error instanceof CommandExitError) return `refused: ${error.exitCode}`;
    throw error;
  }
}

/** The egress bridge's DOCKER-USER rules: each sandbox with rules has one jump there. */
async function jumpsOn(bridge: string): Promise<string[]> {
  return (await must("iptables", "-w", "5", "-S", "DOCKER-USER")).split("\n")
    .filter((line) => line.includes(` -i ${bridge} `));
}

Deno.test({
  name:
    "docker network rules: allowOut under a deny of all, updateNetwork live, no leak between sandboxes",
  ignore: docker.skip || (why !== null && !onCi),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (docker.failure) throw new Error(docker.failure);
  if (why !== null) {
    throw new Error(`CI=true, so the docker network rules test must run, but ${why}`);
  }

  const tag = crypto.randomUUID().slice(0, 6);
  const ns = `dmnr-${tag}`;
  const hostEnd = `dmnr${tag}h`;
  const nsEnd = `dmnr${tag}n`;
  const nonce = `dmnr-${crypto.randomUUID()}`;
  const nodeId = `dmnr-${tag}`;
  const listenerFile = await Deno.makeTempFile({ prefix: "dmnr-", suffix: ".ts" });
  const forwardBefore = (await must("sh", "-c", `cat ${FORWARD}`)).trim();
  let listener: Deno.ChildProcess | undefined;
  let node: DockerNodeProcess | undefined;
  let gw: Awaited<ReturnType<typeof startGateway>> | undefined;
  let bridge: string | undefined;
  const sandboxes: Sandbox[] = [];
  try {
    const { host, a, b } = await freeSubnet();
    await must("ip", "netns", "add", ns);
    await must("ip", "link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd);
    await must("ip", "link", "set", nsEnd, "netns", ns);
    await must("ip", "addr", "add", `${host}/29`, "dev", hostEnd);
    await must("ip", "link", "set", hostEnd, "up");
    await must("ip", "-n", ns, "addr", "add", `${a}/29`, "dev", nsEnd);
    await must("ip", "-n", ns, "addr", "add", `${b}/29`, "dev", nsEnd);
    await must("ip", "-n", ns, "link", "set", nsEnd, "up");
    await must("ip", "-n", ns, "route", "add", "default", "via", host);
    if (forwardBefore !== "1") await must("sh", "-c", `echo 1 > ${FORWARD}`);

    await Deno.writeTextFile(
      listenerFile,
      `for (const hostname of ["${a}", "${b}"]) {
         Deno.serve({ hostname, port: ${PORT}, onListen() {} }, () =>
           new Response(hostname + " ${nonce}\\n"));
       }
       console.log("listening");`,
    );
    listener = await serveInNetns(
      ns,
      [`--allow-net=${a}:${PORT},${b}:${PORT}`],
      listenerFile,
      "the listener in the namespace",
    );
    const answerOf = (address: string) => `${address} ${nonce}`;

    await t.step("precondition: the host reaches A and B in the namespace", async () => {
      for (const address of [a, b]) {
        const raw = await must(
          "timeout",
          "4",
          "bash",
          "-c",
          `exec 3<>/dev/tcp/${address}/${PORT}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3`,
        );
        assert.equal(raw.split("\r\n\r\n")[1]?.trim(), answerOf(address), raw);
      }
    });

    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    node = await startDockerNode({ token: gw.token, gatewayUrl: gw.url, nodeId });
    await until("the docker node to be up at the gateway, enforcing rules", async () => {
      const { body } = await gw!.json("listNodes");
      return body.nodes.some((n: { id: string; state: string; egressRules: boolean }) =>
        n.id === nodeId && n.state === "up" && n.egressRules === true
      );
    }, 30_000);
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

    const open = await create({ allowInternetAccess: true });
    await t.step("precondition: a sandbox with egress and no rules reaches A and B", async () => {
      assert.equal(await fetchFrom(open, a), answerOf(a));
      assert.equal(await fetchFrom(open, b), answerOf(b));
    });
    const egressNetwork = await networkOf(nodeId, "egress");
    const inspect = await new Docker({ socketPath: DEFAULT_DOCKER_SOCKET }).getNetwork(
      egressNetwork,
    ).inspect() as { Options?: Record<string, string> };
    bridge = inspect.Options?.["com.docker.network.bridge.name"];
    assert.ok(bridge, `the egress network ${egressNetwork} names its bridge`);
    assert.deepEqual(await jumpsOn(bridge), [], "a sandbox without rules has no kernel rules");

    await t.step("a sandbox without network options reaches neither", async () => {
      const closed = await create({});
      assert.match(await fetchFrom(closed, a), /^refused: /);
      assert.match(await fetchFrom(closed, b), /^refused: /);
    });

    const ruled = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [a] } });
    await t.step("allowOut [A] under denyOut [0.0.0.0/0]: A answers, B does not", async () => {
      assert.equal(await fetchFrom(ruled, a), answerOf(a));
      assert.match(await fetchFrom(ruled, b), /^refused: /);
      assert.equal((await jumpsOn(bridge!)).length, 1, "one jump, for the ruled sandbox");
    });

    await t.step(
      "the ruled sandbox's rules do not reach the open one on the same node",
      async () => {
        assert.equal(await fetchFrom(open, a), answerOf(a));
        assert.equal(await fetchFrom(open, b), answerOf(b));
      },
    );

    await t.step(
      "updateNetwork flips A and B on the running sandbox; its process lives on",
      async () => {
        const containerOf = async () => {
          const [c] = await new Docker({ socketPath: DEFAULT_DOCKER_SOCKET }).listContainers({
            all: true,
            filters: { label: [`dormice.node=${nodeId}`, `dormice.sandbox=${ruled.sandboxId}`] },
          });
          const info = await new Docker({ socketPath: DEFAULT_DOCKER_SOCKET }).getContainer(c.Id)
            .inspect();
          return info.State.StartedAt;
        };
        const startedAt = await containerOf();
        const beat = await ruled.commands.run(
          "while true; do date +%s%N >> /tmp/dmnr-beat; sleep 0.2; done",
          { background: true },
        );
        await ruled.updateNetwork({ denyOut: [ALL_TRAFFIC], allowOut: [b] });
        assert.equal(await fetchFrom(ruled, b), answerOf(b));
        assert.match(await fetchFrom(ruled, a), /^refused: /);
        // The same process, still running, still beating; the container was not restarted.
        const running = await ruled.commands.list();
        assert.ok(running.some((p) => p.pid === beat.pid), `pid ${beat.pid} still runs`);
        const before = (await ruled.files.read("/tmp/dmnr-beat")).split("\n").length;
        await until(
          "the background process to beat again",
          async () => (await ruled.files.read("/tmp/dmnr-beat")).split("\n").length > before,
        );
        assert.equal(await containerOf(), startedAt, "the container was not restarted");
        assert.equal((await jumpsOn(bridge!)).length, 1, "still one jump: the rules swapped");
        await beat.kill();
        // And the open sandbox still reaches both.
        assert.equal(await fetchFrom(open, a), answerOf(a));
        assert.equal(await fetchFrom(open, b), answerOf(b));
        const info = await Sandbox.getInfo(ruled.sandboxId, opts);
        assert.deepEqual(info.network?.allowOut, [`${b}/32`]);
        assert.deepEqual(info.network?.denyOut, [ALL_TRAFFIC]);
      },
    );

    await t.step("a bad rule is a 400 naming the field; the rules in force stay", async () => {
      const error = await ruled.updateNetwork({ allowOut: ["10.0.0.0/33"] }).catch((e) => e);
      assert.ok(error instanceof Error, String(error));
      assert.match(error.message, /'allowOut\[0\]' '10\.0\.0\.0\/33' has a prefix length/);
      assert.equal(await fetchFrom(ruled, b), answerOf(b));
      assert.match(await fetchFrom(ruled, a), /^refused: /);
    });

    await t.step(
      "paused to disk and resumed in a new container, a sandbox's rules hold again and never " +
        "reach the sandbox given its old address",
      async () => {
        const engine = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
        /** The sandbox's container and its address on the egress network, if it has one. */
        const where = async (sandbox: Sandbox) => {
          const found = await engine.listContainers({
            all: true,
            filters: { label: [`dormice.node=${nodeId}`, `dormice.sandbox=${sandbox.sandboxId}`] },
          });
          if (found.length === 0) return null;
          assert.equal(found.length, 1, `one container for ${sandbox.sandboxId}`);
          const info = await engine.getContainer(found[0].Id).inspect();
          return { id: found[0].Id, ip: info.NetworkSettings.Networks[egressNetwork]?.IPAddress };
        };
        const jumpsOf = async (sandbox: Sandbox) => {
          const own = new RegExp(`dormice:[^\\s"]*:${sandbox.sandboxId}"?\\s`);
          return (await jumpsOn(bridge!)).filter((line) => own.test(line));
        };
        const parked = await create({ network: { denyOut: [ALL_TRAFFIC], allowOut: [a] } });
        const before = await where(parked);
        assert.ok(before?.ip, "the parked sandbox has an address on the egress network");
        assert.match(await fetchFrom(parked, b), /^refused: /);
        assert.equal(await parked.pause({ keepMemory: false }), true);
        assert.equal(await where(parked), null, "paused to disk: no container left");
        // A sandbox made meanwhile takes the freed address, so the resumed one gets another.
        const taker = await create({ allowInternetAccess: true });
        assert.equal(
          (await where(taker))?.ip,
          before.ip,
          "the new sandbox took the old address (the engine gives out the lowest free one)",
        );
        assert.equal(await fetchFrom(taker, a), answerOf(a));
        assert.equal(await fetchFrom(taker, b), answerOf(b), "no rules left on the old address");
        const back = await Sandbox.connect(parked.sandboxId, opts);
        const after = await where(back);
        assert.ok(after?.ip, "resumed: a container with an address on the egress network");
        assert.notEqual(after.id, before.id, "resumed in a new container");
        assert.notEqual(after.ip, before.ip, "resumed at a new address, no old rule matches it");
        assert.equal(await fetchFrom(back, a), answerOf(a));
        assert.match(await fetchFrom(back, b), /^refused: /);
        const jumps = await jumpsOf(back);
        assert.equal(jumps.length, 1, `one jump for the resumed sandbox: ${jumps.join(" | ")}`);
        assert.ok(jumps[0].includes(` -s ${after.ip}/32 `), jumps[0]);
        await back.kill();
        await taker.kill();
        assert.deepEqual(await jumpsOf(back), []);
      },
    );

    await t.step("killing the ruled sandbox removes its kernel rules", async () => {
      await ruled.kill();
      assert.deepEqual(await jumpsOn(bridge!), []);
    });
  } finally {
    for (const sandbox of sandboxes) await sandbox.kill().catch(() => {});
    await node?.stop();
    await gw?.stop();
    await removeContainersOf([nodeId]);
    // Rules a failed run left behind on this run's bridge, and the chains they lead to.
    if (bridge !== undefined) {
      for (const line of await jumpsOn(bridge).catch(() => [])) {
        const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
        await run("iptables", ["-w", "5", "-D", ...words.slice(1)]);
        const chain = words.at(-1)!;
        for (const c of [chain, `${chain}-a`, `${chain}-b`]) {
          await run("iptables", ["-w", "5", "-F", c]);
          await run("iptables", ["-w", "5", "-X", c]);
        }
      }
    }
    try {
      listener?.kill("SIGKILL");
      await listener?.status;
    } catch { /* exited already */ }
    await listener?.stdout.cancel().catch(() => {});
    await run("ip", ["netns", "del", ns]).catch(() => {});
    await run("ip", ["link", "del", hostEnd]).catch(() => {});
    if (forwardBefore !== "1") await run("sh", ["-c", `echo ${forwardBefore} > ${FORWARD}`]);
    await Deno.remove(listenerFile).catch(() => {});
  }
});
