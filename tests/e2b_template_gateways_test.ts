/**
 * Template tags and template builds that do not depend on the gateway that accepted them, with
 * the official `e2b` SDK and plain fetch against real gateways in front of a real fake-executor
 * node: a gateway restarted between a build's request and its upload, steps and status serves
 * them, and still resolves `name:tag` after a restart; in shared mode (two gateways, one etcd) a
 * tag set through one gateway resolves through the other, a new name requested through both at
 * once is one template, and a build requested through one is uploaded, started and read through
 * the other. An upload URL names the one file hash it was
 * issued for, and is spent once the build's steps arrive.
 */
import assert from "node:assert/strict";
import { Sandbox, Template } from "e2b";
import { writeTar } from "../node/executors/docker/_tar.ts";
import { type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { freshCheckIn } from "./_heal_fleet.ts";
import { until } from "./_docker.ts";
import { etcdMissing, startEtcd } from "./support/etcd.ts";

const missing = etcdMissing();

/** The SDK's options for a key through gateway `gw`. */
function sdkOptions(gw: GatewayProcess, apiKey: string) {
  return { apiUrl: `${gw.url}/e2b/api`, sandboxUrl: `${gw.url}/e2b/envd`, apiKey };
}

/** A JSON call of the E2B API through `gw`. */
async function call(
  gw: GatewayProcess,
  apiKey: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<{ status: number; body: Record<string, string> & { present?: boolean } }> {
  const res = await fetch(`${gw.url}/e2b/api${path}`, {
    method,
    headers: { "x-api-key": apiKey, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, body: text ? JSON.parse(text) : null };
}

/** A context the SDK would upload: a gzipped tar holding `hello.txt`, and its hash. */
async function context(): Promise<{ bytes: Uint8Array; hash: string }> {
  const tar = writeTar([{
    name: "hello.txt",
    type: "file",
    data: new TextEncoder().encode("hello"),
  }]);
  const bytes = new Uint8Array(
    await new Response(
      new Blob([tar as BlobPart]).stream().pipeThrough(new CompressionStream("gzip")),
    ).arrayBuffer(),
  );
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as BufferSource));
  return { bytes, hash: [...digest].map((b) => b.toString(16).padStart(2, "0")).join("") };
}

/**
 * One build, its request through `accept` and everything after through `serve`: the upload URL,
 * a refused upload of another hash, the upload, the steps (a `COPY` of it), the spent URL and
 * the status until ready.
 */
async function buildAcross(
  accept: () => GatewayProcess,
  serve: () => GatewayProcess,
  apiKey: string,
  name: string,
  between: () => Promise<void> = () => Promise.resolve(),
): Promise<void> {
  const req = await call(accept(), apiKey, "POST", "/v3/templates", { name });
  assert.equal(req.status, 202, JSON.stringify(req.body));
  const { templateID, buildID } = req.body;
  const files = await context();
  await between();
  const asked = await call(serve(), apiKey, "GET", `/templates/${templateID}/files/${files.hash}`);
  assert.equal(asked.status, 200, JSON.stringify(asked.body));
  assert.equal(asked.body.present, false);
  assert.ok(asked.body.url.startsWith(serve().url), asked.body.url);
  const other = "e".repeat(64);
  const wrongHash = await fetch(asked.body.url.replace(files.hash, other), {
    method: "PUT",
    body: files.bytes as BodyInit,
  });
  assert.equal(wrongHash.status, 400);
  assert.match(
    (await wrongHash.json()).message,
    new RegExp(`issued for files hash '${files.hash}', not '${other}'`),
  );
  const put = await fetch(asked.body.url, { method: "PUT", body: files.bytes as BodyInit });
  assert.equal(put.status, 201, await put.text());
  const present = await call(
    serve(),
    apiKey,
    "GET",
    `/templates/${templateID}/files/${files.hash}`,
  );
  assert.equal(present.body.present, true);
  const started = await call(
    serve(),
    apiKey,
    "POST",
    `/v2/templates/${templateID}/builds/${buildID}`,
    {
      fromTemplate: "base",
      steps: [
        { type: "COPY", args: ["hello.txt", "/tmp/hello.txt", "", ""], filesHash: files.hash },
        { type: "RUN", args: ["echo built"] },
      ],
    },
  );
  assert.equal(started.status, 202, JSON.stringify(started.body));
  const spent = await fetch(asked.body.url, { method: "PUT", body: files.bytes as BodyInit });
  assert.equal(spent.status, 403);
  assert.match((await spent.json()).message, /its build has started/);
  await until(`build ${buildID} is ready`, async () => {
    const status = await call(
      serve(),
      apiKey,
      "GET",
      `/templates/${templateID}/builds/${buildID}/status`,
    );
    assert.equal(status.status, 200, JSON.stringify(status.body));
    assert.notEqual(status.body.status, "error", JSON.stringify(status.body));
    return status.body.status === "ready";
  });
}

Deno.test({
  name: "e2b templates: a restarted gateway serves a build it accepted and still resolves name:tag",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const dir = await Deno.makeTempDir({ prefix: "dormice-tagrestart-" });
  const token = crypto.randomUUID().replaceAll("-", "");
  const env = { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" };
  let gw = await startGateway({ dir, token, env });
  const port = gw.port;
  let node: NodeProcess | undefined;
  const made: Sandbox[] = [];
  const restart = async () => {
    await gw.stop();
    gw = await startGateway({ dir, token, port, env });
    await freshCheckIn(gw, "tagrestart-a", "the node back", (n) => n.reading !== null);
  };
  try {
    node = await startNode({
      token,
      env: {
        DORMICE_GATEWAY_ENDPOINT: gw.url,
        DORMICE_NODE_ID: "tagrestart-a",
        DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
      },
    });
    await freshCheckIn(gw, "tagrestart-a", "the node up", (n) => n.reading !== null);
    const minted = await gw.json("createApiKey", { team: "tagrestart" });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const key = minted.body.key;
    const name = `restart-${crypto.randomUUID().slice(0, 8)}`;

    await t.step(
      "a build requested before the restart is uploaded, started, read after",
      async () => {
        await buildAcross(() => gw, () => gw, key, `${name}-split`, restart);
      },
    );

    await t.step("tags set before the restart resolve after it", async () => {
      const built = await Template.build(
        Template().fromTemplate("base").runCmd("echo v1"),
        `${name}:v1`,
        sdkOptions(gw, key),
      );
      await Template.assignTags(`${name}:v1`, ["production"], sdkOptions(gw, key));
      await restart();
      const tags = await Template.getTags(built.templateId, sdkOptions(gw, key));
      assert.deepEqual(tags.map((x) => x.tag).sort(), ["default", "production", "v1"]);
      assert.ok(tags.every((x) => x.buildId === built.buildId), JSON.stringify(tags));
      made.push(await Sandbox.create(`${name}:production`, sdkOptions(gw, key)));
      await assert.rejects(Sandbox.create(`${name}:nope`, sdkOptions(gw, key)), /Tag 'nope'/);
      // A rebuild after the restart: the tag naming the first build is refused by name.
      await Template.build(
        Template().fromTemplate("base").runCmd("echo v2"),
        name,
        sdkOptions(gw, key),
      );
      await assert.rejects(
        Sandbox.create(`${name}:production`, sdkOptions(gw, key)),
        /Tag 'production' of template '.*' names build .*not its newest build/,
      );
    });
  } finally {
    for (const s of made) await s.kill().catch(() => {});
    await node?.stop();
    await gw.stop();
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});

Deno.test({
  name: `shared mode: template tags and a build's calls work through either gateway${
    missing ? ` (skipped: ${missing})` : ""
  }`,
  ignore: missing !== null,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const etcd = await startEtcd(1);
  const token = crypto.randomUUID().replaceAll("-", "");
  const env = {
    DORMICE_GATEWAY_ETCD: etcd.endpoints,
    DORMICE_GATEWAY_ETCD_PREFIX: `/t-${crypto.randomUUID().slice(0, 8)}/`,
    DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
  };
  const gateways: GatewayProcess[] = [];
  let node: NodeProcess | undefined;
  const made: Sandbox[] = [];
  try {
    for (let i = 0; i < 2; i++) gateways.push(await startGateway({ token, env }));
    const [g1, g2] = gateways;
    node = await startNode({
      token,
      env: {
        DORMICE_GATEWAY_ENDPOINT: gateways.map((g) => g.url).join(","),
        DORMICE_NODE_ID: "tagshared-a",
        DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
      },
    });
    for (const g of gateways) {
      await freshCheckIn(g, "tagshared-a", "the node up", (n) => n.reading !== null);
    }
    const minted = await g1.json("createApiKey", { team: "tagshared" });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    const key = minted.body.key;
    await until("the key works through the second gateway", async () => {
      return (await call(g2, key, "GET", "/templates")).status === 200;
    });
    const name = `shared-${crypto.randomUUID().slice(0, 8)}`;

    await t.step("a tag set through gateway 1 resolves through gateway 2", async () => {
      const built = await Template.build(
        Template().fromTemplate("base").runCmd("echo v1"),
        `${name}:v1`,
        sdkOptions(g1, key),
      );
      await Template.assignTags(`${name}:v1`, ["production"], sdkOptions(g1, key));
      const tags = await Template.getTags(built.templateId, sdkOptions(g2, key));
      assert.deepEqual(tags.map((x) => x.tag).sort(), ["default", "production", "v1"]);
      made.push(await Sandbox.create(`${name}:production`, sdkOptions(g2, key)));
      // Removed through gateway 2, gone through gateway 1.
      await Template.removeTags(name, ["production"], sdkOptions(g2, key));
      await assert.rejects(
        Sandbox.create(`${name}:production`, sdkOptions(g1, key)),
        /Tag 'production'/,
      );
    });

    await t.step("a new name requested through both gateways at once is one template", async () => {
      for (let round = 0; round < 3; round++) {
        const fresh = `${name}-race${round}`;
        const [a, b] = await Promise.all(
          [g1, g2].map((g) => call(g, key, "POST", "/v3/templates", { name: fresh })),
        );
        assert.equal(a.status, 202, JSON.stringify(a.body));
        assert.equal(b.status, 202, JSON.stringify(b.body));
        assert.equal(a.body.templateID, b.body.templateID, `round ${round}`);
        assert.notEqual(a.body.buildID, b.body.buildID);
      }
    });

    await t.step(
      "a deleted template's name, rebuilt at once through either gateway, is a new template",
      async () => {
        for (const by of ["id", "name"] as const) {
          const gone = `${name}-del-${by}`;
          const built = await Template.build(
            Template().fromTemplate("base").runCmd("echo first"),
            gone,
            sdkOptions(g1, key),
          );
          const del = await call(
            g2,
            key,
            "DELETE",
            `/templates/${by === "id" ? built.templateId : gone}`,
          );
          assert.equal(del.status, 204, JSON.stringify(del.body));
          // Well within the build record's life in etcd (its lease), through both gateways.
          for (const g of [g1, g2]) {
            const again = await call(g, key, "POST", "/v3/templates", { name: gone });
            assert.equal(again.status, 202, JSON.stringify(again.body));
            assert.notEqual(again.body.templateID, built.templateId, `by ${by}, through ${g.url}`);
          }
        }
      },
    );

    await t.step("a build requested through gateway 1 runs through gateway 2", async () => {
      await buildAcross(() => g1, () => g2, key, `${name}-split`);
    });
  } finally {
    for (const s of made) await s.kill().catch(() => {});
    await node?.stop();
    for (const g of gateways) await g.stop();
    await etcd.stop();
  }
});
