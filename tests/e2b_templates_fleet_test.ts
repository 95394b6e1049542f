/**
 * A built template served by the whole fleet, through the official `e2b` SDK (unmodified): a
 * gateway in front of two fake nodes that share nothing, the gateway's active limit at 1. With
 * the builder full, `Sandbox.create(alias)` lands on the other node, which heals the template
 * from the builder first; after a rebuild of the alias, every create starts from the new build,
 * on whichever node, never from a copy of the old one a node healed before. `GET /templates`
 * lists it once, and reads past the first page of the team's snapshots. A build whose node
 * stops ends in an error at the SDK rather than polling forever. A build's status is answered
 * by a gateway that did not accept the build (here: the same one, restarted).
 */
import assert from "node:assert/strict";
import { Sandbox, Template } from "e2b";
import { type NodeProcess, startNode } from "./_processes.ts";
import { startGateway } from "./_gateway.ts";
import { freshCheckIn, nodeOf } from "./_heal_fleet.ts";

Deno.test({
  name: "e2b SDK: a built template starts on a node other than its builder, and a rebuild wins",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const gw = await startGateway({
    env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100", DORMICE_GATEWAY_NODE_ACTIVE_LIMIT: "1" },
  });
  const nodes: NodeProcess[] = [];
  const ids = ["tplfleet-a", "tplfleet-b"];
  const made: Sandbox[] = [];
  try {
    for (const id of ids) {
      nodes.push(
        await startNode({
          token: gw.token,
          env: {
            DORMICE_GATEWAY_ENDPOINT: gw.url,
            DORMICE_NODE_ID: id,
            DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
          },
        }),
      );
    }
    for (const id of ids) await freshCheckIn(gw, id, `${id} up`, (n) => n.reading !== null);
    const minted = await gw.json("createApiKey", { team: "tplfleet" });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const opts = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey: minted.body.key,
    };
    const alias = `fleet-${crypto.randomUUID().slice(0, 8)}`;
    const build = (version: string) =>
      Template.build(
        Template().fromTemplate("base").runCmd(`echo ${version} > /tmp/version`),
        alias,
        opts,
      );
    const version = async (s: Sandbox) => (await s.files.read("/tmp/version")).trim();
    const listedNames = async (): Promise<string[]> => {
      const res = await fetch(`${opts.apiUrl}/templates`, {
        headers: { "x-api-key": opts.apiKey },
      });
      assert.equal(res.status, 200);
      return (await res.json()).flatMap((x: { names: string[] }) => x.names);
    };
    const first = await build("v1");
    let builder = "";

    await t.step("builder full: Sandbox.create(alias) heals to the other node", async () => {
      const onBuilder = await Sandbox.create(alias, opts);
      made.push(onBuilder);
      builder = await nodeOf(opts, onBuilder.sandboxId);
      const other = ids.find((id) => id !== builder)!;
      await freshCheckIn(
        gw,
        builder,
        "the builder's check-in, full",
        (n) => (n.reading?.sandboxes.active ?? 0) >= 1,
      );
      const healed = await Sandbox.create(alias, opts);
      made.push(healed);
      assert.equal(await nodeOf(opts, healed.sandboxId), other);
      assert.equal(await version(healed), "v1");
      for (const s of made.splice(0)) await s.kill();
      // Both nodes hold it now, and listNodes says so by name.
      for (const id of ids) {
        await freshCheckIn(
          gw,
          id,
          `${id} naming the template`,
          (n) =>
            ((n as unknown as { snapshotNames?: string[] }).snapshotNames ?? [])
              .includes(`tplfleet/${alias}`),
        );
      }
      // It is one template.
      const names = await listedNames();
      assert.equal(names.filter((n) => n === alias).length, 1, JSON.stringify(names));
    });

    await t.step("a rebuild keeps the id, and every create after it starts from it", async () => {
      const second = await build("v2");
      assert.equal(second.templateId, first.templateId, "a rebuild is a build of one template");
      for (const id of ids) {
        await freshCheckIn(gw, id, `${id} empty`, (n) => n.reading?.sandboxes.active === 0);
      }
      // Each create fills a node; the second lands on the other node.
      const seen = new Map<string, string>();
      for (let i = 0; i < 2; i++) {
        const s = await Sandbox.create(alias, opts);
        made.push(s);
        seen.set(await nodeOf(opts, s.sandboxId), await version(s));
        await freshCheckIn(
          gw,
          await nodeOf(opts, s.sandboxId),
          "the node's check-in, full",
          (n) => (n.reading?.sandboxes.active ?? 0) >= 1,
        );
      }
      assert.equal(seen.size, 2, `both nodes: ${[...seen.keys()]}`);
      assert.deepEqual([...seen.values()], ["v2", "v2"], JSON.stringify([...seen]));
    });

    await t.step(
      "GET /templates lists a template past the first 100 snapshot rows of each node",
      async () => {
        for (const s of made.splice(0)) await s.kill();
        for (const id of ids) {
          await freshCheckIn(gw, id, `${id} empty`, (n) => n.reading?.sandboxes.active === 0);
        }
        // Over 100 snapshots on each node (one sandbox fills a node: the second is on the other).
        for (let n = 0; n < 2; n++) {
          const source = await Sandbox.create("base", opts);
          made.push(source);
          await freshCheckIn(
            gw,
            await nodeOf(opts, source.sandboxId),
            "the node full",
            (r) => (r.reading?.sandboxes.active ?? 0) >= 1,
          );
          for (let i = 0; i < 101; i++) {
            await source.createSnapshot();
          }
        }
        assert.equal(
          new Set(await Promise.all(made.map((m) => nodeOf(opts, m.sandboxId)))).size,
          2,
        );
        for (const s of made.splice(0)) {
          await s.kill();
        }
        for (const id of ids) {
          await freshCheckIn(gw, id, `${id} empty`, (n) => n.reading?.sandboxes.active === 0);
        }
        const late = `${alias}-late`;
        await Template.build(Template().fromTemplate("base").runCmd("echo late"), late, opts);
        assert.ok((await listedNames()).includes(late), "the template built last is listed");
      },
    );

    await t.step(
      "the builder stops mid-build: the status ends in an error, never hangs",
      async () => {
        for (const s of made.splice(0)) await s.kill();
        const background = await Template.buildInBackground(
          Template().fromTemplate("base").runCmd("sleep 600"),
          { alias: `${alias}-stopped`, ...opts },
        );
        const building = await Template.getBuildStatus(background, opts);
        assert.equal(building.status, "building");
        // Both nodes stop: the builder is one of them.
        await Promise.all(nodes.splice(0).map((n) => n.stop()));
        const error = await Template.getBuildStatus(background, opts).then(
          (s) => new Error(`answered ${JSON.stringify(s)}`),
          (e) => e,
        );
        assert.equal(error.name, "BuildError", String(error));
        assert.match(error.message, /which builds this template, (did not answer|is down)/);
      },
    );
  } finally {
    for (const s of made) await s.kill().catch(() => {});
    await Promise.all(nodes.map((n) => n.stop()));
    await gw.stop();
  }
});

Deno.test({
  name:
    "e2b SDK: a build's status is answered by a gateway that did not accept the build (restarted)",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  const dir = await Deno.makeTempDir({ prefix: "dormice-tplgw-" });
  const token = crypto.randomUUID().replaceAll("-", "");
  const env = { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" };
  let gw = await startGateway({ dir, token, env });
  const port = gw.port;
  const node = await startNode({
    token,
    env: {
      DORMICE_GATEWAY_ENDPOINT: gw.url,
      DORMICE_NODE_ID: "tplgw-a",
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    },
  });
  try {
    await freshCheckIn(gw, "tplgw-a", "the node up", (n) => n.reading !== null);
    const minted = await gw.json("createApiKey", { team: "tplgw" });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const opts = {
      apiUrl: `${gw.url}/e2b/api`,
      sandboxUrl: `${gw.url}/e2b/envd`,
      apiKey: minted.body.key,
    };
    const background = await Template.buildInBackground(
      Template().fromTemplate("base").runCmd("echo hello-from-the-build"),
      { alias: "tplgw-one", ...opts },
    );
    await gw.stop();
    gw = await startGateway({ dir, token, port, env });
    await freshCheckIn(
      gw,
      "tplgw-a",
      "the node back at the new gateway",
      (n) => n.reading !== null,
    );
    let status = await Template.getBuildStatus(background, { ...opts, logsOffset: 0 });
    for (let i = 0; i < 100 && status.status === "building"; i++) {
      await new Promise((r) => setTimeout(r, 100));
      status = await Template.getBuildStatus(background, { ...opts, logsOffset: 0 });
    }
    assert.equal(status.status, "ready", JSON.stringify(status.reason));
    assert.ok(status.logEntries.some((l) => l.message === "hello-from-the-build"));
    // Another team still finds no such build.
    const other = await gw.json("createApiKey", { team: "tplgw-other" });
    const theirs = await Template.getBuildStatus(background, {
      ...opts,
      apiKey: other.body.key,
    }).then(() => undefined, (e) => e);
    assert.ok(
      theirs instanceof Error && /not found on any node/.test(theirs.message),
      String(theirs),
    );
  } finally {
    await node.stop();
    await gw.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
