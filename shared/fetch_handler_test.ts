import assert from "node:assert/strict";
import { asFetch } from "./fetch_handler.ts";

Deno.test("asFetch() hands a handler one Request with the method, headers, body and signal", async () => {
  const abort = new AbortController();
  let seen: Request | undefined;
  const send = asFetch((request) => {
    seen = request;
    return new Response("ok");
  });
  const res = await send("http://node.test/lookupSandbox", {
    method: "POST",
    headers: { authorization: "Bearer t" },
    body: '{"name":"x"}',
    signal: abort.signal,
  });
  assert.equal(await res.text(), "ok");
  assert.equal(seen!.url, "http://node.test/lookupSandbox");
  assert.equal(seen!.method, "POST");
  assert.equal(seen!.headers.get("authorization"), "Bearer t");
  assert.equal(await seen!.text(), '{"name":"x"}');
  abort.abort();
  assert.ok(seen!.signal.aborted);
  assert.equal(asFetch(globalThis.fetch), globalThis.fetch, "the global fetch is kept as it is");
});

Deno.test("asFetch() rejects with the signal's reason once it aborts before the handler answers", async () => {
  const abort = new AbortController();
  let seen: Request | undefined;
  // A handler that never watches its signal: it answers only when released.
  let release!: (response: Response) => void;
  const send = asFetch((request) => {
    seen = request;
    return new Promise<Response>((resolve) => release = resolve);
  });
  const answer = send("http://node.test/execCommand", { method: "POST", signal: abort.signal });
  const reason = new Error("the client hung up");
  abort.abort(reason);
  await assert.rejects(answer, (error) => error === reason);
  assert.ok(seen!.signal.aborted, "the handler's Request aborted too");
  release(new Response("late"));
});

Deno.test("asFetch() rejects at once for a signal already aborted, without calling the handler", async () => {
  let calls = 0;
  const send = asFetch(() => {
    calls++;
    return new Response("ok");
  });
  await assert.rejects(
    send("http://node.test/", { signal: AbortSignal.abort() }),
    (error: Error) => error.name === "AbortError",
  );
  assert.equal(calls, 0);
});

Deno.test("asFetch() answers as the handler does when nothing aborts, and a later abort changes nothing", async () => {
  const abort = new AbortController();
  const send = asFetch(() => Promise.resolve(new Response("ok")));
  const res = await send("http://node.test/", { signal: abort.signal });
  abort.abort();
  assert.equal(await res.text(), "ok");
  await assert.rejects(
    asFetch(() => Promise.reject(new TypeError("refused")))("http://node.test/"),
    TypeError,
  );
});
