import { FakeClock } from "../../shared/clock.ts";
import assert from "node:assert/strict";
import {
  connectCodeToStatus,
  ConnectError,
  connectErrorResponse,
  decodeEnvelopes,
  encodeEndStream,
  encodeEnvelope,
  FLAG_END_STREAM,
  readStreamRequest,
  readUnaryRequest,
  statusToConnectCode,
  StreamCut,
  streamResponse,
} from "./connect_codec.ts";

Deno.test("encodeEnvelope() writes flags, a big-endian length and the JSON", () => {
  const bytes = encodeEnvelope(0, { a: 1 });
  assert.equal(bytes[0], 0);
  assert.deepEqual([...bytes.subarray(1, 5)], [0, 0, 0, 7]);
  assert.equal(new TextDecoder().decode(bytes.subarray(5)), '{"a":1}');
});

Deno.test("decodeEnvelopes() reads back several envelopes and the end-stream flag", () => {
  const a = encodeEnvelope(0, { event: { start: { pid: 3 } } });
  const b = encodeEndStream();
  const both = new Uint8Array(a.length + b.length);
  both.set(a);
  both.set(b, a.length);
  const out = decodeEnvelopes(both);
  assert.deepEqual(out, [
    { flags: 0, message: { event: { start: { pid: 3 } } } },
    { flags: FLAG_END_STREAM, message: {} },
  ]);
});

Deno.test("encodeEndStream() carries an error as {error:{code,message}}", () => {
  const [env] = decodeEnvelopes(encodeEndStream({ code: "not_found", message: "gone" }));
  assert.equal(env.flags, 0x02);
  assert.deepEqual(env.message, { error: { code: "not_found", message: "gone" } });
});

Deno.test("decodeEnvelopes() refuses truncated, compressed and non-JSON envelopes", () => {
  const whole = encodeEnvelope(0, { path: "/" });
  assert.throws(() => decodeEnvelopes(whole.subarray(0, 3)), ConnectError);
  assert.throws(() => decodeEnvelopes(whole.subarray(0, whole.length - 1)), /announces/);
  const compressed = whole.slice();
  compressed[0] = 1;
  assert.throws(() => decodeEnvelopes(compressed), (e: ConnectError) => e.code === "unimplemented");
  const junk = new Uint8Array([0, 0, 0, 0, 2, 123, 123]);
  assert.throws(() => decodeEnvelopes(junk), (e: ConnectError) => e.code === "invalid_argument");
});

Deno.test("Connect codes map to HTTP statuses both ways", () => {
  assert.equal(connectCodeToStatus("not_found"), 404);
  assert.equal(connectCodeToStatus("unauthenticated"), 401);
  assert.equal(connectCodeToStatus("unavailable"), 503);
  assert.equal(connectCodeToStatus("invalid_argument"), 400);
  assert.equal(connectCodeToStatus("unimplemented"), 501);
  assert.equal(statusToConnectCode(404), "not_found");
  assert.equal(statusToConnectCode(409), "already_exists");
  assert.equal(statusToConnectCode(503), "unavailable");
  assert.equal(statusToConnectCode(500), "internal");
  assert.equal(statusToConnectCode(507), "resource_exhausted"); // a full data disk
  assert.equal(statusToConnectCode(410), "failed_precondition"); // a lost sandbox
});

Deno.test("connectErrorResponse() answers the code's status with {code, message}", async () => {
  const res = connectErrorResponse("not_found", "No file");
  assert.equal(res.status, 404);
  assert.deepEqual(await res.json(), { code: "not_found", message: "No file" });
});

Deno.test("readStreamRequest() takes exactly one envelope; readUnaryRequest() one object", async () => {
  const req = new Request("http://x/", { method: "POST", body: encodeEnvelope(0, { path: "/a" }) });
  assert.deepEqual(await readStreamRequest(req), { path: "/a" });
  const two = new Uint8Array([...encodeEnvelope(0, {}), ...encodeEnvelope(0, {})]);
  await assert.rejects(
    readStreamRequest(new Request("http://x/", { method: "POST", body: two })),
    /exactly one/,
  );
  assert.deepEqual(
    await readUnaryRequest(new Request("http://x/", { method: "POST", body: "" })),
    {},
  );
  await assert.rejects(
    readUnaryRequest(new Request("http://x/", { method: "POST", body: "[1]" })),
    /JSON object/,
  );
});

Deno.test("readUnaryRequest() turns the JSON reader's refusals into Connect errors", async () => {
  const refusal = async (request: Request) => {
    try {
      await readUnaryRequest(request);
    } catch (error) {
      assert.ok(error instanceof ConnectError, String(error));
      return error;
    }
    assert.fail("expected a ConnectError");
  };
  const notJson = await refusal(new Request("http://x/", { method: "POST", body: "{nope" }));
  assert.equal(notJson.code, "invalid_argument");
  assert.match(notJson.message, /not valid JSON/);
  const big = await refusal(
    new Request("http://x/", {
      method: "POST",
      headers: { "content-length": String(64 * 1024 ** 2) },
      body: "{}",
    }),
  );
  assert.equal(big.code, "invalid_argument");
  assert.match(big.message, /cap of 32 MiB/);
});

Deno.test("readStreamRequest() stops reading an endless body at the cap with a Connect error", async () => {
  let pulled = 0;
  const endless = new ReadableStream<Uint8Array>({
    pull(c) {
      pulled++;
      c.enqueue(new Uint8Array(64 * 1024));
    },
  });
  const request = new Request("http://x/", { method: "POST", body: endless });
  const error = await readStreamRequest(request, {
    maxBytes: 1024 * 1024,
    capVariable: "DORMICE_JSON_BODY_LIMIT_MB",
  }).catch((e) => e);
  assert.ok(error instanceof ConnectError, String(error));
  assert.equal(error.code, "invalid_argument");
  assert.match(error.message, /cap of 1 MiB \(DORMICE_JSON_BODY_LIMIT_MB\)/);
  assert.ok(pulled <= 20, `read ${pulled} chunks of 64 KiB under a 1 MiB cap`);
});

async function readAll(res: Response): Promise<Uint8Array> {
  return new Uint8Array(await res.arrayBuffer());
}

Deno.test("streamResponse() sends messages, then the end-stream {}", async () => {
  const res = streamResponse((sink) => {
    sink.send({ n: 1 });
    sink.send({ n: 2 });
    return Promise.resolve();
  });
  assert.equal(res.headers.get("content-type"), "application/connect+json");
  const out = decodeEnvelopes(await readAll(res));
  assert.deepEqual(out, [
    { flags: 0, message: { n: 1 } },
    { flags: 0, message: { n: 2 } },
    { flags: 2, message: {} },
  ]);
});

Deno.test("streamResponse() ends a failed stream with the error in the end-stream", async () => {
  const res = streamResponse((sink) => {
    sink.send({ n: 1 });
    return Promise.reject(new ConnectError("not_found", "No pid 9"));
  });
  const out = decodeEnvelopes(await readAll(res));
  assert.deepEqual(out.at(-1), {
    flags: 2,
    message: { error: { code: "not_found", message: "No pid 9" } },
  });
});

Deno.test("streamResponse() aborts the sink's signal when the client cancels the body", async () => {
  let seen: AbortSignal | undefined;
  let finished!: () => void;
  const done = new Promise<void>((r) => finished = r);
  const res = streamResponse(async (sink) => {
    seen = sink.signal;
    sink.send({ hello: true });
    await new Promise<void>((r) => sink.signal.addEventListener("abort", () => r()));
    finished();
  });
  const reader = res.body!.getReader();
  await reader.read();
  await reader.cancel();
  await done;
  assert.equal(seen?.aborted, true);
});

Deno.test("streamResponse() ends a stream whose client falls too far behind", async () => {
  const res = streamResponse((sink) => {
    for (let i = 0; i < 100 && !sink.signal.aborted; i++) sink.send({ pad: "x".repeat(100) });
    return Promise.resolve();
  }, { maxBufferedBytes: 1_000 });
  const out = decodeEnvelopes(await readAll(res));
  assert.ok(out.length < 100);
  assert.equal(
    (out.at(-1)?.message as { error: { code: string } }).error.code,
    "resource_exhausted",
  );
});

Deno.test("streamResponse() ends a stream past its deadline with deadline_exceeded", async () => {
  const clock = new FakeClock();
  let seen: AbortSignal | undefined;
  const res = streamResponse(async (sink) => {
    seen = sink.signal;
    sink.send({ n: 1 });
    await new Promise<void>((r) => sink.signal.addEventListener("abort", () => r()));
    sink.send({ late: true }); // after the deadline: dropped
  }, { deadlineMs: 50, timers: clock });
  const reading = readAll(res);
  // `run` never ends by itself: only the deadline can end this stream, and only once it is due.
  clock.tick(49);
  assert.equal(seen?.aborted, false, "the stream ended before its deadline");
  clock.tick(1);
  assert.equal(seen?.aborted, true, "the stream outlived its deadline");
  const out = decodeEnvelopes(await reading);
  assert.deepEqual(out.map((e) => e.flags), [0, 2]);
  const error = (out[1].message as { error: { code: string; message: string } }).error;
  assert.equal(error.code, "deadline_exceeded");
  assert.match(error.message, /50 ms/);
});

Deno.test("streamResponse() drops the connection, with no end-stream, on a StreamCut", async () => {
  const res = streamResponse((sink) => {
    sink.send({ n: 1 });
    return Promise.reject(new StreamCut("the sandbox died"));
  });
  const reader = res.body!.getReader();
  const first = await reader.read();
  assert.deepEqual(decodeEnvelopes(first.value!), [{ flags: 0, message: { n: 1 } }]);
  await assert.rejects(reader.read(), StreamCut);
});
