/**
 * Template tags with the official `e2b` SDK, unmodified, through a real gateway in front of a
 * real fake-executor node: a build's `name:tag` names it, `Template.assignTags` points more tags
 * at the build a `name:tag` names, `Template.getTags` lists them, `Template.removeTags` removes
 * them, `Sandbox.create("name:tag")` starts the newest build and is refused naming the tag when
 * the tag names an older one, another team finds none of it, and bad bodies are 400s naming the
 * field.
 */
import assert from "node:assert/strict";
import { Sandbox, Template } from "e2b";
import { startNode } from "./_processes.ts";
import { startGateway } from "./_gateway.ts";
import { until } from "./_docker.ts";

Deno.test({
  name: "e2b SDK template tags through a gateway in front of a fake node",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const node = await startNode({
    token: gw.token,
    env: {
      DORMICE_GATEWAY_ENDPOINT: gw.url,
      DORMICE_NODE_ID: "tags-fake",
      DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
    },
  }).catch(async (error) => {
    await gw.stop();
    throw error;
  });
  const made: Sandbox[] = [];
  try {
    await until("the node is up with a reading at the gateway", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.some((n: { id: string; state: string; reading: unknown }) =>
        n.id === "tags-fake" && n.state === "up" && n.reading !== null
      );
    });
    const key = async (team: string) => {
      const minted = await gw.json("createApiKey", { team });
      assert.equal(minted.status, 200, JSON.stringify(minted.body));
      return {
        apiUrl: `${gw.url}/e2b/api`,
        sandboxUrl: `${gw.url}/e2b/envd`,
        apiKey: minted.body.key,
      };
    };
    const a = await key("team-a");
    const b = await key("team-b");
    const name = `tags-${crypto.randomUUID().slice(0, 8)}`;
    const call = async (method: string, body: unknown) => {
      const res = await fetch(`${a.apiUrl}/templates/tags`, {
        method,
        headers: { "x-api-key": a.apiKey, "content-type": "application/json" },
        body: JSON.stringify(body),
      });
      const text = await res.text();
      return { status: res.status, body: text ? JSON.parse(text) : null };
    };
    let templateId = "";
    let v1 = "";

    await t.step("a build's name:tag names it; assignTags points more tags at it", async () => {
      const built = await Template.build(
        Template().fromTemplate("base").runCmd("echo v1"),
        `${name}:v1`,
        a,
      );
      templateId = built.templateId;
      v1 = built.buildId;
      const tags = await Template.getTags(templateId, a);
      assert.deepEqual(tags.map((x) => x.tag).sort(), ["default", "v1"]);
      assert.ok(tags.every((x) => x.buildId === v1), JSON.stringify(tags));
      const assigned = await Template.assignTags(`${name}:v1`, ["production", "stable"], a);
      assert.deepEqual(assigned, { buildId: v1, tags: ["production", "stable"] });
      const after = await Template.getTags(templateId, a);
      assert.deepEqual(after.map((x) => x.tag).sort(), ["default", "production", "stable", "v1"]);
      assert.ok(after.every((x) => x.buildId === v1 && !isNaN(x.createdAt.getTime())));
      const sbx = await Sandbox.create(`${name}:production`, a);
      made.push(sbx);
    });

    await t.step("after a rebuild, a tag naming the older build is refused by name", async () => {
      const again = await Template.build(
        Template().fromTemplate("base").runCmd("echo v2"),
        name,
        a,
      );
      assert.equal(again.templateId, templateId);
      const tags = await Template.getTags(templateId, a);
      const of = (tag: string) => tags.find((x) => x.tag === tag)?.buildId;
      assert.equal(of("default"), again.buildId);
      assert.equal(of("v1"), v1);
      await assert.rejects(
        Sandbox.create(`${name}:v1`, a),
        /Tag 'v1' of template '.*' names build .*not its newest build/,
      );
      made.push(await Sandbox.create(`${name}:default`, a));
      await Template.assignTags(`${name}:default`, "v1", a);
      made.push(await Sandbox.create(`${name}:v1`, a));
      await assert.rejects(Sandbox.create(`${name}:nope`, a), /Tag 'nope' of template/);
    });

    await t.step("removeTags removes; a tag it does not have is a 404 naming it", async () => {
      await Template.removeTags(name, ["production", "stable"], a);
      const tags = await Template.getTags(templateId, a);
      assert.deepEqual(tags.map((x) => x.tag).sort(), ["default", "v1"]);
      await assert.rejects(Template.removeTags(name, "production", a), /Tag 'production'/);
      await assert.rejects(Template.assignTags(`${name}:nope`, "x", a), /Tag 'nope'/);
    });

    await t.step("another team finds neither the template nor its tags", async () => {
      const gone = /Template '.*' not found/;
      await assert.rejects(Template.getTags(templateId, b), gone);
      await assert.rejects(Template.assignTags(`${name}:v1`, "mine", b), gone);
      await assert.rejects(Template.removeTags(name, "v1", b), gone);
      await assert.rejects(Sandbox.create(`${name}:v1`, b));
      const tags = await Template.getTags(templateId, a);
      assert.ok(!tags.some((x) => x.tag === "mine"));
      // Published, the template starts for every team, but its tags stay its team's.
      const published = await fetch(`${a.apiUrl}/v2/templates/${templateId}`, {
        method: "PATCH",
        headers: { "x-api-key": a.apiKey, "content-type": "application/json" },
        body: JSON.stringify({ public: true }),
      });
      assert.equal(published.status, 200, await published.text());
      made.push(await Sandbox.create(name, b));
      await assert.rejects(Template.assignTags(`${name}:v1`, "mine", b), gone);
      await assert.rejects(Template.removeTags(name, "v1", b), gone);
      assert.ok((await Template.getTags(templateId, a)).some((x) => x.tag === "v1"));
    });

    await t.step("bad bodies are 400s naming the field", async () => {
      const cases: [string, unknown, RegExp][] = [
        ["POST", { tags: ["x"] }, /'target' is required/],
        ["POST", { target: `${name}:a:b`, tags: ["x"] }, /'target'/],
        ["POST", { target: `${name}:v1`, tags: [] }, /'tags' must be an array of 1 to 16/],
        ["POST", { target: `${name}:v1`, tags: ["bad tag"] }, /'tags' holds 'bad tag'/],
        ["POST", { target: "bad name!", tags: ["x"] }, /'target' 'bad name!' must be/],
        ["POST", { target: "base", tags: ["x"] }, /template of the fleet/],
        ["DELETE", { tags: ["x"] }, /'name' is required/],
        ["DELETE", { name, tags: "x" }, /'tags' must be an array/],
      ];
      for (const [method, body, message] of cases) {
        const res = await call(method, body);
        assert.equal(
          res.status,
          400,
          `${method} ${JSON.stringify(body)}: ${JSON.stringify(res.body)}`,
        );
        assert.match(res.body.message, message);
      }
      await assert.rejects(Sandbox.create(`${name}:a:b`, a), /'templateID'/);
    });
  } finally {
    for (const s of made) await s.kill().catch(() => {});
    await node.stop();
    await gw.stop();
  }
});
