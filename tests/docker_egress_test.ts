/**
 * Network isolation on Docker: a sandbox created without egress cannot open a
 * connection out, and one created with the native spec's `network: true` can, tested against
 * an address inside a network namespace this test makes, never an outside one.
 *
 * The namespace gets one end of a veth pair with an address from 10.213.0.0/16 (a range nothing
 * else in the tests or Docker's default pools uses; a free /30 is picked per run), the host the
 * other end; a tiny Deno listener inside the namespace writes a per-run nonce to whoever
 * connects. The host reaches it first (the precondition), then each sandbox tries for at most 3
 * seconds with bash's `/dev/tcp`. The host forwards container traffic to the veth as it does to
 * any interface (Docker turns `ip_forward` on; the test turns it on if not and restores it), and
 * Docker's own rules drop what leaves the node's `--internal` network. The namespace, the veth
 * and the listener are removed in `finally`; no iptables rule is added.
 *
 * Needs root, `ip` (iproute2), an engine and the base image: with `CI=true` a missing one fails
 * the suite; off CI it skips with a printed reason.
 */
import assert from "node:assert/strict";
import {
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
} from "./_docker.ts";
import { serveInNetns } from "./support/netns.ts";

// Through sh: Deno grants /proc/sys only to --allow-all, and the test task does not.
const FORWARD = "/proc/sys/net/ipv4/ip_forward";
const PORT = 8471;

async function run(cmd: string, args: string[]): Promise<{ ok: boolean; out: string }> {
  const out = await new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "piped" })
    .output();
  const dec = new TextDecoder();
  return { ok: out.success, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

/** Runs `ip …`, throwing with its output when it fails. */
async function ip(...args: string[]): Promise<string> {
  const r = await run("ip", args);
  if (!r.ok) throw new Error(`ip ${args.join(" ")} failed: ${r.out.trim()}`);
  return r.out;
}

async function forwarding(): Promise<string> {
  const r = await run("sh", ["-c", `cat ${FORWARD}`]);
  if (!r.ok) throw new Error(`Cannot read ${FORWARD}: ${r.out.trim()}`);
  return r.out.trim();
}

async function setForwarding(value: string): Promise<void> {
  const r = await run("sh", ["-c", `echo ${value === "1" ? 1 : 0} > ${FORWARD}`]);
  if (!r.ok) throw new Error(`Cannot write ${FORWARD}: ${r.out.trim()}`);
}

/** Why the test cannot run here, or `null` when it can. */
async function egressReadiness(): Promise<string | null> {
  if (Deno.uid() !== 0) return "not root: ip netns and a veth pair need it";
  try {
    if (!(await run("ip", ["-V"])).ok) return "ip does not run";
  } catch {
    return "ip (iproute2) is not installed";
  }
  return null;
}

const docker = await dockerGate("docker egress test");
const why = docker.skip ? null : await egressReadiness();
const onCi = Deno.env.get("CI") === "true";
if (why !== null && !onCi) console.log(`docker egress test skipped: ${why}`);

/** A /30 in 10.213.0.0/16 that no interface of the host has an address in. */
async function freeSubnet(): Promise<{ host: string; inside: string }> {
  const used = await ip("-4", "-o", "addr", "show");
  for (let attempt = 0; attempt < 50; attempt++) {
    const [a, b] = crypto.getRandomValues(new Uint8Array(2));
    const base = `10.213.${a}.${b & 0xfc}`;
    const prefix = base.slice(0, base.lastIndexOf(".") + 1);
    if (used.includes(` ${prefix}`)) continue;
    const last = b & 0xfc;
    return { host: `${prefix}${last + 1}`, inside: `${prefix}${last + 2}` };
  }
  throw new Error("No free /30 in 10.213.0.0/16 after 50 picks");
}

/** A bounded connect that prints what the peer wrote: bash's /dev/tcp under `timeout 3`. */
function probe(address: string): string[] {
  return ["timeout", "3", "bash", "-c", `cat </dev/tcp/${address}/${PORT}`];
}

Deno.test({
  name: "docker egress: no egress cannot reach an address in a test namespace; network: true can",
  ignore: docker.skip || (why !== null && !onCi),
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (docker.failure) throw new Error(docker.failure);
  if (why !== null) throw new Error(`CI=true, so the docker egress test must run, but ${why}`);

  const tag = crypto.randomUUID().slice(0, 6);
  const ns = `dormice-eg-${tag}`;
  const hostEnd = `dmeg${tag}h`;
  const nsEnd = `dmeg${tag}n`;
  const nonce = `dormice-egress-${crypto.randomUUID()}`;
  const nodeId = `dkeg-${tag}`;
  const listenerFile = await Deno.makeTempFile({ prefix: "dormice-egress-", suffix: ".ts" });
  const forwardBefore = await forwarding();
  let listener: Deno.ChildProcess | undefined;
  let node: DockerNodeProcess | undefined;
  try {
    const { host, inside } = await freeSubnet();
    await ip("netns", "add", ns);
    await ip("link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd);
    await ip("link", "set", nsEnd, "netns", ns);
    await ip("addr", "add", `${host}/30`, "dev", hostEnd);
    await ip("link", "set", hostEnd, "up");
    await ip("-n", ns, "addr", "add", `${inside}/30`, "dev", nsEnd);
    await ip("-n", ns, "link", "set", nsEnd, "up");
    // Replies to a container whose address Docker did not masquerade go back through the host.
    await ip("-n", ns, "route", "add", "default", "via", host);
    if (forwardBefore !== "1") await setForwarding("1");

    await Deno.writeTextFile(
      listenerFile,
      `const l = Deno.listen({ hostname: "${inside}", port: ${PORT} });
       console.log("listening");
       for await (const c of l) {
         await c.write(new TextEncoder().encode("${nonce}\\n")).catch(() => {});
         c.close();
       }`,
    );
    listener = await serveInNetns(
      ns,
      [`--allow-net=${inside}:${PORT}`],
      listenerFile,
      "the listener in the namespace",
    );

    await t.step("precondition: the host reaches the listener in the namespace", async () => {
      const r = await run(probe(inside)[0], probe(inside).slice(1));
      assert.ok(r.ok, r.out);
      assert.equal(r.out.trim(), nonce);
    });

    node = await startDockerNode({ nodeId });
    const verb = async (name: string, body: unknown) => {
      const res = await fetch(`${node!.url}/${name}`, {
        method: "POST",
        headers: { authorization: `Bearer ${node!.token}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      const answer = await res.json();
      assert.equal(res.status, 200, JSON.stringify(answer));
      return answer;
    };
    const tryFrom = async (name: string) => {
      const started = Date.now();
      const r = await verb("execCommand", { name, command: probe(inside), timeoutSeconds: 15 });
      return { ...r, ms: Date.now() - started };
    };

    await t.step("a sandbox without egress cannot open a connection to it", async () => {
      await verb("acquireSandbox", { name: "closed" });
      const r = await tryFrom("closed");
      console.log(`  no egress: exit ${r.exitCode} after ${r.ms} ms (${r.stderr.trim()})`);
      assert.notEqual(r.exitCode, 0, JSON.stringify(r));
      assert.ok(!r.stdout.includes(nonce), JSON.stringify(r));
    });

    await t.step("a sandbox created with network: true reaches it", async () => {
      await verb("acquireSandbox", { name: "open", spec: { network: true } });
      const r = await tryFrom("open");
      console.log(`  with egress: exit ${r.exitCode} after ${r.ms} ms`);
      assert.equal(r.exitCode, 0, JSON.stringify(r));
      assert.equal(r.stdout.trim(), nonce);
    });
  } finally {
    await node?.stop();
    await removeContainersOf([nodeId]);
    try {
      listener?.kill("SIGKILL");
      await listener?.status;
    } catch { /* exited already */ }
    await listener?.stdout.cancel().catch(() => {});
    // Deleting the namespace deletes its veth end, and with it the host's.
    await run("ip", ["netns", "del", ns]).catch(() => {});
    await run("ip", ["link", "del", hostEnd]).catch(() => {});
    if (forwardBefore !== "1") await setForwarding(forwardBefore);
    await Deno.remove(listenerFile).catch(() => {});
  }
});
