/**
 * Edges of fork and the filesystem pause through a gateway in front of a fake node, with the
 * official `e2b` SDK (unmodified) and E2B's HTTP API: a fork count that is not a whole number
 * from 1 to 100 is the node's 400 naming it and builds nothing; a fork of a sandbox paused to
 * disk is a 409 saying to connect first; a fork of a sandbox paused in memory copies its files;
 * a pause to disk racing a kill leaves no sandbox behind and no 500; one racing a running
 * command ends the command and resumes with the files.
 */
import assert from "node:assert/strict";
import { Sandbox } from "e2b";
import { startNode } from "./_processes.ts";
import { startGateway } from "./_gateway.ts";
import { until } from "./_docker.ts";

Deno.test({
  name: "e2b fork and filesystem pause edges through a gateway in front of a fake node",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const node = await startNode({
    token: gw.token,
    env: {
      DORMICE_GATEWAY_ENDPOINT: gw.url,
      DORMICE_NODE_ID: "edges-fake",
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    },
  });
  try {
    await until("the node up", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.some((n: { id: string; reading: unknown }) =>
        n.id === "edges-fake" && n.reading !== null
      );
    }, 30_000);
    const minted = await gw.json("createApiKey", { team: "edges" });
    const sdk = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey: minted.body.key as string,
    };
    const api = (path: string, body: unknown) =>
      fetch(`${sdk.apiUrl}${path}`, {
        method: "POST",
        headers: { "x-api-key": sdk.apiKey, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
    const count = async () => (await Sandbox.list(sdk).nextItems()).length;

    await t.step("a fork count outside 1..100 or not whole is a 400 naming it", async () => {
      const sbx = await Sandbox.create(sdk);
      const before = await count();
      for (const bad of [0, -1, 101, 1.5, "2", 1e9, true]) {
        const res = await api(`/sandboxes/${sbx.sandboxId}/fork`, { count: bad });
        const text = await res.text();
        assert.equal(res.status, 400, `count ${JSON.stringify(bad)}: ${text}`);
        assert.match(text, /count/, text);
      }
      assert.equal(await count(), before, "nothing was built");
      await sbx.kill();
    });

    await t.step(
      "a fork of a sandbox paused to disk is a 409; paused in memory, it copies",
      async () => {
        const sbx = await Sandbox.create(sdk);
        await sbx.files.write("/home/user/f.txt", "frozen");
        assert.equal(await sbx.pause(), true);
        const forks = await Sandbox.fork(sbx.sandboxId, { ...sdk, count: 1 });
        assert.ok(forks[0] instanceof Sandbox, String(forks[0]));
        assert.equal(await (forks[0] as Sandbox).files.read("/home/user/f.txt"), "frozen");
        await (forks[0] as Sandbox).kill();
        const back = await Sandbox.connect(sbx.sandboxId, sdk);
        assert.equal(await back.pause({ keepMemory: false }), true);
        const res = await api(`/sandboxes/${sbx.sandboxId}/fork`, { count: 1 });
        const text = await res.text();
        assert.equal(res.status, 409, text);
        assert.match(text, /paused to disk/);
        await back.kill();
      },
    );

    await t.step("a pause to disk racing a kill leaves nothing and answers no 500", async () => {
      for (let i = 0; i < 3; i++) {
        const sbx = await Sandbox.create(sdk);
        const [pause, kill] = await Promise.allSettled([
          sbx.pause({ keepMemory: false }),
          Sandbox.kill(sbx.sandboxId, sdk),
        ]);
        assert.equal(kill.status, "fulfilled", String((kill as PromiseRejectedResult).reason));
        if (pause.status === "rejected") {
          assert.doesNotMatch(String(pause.reason), /\b500\b/);
        }
        assert.equal(await Sandbox.kill(sbx.sandboxId, sdk), false, "the sandbox is gone");
      }
    });

    await t.step("a pause to disk racing a running command ends it; the files resume", async () => {
      const sbx = await Sandbox.create(sdk);
      await sbx.files.write("/home/user/r.txt", "kept");
      const running = sbx.commands.run("sleep 30", { background: true });
      const handle = await running;
      assert.equal(await sbx.pause({ keepMemory: false }), true);
      await handle.wait().catch(() => {});
      const back = await Sandbox.connect(sbx.sandboxId, sdk);
      assert.equal(await back.files.read("/home/user/r.txt"), "kept");
      await back.kill();
    });
  } finally {
    await node.stop();
    await gw.stop();
  }
});
