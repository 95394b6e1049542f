import assert from "node:assert/strict";
import { ExecutorError } from "../../../executors/contract.ts";
import { decodeEnvelopes, StreamCut } from "../../connect_codec.ts";
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
  // envd's words for a failed command, twice: the SDK's CommandExitError takes `error` as its message.
  assert.deepEqual(messages.at(-2)?.event.end, {
    exitCode: 2,
    exited: true,
    status: "exit status 2",
    error: "exit status 2",
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

type Event = { event?: Record<string, Record<string, unknown>> };

/** Reads a whole stream's envelopes. */
async function envelopesOf(res: Response) {
  return { envelopes: decodeEnvelopes(new Uint8Array(await res.arrayBuffer())) };
}

Deno.test("Process/Start honours Connect-Timeout-Ms: deadline_exceeded, and the command dies", async () => {
  const { stream, unary, headers, executor } = await setup();
  const res = await stream(
    "process.Process/Start",
    { process: { cmd: "/bin/bash", args: ["-l", "-c", "echo a; sleep 30"] } },
    headers({ "Connect-Timeout-Ms": "300" }),
  );
  // The stream ends on the deadline, not on `sleep 30`: a stream left to the command would end
  // with its end event, which the assertions below refuse.
  const { envelopes } = await envelopesOf(res);
  const messages = envelopes.map((e) => e.message as Event & { error?: { code: string } });
  assert.deepEqual(messages[1].event?.data, { stdout: btoa("a\n") });
  assert.ok(!messages.some((m) => m.event?.end), "no end event: the deadline ended the stream");
  assert.equal(envelopes.at(-1)?.flags, 2);
  assert.equal(messages.at(-1)?.error?.code, "deadline_exceeded");
  // envd kills the command at its deadline; a stream that merely ended would leave it running.
  const deadline = Date.now() + 3_000;
  let listed: unknown[] = [null];
  while (listed.length > 0 && Date.now() < deadline) {
    listed = (await (await unary("process.Process/List", {})).json()).processes;
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.deepEqual(listed, []);
  await executor.close();
});

Deno.test("Connect-Timeout-Ms: malformed or over 10 digits is invalid_argument, 0 is none", async () => {
  const { stream, headers, executor } = await setup();
  const start = (timeout: string) =>
    stream(
      "process.Process/Start",
      { process: { cmd: "/bin/bash", args: ["-c", "echo ok"] } },
      headers({ "Connect-Timeout-Ms": timeout }),
    );
  for (const bad of ["soon", "-5", "1.5", "12345678901"]) {
    const res = await start(bad);
    assert.equal(res.status, 400, bad);
    const body = await res.json();
    assert.equal(body.code, "invalid_argument");
    assert.match(body.message, /Connect-Timeout-Ms .* 1 to 10 digits/);
  }
  // Ten digits (115 days) is Connect's most; it is clamped to the longest timer, not refused.
  for (const fine of ["0", "9999999999"]) {
    const { envelopes } = await envelopesOf(await start(fine));
    const end = (envelopes.at(-2)?.message as Event).event?.end;
    assert.deepEqual(end, { exitCode: 0, exited: true, status: "exit status 0" }, fine);
  }
  await executor.close();
});

Deno.test("Process/Connect's deadline ends that stream only; the command runs on", async () => {
  const { stream, unary, headers, executor } = await setup();
  const started = await stream(
    "process.Process/Start",
    { process: { cmd: "/bin/bash", args: ["-c", "sleep 30"] } },
  );
  const reader = started.body!.getReader();
  const [first] = decodeEnvelopes((await reader.read()).value!);
  const pid = (first.message as { event: { start: { pid: number } } }).event.start.pid;
  await reader.cancel();
  const attached = await stream(
    "process.Process/Connect",
    { process: { pid } },
    headers({ "Connect-Timeout-Ms": "200" }),
  );
  const { envelopes } = await envelopesOf(attached);
  assert.equal(
    (envelopes.at(-1)?.message as { error: { code: string } }).error.code,
    "deadline_exceeded",
  );
  const listed = await (await unary("process.Process/List", {})).json();
  assert.deepEqual(listed.processes.map((p: { pid: number }) => p.pid), [pid]);
  await executor.close();
});

Deno.test("a sandbox destroyed mid-command cuts its streams: no end event, no end-stream", async () => {
  const { stream, service, sandbox, executor } = await setup();
  const res = await stream(
    "process.Process/Start",
    { process: { cmd: "/bin/bash", args: ["-c", "echo up; sleep 30"] } },
  );
  const reader = res.body!.getReader();
  let seen = new Uint8Array();
  while (!new TextDecoder().decode(seen).includes(btoa("up\n"))) {
    const { value } = await reader.read();
    seen = new Uint8Array([...seen, ...value!]);
  }
  assert.equal(await service.destroy({ id: sandbox.id }), true);
  // As when envd's machine dies: the body breaks instead of ending with the kill's exit.
  await assert.rejects(async () => {
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      assert.fail(`no more envelopes expected: ${JSON.stringify(decodeEnvelopes(r.value))}`);
    }
  }, StreamCut);
  await executor.close();
});

Deno.test("Process/Start with a pty: pty data, pty input, Update resizes, wrong input refused", async () => {
  const { stream, unary, executor } = await setup();
  const res = await stream("process.Process/Start", {
    process: { cmd: "/bin/bash", args: ["-i", "-l"], envs: { TERM: "xterm-256color" } },
    pty: { size: { cols: 80, rows: 24 } },
  });
  const reader = res.body!.getReader();
  const [first] = decodeEnvelopes((await reader.read()).value!);
  const pid = (first.message as { event: { start: { pid: number } } }).event.start.pid;
  let shown = "";
  const until = async (text: string) => {
    while (!shown.includes(text)) {
      const { value, done } = await reader.read();
      assert.ok(!done, `the stream ended before '${text}': ${shown}`);
      for (const e of decodeEnvelopes(value!)) {
        const data = (e.message as Event).event?.data;
        if (!data) continue;
        assert.deepEqual(Object.keys(data), ["pty"], "a terminal's output is pty data only");
        shown += atob(data.pty as string);
      }
    }
  };
  const type = (text: string) =>
    unary("process.Process/SendInput", { process: { pid }, input: { pty: btoa(text) } });
  assert.equal((await type("stty size; echo err >&2\n")).status, 200);
  await until("24 80");
  await until("err");
  const resized = await unary("process.Process/Update", {
    process: { pid },
    pty: { size: { cols: 100, rows: 30 } },
  });
  assert.equal(resized.status, 200);
  await resized.body?.cancel();
  await type("stty size\n");
  await until("30 100");
  const stdin = await unary("process.Process/SendInput", {
    process: { pid },
    input: { stdin: btoa("x") },
  });
  assert.equal(stdin.status, 400);
  assert.match((await stdin.json()).message, /runs on a terminal: send its input as 'input.pty'/);
  const zero = await unary("process.Process/Update", {
    process: { pid },
    pty: { size: { cols: 0, rows: 30 } },
  });
  assert.equal((await zero.json()).code, "invalid_argument");
  await type("exit 4\n");
  let rest = new Uint8Array();
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    rest = new Uint8Array([...rest, ...r.value]);
  }
  const end = decodeEnvelopes(rest).map((e) => (e.message as Event).event?.end).find(Boolean);
  assert.deepEqual(end, {
    exitCode: 4,
    exited: true,
    status: "exit status 4",
    error: "exit status 4",
  });
  await executor.close();
});

Deno.test("Process/Update of a command without a terminal is invalid_argument", async () => {
  const { stream, unary, executor } = await setup();
  const res = await stream(
    "process.Process/Start",
    { process: { cmd: "/bin/bash", args: ["-c", "sleep 30"] } },
  );
  const reader = res.body!.getReader();
  const [first] = decodeEnvelopes((await reader.read()).value!);
  const pid = (first.message as { event: { start: { pid: number } } }).event.start.pid;
  await reader.cancel();
  const update = await unary("process.Process/Update", {
    process: { pid },
    pty: { size: { cols: 10, rows: 10 } },
  });
  assert.equal(update.status, 400);
  assert.match((await update.json()).message, /has no terminal/);
  const input = await unary("process.Process/SendInput", {
    process: { pid },
    input: { pty: btoa("x") },
  });
  assert.match((await input.json()).message, /has no terminal: send its input as 'input.stdin'/);
  await executor.close();
});

Deno.test("output that is not UTF-8 reaches the client as its bytes (base64 data)", async () => {
  const { stream, executor } = await setup();
  const res = await stream("process.Process/Start", {
    process: { cmd: "/bin/bash", args: ["-l", "-c", "printf 'a\\xe2\\x28b\\0\\377'"] },
  });
  const { envelopes } = await envelopesOf(res);
  const out = envelopes.map((e) => (e.message as Event).event?.data?.stdout).filter(Boolean);
  const bytes = out.flatMap((b64) => [...atob(b64 as string)].map((c) => c.charCodeAt(0)));
  assert.deepEqual(bytes, [0x61, 0xe2, 0x28, 0x62, 0x00, 0xff]);
  await executor.close();
});
