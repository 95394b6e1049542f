import assert from "node:assert/strict";
import { FakeExecutor } from "../executors/fake.ts";
import { Ledger } from "../ledger.ts";
import { SandboxService } from "../service.ts";
import { AccessTokens } from "../../shared/access_tokens.ts";
import { createPortsDoor } from "./ports.ts";

async function setup() {
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const executor = new FakeExecutor();
  const service = new SandboxService({ ledger, executor });
  const door = createPortsDoor(service, executor, {
    accessTokens: new AccessTokens("s".repeat(32)),
  });
  const { sandbox } = await service.acquire({ name: "ports" });
  return {
    id: sandbox.id,
    door,
    async [Symbol.asyncDispose]() {
      await executor.close();
      ledger.close();
    },
  };
}

const CHROME = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) " +
  "Chrome/91.0.4472.124 Safari/537.36";

Deno.test("ports door: a closed port is E2B's 502 word for word, with the port and what to do", async () => {
  await using s = await setup();
  const res = await s.door(
    new Request("http://n/e2b/ports/3000/", { headers: { "e2b-sandbox-id": s.id } }),
  );
  assert.equal(res.status, 502);
  const body = await res.json();
  assert.equal(body.message, "The sandbox is running but port is not open");
  assert.equal(body.sandboxId, s.id);
  assert.equal(body.port, 3000);
  assert.equal(body.code, 502);
  assert.match(body.hint, /start a server on 0\.0\.0\.0:3000/);
});

Deno.test("ports door: a browser gets E2B's Closed Port Error page", async () => {
  await using s = await setup();
  const res = await s.door(
    new Request("http://n/e2b/ports/3000/", {
      headers: { "e2b-sandbox-id": s.id, "user-agent": CHROME },
    }),
  );
  assert.equal(res.status, 502);
  assert.match(res.headers.get("content-type") ?? "", /^text\/html/);
  const page = await res.text();
  assert.match(page, /<title>Closed Port Error<\/title>/);
  assert.ok(page.includes(s.id) && page.includes("3000"));
});
