import assert from "node:assert/strict";
import { boundedShutdown } from "./shutdown.ts";

Deno.test("boundedShutdown() closes after in-flight work finishes within the bound", async () => {
  let closed = false;
  const ok = await boundedShutdown({ shutdown: () => Promise.resolve() }, 1000, () => {
    closed = true;
  });
  assert.equal(ok, true);
  assert.equal(closed, true);
});

Deno.test("boundedShutdown() gives up at the bound and still closes", async () => {
  let closed = false;
  const ok = await boundedShutdown({ shutdown: () => new Promise(() => {}) }, 0, () => {
    closed = true;
  });
  assert.equal(ok, false);
  assert.equal(closed, true);
});

Deno.test("boundedShutdown() stops a real server holding a slow request", async () => {
  const server = Deno.serve({ port: 0, hostname: "127.0.0.1", onListen() {} }, async () => {
    await new Promise((r) => setTimeout(r, 50));
    return new Response("done");
  });
  const res = fetch(`http://127.0.0.1:${server.addr.port}/`);
  await new Promise((r) => setTimeout(r, 10));
  const ok = await boundedShutdown(server, 2000);
  assert.equal(ok, true);
  assert.equal(await (await res).text(), "done");
});
