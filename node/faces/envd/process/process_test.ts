import assert from "node:assert/strict";
import { ExecutorError } from "../../../executors/contract.ts";
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

Deno.test("a tag names a process of the caller's sandbox, never another sandbox's pid", async () => {
  const { service, sandbox, accessTokens, stream, unary, headers, executor } = await setup();
  const { sandbox: other } = await service.acquire({ name: "envd-2" });
  const otherHeaders = {
    "E2b-Sandbox-Id": other.id,
    "X-Access-Token": accessTokens.forSandbox(other.id),
  };
  /** Starts `sleep 30`, reads its pid from the start event, then hangs up (it keeps running). */
  const startSleep = async (h: typeof otherHeaders, tag?: string) => {
    const res = await stream(
      "process.Process/Start",
      { process: { cmd: "/bin/bash", args: ["-c", "sleep 30"] }, ...(tag ? { tag } : {}) },
      h,
    );
    const reader = res.body!.getReader();
    const [start] = decodeEnvelopes((await reader.read()).value!);
    await reader.cancel();
    return (start.message as { event: { start: { pid: number } } }).event.start.pid;
  };
  const untagged = await startSleep(headers());
  const job = await startSleep(headers(), "job");
  // Pids count per sandbox, so the other sandbox's "job" has the pid of this one's untagged.
  const otherJob = await startSleep(otherHeaders, "job");
  assert.equal(otherJob, untagged);
  const running = service.commands({ id: sandbox.id });
  // Whichever ends first is the one the signal reached; the other sleeps on.
  const ended = Promise.race([
    running.get(job)!.handle.exited.then(() => "job"),
    running.get(untagged)!.handle.exited.then(() => "untagged"),
  ]);
  const kill = await unary("process.Process/SendSignal", {
    process: { tag: "job" },
    signal: "SIGNAL_SIGKILL",
  });
  assert.equal(kill.status, 200);
  await kill.body?.cancel();
  assert.equal(await ended, "job");
  const listed = await (await unary("process.Process/List", {})).json();
  assert.deepEqual(listed.processes.map((p: { pid: number }) => p.pid), [untagged]);
  const otherListed = await (await unary("process.Process/List", {}, otherHeaders)).json();
  assert.deepEqual(otherListed.processes.map((p: { pid: number }) => p.pid), [otherJob]);
  await executor.close();
});

Deno.test("Process/Start ends with a Connect error, not an end event, when the command's end is lost", async () => {
  const { service, stream, executor } = await setup();
  const lost = new ExecutorError("unavailable", "Lost the Docker engine on /run/x.sock");
  service.startCommand = () =>
    Promise.resolve({
      pid: 7,
      stdout: new Response("partial").body!,
      stderr: new Response("").body!,
      exited: Promise.reject(lost),
      writeStdin: () => Promise.resolve(),
      closeStdin: () => Promise.resolve(),
      kill: () => Promise.resolve(),
      resize: () => Promise.resolve(),
    });
  const res = await stream("process.Process/Start", { process: { cmd: "sleep", args: ["9"] } });
  const envelopes = decodeEnvelopes(new Uint8Array(await res.arrayBuffer()));
  const events = envelopes.slice(0, -1).map((e) =>
    Object.keys((e.message as { event: object }).event)[0]
  );
  assert.deepEqual(events, ["start", "data"]);
  assert.deepEqual(envelopes.at(-1), {
    flags: 2,
    message: { error: { code: "unavailable", message: lost.message } },
  });
  await executor.close();
});
