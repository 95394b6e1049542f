/**
 * The official `e2b` SDK, unmodified, against one node (fake executor): control plane under
 * `/e2b/api`, envd under `/e2b/envd`, the signed `/files` door at the root.
 *
 * Needs --allow-net=127.0.0.1 --allow-env (the SDK reads env, e.g. TF_BUILD and E2B_*); no
 * read or sys permission is needed.
 */
import assert from "node:assert/strict";
import { Hono } from "hono";
import { AuthenticationError, Sandbox } from "e2b";
import { FakeExecutor } from "../node/executors/fake.ts";
import { Ledger } from "../node/ledger.ts";
import { SandboxService } from "../node/service.ts";
import { createE2bApi } from "../node/faces/e2b_api.ts";
import { createEnvd, handleSignedFiles } from "../node/faces/envd/mod.ts";
import { AccessTokens } from "../shared/access_tokens.ts";
import { StreamCut } from "../shared/stream_cut.ts";
import { commandFidelitySteps, commandSteps } from "./_e2b_steps.ts";
import { startNode } from "./_processes.ts";

const apiToken = "test-fleet-token-0123456789abcdefghij";

/** Where the SDK is pointed: the three settings of E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY. */
interface Target {
  base: string;
  opts: { apiUrl: string; sandboxUrl: string; apiKey: string };
}

function targetAt(base: string, apiKey: string): Target {
  return { base, opts: { apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd`, apiKey } };
}

/** A node assembled in this process from the real service, the fake executor and the faces. */
function startInProcessNode(): Target & { close(): Promise<void> } {
  const executor = new FakeExecutor();
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:0" });
  const service = new SandboxService({ ledger, executor });
  const accessTokens = new AccessTokens("node secret for envd access tokens 0123");
  const app = new Hono();
  app.route("/e2b/api", createE2bApi(service, { apiToken, accessTokens }));
  app.route("/e2b/envd", createEnvd(service, { accessTokens }));
  app.route("/", handleSignedFiles(service, { accessTokens }));
  const server = Deno.serve({
    hostname: "127.0.0.1",
    port: 0,
    onListen() {},
    // A stream cut under a killed sandbox is expected here; anything else is printed.
    onError(error) {
      if (!(error instanceof StreamCut)) console.error(error);
      return new Response(null, { status: 500 });
    },
  }, app.fetch);
  return {
    ...targetAt(`http://127.0.0.1:${server.addr.port}`, apiToken),
    async close() {
      await server.shutdown();
      await executor.close();
    },
  };
}

/** The exam: every SDK behaviour a node must serve. */
async function exam(t: Deno.TestContext, target: Target): Promise<void> {
  const { opts } = target;
  let sandbox!: Sandbox;

  // Every later step needs this sandbox; when create fails, stop rather than cascade.
  const created = await t.step(
    "Sandbox.create() unnamed makes a fresh sandbox each time",
    async () => {
      sandbox = await Sandbox.create(opts);
      const other = await Sandbox.create(opts);
      assert.notEqual(sandbox.sandboxId, other.sandboxId);
      assert.equal(await other.kill(), true);
    },
  );
  if (!created) return;

  await t.step("Sandbox.create() with metadata.name twice returns the same sandbox", async () => {
    const a = await Sandbox.create({ ...opts, metadata: { name: "agent-7", team: "x" } });
    const b = await Sandbox.create({ ...opts, metadata: { name: "agent-7", team: "x" } });
    assert.equal(a.sandboxId, b.sandboxId);
    assert.equal((await a.getInfo()).metadata.name, "agent-7");
  });

  await commandSteps(t, sandbox, "on one node");
  await commandFidelitySteps(t, sandbox, opts);

  await t.step("envVars, envs and cwd reach the command", async () => {
    const withEnv = await Sandbox.create({ ...opts, envs: { GREETING: "hey" } });
    assert.equal((await withEnv.commands.run("echo $GREETING")).stdout, "hey\n");
    const r = await withEnv.commands.run("echo $X; pwd", { envs: { X: "y" }, cwd: "/tmp" });
    assert.equal(r.stdout, "y\n/tmp\n");
    await withEnv.kill();
  });

  await t.step("stdin: sendStdin, closeStdin, and connect() to a running command", async () => {
    const handle = await sandbox.commands.run("cat", { background: true, stdin: true });
    const seen: string[] = [];
    const attached = await sandbox.commands.connect(handle.pid, {
      onStdout: (text) => {
        seen.push(text);
      },
    });
    await sandbox.commands.sendStdin(handle.pid, "abc\n");
    await sandbox.commands.closeStdin(handle.pid);
    const done = await handle.wait();
    assert.equal(done.stdout, "abc\n");
    await attached.wait();
    assert.equal(seen.join(""), "abc\n");
  });

  await t.step("files.watchDir reports a write through envd, and commands' changes", async () => {
    const events: string[] = [];
    let wanted = 0;
    let got!: () => void;
    let arrived!: Promise<void>;
    const expect = (n: number) => {
      wanted = n;
      let timer: ReturnType<typeof setTimeout>;
      arrived = Promise.race([
        new Promise<void>((resolve) => got = resolve),
        new Promise<never>((_, reject) =>
          timer = setTimeout(() => reject(new Error(`no ${n} events in 5 s: ${events}`)), 5000)
        ),
      ]).finally(() => clearTimeout(timer));
    };
    expect(3);
    const watch = await sandbox.files.watchDir("/tmp", (event) => {
      events.push(`${event.type} ${event.name}`);
      if (events.length >= wanted) got();
    });
    await sandbox.files.write("/tmp/watched.txt", "w");
    await arrived;
    // envd's inotify sees its own write as a create, the chown to the user, and the write.
    assert.deepEqual(events.splice(0), [
      "create watched.txt",
      "chmod watched.txt",
      "write watched.txt",
    ]);
    expect(2);
    await sandbox.commands.run("echo c > /tmp/by-command.txt");
    await arrived;
    await watch.stop();
    assert.deepEqual(events, ["create by-command.txt", "write by-command.txt"]);
  });

  await t.step(
    "files.write / files.read: text and binary, multipart and octet-stream",
    async () => {
      const info = await sandbox.files.write("/tmp/a.txt", "hello\n");
      assert.equal((info as { path: string }).path, "/tmp/a.txt");
      assert.equal(await sandbox.files.read("/tmp/a.txt"), "hello\n");
      const bytes = new Uint8Array([0, 1, 2, 250, 255, 10, 13]);
      await sandbox.files.write("/tmp/b.bin", bytes.buffer);
      assert.deepEqual(await sandbox.files.read("/tmp/b.bin", { format: "bytes" }), bytes);
      await sandbox.files.write("/tmp/c.bin", bytes.buffer, { useOctetStream: true });
      assert.deepEqual(await sandbox.files.read("/tmp/c.bin", { format: "bytes" }), bytes);
      await sandbox.files.write("/tmp/g.txt", "zipped", { gzip: true });
      assert.equal(await sandbox.files.read("/tmp/g.txt"), "zipped");
      const many = await sandbox.files.write([
        { path: "/tmp/m/1.txt", data: "one" },
        { path: "/tmp/m/2.txt", data: "two" },
      ]);
      assert.equal(many.length, 2);
      assert.equal(await sandbox.files.read("/tmp/m/2.txt"), "two");
      // Relative paths start at the user's home, as envd resolves them.
      await sandbox.files.write("rel.txt", "r");
      assert.equal(await sandbox.files.read("/home/user/rel.txt"), "r");
    },
  );

  await t.step("files.list, exists, makeDir, remove", async () => {
    const names = (await sandbox.files.list("/tmp/m")).map((e) => `${e.name}:${e.type}`).sort();
    assert.deepEqual(names, ["1.txt:file", "2.txt:file"]);
    assert.equal(await sandbox.files.exists("/tmp/a.txt"), true);
    assert.equal(await sandbox.files.exists("/tmp/nope.txt"), false);
    assert.equal(await sandbox.files.makeDir("/tmp/d/e"), true);
    assert.equal(await sandbox.files.makeDir("/tmp/d/e"), false);
    const dir = await sandbox.files.getInfo("/tmp/d");
    assert.equal(dir.type, "dir");
    await sandbox.files.remove("/tmp/a.txt");
    assert.equal(await sandbox.files.exists("/tmp/a.txt"), false);
    const missing = await sandbox.files.read("/tmp/a.txt").catch((e) => e);
    assert.equal(missing?.name, "FileNotFoundError");
  });

  await t.step("signed download and upload URLs work at the server root", async () => {
    await sandbox.files.write("/tmp/s.txt", "signed");
    const url = await sandbox.downloadUrl("/tmp/s.txt");
    assert.ok(url.startsWith(`${target.base}/files?`), url);
    const res = await fetch(url);
    assert.equal(await res.text(), "signed");
    const up = await sandbox.uploadUrl("/tmp/up.txt", { useSignatureExpiration: 60 });
    const form = new FormData();
    form.append("file", new Blob(["uploaded"]), "/tmp/up.txt");
    const put = await fetch(up, { method: "POST", body: form });
    assert.equal(put.status, 200, await put.clone().text());
    await put.body?.cancel();
    assert.equal(await sandbox.files.read("/tmp/up.txt"), "uploaded");
    const forged = new URL(url);
    forged.searchParams.set("path", "/tmp/up.txt");
    const bad = await fetch(forged);
    assert.equal(bad.status, 401);
    await bad.body?.cancel();
  });

  await t.step("setTimeout and getInfo report state, metadata and the deadline", async () => {
    const named = await Sandbox.create({ ...opts, metadata: { name: "info-1", team: "y" } });
    await named.setTimeout(600_000);
    const info = await named.getInfo();
    assert.equal(info.state, "running");
    assert.deepEqual(info.metadata, { name: "info-1", team: "y" });
    const left = info.endAt.getTime() - Date.now();
    assert.ok(left > 500_000 && left <= 600_000, `endAt ${left} ms away`);
  });

  await t.step("Sandbox.list() filters by metadata", async () => {
    const paginator = Sandbox.list({ ...opts, query: { metadata: { team: "x" } } });
    const items = await paginator.nextItems();
    assert.deepEqual(items.map((s) => s.metadata.name), ["agent-7"]);
    const paged = Sandbox.list({ ...opts, limit: 1 });
    const first = await paged.nextItems();
    assert.equal(first.length, 1);
    assert.equal(paged.hasNext, true);
    const second = await paged.nextItems();
    assert.notEqual(second[0].sandboxId, first[0].sandboxId);
  });

  await t.step("pause, then connect resumes the sandbox", async () => {
    assert.equal(await sandbox.pause(), true);
    assert.equal((await sandbox.getInfo()).state, "paused");
    const again = await Sandbox.connect(sandbox.sandboxId, opts);
    assert.equal((await again.getInfo()).state, "running");
    assert.equal((await again.commands.run("echo back")).stdout, "back\n");
  });

  await t.step("kill() is true, then false", async () => {
    assert.equal(await sandbox.kill(), true);
    assert.equal(await Sandbox.kill(sandbox.sandboxId, opts), false);
  });

  await t.step("a wrong API key is an AuthenticationError", async () => {
    const error = await Sandbox.create({ ...opts, apiKey: "wrong-key" }).catch((e) => e);
    assert.ok(error instanceof AuthenticationError, String(error));
  });
}

Deno.test({
  name: "the e2b SDK drives E2B faces assembled in-process",
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const node = startInProcessNode();
  try {
    await exam(t, node);
  } finally {
    await node.close();
  }
});

Deno.test({
  name: "the e2b SDK drives a real node process (node/main.ts, fake executor)",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const node = await startNode();
  try {
    await exam(t, targetAt(node.url, node.token));
  } finally {
    await node.stop();
  }
});
