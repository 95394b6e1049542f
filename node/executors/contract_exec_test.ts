/**
 * The executor contract for exec and its handle (output streams, exit codes, cwd and env, stdin,
 * kill, timeouts, terminals), run against both executors by `_contract_fixtures_test.ts`.
 */
import assert from "node:assert/strict";
import {
  type Case,
  contractSuite,
  encoder,
  rejectsWith,
  run,
  text,
} from "./_contract_fixtures_test.ts";

/**
 * A terminal's output as it accumulates: `until(text)` waits (10 s at most) until it shows
 * `text`, whatever else (prompts, echoed input) it shows around it.
 */
function screen(stream: ReadableStream<Uint8Array>) {
  const decoder = new TextDecoder();
  let shown = "";
  let ended = false;
  let changed = () => {};
  (async () => {
    for await (const chunk of stream) {
      shown += decoder.decode(chunk, { stream: true });
      changed();
    }
    ended = true;
    changed();
  })();
  return {
    async until(wanted: string, withinMs = 10_000): Promise<void> {
      const deadline = Date.now() + withinMs;
      while (!shown.includes(wanted)) {
        if (ended) assert.fail(`the terminal closed without showing '${wanted}': ${shown}`);
        const left = deadline - Date.now();
        if (left <= 0) {
          assert.fail(`the terminal did not show '${wanted}' in ${withinMs} ms: ${shown}`);
        }
        let timer!: ReturnType<typeof setTimeout>;
        await new Promise<void>((resolve) => {
          changed = resolve;
          timer = setTimeout(resolve, left);
        });
        clearTimeout(timer);
      }
    },
  };
}

const cases: Record<string, Case> = {
  "exec() streams stdout and stderr apart and reports the exit code": async (ex, id) => {
    const r = await run(ex, id, "echo out; echo err >&2; exit 3");
    assert.deepEqual(r, { stdout: "out\n", stderr: "err\n", exit: { exitCode: 3 } });
  },
  "exec() delivers output as it comes, before the command ends": async (ex, id) => {
    const handle = await ex.exec(id, { cmd: ["/bin/bash", "-c", "echo one; sleep 1; echo two"] });
    let ended = false;
    handle.exited.then(() => ended = true);
    const reader = handle.stdout.getReader();
    const first = await reader.read();
    assert.equal(new TextDecoder().decode(first.value), "one\n");
    assert.equal(ended, false, "the first line must arrive while the command still runs");
    let rest = "";
    for (let r = await reader.read(); !r.done; r = await reader.read()) {
      rest += new TextDecoder().decode(r.value);
    }
    assert.equal(rest, "two\n");
    await text(handle.stderr);
    assert.equal((await handle.exited).exitCode, 0);
  },
  "exec() runs in cwd with the sandbox env and the command env": async (ex, id) => {
    const r = await run(ex, id, 'echo "$PWD $SANDBOX_VAR $COMMAND_VAR"', {
      cwd: "/tmp",
      env: { COMMAND_VAR: "two" },
    });
    assert.equal(r.stdout, "/tmp one two\n");
  },
  "exec() starts in the home when no cwd is given": async (ex, id) => {
    assert.equal((await run(ex, id, 'echo "$PWD"')).stdout, "/home/user\n");
  },
  "exec() refuses a cwd that does not exist with not_found": async (ex, id) => {
    await rejectsWith(
      ex.exec(id, { cmd: ["/bin/bash", "-c", "true"], cwd: "/nowhere" }),
      "not_found",
    );
  },
  "exec() refuses an empty command": async (ex, id) => {
    await rejectsWith(ex.exec(id, { cmd: [] }), "invalid");
  },
  "exec() feeds stdin and ends the command when stdin closes": async (ex, id) => {
    const handle = await ex.exec(id, { cmd: ["/bin/bash", "-c", "cat"], stdin: true });
    const out = text(handle.stdout);
    await handle.writeStdin(encoder.encode("hello "));
    await handle.writeStdin(encoder.encode("stdin\n"));
    await handle.closeStdin();
    assert.equal(await out, "hello stdin\n");
    await text(handle.stderr);
    assert.equal((await handle.exited).exitCode, 0);
    await rejectsWith(handle.writeStdin(encoder.encode("late")), "invalid");
  },
  "writeStdin() on a command started without stdin is invalid": async (ex, id) => {
    const handle = await ex.exec(id, { cmd: ["/bin/bash", "-c", "true"] });
    await rejectsWith(handle.writeStdin(encoder.encode("x")), "invalid");
    await Promise.all([text(handle.stdout), text(handle.stderr), handle.exited]);
  },
  "kill() ends a running command with the signal": async (ex, id) => {
    const handle = await ex.exec(id, { cmd: ["/bin/bash", "-c", "sleep 30"] });
    const output = Promise.all([text(handle.stdout), text(handle.stderr)]);
    await handle.kill("SIGKILL");
    const exit = await handle.exited;
    await output;
    assert.equal(exit.exitCode, 137);
    assert.equal(exit.signal, "SIGKILL");
    await handle.kill(); // an ended command is not an error
  },
  "exec() kills a command past timeoutMs and says so": async (ex, id) => {
    const r = await run(ex, id, "sleep 30", { timeoutMs: 300 });
    assert.equal(r.exit.timedOut, true);
    assert.equal(r.exit.signal, "SIGKILL");
    assert.equal(r.exit.exitCode, 137);
  },
  "exec() with tty runs on a terminal: typed input, one output stream, resize": async (ex, id) => {
    const handle = await ex.exec(id, {
      cmd: ["/bin/bash", "-i", "-l"],
      tty: { cols: 80, rows: 24 },
      env: { TERM: "xterm" },
    });
    const shown = screen(handle.stdout);
    const stderr = text(handle.stderr);
    const type = (line: string) => handle.writeStdin(encoder.encode(line + "\n"));
    // What is typed may be echoed (a real terminal does): wait for what only the output holds.
    await type("stty size");
    await shown.until("24 80");
    await type("printf 'e%sr\\n' r >&2");
    await shown.until("err");
    await handle.resize({ cols: 100, rows: 30 });
    // Docker's engine has answered a resize before the terminal's size changed (seen once on a
    // host with a load of 19): ask again, for 10 s at most, rather than read the first answer.
    for (let asked = 1;; asked++) {
      await type("stty size");
      const seen = await shown.until("30 100", 2_000).then(() => true, () => false);
      if (seen) break;
      assert.ok(asked < 5, "the terminal never showed its new size '30 100'");
    }
    await type("exit 3");
    assert.equal((await handle.exited).exitCode, 3);
    assert.equal(await stderr, "", "a terminal shows stderr on its one stream");
    const plain = await ex.exec(id, { cmd: ["/bin/bash", "-c", "sleep 30"] });
    await rejectsWith(plain.resize({ cols: 10, rows: 10 }), "invalid");
    await plain.kill("SIGKILL");
    await Promise.all([text(plain.stdout), text(plain.stderr), plain.exited]);
  },
  "exec() output that is not UTF-8 comes as its bytes": async (ex, id) => {
    const handle = await ex.exec(id, {
      cmd: ["/bin/bash", "-c", "printf 'a\\xe2\\x28b\\377'; printf '\\xc3' >&2"],
    });
    const [out, err] = await Promise.all([
      new Response(handle.stdout).arrayBuffer(),
      new Response(handle.stderr).arrayBuffer(),
    ]);
    await handle.exited;
    assert.deepEqual([...new Uint8Array(out)], [0x61, 0xe2, 0x28, 0x62, 0xff]);
    assert.deepEqual([...new Uint8Array(err)], [0xc3]);
  },
};

await contractSuite(cases);
