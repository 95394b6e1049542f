import assert from "node:assert/strict";
import { ExecutorError } from "./contract.ts";
import { FakeExecutor } from "./fake.ts";

const encoder = new TextEncoder();
const decoder = new TextDecoder();

async function withSandbox(
  fn: (executor: FakeExecutor, id: string) => Promise<void>,
): Promise<void> {
  const executor = new FakeExecutor();
  await executor.create({
    id: "sbx_1",
    name: "a",
    template: "base",
    spec: {},
    env: { GREETING: "hi" },
  });
  try {
    await fn(executor, "sbx_1");
  } finally {
    await executor.close();
  }
}

async function run(
  executor: FakeExecutor,
  id: string,
  cmd: string[] | string,
  extra: { cwd?: string; env?: Record<string, string> } = {},
): Promise<{ exitCode: number; stdout: string; stderr: string; signal?: string }> {
  const argv = typeof cmd === "string" ? ["/bin/bash", "-l", "-c", cmd] : cmd;
  const handle = await executor.exec(id, { cmd: argv, ...extra });
  const [stdout, stderr, exit] = await Promise.all([
    new Response(handle.stdout).text(),
    new Response(handle.stderr).text(),
    handle.exited,
  ]);
  return { ...exit, stdout, stderr };
}

Deno.test("FakeExecutor runs the E2B SDK's bash -l -c wrapping", async () => {
  await withSandbox(async (executor, id) => {
    assert.deepEqual(await run(executor, id, "echo hi"), {
      exitCode: 0,
      stdout: "hi\n",
      stderr: "",
    });
    assert.deepEqual(await run(executor, id, ["sh", "-c", "printf '%s-%d\\n' a 3"]), {
      exitCode: 0,
      stdout: "a-3\n",
      stderr: "",
    });
    assert.equal((await run(executor, id, ["echo", "direct", "argv"])).stdout, "direct argv\n");
  });
});

Deno.test("FakeExecutor interprets quotes, variables, ;, && and ||", async () => {
  await withSandbox(async (executor, id) => {
    const r = await run(
      executor,
      id,
      `echo "$GREETING $WHO" '$GREETING'; export X=1; echo $X && false || echo "after $?"; true && echo ok`,
      { env: { WHO: "there" } },
    );
    assert.equal(r.stdout, "hi there $GREETING\n1\nafter 1\nok\n");
    assert.equal((await run(executor, id, "pwd; cd /tmp && pwd")).stdout, "/home/user\n/tmp\n");
    assert.equal((await run(executor, id, "pwd", { cwd: "/tmp" })).stdout, "/tmp\n");
    assert.equal((await run(executor, id, "A=5; echo ${A}x")).stdout, "5x\n");
  });
});

Deno.test("FakeExecutor redirects >, >>, >&2, 2>&1 and <", async () => {
  await withSandbox(async (executor, id) => {
    const r = await run(
      executor,
      id,
      "echo one > f.txt; echo two >> f.txt; cat f.txt; echo oops >&2; cat missing 2>&1; cat < f.txt > g.txt",
    );
    assert.equal(r.stdout, "one\ntwo\ncat: missing: No such file or directory\n");
    assert.equal(r.stderr, "oops\n");
    assert.equal(decoder.decode(await executor.readFile(id, "/home/user/g.txt")), "one\ntwo\n");
    const both = await run(executor, id, "bash -c 'echo x; echo y >&2' > both.txt 2>&1");
    assert.equal(both.stdout + both.stderr, "");
    assert.equal(decoder.decode(await executor.readFile(id, "both.txt")), "x\ny\n");
  });
});

Deno.test("FakeExecutor: exit codes, unknown commands and syntax errors", async () => {
  await withSandbox(async (executor, id) => {
    assert.equal((await run(executor, id, "exit 3")).exitCode, 3);
    assert.equal((await run(executor, id, "echo a; exit 4; echo b")).stdout, "a\n");
    assert.deepEqual(await run(executor, id, "nope --x"), {
      exitCode: 127,
      stdout: "",
      stderr: "nope: command not found\n",
    });
    const bad = await run(executor, id, "echo 'unclosed");
    assert.equal(bad.exitCode, 2);
    assert.match(bad.stderr, /unexpected EOF/);
    const pipe = await run(executor, id, "echo a | cat");
    assert.equal(pipe.exitCode, 2);
    assert.match(pipe.stderr, /does not support '\|'/);
  });
});

Deno.test("FakeExecutor: mkdir -p, touch, ls, rm, env", async () => {
  await withSandbox(async (executor, id) => {
    const r = await run(
      executor,
      id,
      "mkdir -p /tmp/a/b && touch /tmp/a/f && ls /tmp/a; rm -r /tmp/a/b; ls /tmp/a",
    );
    assert.equal(r.stdout, "b\nf\nf\n");
    assert.match((await run(executor, id, "env")).stdout, /^GREETING=hi$/m);
    assert.equal((await run(executor, id, "rm /nope")).exitCode, 1);
    assert.equal((await run(executor, id, "rm -f /nope")).exitCode, 0);
  });
});

Deno.test("FakeExecutor streams output as produced and sleep really waits", async () => {
  await withSandbox(async (executor, id) => {
    const handle = await executor.exec(id, { cmd: ["bash", "-c", "echo a; sleep 0.05; echo b"] });
    const reader = handle.stdout.getReader();
    const first = await reader.read();
    assert.equal(decoder.decode(first.value), "a\n");
    let exitedEarly = false;
    handle.exited.then(() => exitedEarly = true);
    await Promise.resolve();
    assert.equal(exitedEarly, false);
    assert.equal(decoder.decode((await reader.read()).value), "b\n");
    assert.equal((await reader.read()).done, true);
    assert.deepEqual(await handle.exited, { exitCode: 0 });
    await handle.stderr.cancel();
  });
});

Deno.test("FakeExecutor: kill ends a running command with SIGKILL, timeoutMs too", async () => {
  await withSandbox(async (executor, id) => {
    const handle = await executor.exec(id, { cmd: ["sleep", "30"] });
    await handle.kill();
    assert.deepEqual(await handle.exited, { exitCode: 137, signal: "SIGKILL" });
    const timed = await executor.exec(id, { cmd: ["sleep", "30"], timeoutMs: 10 });
    assert.deepEqual(await timed.exited, { exitCode: 137, signal: "SIGKILL", timedOut: true });
    await handle.kill(); // already ended: not an error
  });
});

Deno.test("FakeExecutor: cat reads stdin when started with stdin", async () => {
  await withSandbox(async (executor, id) => {
    const handle = await executor.exec(id, { cmd: ["cat"], stdin: true });
    await handle.writeStdin(encoder.encode("hello "));
    await handle.writeStdin(encoder.encode("world"));
    await handle.closeStdin();
    assert.equal(await new Response(handle.stdout).text(), "hello world");
    assert.deepEqual(await handle.exited, { exitCode: 0 });
    await assert.rejects(handle.writeStdin(encoder.encode("x")), /closed/);
    const noStdin = await executor.exec(id, { cmd: ["cat"] });
    assert.deepEqual(await noStdin.exited, { exitCode: 0 });
    await assert.rejects(noStdin.writeStdin(encoder.encode("x")), /without stdin/);
  });
});

Deno.test("FakeExecutor: printf and echo -e escapes are bytes, not UTF-8 text", async () => {
  await withSandbox(async (executor, id) => {
    const bytes = async (script: string) => {
      const handle = await executor.exec(id, { cmd: ["/bin/bash", "-c", script] });
      const out = new Uint8Array(await new Response(handle.stdout).arrayBuffer());
      await handle.exited;
      return [...out];
    };
    // The fake once printed `\xe2` as four characters; bash writes the one byte.
    assert.deepEqual(await bytes("printf '\\xe2'"), [0xe2]);
    assert.deepEqual(await bytes("printf 'a\\101\\0%s\\n' é"), [
      0x61,
      0x41,
      0x00,
      0xc3,
      0xa9,
      0x0a,
    ]);
    assert.deepEqual(await bytes("echo -e '\\x41\\0101\\q'"), [0x41, 0x41, 0x5c, 0x71, 0x0a]);
    assert.deepEqual(await bytes("echo '\\xe2'"), [...encoder.encode("\\xe2\n")]);
    assert.deepEqual(await bytes("printf '%s-%d%%\\n' a 7 b 8"), [
      ...encoder.encode("a-7%\nb-8%\n"),
    ]);
  });
});

Deno.test("FakeExecutor: bash reading stdin runs each line as it arrives", async () => {
  await withSandbox(async (executor, id) => {
    const handle = await executor.exec(id, { cmd: ["/bin/bash"], stdin: true });
    const reader = handle.stdout.getReader();
    await handle.writeStdin(encoder.encode("X=1; echo one $X\n"));
    assert.equal(decoder.decode((await reader.read()).value), "one 1\n");
    await handle.writeStdin(encoder.encode("echo two $X\nexit 3\necho never\n"));
    assert.equal(decoder.decode((await reader.read()).value), "two 1\n");
    assert.deepEqual(await handle.exited, { exitCode: 3 });
    assert.equal((await reader.read()).done, true);
  });
});

Deno.test("FakeExecutor: a tty merges stderr into stdout, keeps stdin open, and resizes", async () => {
  await withSandbox(async (executor, id) => {
    const handle = await executor.exec(id, {
      cmd: ["/bin/bash", "-i", "-l"],
      tty: { cols: 80, rows: 24 },
    });
    const reader = handle.stdout.getReader();
    await handle.writeStdin(encoder.encode("stty size; echo err >&2\n"));
    assert.equal(decoder.decode((await reader.read()).value), "24 80\n");
    assert.equal(decoder.decode((await reader.read()).value), "err\n");
    await handle.resize({ cols: 120, rows: 40 });
    await handle.writeStdin(encoder.encode("stty size\nexit\n"));
    assert.equal(decoder.decode((await reader.read()).value), "40 120\n");
    assert.deepEqual(await handle.exited, { exitCode: 0 });
    assert.equal(await new Response(handle.stderr).text(), "");
    const plain = await run(executor, id, "stty size");
    assert.equal(plain.exitCode, 1);
    assert.match(plain.stderr, /Inappropriate ioctl for device/);
    const noTty = await executor.exec(id, { cmd: ["sleep", "1"] });
    await assert.rejects(noTty.resize({ cols: 1, rows: 1 }), /no terminal/);
    await noTty.kill();
  });
});

Deno.test("FakeExecutor files: binary-safe, errors carry codes", async () => {
  await withSandbox(async (executor, id) => {
    const bytes = new Uint8Array([0, 255, 1, 2]);
    const entry = await executor.writeFile(id, "/data/x/bin", bytes);
    assert.equal(entry.size, 4);
    assert.equal(entry.type, "file");
    assert.deepEqual(await executor.readFile(id, "/data/x/bin"), bytes);
    assert.deepEqual((await executor.listDir(id, "/data", 2)).map((e) => e.path), [
      "/data/x",
      "/data/x/bin",
    ]);
    const code = async (p: Promise<unknown>) => {
      try {
        await p;
      } catch (e) {
        assert.ok(e instanceof ExecutorError);
        return e.code;
      }
      assert.fail("expected an ExecutorError");
    };
    assert.equal(await code(executor.readFile(id, "/nope")), "not_found");
    assert.equal(await code(executor.readFile(id, "/data")), "is_dir");
    assert.equal(await code(executor.writeFile(id, "/data/x/bin/y", bytes)), "not_dir");
    assert.equal(await code(executor.readFile("sbx_none", "/a")), "gone");
    assert.equal(await executor.makeDir(id, "/data"), false);
    assert.equal((await executor.move(id, "/data/x", "/moved")).type, "dir");
    assert.deepEqual(await executor.readFile(id, "/moved/bin"), bytes);
    await executor.remove(id, "/moved");
    assert.equal(await code(executor.stat(id, "/moved")), "not_found");
  });
});

Deno.test("FakeExecutor.pause() makes calls wait until resume()", async () => {
  await withSandbox(async (executor, id) => {
    await executor.pause(id);
    let done = false;
    const reading = executor.writeFile(id, "/a", encoder.encode("x")).then(() => done = true);
    for (let i = 0; i < 20; i++) await Promise.resolve();
    assert.equal(done, false);
    await executor.resume(id);
    await reading;
    assert.equal(done, true);
  });
});

Deno.test("FakeExecutorHooks park, delay, fail and count calls", async () => {
  const executor = new FakeExecutor({ templates: ["base"] });
  const release = executor.hooks.park("create");
  let landed = false;
  const creating = executor.create({ id: "sbx_1", name: "a", template: "base", spec: {}, env: {} })
    .then(() => landed = true);
  await executor.hooks.parked("create");
  assert.equal(landed, false);
  release();
  await creating;
  assert.equal(executor.hooks.calls.create, 1);
  executor.hooks.fail("exec", new ExecutorError("unavailable", "Engine down"));
  await assert.rejects(executor.exec("sbx_1", { cmd: ["true"] }), /Engine down/);
  const ok = await executor.exec("sbx_1", { cmd: ["true"] });
  assert.deepEqual(await ok.exited, { exitCode: 0 });
  executor.hooks.delay("stat", 1);
  assert.equal((await executor.stat("sbx_1", "/tmp")).type, "dir");
  await assert.rejects(
    executor.create({ id: "sbx_2", name: "b", template: "other", spec: {}, env: {} }),
    /Template 'other' is not known on this node/,
  );
  await assert.rejects(
    executor.create({ id: "sbx_1", name: "a", template: "base", spec: {}, env: {} }),
    /already exists/,
  );
  assert.deepEqual(await executor.list(), ["sbx_1"]);
  await executor.destroy("sbx_1");
  await executor.destroy("sbx_1");
  assert.deepEqual(await executor.list(), []);
  await executor.close();
});

Deno.test("FakeExecutor: a build from a deleted template fails at its base step naming it", async () => {
  const executor = new FakeExecutor({ templates: ["base"] });
  const io = {
    log: () => {},
    contextFile: () => undefined,
    signal: new AbortController().signal,
  };
  const spec = {
    buildId: "b1",
    team: "t",
    steps: [{ type: "RUN", args: ["echo x > /tmp/x"] }],
    force: false,
  };
  const base = await executor.buildTemplate({
    ...spec,
    templateId: "snap-aaaaaaaaaaaaaaaaaaaa",
    name: "parent",
    fromTemplate: "base",
  }, io);
  assert.equal(await executor.deleteSnapshot(base.snapshotId), true);
  const failed = await executor.buildTemplate({
    ...spec,
    buildId: "b2",
    templateId: "snap-bbbbbbbbbbbbbbbbbbbb",
    name: "child",
    fromSnapshot: base.snapshotId,
    fromSnapshotName: "parent",
  }, io).catch((e) => e);
  assert.equal(failed.step, "base");
  assert.match(failed.message, /fromTemplate\('parent'\): that template was deleted/);
  assert.deepEqual(await executor.listSnapshots("t"), [], "nothing built on another base");
});
