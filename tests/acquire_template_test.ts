/**
 * A name keeps the template it was built from: an acquire of an existing name that asks for
 * another template is a 409 from the node, passed through the gateway in the native dialect,
 * and the E2B named create says the same in E2B's. One gateway and one real node app on the
 * fake executor, in process.
 */
import assert from "node:assert/strict";
import { createGateway } from "../gateway/app.ts";
import { checkIn, fetchToNodes } from "../gateway/_fixtures_test.ts";
import { testNodeApp } from "../node/_app_fixtures_test.ts";
import { FakeExecutor } from "../node/executors/fake.ts";

const token = "acquire-template-test-token-0123456789abcdef";
const endpoint = "http://10.0.0.5:3676";

function fleet() {
  const executor = new FakeExecutor();
  const node = testNodeApp({ token, endpoint, executor });
  const gateway = createGateway({
    token,
    fetch: fetchToNodes(new Map([[endpoint, { handle: (r: Request) => node.fetch(r) }]])),
  });
  const call = (path: string, body: unknown, headers: Record<string, string> = {}) =>
    gateway.fetch(
      new Request(`http://gw.test${path}`, {
        method: "POST",
        headers: {
          authorization: `Bearer ${token}`,
          "content-type": "application/json",
          ...headers,
        },
        body: JSON.stringify(body),
      }),
    );
  return {
    executor,
    call,
    async close() {
      gateway.close();
      await node.close();
    },
  };
}

Deno.test("acquireSandbox through the gateway: another template for an existing name is a 409 naming both", async () => {
  const f = fleet();
  try {
    const joined = await f.call("/checkIn", checkIn("node-1", endpoint));
    assert.equal(joined.status, 200, await joined.text());
    const built = await f.call("/acquireSandbox", { name: "agent-1", template: "minimal" });
    assert.equal(built.status, 200, await built.clone().text());
    const { sandbox } = await built.json();
    assert.equal(sandbox.template, "minimal");

    const refused = await f.call("/acquireSandbox", { name: "agent-1", template: "base" });
    assert.equal(refused.status, 409);
    const body = await refused.json();
    assert.deepEqual(Object.keys(body), ["message"], "the native dialect: {message}");
    assert.match(
      body.message,
      /'agent-1' exists with template 'minimal'.*asks for template 'base'/,
    );
    assert.match(body.message, /destroy it first \(destroySandbox.*or use another name/);
    assert.equal((await f.executor.list()).length, 1, "nothing else was built");

    // Naming no template, or the same one, wakes it as before.
    for (const template of [undefined, "minimal"]) {
      const woken = await f.call("/acquireSandbox", { name: "agent-1", template });
      assert.equal(woken.status, 200);
      const answer = await woken.json();
      assert.equal(answer.created, false);
      assert.equal(answer.sandbox.id, sandbox.id);
    }

    // The E2B named create holds the same rule, in E2B's {code, message}.
    const e2b = await f.call(
      "/e2b/api/sandboxes",
      { templateID: "base", metadata: { name: "agent-1" } },
      { "x-api-key": token },
    );
    assert.equal(e2b.status, 409);
    const e2bBody = await e2b.json();
    assert.equal(e2bBody.code, 409);
    assert.match(e2bBody.message, /exists with template 'minimal'/);

    // The remedy works: destroy, then the name builds from the template asked for.
    const destroyed = await f.call("/destroySandbox", { name: "agent-1" });
    assert.equal(destroyed.status, 200, await destroyed.text());
    const rebuilt = await f.call("/acquireSandbox", { name: "agent-1", template: "base" });
    assert.equal(rebuilt.status, 200);
    const again = await rebuilt.json();
    assert.equal(again.created, true);
    assert.equal(again.sandbox.template, "base");
  } finally {
    await f.close();
  }
});
