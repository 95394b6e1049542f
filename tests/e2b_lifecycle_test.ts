/**
 * The lifecycle and control-plane exam: the official `e2b` SDK, unmodified, against a
 * real gateway process in front of two real node processes (fake executor), each node with the
 * default 60 s safety sweep, so a deadline that fires on time is the node's timer at work.
 * Direct calls to a node only stage sandboxes on a chosen node.
 *
 * Needs --allow-net=127.0.0.1 --allow-env --allow-run --allow-read --allow-write.
 */
import assert from "node:assert/strict";
import { ALL_TRAFFIC, Sandbox, SandboxError } from "e2b";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { sdkOptions } from "./_two_nodes.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` every 50 ms until it returns true; gives up (throws) after `ms`. */
async function until(what: string, check: () => Promise<boolean>, ms = 8000): Promise<void> {
  const start = Date.now();
  while (Date.now() - start < ms) {
    if (await check()) return;
    await sleep(50);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

/** A gateway in front of two fake nodes, started together and stopped together. */
async function startFleet() {
  const token = newToken();
  const gwPort = freePort();
  const gwUrl = `http://127.0.0.1:${gwPort}`;
  const nodeEnv = (id: string) => ({
    DORMICE_GATEWAY_ENDPOINT: gwUrl,
    DORMICE_NODE_ID: id,
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    // The safety sweep a day apart: a deadline applied while a test runs is its own timer's.
    DORMICE_SCAN_INTERVAL_SECONDS: "86400",
    // A second template, for the list's template filter (the fake needs no image for it).
    DORMICE_TEMPLATES: "base=dormice-base:latest,python=dormice-python:latest",
  });
  const started: { stop(): Promise<unknown> }[] = [];
  const keep = <T extends { stop(): Promise<unknown> }>(p: Promise<T>) =>
    p.then((x) => {
      started.push(x);
      return x;
    });
  const stop = () => Promise.all(started.map((p) => p.stop()));
  try {
    const [gw, a, b]: [GatewayProcess, NodeProcess, NodeProcess] = await Promise.all([
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
    return { token, gw, a, b, opts: sdkOptions(gw.url, token), stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

Deno.test({
  name: "e2b SDK lifecycle and control plane through a gateway in front of two nodes",
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const fleet = await startFleet();
  const { opts } = fleet;
  try {
    // Made first, so the nodes' 5 s sampler has sampled it a few times by the metrics step.
    const sampled = await Sandbox.create(opts);

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

    await t.step(
      "getInfo() reports the sandbox's own cpu and memory, as its metrics do",
      async () => {
        const sandbox = await Sandbox.create(opts);
        const info = await sandbox.getInfo();
        const [metric] = await sandbox.getMetrics();
        assert.equal(info.cpuCount, 1);
        assert.equal(metric.cpuCount, info.cpuCount);
        assert.equal(metric.memTotal, info.memoryMB * 1024 * 1024);
        const listed = await Sandbox.list({ ...opts, query: { metadata: {} } }).nextItems();
        const row = listed.find((s) => s.sandboxId === sandbox.sandboxId);
        assert.deepEqual([row?.cpuCount, row?.memoryMB], [info.cpuCount, info.memoryMB]);
        await sandbox.kill();
      },
    );

    // The moment a deadline fires (not before, not at the next sweep) is proven on a fake clock in
    // node/deadline_scanner_test.ts; here, with the sweep a day away, that it fires at all shows
    // the node's deadline timer applies it. The bounds only keep a broken timer from hanging.
    await t.step("setTimeout(2 s) kills the sandbox by the node's deadline timer", async () => {
      const sandbox = await Sandbox.create(opts);
      await sandbox.setTimeout(2_000);
      await until("the deadline to kill the sandbox", async () => {
        const res = await fetch(`${opts.apiUrl}/sandboxes/${sandbox.sandboxId}`, {
          headers: { "x-api-key": opts.apiKey },
        });
        await res.body?.cancel();
        return res.status === 404;
      }, 30_000);
      assert.equal(await Sandbox.kill(sandbox.sandboxId, opts), false);
    });

    await t.step("lifecycle.onTimeout 'pause' pauses by the node's deadline timer", async () => {
      const sandbox = await Sandbox.create({
        ...opts,
        timeoutMs: 2_000,
        lifecycle: { onTimeout: "pause" },
      });
      await until(
        "the deadline to pause the sandbox",
        async () => (await sandbox.getInfo()).state === "paused",
        30_000,
      );
      await sandbox.kill();
    });

    await t.step(
      "lifecycle.autoResume: traffic through envd resumes a paused sandbox",
      async () => {
        const sandbox = await Sandbox.create({
          ...opts,
          lifecycle: { onTimeout: "pause", autoResume: true },
        });
        assert.deepEqual((await sandbox.getInfo()).lifecycle, {
          onTimeout: "pause",
          autoResume: true,
        });
        assert.equal(await sandbox.pause(), true);
        assert.equal((await sandbox.getInfo()).state, "paused");
        assert.equal((await sandbox.commands.run("echo resumed")).stdout, "resumed\n");
        assert.equal((await sandbox.getInfo()).state, "running");
        await sandbox.kill();
      },
    );

    await t.step("without autoResume a paused sandbox stays paused until connect", async () => {
      const sandbox = await Sandbox.create({ ...opts, lifecycle: { onTimeout: "pause" } });
      assert.equal(await sandbox.pause(), true);
      assert.equal(await sandbox.isRunning(), false);
      const refused = await sandbox.commands.run("echo no").catch((e) => e);
      assert.ok(refused instanceof Error, String(refused));
      assert.equal((await sandbox.getInfo()).state, "paused");
      await sandbox.connect();
      assert.equal(await sandbox.isRunning(), true);
      assert.equal((await sandbox.commands.run("echo yes")).stdout, "yes\n");
      await sandbox.kill();
    });

    await t.step("the pause lifecycle survives an auto-pause and a connect", async () => {
      const sandbox = await Sandbox.create({
        ...opts,
        timeoutMs: 1_000,
        lifecycle: { onTimeout: "pause" },
      });
      await until("the first auto-pause", async () => (await sandbox.getInfo()).state === "paused");
      await sandbox.connect({ timeoutMs: 1_000 });
      assert.equal((await sandbox.getInfo()).state, "running");
      // Paused again, not killed: the lifecycle outlived the first pause.
      await until(
        "the second auto-pause",
        async () => (await sandbox.getInfo()).state === "paused",
      );
      await sandbox.kill();
    });

    await t.step(
      "POST /sandboxes/{id}/refreshes extends the deadline through the gateway",
      async () => {
        // The JS SDK 2.51 has no refresh call; the Python SDK and older clients post it.
        const sandbox = await Sandbox.create({ ...opts, timeoutMs: 30_000 });
        const res = await fetch(`${opts.apiUrl}/sandboxes/${sandbox.sandboxId}/refreshes`, {
          method: "POST",
          headers: { "x-api-key": opts.apiKey, "content-type": "application/json" },
          body: JSON.stringify({ duration: 600 }),
        });
        assert.equal(res.status, 204);
        await res.body?.cancel();
        const left = (await sandbox.getInfo()).endAt.getTime() - Date.now();
        assert.ok(left > 590_000 && left <= 600_000, `endAt ${left} ms away`);
        await sandbox.kill();
      },
    );

    await t.step(
      "allowInternetAccess is kept; domain rules are kept; a malformed or non-ASCII entry is a 400 naming it",
      async () => {
        const open = await Sandbox.create({ ...opts, allowInternetAccess: true });
        assert.equal((await open.getInfo()).allowInternetAccess, true);
        const unset = await Sandbox.create(opts);
        assert.equal((await unset.getInfo()).allowInternetAccess, undefined);
        const ruled = await Sandbox.create({
          ...opts,
          network: { allowOut: ["example.com"], denyOut: ["0.0.0.0/0"] },
        });
        assert.deepEqual((await ruled.getInfo()).network?.allowOut, ["example.com"]);
        const idn = await Sandbox.create({
          ...opts,
          network: { allowOut: ["bücher.example"], denyOut: ["0.0.0.0/0"] },
        }).catch((e) => e);
        assert.ok(idn instanceof SandboxError, String(idn));
        assert.match(
          idn.message,
          /^400: 'network\.allowOut\[0\]' 'bücher\.example' is an internationalized name: .*'xn--bcher-kva\.example'/,
        );
        const bad = await Sandbox.create({
          ...opts,
          network: { allowOut: ["10.0.0.300"], denyOut: ["0.0.0.0/0"] },
        }).catch((e) => e);
        assert.ok(bad instanceof SandboxError, `a malformed entry was taken: ${bad}`);
        assert.match(bad.message, /^400: 'network\.allowOut\[0\]' '10\.0\.0\.300' is not/);
        await ruled.kill();
        await Promise.all([open.kill(), unset.kill()]);
      },
    );

    await t.step(
      "template deletes are a 501 sentence, not 'not found'",
      async () => {
        const sandbox = await Sandbox.create(opts);
        const calls: [string, () => Promise<unknown>][] = [
          ["deleteSnapshot", () => Sandbox.deleteSnapshot("base", opts)],
        ];
        for (const [name, call] of calls) {
          const error = await call().then(() => undefined, (e) => e);
          assert.ok(error instanceof SandboxError, `${name}: ${error}`);
          assert.equal(error.name, "SandboxError", `${name} must not read as SandboxNotFoundError`);
          assert.match(error.message, /^501: .* not built on this fleet/, name);
        }
        await sandbox.kill();
      },
    );

    await t.step(
      "updateNetwork replaces address rules through the gateway; get reports them",
      async () => {
        const ruled = await Sandbox.create({
          ...opts,
          network: { denyOut: [ALL_TRAFFIC], allowOut: ["198.18.0.1"] },
        });
        assert.deepEqual((await ruled.getInfo()).network?.allowOut, ["198.18.0.1/32"]);
        await ruled.updateNetwork({ allowInternetAccess: false, allowOut: ["198.18.0.2"] });
        const info = await ruled.getInfo();
        assert.deepEqual(info.network?.allowOut, ["198.18.0.2/32"]);
        assert.deepEqual(info.network?.denyOut, [ALL_TRAFFIC]);
        const bad = await ruled.updateNetwork({ denyOut: ["1.2.3.4/40"] }).catch((e) => e);
        assert.ok(bad instanceof SandboxError, String(bad));
        assert.match(bad.message, /^400: 'denyOut\[0\]' '1\.2\.3\.4\/40' has a prefix length/);
        // Without egress there is no route for rules to open: a 409 saying how to get one.
        const closed = await Sandbox.create(opts);
        const refused = await closed.updateNetwork({ allowOut: ["1.1.1.1"] }).catch((e) => e);
        assert.ok(refused instanceof SandboxError, String(refused));
        assert.match(refused.message, /^409: .*was made without egress/);
        await Promise.all([ruled.kill(), closed.kill()]);
      },
    );

    await t.step("getMetrics() answers the node's 5 s history within start and end", async () => {
      let samples = await sampled.getMetrics();
      await until("two samples in the history", async () => {
        samples = await sampled.getMetrics();
        return samples.length >= 2;
      }, 12_000);
      const second = samples[1].timestamp;
      assert.ok(second.getTime() - samples[0].timestamp.getTime() >= 4_000, "about 5 s apart");
      const later = await sampled.getMetrics({ start: second, end: new Date() });
      assert.ok(later.length >= 1 && later.length === samples.length - 1, `${later.length}`);
      assert.ok(later.every((m) => m.timestamp.getTime() >= second.getTime() - 1_000));
      const before = await sampled.getMetrics({
        start: new Date(Date.now() - 3_600_000),
        end: new Date(Date.now() - 1_800_000),
      });
      assert.deepEqual(before, []);
    });

    await t.step("GET /sandboxes/metrics?sandbox_ids= merges both nodes' answers", async () => {
      // One sandbox made directly on each node, so the spread does not depend on placement.
      const onA = await Sandbox.create(sdkOptions(fleet.a.url, fleet.token));
      const onB = await Sandbox.create(sdkOptions(fleet.b.url, fleet.token));
      const ids = [onA.sandboxId, onB.sandboxId, "sbx_nowhere"].join(",");
      const res = await fetch(`${opts.apiUrl}/sandboxes/metrics?sandbox_ids=${ids}`, {
        headers: { "x-api-key": opts.apiKey },
      });
      assert.equal(res.status, 200);
      const { sandboxes } = await res.json();
      assert.deepEqual(Object.keys(sandboxes).sort(), [onA.sandboxId, onB.sandboxId].sort());
      assert.equal(sandboxes[onA.sandboxId].cpuCount, 1);
      const many = Array.from({ length: 101 }, (_, i) => `sbx_${i}`).join(",");
      const tooMany = await fetch(`${opts.apiUrl}/sandboxes/metrics?sandbox_ids=${many}`, {
        headers: { "x-api-key": opts.apiKey },
      });
      assert.equal(tooMany.status, 400);
      assert.equal((await tooMany.json()).code, 400);
      await Promise.all([onA.kill(), onB.kill(), sampled.kill()]);
    });

    await t.step(
      "Sandbox.list filters by state, template and startedAfter, in order, across nodes",
      async () => {
        const make = async (node: NodeProcess, template: string) => {
          const s = await Sandbox.create(template, {
            ...sdkOptions(node.url, fleet.token),
            metadata: { suite: "filters" },
          });
          await sleep(20); // distinct start times, so the order is the test's
          return s;
        };
        const started = new Date();
        const s1 = await make(fleet.a, "base");
        const s2 = await make(fleet.b, "python");
        const s3 = await make(fleet.a, "python");
        const s4 = await make(fleet.b, "base");
        await s3.pause();
        const ids = async (query: Record<string, unknown>, order?: "asc" | "desc") =>
          (await Sandbox.list({
            ...opts,
            order,
            query: { metadata: { suite: "filters" }, ...query },
          })
            .nextItems()).map((s) => s.sandboxId);
        const all = [s1, s2, s3, s4].map((s) => s.sandboxId);
        assert.deepEqual(await ids({}), [...all].reverse(), "newest first by default");
        assert.deepEqual(await ids({}, "asc"), all);
        assert.deepEqual(await ids({ state: ["paused"] }), [s3.sandboxId]);
        assert.deepEqual(
          await ids({ state: ["running"] }, "asc"),
          [s1, s2, s4].map((s) => s.sandboxId),
        );
        assert.deepEqual(await ids({ template: "python" }, "asc"), [s2.sandboxId, s3.sandboxId]);
        const after = (await Sandbox.getInfo(s2.sandboxId, opts)).startedAt;
        assert.ok(after.getTime() > started.getTime());
        assert.deepEqual(
          await ids({ startedAfter: after }, "asc"),
          [s2, s3, s4].map((s) => s.sandboxId),
        );
        // Paged one at a time, ascending, across both nodes: every row once, in order.
        const paged = Sandbox.list({
          ...opts,
          order: "asc",
          limit: 1,
          query: { metadata: { suite: "filters" } },
        });
        const seen: string[] = [];
        while (paged.hasNext) seen.push(...(await paged.nextItems()).map((s) => s.sandboxId));
        assert.deepEqual(seen, all);
        // X-Total-Running: the running rows matching the filters before paging, summed over nodes.
        const res = await fetch(
          `${opts.apiUrl}/v2/sandboxes?limit=1&metadata=${
            encodeURIComponent("suite=filters")
          }&state=running,paused`,
          { headers: { "x-api-key": opts.apiKey } },
        );
        assert.equal(res.headers.get("x-total-running"), "3");
        assert.equal((await res.json()).length, 1);
        await Promise.all([s1, s2, s3, s4].map((s) => s.kill()));
      },
    );
  } finally {
    await fleet.stop();
  }
});
