import assert from "node:assert/strict";
import { decodeEnvelopes } from "../../connect_codec.ts";
import { setup } from "../_fixtures_test.ts";

Deno.test("Process/Start streams start, data, end and the end-stream envelope", async () => {
  const { stream, executor } = await setup();
  const res = await stream("process.Process/Start", {
    process: { cmd: "/bin/bash", args: ["-l", "-c", "echo hi; echo err >&2; exit 2"] },
  });
  assert.equal(res.headers.get("content-type"), "application/connect+json");
  const envelopes = decodeEnvelopes(new Uint8Array(await res.arrayBuffer()));
  const messages = envelopes.map((e) => e.message as Record<string, Record<string, unknown>>);
  assert.ok("start" in messages[0].event);
  const out = messages.filter((m) => m.event?.data).map((m) => m.event.data);
  assert.deepEqual(out, [{ stdout: btoa("hi\n") }, { stderr: btoa("err\n") }]);
  assert.deepEqual(messages.at(-2)?.event.end, {
    exitCode: 2,
    exited: true,
    status: "exit status 2",
  });
  assert.deepEqual(envelopes.at(-1), { flags: 2, message: {} });
  await executor.close();
});

Deno.test("a client hanging up stops its stream; the command lives on until killed", async () => {
  const { stream, unary, headers, executor } = await setup();
  const client = new AbortController();
  const res = await stream(
    "process.Process/Start",
    { process: { cmd: "/bin/bash", args: ["-c", "sleep 30"] } },
    headers({ "Keepalive-Ping-Interval": "1" }),
    client.signal,
  );
  const reader = res.body!.getReader();
  const first = await reader.read();
  const [start] = decodeEnvelopes(first.value!);
  const pid = (start.message as { event: { start: { pid: number } } }).event.start.pid;
  client.abort();
  await reader.cancel();
  const listed = await (await unary("process.Process/List", {})).json();
  assert.deepEqual(listed.processes.map((p: { pid: number }) => p.pid), [pid]);
  const kill = await unary("process.Process/SendSignal", {
    process: { pid },
    signal: "SIGNAL_SIGKILL",
  });
  assert.equal(kill.status, 200);
  await kill.body?.cancel();
  const again = await unary("process.Process/SendSignal", {
    process: { pid: 999 },
    signal: "SIGNAL_SIGKILL",
  });
  assert.equal(again.status, 404);
  assert.equal((await again.json()).code, "not_found");
  await executor.close();
});
