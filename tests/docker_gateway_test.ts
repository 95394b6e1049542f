/**
 * The gateway exam's docker subset: a real gateway in front of a real node on the
 * Docker executor, spoken to only with `fetch` on the native verbs: create, run, a command
 * killed at its timeout, big output streamed through the gateway, files, metrics, destroy, and
 * a restart of the node after its container was removed by hand (reconciled: the row is kept,
 * marked and reported, never dropped). Pause/resume and the streamed command (which the native
 * face does not have) are in `docker_e2b_test.ts`.
 *
 * Needs an engine and the base image (`.ci/docker.sh`): with `CI=true` it never skips; off CI
 * it skips with a printed reason.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import {
  containersOf,
  dockerGate,
  type DockerNodeProcess,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const gate = await dockerGate("docker gateway suite");

Deno.test({
  name: "docker gateway suite: native verbs through a gateway to a node on Docker",
  ignore: gate.skip,
  // Child processes and dockerode's pooled unix sockets outlive single steps by design.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  let gw: GatewayProcess | undefined;
  let node: DockerNodeProcess | undefined;
  const nodeId = `dkgw-${crypto.randomUUID().slice(0, 8)}`;
  try {
    gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
    const g = gw;
    node = await startDockerNode({ token: g.token, gatewayUrl: g.url, nodeId });
    await until("the docker node to be up at the gateway", async () => {
      const { body } = await g.json("listNodes");
      return body.nodes.some((n: { id: string; state: string }) =>
        n.id === nodeId && n.state === "up"
      );
    });
    const name = `dk-${crypto.randomUUID().slice(0, 8)}`;
    const exec = async (body: Record<string, unknown>) => {
      const r = await g.json("execCommand", { name, ...body });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      return r.body;
    };

    await t.step("acquireSandbox builds one container on the node, once", async () => {
      const first = await g.json("acquireSandbox", {
        name,
        metadata: { suite: "docker" },
        spec: { cpus: 0.5, memoryMB: 192 },
      });
      assert.equal(first.status, 200, JSON.stringify(first.body));
      assert.equal(first.body.created, true);
      assert.equal(first.body.sandbox.nodeId, nodeId);
      assert.equal(first.body.sandbox.state, "active");
      const again = await g.json("acquireSandbox", { name });
      assert.equal(again.status, 200, JSON.stringify(again.body));
      assert.equal(again.body.created, false);
      assert.equal(again.body.sandbox.id, first.body.sandbox.id);
      assert.deepEqual(await containersOf(nodeId), [first.body.sandbox.id]);
    });

    await t.step("execCommand runs real code: exit code, stderr, cwd, env, bash -l", async () => {
      assert.deepEqual(
        await exec({ command: "echo out; echo err >&2; exit 3" }),
        {
          exitCode: 3,
          stdout: "out\n",
          stderr: "err\n",
          stdoutTruncated: false,
          stderrTruncated: false,
        },
      );
      const r = await exec({ command: 'echo "$PWD $X"', cwd: "/tmp", env: { X: "y" } });
      assert.equal(r.stdout, "/tmp y\n");
      const bash = await exec({ command: ["/bin/bash", "-l", "-c", "echo $((6 * 7))"] });
      assert.equal(bash.stdout, "42\n");
    });

    await t.step(
      "the sandbox is isolated: no route out, not root, capabilities dropped",
      async () => {
        // One interface besides lo: the node's internal network (Docker's --internal, which
        // forwards nothing out), through which the node reaches the sandbox's ports.
        const r = await exec({
          command: "ls /sys/class/net | tr '\\n' ' '; echo; id -u; grep CapEff /proc/self/status",
        });
        const [nets, uid, caps] = r.stdout.trim().split("\n");
        assert.equal(nets.trim(), "eth0 lo");
        assert.notEqual(uid, "0");
        assert.match(caps, /CapEff:\s+0+$/);
      },
    );

    await t.step("a command past its timeout is killed and says so", async () => {
      const r = await exec({ command: "echo started; sleep 30", timeoutSeconds: 1 });
      // The kill, not the sleep, ends the call: a sleep left to its end would exit 0, not timed out.
      assert.equal(r.timedOut, true);
      assert.equal(r.exitCode, 137);
      assert.equal(r.stdout, "started\n");
    });

    await t.step("a timed-out command whose output outlives the kill still answers", async () => {
      // The command's own process becomes a sleep without the marker the kill finds a command's
      // processes by (`exec`, so on any /bin/sh: the engine ends the output when that process
      // ends), so it outlives the kill with the output open: the answer comes after the kill's
      // grace, not the sleep.
      const r = await exec({
        command:
          "echo started; exec env -u DORMICE_EXEC_ID sh -c 'echo $$ > /tmp/escaped; exec sleep 30'",
        timeoutSeconds: 1,
      });
      assert.equal(r.timedOut, true);
      assert.equal(r.exitCode, -1);
      assert.equal(r.stdout, "started\n");
      // Answered while the escaped sleep still runs (holding the output open): the kill below
      // finds it. An answer that waited for the output would come after the sleep's end.
      const killed = await exec({ command: 'kill "$(cat /tmp/escaped)"' });
      assert.equal(killed.exitCode, 0, `the escaped sleep had ended: ${JSON.stringify(killed)}`);
    });

    await t.step(
      "big output flows through the gateway, capped with the truncated flag",
      async () => {
        const r = await exec({ command: "yes abcdefgh | head -c 3000000; echo done >&2" });
        assert.equal(r.exitCode, 0);
        assert.equal(r.stdoutTruncated, true);
        assert.equal(r.stdout.length, 1024 * 1024);
        assert.equal(r.stderr, "done\n");
      },
    );

    await t.step(
      "files: binary-safe write and read, parents created, a missing one 404",
      async () => {
        const bytes = new Uint8Array(256 * 4).map((_, i) => i % 256);
        const w = await g.json("writeFile", {
          name,
          path: "/tmp/bin/all-bytes",
          contentBase64: Buffer.from(bytes).toString("base64"),
        });
        assert.equal(w.status, 200, JSON.stringify(w.body));
        assert.equal(w.body.size, bytes.length);
        const r = await g.json("readFile", { name, path: "/tmp/bin/all-bytes" });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        assert.deepEqual(new Uint8Array(Buffer.from(r.body.contentBase64, "base64")), bytes);
        const text = await g.json("writeFile", {
          name,
          path: "notes/today.txt",
          content: "héllo\n",
        });
        assert.equal(text.status, 200, JSON.stringify(text.body));
        assert.equal((await exec({ command: "cat ~/notes/today.txt" })).stdout, "héllo\n");
        const missing = await g.json("readFile", { name, path: "/tmp/nope" });
        assert.equal(missing.status, 404, JSON.stringify(missing.body));
      },
    );

    await t.step("getSandboxMetrics reports the container's own limits", async () => {
      const r = await g.json("getSandboxMetrics", { name });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.metrics.memoryLimitBytes, 192 * 1024 * 1024);
      assert.equal(r.body.metrics.cpuCount, 1);
      assert.ok(r.body.metrics.memoryUsedBytes > 0);
    });

    await t.step("destroySandbox removes the container; a second destroy is false", async () => {
      const r = await g.json("destroySandbox", { name });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.equal(r.body.destroyed, true);
      assert.deepEqual(await containersOf(nodeId), []);
      const gone = await g.json("execCommand", { name, command: "true" });
      assert.equal(gone.status, 404, JSON.stringify(gone.body));
      const again = await g.json("destroySandbox", { name });
      assert.equal(again.body.destroyed, false);
    });

    await t.step(
      "a restart after a container vanished keeps the row, marked and reported",
      async () => {
        const lost = `${name}-lost`;
        const created = await g.json("acquireSandbox", { name: lost });
        assert.equal(created.status, 200, JSON.stringify(created.body));
        const id = created.body.sandbox.id;
        const { dataDir, port } = node!;
        await node!.process.stop();
        await removeContainersOf([nodeId]);
        node = await startDockerNode({
          token: g.token,
          gatewayUrl: g.url,
          nodeId,
          dataDir,
          port,
        });
        assert.match(node.process.stderr(), new RegExp(`sandbox lost.*"id":"${id}"`));
        const found = await g.json("lookupSandbox", { name: lost });
        assert.equal(found.status, 200, JSON.stringify(found.body));
        assert.deepEqual(found.body, {
          found: true,
          sandbox: { id, name: lost, state: "stopped", team: "default" },
        });
        const wake = await g.json("acquireSandbox", { name: lost });
        assert.equal(wake.status, 410, JSON.stringify(wake.body));
        assert.match(wake.body.message, /lost its docker sandbox.*destroy it/);
        assert.equal((await g.json("destroySandbox", { name: lost })).body.destroyed, true);
        const fresh = await g.json("acquireSandbox", { name: lost });
        assert.equal(fresh.body.created, true, JSON.stringify(fresh.body));
        assert.equal((await g.json("destroySandbox", { name: lost })).body.destroyed, true);
      },
    );
  } finally {
    await node?.stop();
    // The node keeps its data dir when restarted on it; remove it here.
    if (node) await Deno.remove(node.dataDir, { recursive: true }).catch(() => {});
    await gw?.stop();
    await removeContainersOf([nodeId]);
  }
});
