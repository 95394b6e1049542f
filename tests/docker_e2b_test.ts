/**
 * The E2B SDK exam's docker subset: the official `e2b` package, unmodified, pointed
 * at a real gateway (`/e2b/api`, `/e2b/envd`) in front of a real node process on the Docker
 * executor: create, run, a streamed command, files, pause/resume, kill, on real containers.
 *
 * The SDK creates the `base` template unless told otherwise, so this suite runs on the Debian
 * image (`deploy/images/build-base.sh`), as an agent would. Needs an engine and the images
 * (`.ci/docker.sh`): with `CI=true` it never skips; off CI it skips with a printed reason.
 * Needs --allow-net=127.0.0.1,unix:/var/run/docker.sock --allow-env (the SDK and dockerode read
 * the environment) --allow-run --allow-read --allow-write (the gateway and node processes and
 * their temp dirs).
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { CommandExitError, Sandbox, SandboxError } from "e2b";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import { commandFidelitySteps } from "./_e2b_steps.ts";
import { startGateway } from "./_gateway.ts";
import {
  containersOf,
  dockerGate,
  type DockerNodeProcess,
  networkOf,
  removeContainersOf,
  startDockerNode,
  until,
} from "./_docker.ts";

const gate = await dockerGate("docker E2B suite");

/** Where the SDK is pointed: the three settings of E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY. */
interface Target {
  opts: { apiUrl: string; sandboxUrl: string; apiKey: string };
  /** The node id whose containers the sandboxes are (the `dormice.node` label). */
  nodeId: string;
  close(): Promise<void>;
}

/** The engine state ("running", "paused", ...) of a sandbox's container. */
async function containerState(nodeId: string, sandboxId: string): Promise<string | undefined> {
  const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
  const [c] = await docker.listContainers({
    all: true,
    filters: { label: [`dormice.node=${nodeId}`, `dormice.sandbox=${sandboxId}`] },
  });
  return c?.State;
}

/** A gateway with one node on the Docker executor behind it; the SDK talks to the gateway. */
async function dockerFleet(): Promise<Target> {
  const nodeId = `dke2b-${crypto.randomUUID().slice(0, 8)}`;
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  let node: DockerNodeProcess | undefined;
  try {
    node = await startDockerNode({
      token: gw.token,
      gatewayUrl: gw.url,
      nodeId,
      // The safety sweep a day apart: a deadline applied while a test runs is its own timer's.
      env: { DORMICE_SCAN_INTERVAL_SECONDS: "86400" },
    });
    await until("the docker node to be up at the gateway", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.some((n: { id: string; state: string }) =>
        n.id === nodeId && n.state === "up"
      );
    });
  } catch (error) {
    await node?.stop();
    await gw.stop();
    throw error;
  }
  return {
    opts: { apiUrl: `${gw.url}/e2b/api`, sandboxUrl: `${gw.url}/e2b/envd`, apiKey: gw.token },
    nodeId,
    async close() {
      await node?.stop();
      await gw.stop();
    },
  };
}

/** The subset: every step works on real containers. */
async function exam(t: Deno.TestContext, target: Target): Promise<void> {
  const { opts, nodeId } = target;
  let sandbox!: Sandbox;

  const created = await t.step("Sandbox.create() builds a container; a name is kept", async () => {
    sandbox = await Sandbox.create(opts);
    assert.equal(await containerState(nodeId, sandbox.sandboxId), "running");
    const a = await Sandbox.create({ ...opts, metadata: { name: "dk-agent" } });
    const b = await Sandbox.create({ ...opts, metadata: { name: "dk-agent" } });
    assert.equal(a.sandboxId, b.sandboxId);
    assert.equal(await a.kill(), true);
  });
  if (!created) return;

  await t.step("commands.run runs under /bin/bash -l: output and exit codes", async () => {
    const r = await sandbox.commands.run("echo hi $((6 * 7)); echo $0");
    assert.equal(r.stdout, "hi 42\n/bin/bash\n");
    assert.equal(r.exitCode, 0);
    const error = await sandbox.commands.run("echo oops >&2; exit 3").catch((e) => e);
    assert.ok(error instanceof CommandExitError, String(error));
    assert.equal(error.exitCode, 3);
    assert.equal(error.stderr, "oops\n");
    const env = await sandbox.commands.run("echo $X; pwd", { envs: { X: "y" }, cwd: "/tmp" });
    assert.equal(env.stdout, "y\n/tmp\n");
  });

  await t.step(
    "the default template is the Debian base: python3, pip, git, curl, sudo without a password",
    async () => {
      const py = await sandbox.commands.run("python3 -c 'print(1+1)'");
      assert.equal(py.stdout, "2\n");
      const sudo = await sandbox.commands.run("sudo -n true && sudo -n id -un");
      assert.deepEqual([sudo.stdout, sudo.stderr], ["root\n", ""]);
      const tools = await sandbox.commands.run(
        "python3 -m pip --version >/dev/null && git --version >/dev/null && " +
          "curl --version >/dev/null && ps -o comm= -p $$ && echo $HOME",
      );
      assert.equal(tools.stdout, "bash\n/home/user\n");
      const root = await sandbox.commands.run("id -un; touch /opt/made-by-root", { user: "root" });
      assert.equal(root.stdout, "root\n");
    },
  );

  await t.step(
    "onStdout streams: the first line arrives while the command still runs",
    async () => {
      // The command waits for a file this test writes only after seeing the first line, so the
      // line must have been streamed, not buffered until the end (no clock involved).
      let sawFirst!: () => void;
      const first = new Promise<void>((resolve) => sawFirst = resolve);
      const chunks: string[] = [];
      const handle = await sandbox.commands.run(
        "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second",
        {
          background: true,
          onStdout: (text) => {
            chunks.push(text);
            if (chunks.join("").includes("first\n")) sawFirst();
          },
        },
      );
      await first;
      assert.equal(chunks.join(""), "first\n");
      await sandbox.files.write("/tmp/go", "");
      const done = await handle.wait();
      assert.equal(done.stdout, "first\nsecond\n");
    },
  );

  await commandFidelitySteps(t, sandbox, opts);

  await t.step("files: binary write/read, list, makeDir, exists, remove", async () => {
    const bytes = new Uint8Array(512).map((_, i) => (i * 7) % 256);
    await sandbox.files.write("/tmp/f/b.bin", bytes.buffer);
    assert.deepEqual(await sandbox.files.read("/tmp/f/b.bin", { format: "bytes" }), bytes);
    await sandbox.files.write("rel.txt", "relative\n");
    assert.equal((await sandbox.commands.run("cat ~/rel.txt")).stdout, "relative\n");
    assert.equal(await sandbox.files.makeDir("/tmp/f/d"), true);
    assert.equal(await sandbox.files.makeDir("/tmp/f/d"), false);
    const names = (await sandbox.files.list("/tmp/f")).map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ["b.bin:file", "d:dir"]);
    assert.equal(await sandbox.files.exists("/tmp/f/b.bin"), true);
    await sandbox.files.remove("/tmp/f/b.bin");
    assert.equal(await sandbox.files.exists("/tmp/f/b.bin"), false);
    // envd's remove of a missing path succeeds.
    await sandbox.files.remove("/tmp/f/b.bin");
    const missing = await sandbox.files.read("/tmp/f/b.bin").catch((e) => e);
    assert.equal(missing?.name, "FileNotFoundError");
  });

  await t.step(
    "files honour user root: makeDir in /opt, list /root, root owns its write",
    async () => {
      const asRoot = { user: "root" } as const;
      assert.equal(await sandbox.files.makeDir("/opt/x", asRoot), true);
      await sandbox.files.write("/root/r.txt", "r", asRoot);
      const listed = await sandbox.files.list("/root", asRoot);
      assert.ok(listed.some((e) => e.name === "r.txt"), JSON.stringify(listed));
      assert.equal(await sandbox.files.read("/root/r.txt", asRoot), "r");
      const owners = await sandbox.commands.run("stat -c %U /root/r.txt /opt/x", asRoot);
      assert.equal(owners.stdout, "root\nroot\n");
      await sandbox.files.write("/tmp/mine.txt", "m");
      assert.equal((await sandbox.commands.run("stat -c %U /tmp/mine.txt")).stdout, "user\n");
    },
  );

  await t.step("entries carry envd's metadata; a symlink its absolute target", async () => {
    await sandbox.files.makeDir("/tmp/meta/sub");
    await sandbox.files.write("/tmp/meta/f.txt", "hello");
    await sandbox.commands.run("cd /tmp/meta && ln -s f.txt lf && ln -s sub ls");
    const entries = new Map((await sandbox.files.list("/tmp/meta")).map((e) => [e.name, e]));
    const file = entries.get("f.txt")!;
    assert.deepEqual(
      [file.type, file.size, file.mode, file.permissions, file.owner, file.group],
      ["file", 5, 0o644, "-rw-r--r--", "user", "user"],
    );
    assert.ok(file.modifiedTime instanceof Date && file.modifiedTime.getTime() > 1.6e12);
    const dir = entries.get("sub")!;
    assert.deepEqual([dir.type, dir.mode, dir.permissions], ["dir", 0o755, "drwxr-xr-x"]);
    assert.ok(dir.size > 0, `a directory's size is its own: ${dir.size}`);
    // envd describes a link by what it leads to, with the absolute target.
    const link = await sandbox.files.getInfo("/tmp/meta/lf");
    assert.deepEqual(
      [link.type, link.symlinkTarget, link.permissions],
      ["file", "/tmp/meta/f.txt", "Lrwxrwxrwx"],
    );
    assert.equal(entries.get("ls")?.type, "dir");
    assert.equal(entries.get("ls")?.symlinkTarget, "/tmp/meta/sub");
  });

  await t.step("files.write keeps metadata as xattrs: getInfo and list show it", async () => {
    const metadata = { owner: "ana" };
    const written = await sandbox.files.write("/tmp/md/a.txt", "x", { metadata });
    assert.deepEqual(written.metadata, metadata);
    await sandbox.files.write("/tmp/md/plain.txt", "y");
    assert.deepEqual((await sandbox.files.getInfo("/tmp/md/a.txt")).metadata, metadata);
    // A command editing the file in place keeps it: it lives on the file, not in the node.
    await sandbox.commands.run("echo more >> /tmp/md/a.txt");
    const listed = new Map((await sandbox.files.list("/tmp/md")).map((e) => [e.name, e]));
    assert.deepEqual(listed.get("a.txt")?.metadata, metadata);
    assert.equal(listed.get("plain.txt")?.metadata, undefined);
    const attr = await sandbox.commands.run("getfattr --only-values -n user.e2b.owner a.txt", {
      cwd: "/tmp/md",
    });
    assert.equal(attr.stdout, "ana");
  });

  await t.step("files.read reads a virtual file like cat does", async () => {
    const version = await sandbox.files.read("/proc/version");
    assert.match(version, /^Linux version /);
    assert.equal(version, (await sandbox.commands.run("cat /proc/version")).stdout);
  });

  await t.step(
    "files.watchDir: envd's three events for a write, commands' changes too",
    async () => {
      await sandbox.files.makeDir("/tmp/wd/nested");
      const flat: string[] = [];
      const deep: { name: string; type: string; size?: number }[] = [];
      const w1 = await sandbox.files.watchDir("/tmp/wd", (e) => {
        flat.push(`${e.type} ${e.name}`);
      });
      const w2 = await sandbox.files.watchDir("/tmp/wd", (e) => {
        deep.push({ name: e.name, type: e.type, size: e.entry?.size });
      }, { recursive: true, includeEntry: true });
      try {
        await sandbox.files.write("/tmp/wd/a.txt", "abc");
        await until("the write's events", () => Promise.resolve(flat.length >= 3));
        assert.deepEqual(flat.splice(0), ["create a.txt", "chmod a.txt", "write a.txt"]);
        await sandbox.commands.run(
          "echo made > /tmp/wd/nested/by-cmd.txt; mv /tmp/wd/a.txt /tmp/wd/b.txt",
        );
        await until("the command's changes", () =>
          Promise.resolve(
            flat.includes("create b.txt") &&
              deep.some((e) => e.name === "nested/by-cmd.txt" && e.type === "write"),
          ));
        assert.ok(flat.includes("rename a.txt"), flat.join(", "));
        assert.ok(!flat.some((e) => e.includes("nested/")), "not recursive: " + flat.join(", "));
        const written = deep.find((e) => e.name === "nested/by-cmd.txt" && e.type === "write");
        assert.equal(written?.size, 5, "includeEntry: the entry comes with the event");
      } finally {
        await w1.stop();
        await w2.stop();
      }
      const missing = await sandbox.files.watchDir("/tmp/no-such-dir", () => {}).catch((e) => e);
      assert.equal(missing?.name, "FileNotFoundError");
    },
  );

  await t.step("pause freezes the container; connect thaws it with its processes", async () => {
    const sleeper = await sandbox.commands.run("sleep 300", { background: true });
    assert.equal(await sandbox.pause(), true);
    assert.equal((await sandbox.getInfo()).state, "paused");
    assert.equal(await containerState(nodeId, sandbox.sandboxId), "paused");
    const again = await Sandbox.connect(sandbox.sandboxId, opts);
    assert.equal((await again.getInfo()).state, "running");
    assert.equal(await containerState(nodeId, sandbox.sandboxId), "running");
    assert.equal((await again.commands.run("echo back")).stdout, "back\n");
    assert.ok((await again.commands.list()).some((p) => p.pid === sleeper.pid));
    assert.equal(await sleeper.kill(), true);
    const ended = await sleeper.wait().catch((e) => e);
    assert.ok(ended instanceof CommandExitError, String(ended));
  });

  await t.step("getInfo() reports the container's own cpu and memory limits", async () => {
    const info = await sandbox.getInfo();
    const [metric] = await sandbox.getMetrics();
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    const [c] = await docker.listContainers({
      filters: { label: [`dormice.node=${nodeId}`, `dormice.sandbox=${sandbox.sandboxId}`] },
    });
    const host = (await docker.getContainer(c.Id).inspect()).HostConfig;
    assert.equal(info.cpuCount, Math.ceil((host.NanoCpus ?? 0) / 1e9));
    assert.equal(info.memoryMB * 1024 * 1024, host.Memory);
    assert.equal(metric.cpuCount, info.cpuCount);
    assert.equal(metric.memTotal, host.Memory);
  });

  await t.step("a timeout kills or pauses the container by its own timer", async () => {
    const short = await Sandbox.create(opts);
    const pausing = await Sandbox.create({ ...opts, lifecycle: { onTimeout: "pause" } });
    await Promise.all([short.setTimeout(2_000), pausing.setTimeout(2_000)]);
    // The node's sweep is a day away (dockerFleet): only the deadline timer can do these, so the
    // bounds below only keep a broken timer from hanging the test.
    await until(
      "the kill deadline",
      async () => await containerState(nodeId, short.sandboxId) === undefined,
      30_000,
    );
    await until(
      "the pause deadline",
      async () => await containerState(nodeId, pausing.sandboxId) === "paused",
      30_000,
    );
    assert.equal((await pausing.getInfo()).state, "paused");
    assert.equal(await pausing.kill(), true);
  });

  await t.step("autoResume: a command resumes the paused container; without it, no", async () => {
    const waking = await Sandbox.create({
      ...opts,
      lifecycle: { onTimeout: "pause", autoResume: true },
    });
    const staying = await Sandbox.create({ ...opts, lifecycle: { onTimeout: "pause" } });
    await Promise.all([waking.pause(), staying.pause()]);
    assert.equal(await containerState(nodeId, waking.sandboxId), "paused");
    assert.equal((await waking.commands.run("echo resumed")).stdout, "resumed\n");
    assert.equal(await containerState(nodeId, waking.sandboxId), "running");
    assert.equal(await staying.isRunning(), false);
    assert.ok((await staying.commands.run("echo no").catch((e) => e)) instanceof Error);
    assert.equal(await containerState(nodeId, staying.sandboxId), "paused");
    await Promise.all([waking.kill(), staying.kill()]);
  });

  await t.step(
    "allowInternetAccess picks the container's network: internal unless asked",
    async () => {
      // Only the container's configuration is checked: this test never reaches an outside address.
      const networkMode = async (sandboxId: string) => {
        const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
        const [c] = await docker.listContainers({
          filters: { label: [`dormice.node=${nodeId}`, `dormice.sandbox=${sandboxId}`] },
        });
        return (await docker.getContainer(c.Id).inspect()).HostConfig.NetworkMode;
      };
      const open = await Sandbox.create({ ...opts, allowInternetAccess: true });
      const closed = await Sandbox.create({ ...opts, allowInternetAccess: false });
      // With egress: the node's own egress network (inter-container traffic off), not bridge.
      assert.equal(await networkMode(open.sandboxId), await networkOf(nodeId, "egress"));
      // Without egress: the node's --internal network, which forwards nothing out.
      const internal = await networkOf(nodeId, "internal");
      assert.equal(await networkMode(closed.sandboxId), internal);
      assert.equal(await networkMode(sandbox.sandboxId), internal, "the default is no egress");
      assert.equal((await open.getInfo()).allowInternetAccess, true);
      assert.equal((await closed.getInfo()).allowInternetAccess, false);
      await Promise.all([open.kill(), closed.kill()]);
    },
  );

  await t.step(
    "an unknown template is the gateway's 400 naming the fleet's templates",
    async () => {
      const error = await Sandbox.create("no-such-template", opts).catch((e) => e);
      assert.ok(error instanceof SandboxError, String(error));
      assert.match(
        error.message,
        // No node holds it, so the gateway answers before any node is asked.
        /^400: No node of the fleet has template 'no-such-template': the fleet offers base/,
      );
    },
  );

  await t.step("getMetrics() answers the container's history within start and end", async () => {
    const samples = await sandbox.getMetrics();
    assert.ok(samples.length >= 1);
    assert.ok(samples.every((m) => m.cpuCount === 1 && m.memUsed > 0));
    const last = samples.at(-1)!.timestamp;
    const fromLast = await sandbox.getMetrics({ start: last, end: new Date() });
    assert.ok(fromLast.length >= 1 && fromLast.length <= samples.length);
    const before = await sandbox.getMetrics({
      start: new Date(Date.now() - 3_600_000),
      end: new Date(Date.now() - 1_800_000),
    });
    assert.deepEqual(before, []);
  });

  await t.step("kill() removes the container: true, then false", async () => {
    assert.equal(await sandbox.kill(), true);
    assert.equal(await containerState(nodeId, sandbox.sandboxId), undefined);
    assert.equal(await Sandbox.kill(sandbox.sandboxId, opts), false);
    assert.deepEqual(await containersOf(nodeId), []);
  });
}

Deno.test({
  name: "docker E2B suite: the e2b SDK drives real containers",
  ignore: gate.skip,
  // The SDK keeps pooled keep-alive connections, dockerode its unix sockets.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const target = await dockerFleet();
  try {
    await exam(t, target);
  } finally {
    await target.close();
    await removeContainersOf([target.nodeId]);
  }
});
