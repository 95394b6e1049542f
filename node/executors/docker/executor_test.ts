import assert from "node:assert/strict";
import Docker from "dockerode";
import { DockerExecutor } from "./executor.ts";
import { DEFAULT_DOCKER_SOCKET } from "./engine.ts";
import type { DockerEngine } from "./engine.ts";
import { ExecutorError } from "../contract.ts";
import { dockerReadiness } from "./_fixtures_test.ts";

/** An engine that never answers until the caller gives up, like a hung dockerd. */
function hungEngine(seen: AbortSignal[]): DockerEngine {
  const hang = (options: { abortSignal?: AbortSignal }) =>
    new Promise<never>((_, reject) => {
      const signal = options.abortSignal!;
      seen.push(signal);
      signal.addEventListener("abort", () => reject(new Error("aborted")), { once: true });
    });
  const container = {
    inspect: hang,
    start: hang,
    remove: hang,
    pause: hang,
    unpause: hang,
    exec: hang,
    putArchive: (_tar: Uint8Array, options: { abortSignal?: AbortSignal }) => hang(options),
    getArchive: hang,
    stats: hang,
  };
  return {
    ping: hang,
    getImage: () => ({ inspect: hang }),
    getContainer: () => container,
    createContainer: hang,
    listContainers: hang,
  } as unknown as DockerEngine;
}

Deno.test("DockerExecutor gives every engine call its own deadline", async () => {
  const seen: AbortSignal[] = [];
  const executor = new DockerExecutor({
    nodeId: "n1",
    docker: hungEngine(seen),
    callTimeoutMs: 20,
  });
  const code = async (promise: Promise<unknown>) => {
    try {
      await promise;
    } catch (error) {
      assert.ok(error instanceof ExecutorError);
      return error.code;
    }
    return "resolved";
  };
  assert.equal(await code(executor.list()), "timeout");
  assert.equal(await code(executor.pause("sb1")), "timeout");
  assert.equal(
    await code(executor.create({ id: "sb1", name: "a", template: "base", spec: {}, env: {} })),
    "timeout",
  );
  assert.equal(await code(executor.exec("sb1", { cmd: ["true"] })), "timeout");
  assert.ok(seen.length >= 4 && seen.every((signal) => signal.aborted), "each call was aborted");
  await executor.close();
});

Deno.test("DockerExecutor.connect() refuses a hung engine with a sentence naming the socket", async () => {
  const executor = DockerExecutor.connect({
    nodeId: "n1",
    docker: hungEngine([]),
    socketPath: "/run/test-docker.sock",
    callTimeoutMs: 20,
  });
  await assert.rejects(executor, (error: unknown) => {
    assert.ok(error instanceof ExecutorError);
    assert.equal(error.code, "unavailable");
    assert.match(error.message, /\/run\/test-docker\.sock/);
    assert.match(error.message, /dockerd/);
    return true;
  });
});

Deno.test("DockerExecutor.create() names the known templates for an unknown one", async () => {
  const executor = new DockerExecutor({ nodeId: "n1", docker: hungEngine([]) });
  await assert.rejects(
    executor.create({ id: "sb1", name: "a", template: "ruby", spec: {}, env: {} }),
    (error: unknown) =>
      error instanceof ExecutorError && error.code === "invalid" &&
      /use one of base/.test(error.message),
  );
});

// ---- Against a real engine (same gate as the contract suite) -------------------------------

const onCi = Deno.env.get("CI") === "true";
const readiness = await dockerReadiness();
const notReady = readiness.ready ? null : readiness.why;
if (notReady && !onCi) console.log(`docker_executor_test: engine cases skipped: ${notReady}`);

/** A case on a fresh sandbox of `template`: `minimal` (busybox, fast) unless it needs Debian. */
function engineTest(
  name: string,
  fn: (executor: DockerExecutor, id: string, nodeId: string) => Promise<void>,
  template = "minimal",
) {
  Deno.test({
    name: `DockerExecutor ${name}`,
    ignore: notReady !== null && !onCi,
    // dockerode's node:http agent keeps its unix sockets to the engine open between calls.
    sanitizeOps: false,
    sanitizeResources: false,
    fn: async () => {
      if (notReady) throw new Error(`CI=true, so the Docker cases must run, but ${notReady}`);
      const nodeId = `unit-${Math.random().toString(36).slice(2, 8)}`;
      const executor = new DockerExecutor({ nodeId });
      const id = "sb1";
      await executor.create({
        id,
        name: "unit",
        template,
        spec: { memoryMB: 96 },
        env: {},
      });
      try {
        await fn(executor, id, nodeId);
      } finally {
        await executor.destroy(id);
        await executor.close();
      }
    },
  });
}

async function sh(executor: DockerExecutor, id: string, script: string, user?: string) {
  const handle = await executor.exec(id, { cmd: ["/bin/bash", "-l", "-c", script], user });
  const [stdout, stderr, exit] = await Promise.all([
    new Response(handle.stdout).text(),
    new Response(handle.stderr).text(),
    handle.exited,
  ]);
  return { stdout, stderr, code: exit.exitCode };
}

engineTest(
  "isolates the sandbox: no route out, non-root without capabilities, root's narrow set, limits",
  async (ex, id) => {
    // One interface besides lo: the node's internal network, which the node reaches ports
    // through and whose bridge forwards nothing out (Docker's --internal).
    const r = await sh(
      ex,
      id,
      "id -un; ls /sys/class/net | tr '\\n' ' '; grep CapEff /proc/self/status",
    );
    assert.equal(r.stdout, "user\neth0 lo CapEff:\t0000000000000000\n");
    // CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7,
    // NET_BIND_SERVICE 10, AUDIT_WRITE 29: no NET_RAW (13), SYS_CHROOT (18), MKNOD (27) or
    // SYS_PTRACE (19), which Docker's default set would give.
    const root = await sh(ex, id, "grep CapEff /proc/self/status", "root");
    assert.equal(root.stdout, "CapEff:\t00000000200004fb\n");
    const stats = await ex.stats(id);
    assert.equal(stats.memoryLimitBytes, 96 * 1024 * 1024);
    assert.equal(stats.cpuCount, 1);
  },
);

engineTest("kill() reaches the command's descendants and spares other commands", async (ex, id) => {
  const bystander = await ex.exec(id, { cmd: ["/bin/bash", "-c", "sleep 30"] });
  const target = await ex.exec(id, {
    cmd: ["/bin/bash", "-c", "sleep 31 & sleep 32 & wait"],
  });
  await target.kill("SIGTERM");
  await Promise.all([new Response(target.stdout).text(), new Response(target.stderr).text()]);
  assert.equal((await target.exited).exitCode, 143);
  const left = await sh(ex, id, "ps -o args | grep '^sleep 3' | sort");
  assert.equal(left.stdout, "sleep 30\n", "only the bystander's sleep remains");
  await bystander.kill();
  await Promise.all([new Response(bystander.stdout).text(), new Response(bystander.stderr).text()]);
  assert.equal((await bystander.exited).signal, "SIGKILL");
});

engineTest("keeps odd file names intact and follows symlinks on read", async (ex, id) => {
  const odd = '/tmp/odd/it\'s a "name"\nwith a newline.txt';
  await ex.writeFile(id, odd, new TextEncoder().encode("odd"));
  const entries = await ex.listDir(id, "/tmp/odd");
  assert.deepEqual(entries.map((e) => e.path), [odd]);
  assert.equal((await ex.stat(id, odd)).size, 3);
  await sh(ex, id, "ln -s /etc/group /tmp/odd/link");
  const link = await ex.stat(id, "/tmp/odd/link");
  assert.equal(link.type, "symlink");
  assert.equal(link.symlinkTarget, "/etc/group");
  assert.equal(
    new TextDecoder().decode(await ex.readFile(id, "/tmp/odd/link")),
    "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n",
  );
});

engineTest(
  "lists only what its own instance made, even beside its node id's twin",
  async (ex, id, nodeId) => {
    assert.deepEqual(await ex.list(), [id]);
    const other = new DockerExecutor({ nodeId: "some-other-node-unit" });
    assert.ok(!(await other.list()).includes(id));
    await other.close();
    // Another data dir of the same node id (a second copy of a fleet): not its container, and not
    // an older one either, so its boot neither removes nor adopts it.
    const twin = new DockerExecutor({ nodeId });
    assert.notEqual(twin.instanceId, ex.instanceId);
    assert.deepEqual(await twin.list(), []);
    assert.deepEqual(await twin.legacy(), []);
    await twin.close();
    // The same instance after a restart finds it again.
    const again = new DockerExecutor({ nodeId, instanceId: ex.instanceId });
    assert.deepEqual(await again.list(), [id]);
    await again.close();
  },
);

engineTest(
  "names a container from before instance labels as legacy, and destroys it by id",
  async (ex, _id, nodeId) => {
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    // What a node made before instance labels: the node id and the sandbox id, nothing more.
    const old = await docker.createContainer({
      name: `dormice-${nodeId}-sbx_older`,
      Image: "dormice-minimal:latest",
      Entrypoint: ["sleep"],
      Cmd: ["60"],
      Labels: { "dormice.node": nodeId, "dormice.sandbox": "sbx_older" },
      HostConfig: { NetworkMode: "none" },
    });
    try {
      assert.deepEqual(await ex.legacy(), ["sbx_older"]);
      assert.ok(!(await ex.list()).includes("sbx_older"), "not proven its own");
      await ex.destroy("sbx_older");
      assert.deepEqual(await ex.legacy(), []);
    } finally {
      await old.remove({ force: true }).catch(() => {});
    }
  },
);

engineTest("runs a command as root only when asked by name", async (ex, id) => {
  assert.equal((await sh(ex, id, "id -un", "root")).stdout, "root\n");
  assert.equal((await sh(ex, id, "id -un", "someone-else")).stdout, "user\n");
});

// The Debian image runs GNU coreutils, procps and dash where the minimal one runs busybox: the
// executor's helper scripts (stat, list, kill by token) must read both the same way.
engineTest("runs its helper scripts on the Debian base image, and sudo works", async (ex, id) => {
  const odd = '/tmp/odd/it\'s a "name"\nwith a newline.txt';
  await ex.writeFile(id, odd, new TextEncoder().encode("odd"));
  await sh(
    ex,
    id,
    'cd /tmp/odd && ln -s "it\'s a \\"name\\"" rel && ln -s /etc/group abs && mkdir d',
  );
  const entries = await ex.listDir(id, "/tmp/odd");
  assert.deepEqual(
    entries.map((e) => [e.path, e.type, e.symlinkTarget]),
    [
      ["/tmp/odd/abs", "symlink", "/etc/group"],
      ["/tmp/odd/d", "dir", undefined],
      [odd, "file", undefined],
      // envd's target: absolute, every hop followed.
      ["/tmp/odd/rel", "symlink", `/tmp/odd/it's a "name"`],
    ],
  );
  const file = await ex.stat(id, odd);
  assert.deepEqual([file.size, file.owner, file.mode], [3, "user", 0o644]);
  assert.match(new TextDecoder().decode(await ex.readFile(id, "/tmp/odd/abs")), /^user:x:1000:/m);
  await ex.move(id, "/tmp/odd/d", "/tmp/odd/e");
  await ex.remove(id, "/tmp/odd/e");
  assert.equal(await ex.makeDir(id, "/tmp/odd/f/g"), true);

  const target = await ex.exec(id, { cmd: ["/bin/bash", "-c", "sleep 31 & sleep 32 & wait"] });
  await target.kill("SIGTERM");
  await Promise.all([new Response(target.stdout).text(), new Response(target.stderr).text()]);
  assert.equal((await target.exited).exitCode, 143);
  assert.equal((await sh(ex, id, "ps -eo args | grep -c '^sleep 3'")).stdout, "0\n");

  const r = await sh(ex, id, "sudo -n id -u && python3 -c 'print(1+1)' && sudo -n touch /opt/x");
  assert.deepEqual([r.stdout, r.stderr, r.code], ["0\n2\n", "", 0]);
}, "base");

// What root (a command run as root, or sudo) tries against the machine, one line per attempt:
// the attempt's name and how it ended. Python gives the kernel's own errno where a tool would
// print a sentence.
const ROOT_ATTEMPTS = String.raw`
mount -t tmpfs none /mnt 2>/dev/null; echo "mount-tmpfs $?"
mount --bind /tmp /mnt 2>/dev/null; echo "mount-bind $?"
unshare -Urm true 2>/dev/null; echo "unshare-userns $?"
echo h 2>/dev/null >/proc/sysrq-trigger; echo "sysrq $?"
python3 - "$HOST_PID" <<'EOF'
import ctypes, errno, os, socket, sys
def report(name, call):
    try:
        call()
        print(name, "allowed")
    except OSError as e:
        print(name, errno.errorcode[e.errno])
libc = ctypes.CDLL(None, use_errno=True)
def syscall(*args):
    if libc.syscall(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
report("raw-socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
report("packet-socket", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
null = os.open("/dev/null", os.O_RDONLY)
report("finit_module", lambda: syscall(313, null, b"", 0))
report("init_module", lambda: syscall(175, None, 0, b""))
report("ptrace-host-pid", lambda: syscall(101, 16, int(sys.argv[1]), None, None))
EOF
echo "docker-socket $(find / -xdev \( -name docker.sock -o -name containerd.sock \) 2>/dev/null | wc -l)"
echo "pid-ns $(readlink /proc/self/ns/pid)"
ps -eo comm= >/tmp/processes
echo "processes $(sort -u /tmp/processes | tr '\n' ' ')"
grep -E '^(CapBnd|NoNewPrivs)' /proc/self/status | tr -d '\t' | tr ':' ' '
`;

engineTest(
  "keeps root from the machine: no mount, raw socket, module, sysrq, host process or Docker socket",
  async (ex, id) => {
    const handle = await ex.exec(id, {
      cmd: ["/bin/bash", "-c", ROOT_ATTEMPTS],
      user: "root",
      env: { HOST_PID: String(Deno.pid) },
    });
    const [out, err] = await Promise.all([
      new Response(handle.stdout).text(),
      new Response(handle.stderr).text(),
    ]);
    assert.equal((await handle.exited).exitCode, 0, err);
    const said = Object.fromEntries(
      out.trim().split("\n").map((line) => [line.split(" ")[0], line.slice(line.indexOf(" ") + 1)]),
    );
    // Measured 2026-12-04 (Docker 20.10.24, kernel 6.18): mount 32 is mount(8)'s "permission
    // denied"; unshare fails as the default seccomp profile refuses new user namespaces to a
    // process without SYS_ADMIN; the kernel here has no /proc/sysrq-trigger, and where it has
    // one Docker mounts it read-only.
    assert.equal(said["mount-tmpfs"], "32");
    assert.equal(said["mount-bind"], "32");
    assert.notEqual(said["unshare-userns"], "0");
    assert.notEqual(said.sysrq, "0");
    assert.equal(said["raw-socket"], "EPERM", "NET_RAW is not granted");
    assert.equal(said["packet-socket"], "EPERM");
    assert.equal(said.finit_module, "EPERM", "SYS_MODULE is not granted");
    assert.equal(said.init_module, "EPERM");
    // The node (this test process) is not in the sandbox's pid namespace at all.
    assert.equal(said["ptrace-host-pid"], "ESRCH");
    // Through readlink: Deno grants /proc/self only to --allow-all.
    const hostNs = await new Deno.Command("readlink", { args: ["/proc/self/ns/pid"] }).output();
    assert.match(said["pid-ns"], /^pid:\[\d+\]$/);
    assert.notEqual(said["pid-ns"], new TextDecoder().decode(hostNs.stdout).trim());
    const processes = said.processes.trim().split(" ");
    assert.deepEqual(
      processes.filter((p) => !["bash", "docker-init", "ps", "python3", "sleep"].includes(p)),
      [],
      `only the sandbox's own processes are visible: ${said.processes}`,
    );
    assert.equal(said["docker-socket"], "0", "no engine socket inside");
    // The bounding set is the nine capabilities, so no setuid binary (sudo included) gains more;
    // no-new-privileges stays off for sudo's sake.
    assert.equal(said.CapBnd, "00000000200004fb");
    assert.equal(said.NoNewPrivs, "0");
  },
  "base",
);

/** An engine that answers just enough to build sandboxes, recording every create. */
function recordingEngine(refuseStorageOpt: string | null) {
  const creates: Record<string, unknown>[] = [];
  const removed: string[] = [];
  const ok = () => Promise.resolve({});
  const engine = {
    ping: ok,
    info: () =>
      Promise.resolve({ Driver: "overlay2", DriverStatus: [["Backing Filesystem", "extfs"]] }),
    getImage: () => ({ inspect: () => Promise.resolve({ Config: { User: "user" } }) }),
    getContainer: (name: string) => ({
      remove: () => (removed.push(name), Promise.resolve()),
      start: ok,
    }),
    createContainer: (options: Record<string, unknown>) => {
      creates.push(options);
      const opts = (options.HostConfig as { StorageOpt?: unknown }).StorageOpt;
      if (opts && refuseStorageOpt !== null) {
        return Promise.reject(Object.assign(new Error(refuseStorageOpt), { statusCode: 500 }));
      }
      return Promise.resolve({ start: ok });
    },
    listContainers: () => Promise.resolve([]),
    getNetwork: () => ({
      inspect: () =>
        Promise.resolve({
          Internal: true,
          Options: { "com.docker.network.bridge.enable_icc": "false" },
        }),
      remove: ok,
    }),
    createNetwork: ok,
  } as unknown as DockerEngine;
  return { engine, creates, removed };
}

Deno.test("DockerExecutor bounds each sandbox's writable layer when diskMB is set, and only then", async () => {
  const bounded = recordingEngine(null);
  const executor = await DockerExecutor.connect({
    nodeId: "n1",
    instanceId: "i1",
    docker: bounded.engine,
    // Networks are _network_test.ts's: this engine has none, and the host is not touched.
    hostFirewall: false,
    templates: new Map([["base", "img:1"]]),
    defaults: { diskMB: 64 },
  });
  // connect() probed the bound with a container it never started, then removed it.
  assert.equal(bounded.creates[0].name, "dormice-n1-disk-probe-i1");
  assert.ok(bounded.removed.includes("dormice-n1-disk-probe-i1"));
  await executor.create({ id: "sb1", name: "a", template: "base", spec: {}, env: {} });
  const hostConfig = (o: Record<string, unknown>) => o.HostConfig as Record<string, unknown>;
  assert.deepEqual(hostConfig(bounded.creates.at(-1)!).StorageOpt, { size: "64M" });

  const unbounded = recordingEngine(null);
  const plain = await DockerExecutor.connect({
    nodeId: "n1",
    docker: unbounded.engine,
    // Networks are _network_test.ts's: this engine has none, and the host is not touched.
    hostFirewall: false,
    templates: new Map([["base", "img:1"]]),
  });
  await plain.create({ id: "sb1", name: "a", template: "base", spec: {}, env: {} });
  assert.equal(unbounded.creates.length, 1, "no probe without a bound");
  assert.equal(hostConfig(unbounded.creates[0]).StorageOpt, undefined);
});

Deno.test("DockerExecutor.connect() refuses a disk bound the storage driver cannot keep", async () => {
  const refusing = recordingEngine(
    "--storage-opt is supported only for overlay over xfs with 'pquota' mount option",
  );
  const error = await DockerExecutor.connect({
    nodeId: "n1",
    instanceId: "i1",
    docker: refusing.engine,
    // Networks are _network_test.ts's: this engine has none, and the host is not touched.
    hostFirewall: false,
    templates: new Map([["base", "img:1"]]),
    defaults: { diskMB: 64 },
  }).catch((e) => e);
  assert.ok(error instanceof ExecutorError, String(error));
  assert.match(
    error.message,
    /^A disk bound of 64 MiB per sandbox \(DORMICE_SANDBOX_DISK_MB\) needs a storage driver .* \(overlay2 on extfs\) refuses it: .*only for overlay over xfs.*Unset DORMICE_SANDBOX_DISK_MB, or/,
  );
  assert.ok(refusing.removed.includes("dormice-n1-disk-probe-i1"), "no probe left behind");
});

engineTest(
  "reads a file whole and refuses a directory from its archive's first entry",
  async (ex, id) => {
    await sh(ex, id, "mkdir -p /tmp/tree && head -c 3000000 /dev/urandom > /tmp/tree/big");
    const big = await ex.readFile(id, "/tmp/tree/big");
    assert.equal(big.length, 3_000_000);
    const sum = await sh(ex, id, "md5sum /tmp/tree/big | cut -d' ' -f1");
    const { createHash } = await import("node:crypto");
    assert.equal(createHash("md5").update(big).digest("hex"), sum.stdout.trim());
    // The directory's archive holds the 3 MB file too; the first entry says it is a directory.
    await assert.rejects(ex.readFile(id, "/tmp/tree"), /it is a directory/);
  },
);
