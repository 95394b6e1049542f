/**
 * The E2B exam through a gateway: the official `e2b` SDK, unmodified, against a real gateway process in front of
 * two real node processes (fake executor). The SDK is given only `apiUrl`, `sandboxUrl` and
 * `apiKey`, all pointing at the gateway; direct calls to a node only stage a spread of sandboxes
 * across both nodes.
 */
import assert from "node:assert/strict";
import { AuthenticationError, Sandbox } from "e2b";
import { commandFidelitySteps, commandSteps } from "./_e2b_steps.ts";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { AccessTokens } from "../shared/access_tokens.ts";
import { sdkOptions } from "./_two_nodes.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` every 100 ms until it returns true or `ms` passes. */
async function until(what: string, check: () => Promise<boolean>, ms = 8000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

Deno.test({
  name: "the e2b SDK drives sandboxes through a gateway in front of two nodes",
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  // A raw envd request carries the sandbox's access token, as the SDK's do (the gateway checks it).
  const envdTokens = AccessTokens.fromFleetToken(token);
  const envdHeaders = (id: string) => ({
    "content-type": "application/json",
    "e2b-sandbox-id": id,
    "x-access-token": envdTokens.forSandbox(id),
  });
  const gwPort = freePort();
  const gwUrl = `http://127.0.0.1:${gwPort}`;
  const nodeEnv = (id: string) => ({
    DORMICE_GATEWAY_ENDPOINT: gwUrl,
    DORMICE_NODE_ID: id,
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    DORMICE_SCAN_INTERVAL_SECONDS: "1",
  });
  const started: { stop(): Promise<unknown> }[] = [];
  const keep = <T extends { stop(): Promise<unknown> }>(p: Promise<T>) =>
    p.then((x) => {
      started.push(x);
      return x;
    });
  let gw!: GatewayProcess, a!: NodeProcess, b!: NodeProcess;
  try {
    [gw, a, b] = await Promise.all([
      // The machine's real CPU use is noise from other work, not a test input.
      keep(
        startGateway({ token, port: gwPort, env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } }),
      ),
      keep(startNode({ token, env: nodeEnv("node-a") })),
      keep(startNode({ token, env: nodeEnv("node-b") })),
    ]);
    await until("node-a and node-b up with a reading", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.filter((n: { state: string; reading: unknown }) =>
        n.state === "up" && n.reading !== null
      ).length === 2;
    });
    const opts = sdkOptions(gw.url, token);
    let sandbox!: Sandbox;

    const created = await t.step("Sandbox.create() unnamed makes a fresh sandbox", async () => {
      sandbox = await Sandbox.create(opts);
      const other = await Sandbox.create(opts);
      assert.notEqual(sandbox.sandboxId, other.sandboxId);
      // The node took the name the gateway gave it, so name and id lead to the same sandbox.
      const byId = await gw.json("lookupSandbox", { id: sandbox.sandboxId });
      assert.match(byId.body.sandbox?.name ?? "", /^e2b-[0-9a-f]{20}$/);
      const byName = await gw.json("lookupSandbox", { name: byId.body.sandbox.name });
      assert.equal(byName.body.sandbox?.id, sandbox.sandboxId);
      assert.equal(await other.kill(), true);
    });
    if (!created) return;

    await t.step("Sandbox.create() with metadata.name twice returns the same sandbox", async () => {
      const first = await Sandbox.create({ ...opts, metadata: { name: "gw-agent-1", team: "x" } });
      const again = await Sandbox.create({ ...opts, metadata: { name: "gw-agent-1", team: "x" } });
      assert.equal(again.sandboxId, first.sandboxId);
      // Exactly one node holds it.
      const holders = [];
      for (const node of [a, b]) {
        const direct = await fetch(`${node.url}/lookupSandbox`, {
          method: "POST",
          headers: { authorization: `Bearer ${token}` },
          body: JSON.stringify({ name: "gw-agent-1" }),
        });
        if ((await direct.json()).found) holders.push(node.url);
      }
      assert.equal(holders.length, 1);
    });

    await commandSteps(t, sandbox, "through two hops");
    await commandFidelitySteps(t, sandbox, opts);

    await t.step("files: write/read text and binary, multipart and octet-stream", async () => {
      await sandbox.files.write("/tmp/a.txt", "hello\n");
      assert.equal(await sandbox.files.read("/tmp/a.txt"), "hello\n");
      const bytes = new Uint8Array([0, 1, 2, 250, 255, 10, 13]);
      await sandbox.files.write("/tmp/b.bin", bytes.buffer);
      assert.deepEqual(await sandbox.files.read("/tmp/b.bin", { format: "bytes" }), bytes);
      await sandbox.files.write("/tmp/c.bin", bytes.buffer, { useOctetStream: true });
      assert.deepEqual(await sandbox.files.read("/tmp/c.bin", { format: "bytes" }), bytes);
      const big = new Uint8Array(3 * 1024 * 1024).map((_, i) => i % 251);
      await sandbox.files.write("/tmp/big.bin", big.buffer, { useOctetStream: true });
      assert.deepEqual(await sandbox.files.read("/tmp/big.bin", { format: "bytes" }), big);
    });

    await t.step("files: list, exists true and false, makeDir, remove", async () => {
      await sandbox.files.write([
        { path: "/tmp/m/1.txt", data: "one" },
        { path: "/tmp/m/2.txt", data: "two" },
      ]);
      const names = (await sandbox.files.list("/tmp/m")).map((e) => `${e.name}:${e.type}`).sort();
      assert.deepEqual(names, ["1.txt:file", "2.txt:file"]);
      assert.equal(await sandbox.files.exists("/tmp/a.txt"), true);
      assert.equal(await sandbox.files.exists("/tmp/nope.txt"), false);
      assert.equal(await sandbox.files.makeDir("/tmp/d/e"), true);
      assert.equal((await sandbox.files.getInfo("/tmp/d")).type, "dir");
      await sandbox.files.remove("/tmp/a.txt");
      assert.equal(await sandbox.files.exists("/tmp/a.txt"), false);
      // envd's remove of a missing path succeeds.
      await sandbox.files.remove("/tmp/a.txt");
    });

    await t.step("files honour the user: what root writes is root's", async () => {
      const asRoot = { user: "root" } as const;
      assert.equal(await sandbox.files.makeDir("/opt/gw", asRoot), true);
      await sandbox.files.write("/root/r.txt", "r", asRoot);
      assert.equal((await sandbox.files.getInfo("/root/r.txt", asRoot)).owner, "root");
      const listed = await sandbox.files.list("/root", asRoot);
      assert.deepEqual(listed.filter((e) => e.name === "r.txt").map((e) => e.owner), ["root"]);
      await sandbox.files.write("/tmp/mine.txt", "m");
      assert.equal((await sandbox.files.getInfo("/tmp/mine.txt")).owner, "user");
    });

    await t.step("entries carry envd's metadata; a symlink its absolute target", async () => {
      await sandbox.files.write("/tmp/meta/f.txt", "hello");
      await sandbox.commands.run("cd /tmp/meta && ln -s f.txt lf");
      const file = await sandbox.files.getInfo("/tmp/meta/f.txt");
      assert.deepEqual(
        [file.size, file.mode, file.permissions, file.owner, file.group],
        [5, 0o644, "-rw-r--r--", "user", "user"],
      );
      assert.ok((await sandbox.files.getInfo("/tmp/meta")).size > 0);
      const link = await sandbox.files.getInfo("/tmp/meta/lf");
      assert.deepEqual([link.type, link.symlinkTarget], ["file", "/tmp/meta/f.txt"]);
    });

    await t.step("files.watchDir sees envd's writes and commands' changes, recursive", async () => {
      await sandbox.files.makeDir("/tmp/gw-watch");
      const events: string[] = [];
      const watch = await sandbox.files.watchDir("/tmp/gw-watch", (e) => {
        events.push(`${e.type} ${e.name}`);
      }, { recursive: true });
      try {
        await sandbox.files.write("/tmp/gw-watch/up.txt", "u");
        await sandbox.commands.run("mkdir -p /tmp/gw-watch/n && echo x > /tmp/gw-watch/n/f.txt");
        await until("the command's write", () => Promise.resolve(events.includes("write n/f.txt")));
        assert.deepEqual(events, [
          "create up.txt",
          "chmod up.txt",
          "write up.txt",
          "create n",
          "create n/f.txt",
          "write n/f.txt",
        ]);
      } finally {
        await watch.stop();
      }
    });

    await t.step("files.read reads a virtual file, whose size says 0", async () => {
      assert.match(await sandbox.files.read("/proc/version"), /^Linux version /);
      assert.equal((await sandbox.files.getInfo("/proc/version")).size, 0);
    });

    await t.step("setTimeout and getInfo report state and metadata", async () => {
      const named = await Sandbox.create({ ...opts, metadata: { name: "gw-info-1", team: "y" } });
      await named.setTimeout(600_000);
      const info = await named.getInfo();
      assert.equal(info.state, "running");
      assert.deepEqual(info.metadata, { name: "gw-info-1", team: "y" });
      const left = info.endAt.getTime() - Date.now();
      assert.ok(left > 500_000 && left <= 600_000, `endAt ${left} ms away`);
    });

    await t.step("Sandbox.list with a metadata filter spans both nodes, and pages", async () => {
      // One sandbox made directly on each node, so the spread does not depend on placement.
      const onA = await Sandbox.create({
        ...sdkOptions(a.url, token),
        metadata: { name: "gw-spread-a", team: "spread" },
      });
      const onB = await Sandbox.create({
        ...sdkOptions(b.url, token),
        metadata: { name: "gw-spread-b", team: "spread" },
      });
      const listed = await Sandbox.list({ ...opts, query: { metadata: { team: "spread" } } })
        .nextItems();
      assert.deepEqual(
        listed.map((s) => s.sandboxId).sort(),
        [onA.sandboxId, onB.sandboxId].sort(),
      );
      const paged = Sandbox.list({ ...opts, limit: 1, query: { metadata: { team: "spread" } } });
      const first = await paged.nextItems();
      assert.equal(first.length, 1);
      assert.equal(paged.hasNext, true);
      const second = await paged.nextItems();
      assert.equal(second.length, 1);
      assert.notEqual(second[0].sandboxId, first[0].sandboxId);
      assert.equal(paged.hasNext, false);
      // Sandboxes made behind the gateway's back are found by id.
      assert.equal(
        (await Sandbox.connect(onB.sandboxId, opts).then((s) => s.commands.run("echo b")))
          .stdout,
        "b\n",
      );
    });

    await t.step("pause, then connect resumes the sandbox", async () => {
      assert.equal(await sandbox.pause(), true);
      assert.equal((await sandbox.getInfo()).state, "paused");
      const again = await Sandbox.connect(sandbox.sandboxId, opts);
      assert.equal((await again.getInfo()).state, "running");
      assert.equal((await again.commands.run("echo back")).stdout, "back\n");
    });

    await t.step("kill() is true, then false; envd then answers unavailable", async () => {
      const id = sandbox.sandboxId;
      assert.equal(await sandbox.kill(), true);
      assert.equal(await Sandbox.kill(id, opts), false);
      const res = await fetch(`${gw.url}/e2b/envd/process.Process/List`, {
        method: "POST",
        headers: envdHeaders(id),
        body: "{}",
      });
      assert.equal((await res.json()).code, "unavailable");
    });

    await t.step("a sandbox whose timeout passes is killed by the node's scanner", async () => {
      const short = await Sandbox.create({ ...opts, timeoutMs: 1000 });
      await until("the scanner to kill the sandbox", async () => {
        const res = await fetch(`${gw.url}/e2b/api/sandboxes/${short.sandboxId}`, {
          headers: { "x-api-key": token },
        });
        const body = await res.json();
        return res.status === 404 && body.code === 404;
      });
    });

    await t.step("the bare signed /files door is an honest 501", async () => {
      const res = await fetch(`${gw.url}/files?path=/tmp/x&signature=v1_abc`);
      assert.equal(res.status, 501);
      const body = await res.json();
      assert.equal(body.code, 501);
      assert.match(body.message, /node/);
    });

    await t.step("a wrong API key is an AuthenticationError", async () => {
      const error = await Sandbox.create({ ...opts, apiKey: "wrong-key" }).catch((e) => e);
      assert.ok(error instanceof AuthenticationError, String(error));
    });

    await t.step("a stopped node is named by the list and envd answers unavailable", async () => {
      const onB = (await Sandbox.list({ ...opts, query: { metadata: { name: "gw-spread-b" } } })
        .nextItems())[0];
      assert.ok(onB, "the sandbox made on node-b is listed");
      // The gateway trusts node-b's digest only once a check-in made after its last create has
      // arrived (until then its own create keeps node-b asked): wait for one sent well after it
      // (1.5 s on, with check-ins every second), so none that was built before can count.
      const since = Date.now() + 1500;
      await until("node-b checks in after its last create", async () => {
        const { body } = await gw.json("listNodes");
        const nodeB = body.nodes.find((n: { id: string }) => n.id === "node-b");
        return nodeB !== undefined && Date.now() - nodeB.lastCheckInAgeMs > since;
      });
      started.splice(started.indexOf(b), 1);
      await b.stop();
      const res = await fetch(`${gw.url}/e2b/api/v2/sandboxes?metadata=team%3Dspread`, {
        headers: { "x-api-key": token },
      });
      assert.equal(res.status, 200);
      assert.equal(res.headers.get("x-dormice-unreachable"), "node-b");
      assert.deepEqual(
        (await res.json()).map((s: { metadata: { name: string } }) => s.metadata.name),
        [
          "gw-spread-a",
        ],
      );
      // Cached on node-b: the node does not answer.
      const cached = await fetch(`${gw.url}/e2b/envd/process.Process/List`, {
        method: "POST",
        headers: envdHeaders(onB.sandboxId),
        body: "{}",
      });
      assert.equal(cached.status, 502);
      assert.equal((await cached.json()).code, "unavailable");
      // Unknown: node-b's last lookup digest rules it out (digests are on by default), so the
      // silent node does not hold it up: the gateway says at once that no node has it.
      const unknown = await fetch(`${gw.url}/e2b/envd/process.Process/List`, {
        method: "POST",
        headers: envdHeaders("sbx_nowhere"),
        body: "{}",
      });
      assert.equal(unknown.status, 502);
      const gone = await unknown.json();
      assert.equal(gone.code, "unavailable");
      assert.match(gone.message, /No sandbox 'sbx_nowhere' on any node/);
      // A name node-b's digest may hold stays a 503 while it is silent: tests/lookup_digest_test.ts.
    });
  } finally {
    await Promise.all(started.map((p) => p.stop()));
  }
});
