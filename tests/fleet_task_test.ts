/**
 * `deno task fleet` as a new user meets it, run as the task itself (tests/_fleet_task.ts):
 *
 * - on Docker, a port served inside a sandbox answers through the gateway: the nodes must run
 *   with `deno task node`'s permissions, since a container's address is none a loopback-only
 *   `--allow-net` names;
 * - `--shared` started by npx (the README's command) logs no info lines by default and, stopped
 *   by a SIGTERM to npx alone, leaves no gateway, node or etcd behind and stops without an error
 *   line;
 * - `--verbose` shows the parts' info lines;
 * - on Docker, the nodes agree on the fleet-invariant settings (one egress CA for all), so the
 *   gateway reports no config digest mismatch and logs no warning about one.
 *
 * The Docker case needs an engine and the images, the shared one etcd: with `CI=true` neither
 * skips; off CI each skips with a printed reason.
 */
import assert from "node:assert/strict";
import { dockerGate, removeContainersOf } from "./_docker.ts";
import { type FleetTask, startFleetTask } from "./_fleet_task.ts";

const onCi = Deno.env.get("CI") === "true";
const docker = await dockerGate("deno task fleet docker case");

async function missing(command: string, args: string[]): Promise<string | null> {
  try {
    const out = await new Deno.Command(command, { args, stdout: "null", stderr: "null" })
      .output();
    return out.success ? null : `${command} does not run`;
  } catch {
    return `${command} is not installed`;
  }
}
const noEtcd = await missing("etcd", ["--version"]);
const noNpx = await missing("npx", ["--version"]);
const sharedWhy = noEtcd ?? noNpx;
if (sharedWhy !== null && !onCi) console.log(`deno task fleet --shared case skipped: ${sharedWhy}`);

async function post(fleet: FleetTask, verb: string, body: unknown) {
  const res = await fetch(`${fleet.gatewayUrl}/${verb}`, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      authorization: `Bearer ${fleet.exported("E2B_API_KEY")}`,
    },
    body: JSON.stringify(body),
  });
  // deno-lint-ignore no-explicit-any
  return { status: res.status, body: await res.json() as any };
}

Deno.test({
  name: "deno task fleet on Docker: a sandbox's port answers through the gateway",
  ignore: docker.skip,
  // The fleet's processes and their pipes are the test's to stop, in `finally`.
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (docker.failure) throw new Error(docker.failure);
  const fleet = startFleetTask({ args: ["--verbose"], env: { DORMICE_EXECUTOR: "docker" } });
  try {
    await fleet.up();
    assert.match(fleet.stdout(), /docker executor/, "the precondition: real containers");
    // --verbose shows what the default leaves out.
    assert.match(fleet.stderr(), /"level":"info".*"msg":"node listening"/);
    const made = await post(fleet, "acquireSandbox", { name: "web", template: "minimal" });
    assert.equal(made.status, 200, JSON.stringify(made.body));
    const id: string = made.body.sandbox.id;
    // A word only this sandbox's server can answer with.
    const word = crypto.randomUUID();
    const served = await post(fleet, "execCommand", {
      name: "web",
      command: `mkdir -p /tmp/www && echo ${word} > /tmp/www/index.html && ` +
        "busybox httpd -p 8080 -h /tmp/www",
    });
    assert.equal(served.status, 200, JSON.stringify(served.body));
    assert.equal(served.body.exitCode, 0, JSON.stringify(served.body));
    // Through the gateway's envd door with the port header, as the SDK's getHost() traffic
    // goes without a domain: gateway, then the node, then the container's address.
    let res: Response | undefined;
    let text = "";
    for (let i = 0; i < 50; i++) {
      res = await fetch(`${fleet.gatewayUrl}/e2b/envd/index.html`, {
        headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8080" },
      });
      text = await res.text();
      // httpd may take a moment to listen: a refused connection is a 502 naming the port.
      if (res.status !== 502 || !/not listening|refused|port 8080/i.test(text)) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(res?.status, 200, `${text}\n${fleet.stderr()}`);
    assert.equal(text.trim(), word);

    // Both nodes have checked in with a digest (the check-in interval is 5 s): they agree.
    // deno-lint-ignore no-explicit-any
    let nodes: any[] = [];
    for (let i = 0; i < 150; i++) {
      const listed = await fetch(`${fleet.gatewayUrl}/listNodes`, {
        method: "POST",
        headers: {
          "content-type": "application/json",
          authorization: `Bearer ${fleet.exported("DORMICE_API_TOKEN")}`,
        },
        body: "{}",
      });
      nodes = (await listed.json()).nodes ?? [];
      if (nodes.length === 2 && nodes.every((n) => typeof n.configDigest === "string")) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(nodes.length, 2, JSON.stringify(nodes));
    assert.ok(nodes.every((n) => typeof n.configDigest === "string"), "precondition: digests");
    assert.equal(nodes[0].configDigest, nodes[1].configDigest, "the nodes' digests");
    assert.deepEqual(nodes.map((n) => n.configDigestMismatch), [false, false]);
    assert.doesNotMatch(fleet.stderr(), /fleet-invariant settings differ/);
  } finally {
    await fleet.stop();
    await removeContainersOf(fleet.nodeIds);
  }
});

Deno.test({
  name: "deno task fleet --shared: a SIGTERM to npx stops every part, nodes first, quietly",
  ignore: sharedWhy !== null && !onCi,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  if (sharedWhy !== null) {
    throw new Error(`CI=true, so the fleet --shared case must run, but ${sharedWhy}`);
  }
  const fleet = startFleetTask({
    args: ["--shared"],
    env: { DORMICE_EXECUTOR: "fake" },
    launcher: "npx",
  });
  try {
    await fleet.up();
    // npx, its shell, deno task, the fleet, etcd, two gateways, two nodes.
    const running = await fleet.pids();
    assert.ok(running.length >= 7, `the precondition: the fleet runs (${running.length} found)`);
    const before = fleet.stderr().length;
    // Quiet by default: the parts' info lines (listening, placer ready) stay out of the terminal.
    assert.doesNotMatch(fleet.stderr(), /"level":"info"/, fleet.stderr());

    // npx alone, as `kill <pid of npx>` or a supervisor's stop does: npm exits at once and does
    // not pass the signal on.
    fleet.child.kill("SIGTERM");
    const deadline = Date.now() + 30_000;
    let left = await fleet.pids();
    while (left.length > 0 && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 250));
      left = await fleet.pids();
    }
    assert.deepEqual(left, [], `still running 30 s after the SIGTERM:\n${fleet.stderr()}`);
    const shutdown = fleet.stderr().slice(before);
    assert.match(shutdown, /Stopped: node-|Stopped: ft/, shutdown);
    assert.doesNotMatch(shutdown, /"level":"error"|connection is closing/, shutdown);
  } finally {
    await fleet.stop();
  }
});
