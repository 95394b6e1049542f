/**
 * The code interpreter server's framing, without a kernel: how kernel messages become the lines
 * `@e2b/code-interpreter` parses, and that /execute sends each line as it is emitted (a chunk
 * per line), before the cell ends. Runs server.py's own functions under the host's python3
 * (jupyter_client is imported only when a kernel starts). Needs  --allow-run --allow-read
 * --allow-write --allow-net=127.0.0.1; skips without python3 (fails under CI=true).
 */
import assert from "node:assert/strict";

const SERVER_DIR = new URL(".", import.meta.url).pathname;

async function python(): Promise<string | null> {
  try {
    const { success } = await new Deno.Command("python3", {
      args: ["-c", "import sys; sys.exit(sys.version_info < (3, 9))"],
      stdout: "null",
      stderr: "null",
    }).output();
    return success ? null : "python3 is older than 3.9";
  } catch (error) {
    return `no python3 on PATH (${(error as Error).message})`;
  }
}

const why = await python();
const onCi = Deno.env.get("CI") === "true";
if (why && !onCi) console.log(`code interpreter server framing tests skipped: ${why}`);

/** Runs `script` with server.py importable as `server`; returns its stdout. */
async function runPython(script: string): Promise<string> {
  const out = await new Deno.Command("python3", {
    args: ["-B", "-c", `import sys; sys.path.insert(0, ${JSON.stringify(SERVER_DIR)})\n${script}`],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.ok(out.success, `python3 failed: ${stderr}`);
  return new TextDecoder().decode(out.stdout);
}

function iopub(type: string, content: Record<string, unknown>) {
  return { header: { msg_type: type }, parent_header: { msg_id: "m1" }, content };
}

Deno.test({
  name: "server.translate: kernel messages become the client's stdout, result, error, " +
    "number_of_executions and end_of_execution lines",
  ignore: why !== null && !onCi,
  async fn() {
    if (why) throw new Error(`CI=true, so this test must run, but ${why}`);
    const messages = [
      iopub("execute_input", { code: "x", execution_count: 3 }),
      iopub("stream", { name: "stdout", text: "hi\n" }),
      iopub("stream", { name: "stderr", text: "oops\n" }),
      iopub("execute_result", { data: { "text/plain": "42", "text/html": "<b>42</b>" } }),
      iopub("display_data", {
        data: { "image/png": "iVBOR", "text/plain": "<Figure>", "application/x-custom": { a: 1 } },
      }),
      iopub("error", {
        ename: "ZeroDivisionError",
        evalue: "division by zero",
        traceback: ["a", "b"],
      }),
      iopub("status", { execution_state: "busy" }),
      iopub("status", { execution_state: "idle" }),
    ];
    const out = await runPython(`
import json, server
for msg in json.loads(${JSON.stringify(JSON.stringify(messages))}):
    lines, ended = server.translate(msg)
    for line in lines:
        sys.stdout.write(server.to_line(line).decode())
    if ended:
        sys.stdout.write("ENDED\\n")
`);
    const lines = out.trimEnd().split("\n");
    assert.equal(lines.at(-1), "ENDED");
    const parsed = lines.slice(0, -1).map((l) => JSON.parse(l));
    for (const p of parsed) {
      if ("timestamp" in p) p.timestamp = "T";
    }
    assert.deepEqual(parsed, [
      { type: "number_of_executions", execution_count: 3 },
      { type: "stdout", text: "hi\n", timestamp: "T" },
      { type: "stderr", text: "oops\n", timestamp: "T" },
      { type: "result", is_main_result: true, text: "42", html: "<b>42</b>" },
      {
        type: "result",
        is_main_result: false,
        png: "iVBOR",
        text: "<Figure>",
        extra: { "application/x-custom": { a: 1 } },
      },
      { type: "error", name: "ZeroDivisionError", value: "division by zero", traceback: "a\nb" },
      { type: "end_of_execution" },
    ]);
  },
});

Deno.test({
  name: "server /execute: each line is sent when emitted, before the cell ends; bad input is a " +
    "400 naming the field",
  ignore: why !== null && !onCi,
  async fn() {
    if (why) throw new Error(`CI=true, so this test must run, but ${why}`);
    const dir = await Deno.makeTempDir({ prefix: "ci-framing-" });
    const go = `${dir}/go`;
    // A fake context: one line, then it waits (bounded) for a file the test writes only after it
    // read that line, then a second line and the end.
    const child = new Deno.Command("python3", {
      args: [
        "-B",
        "-c",
        `import sys, os, time, threading
sys.path.insert(0, ${JSON.stringify(SERVER_DIR)})
import server
class Fake:
    def execute(self, code, env_vars, emit):
        emit(server.to_line({"type": "stdout", "text": "first\\n", "timestamp": "t"}))
        for _ in range(300):
            if os.path.exists(${JSON.stringify(go)}): break
            time.sleep(0.05)
        else:
            emit(server.to_line({"type": "stdout", "text": "no go file\\n", "timestamp": "t"}))
        emit(server.to_line({"type": "stdout", "text": "second\\n", "timestamp": "t"}))
        emit(server.to_line({"type": "end_of_execution"}))
server.CONTEXTS.default = lambda language: Fake()
httpd = server.ThreadingHTTPServer(("127.0.0.1", 0), server.Handler)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
`,
      ],
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    try {
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let head = "";
      while (!head.includes("\n")) {
        const { value, done } = await reader.read();
        if (done) throw new Error("the server exited before it printed its port");
        head += value;
      }
      reader.releaseLock();
      const base = `http://127.0.0.1:${head.trim()}`;

      const res = await fetch(`${base}/execute`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ code: "anything" }),
      });
      assert.equal(res.status, 200);
      const lines = res.body!.pipeThrough(new TextDecoderStream()).getReader();
      let text = "";
      while (!text.includes("\n")) {
        const { value, done } = await lines.read();
        if (done) break;
        text += value;
      }
      assert.deepEqual(JSON.parse(text.split("\n")[0]), {
        type: "stdout",
        text: "first\n",
        timestamp: "t",
      });
      await Deno.writeTextFile(go, "");
      for (;;) {
        const { value, done } = await lines.read();
        if (done) break;
        text += value;
      }
      assert.deepEqual(
        text.trimEnd().split("\n").map((l) => JSON.parse(l).text ?? JSON.parse(l).type),
        ["first\n", "second\n", "end_of_execution"],
      );

      for (
        const [body, field] of [
          [{}, "'code'"],
          [{ code: "1", env_vars: { A: 1 } }, "'env_vars'"],
          [{ code: "1", context_id: "c", language: "python" }, "context_id or language"],
        ] as const
      ) {
        const bad = await fetch(`${base}/execute`, {
          method: "POST",
          body: JSON.stringify(body),
        });
        assert.equal(bad.status, 400);
        assert.ok((await bad.json()).error.includes(field));
      }
      // One connection carries cell after cell, as the port door's pool reuses it.
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(head.trim()) });
      try {
        const request = (code: string) => {
          const body = JSON.stringify({ code });
          return `POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
            `Content-Length: ${body.length}\r\n\r\n${body}`;
        };
        const raw = conn.readable.pipeThrough(new TextDecoderStream()).getReader();
        let seen = "";
        for (const code of ["a", "b"]) {
          await conn.write(new TextEncoder().encode(request(code)));
          const before = seen.split("0\r\n\r\n").length;
          while (seen.split("0\r\n\r\n").length === before) {
            const { value, done } = await raw.read();
            assert.ok(!done, `the server closed the connection after ${before - 1} cell(s)`);
            seen += value;
          }
        }
        assert.equal(seen.match(/HTTP\/1\.1 200/g)?.length, 2);
        assert.doesNotMatch(seen, /Connection: close/i);
        raw.releaseLock();
      } finally {
        // Already closed when the server hung up and the reader ended.
        try {
          conn.close();
        } catch { /* closed */ }
      }

      // A body forwarded as it streams comes chunked, with no Content-Length.
      const chunked = await fetch(`${base}/execute`, {
        method: "POST",
        body: ReadableStream.from([new TextEncoder().encode('{"code": "1"')]).pipeThrough(
          new TransformStream({
            transform(chunk, controller) {
              controller.enqueue(chunk);
              controller.enqueue(new TextEncoder().encode("}"));
            },
          }),
        ),
      });
      assert.equal(chunked.status, 200);
      assert.match(await chunked.text(), /"second\\n"/);
      const notJson = await fetch(`${base}/execute`, { method: "POST", body: "{" });
      assert.equal(notJson.status, 400);
      assert.match((await notJson.json()).error, /not JSON/);
      const unknown = await fetch(`${base}/contexts/nope/restart`, { method: "POST" });
      assert.equal(unknown.status, 404);
      assert.match((await unknown.json()).error, /Context 'nope' does not exist/);
    } finally {
      child.kill();
      await child.status;
      await child.stdout.cancel().catch(() => {});
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "server contexts: at most DORMICE_CODE_INTERPRETER_MAX_CONTEXTS, then a 429 saying to " +
    "remove one; a removed one frees its place",
  ignore: why !== null && !onCi,
  async fn() {
    if (why) throw new Error(`CI=true, so this test must run, but ${why}`);
    const out = await runPython(`
import os
os.environ["DORMICE_CODE_INTERPRETER_MAX_CONTEXTS"] = "2"
import server
class FakeContext:
    def __init__(self, language, cwd):
        import uuid
        self.id, self.language, self.cwd = str(uuid.uuid4()), language, cwd
    def describe(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}
    def stop(self):
        pass
server.Context = FakeContext
contexts = server.Contexts()
a = contexts.create(None, "/")
b = contexts.create("python", "/tmp")
try:
    contexts.create(None, "/")
    print("no refusal")
except server.RequestError as error:
    print(int(error.status), error.message)
contexts.remove(a.id)
c = contexts.create(None, "/")
print(sorted(x["cwd"] for x in contexts.list()))
try:
    contexts.create(None, "/no/such/dir")
except server.RequestError as error:
    print(int(error.status), error.message)
`);
    const [refusal, listed, badCwd] = out.trimEnd().split("\n");
    assert.match(refusal, /^429 This sandbox runs 2 contexts, its limit .*remove one/);
    assert.equal(listed, "['/', '/tmp']");
    assert.match(badCwd, /^400 cwd '\/no\/such\/dir' is not a directory/);
  },
});
