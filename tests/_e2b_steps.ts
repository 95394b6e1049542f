/**
 * The e2b SDK's command steps, shared by the exam against one node and the exam through the
 * gateway: the same client calls must behave the same whichever door they come through.
 *
 * @module
 */
import assert from "node:assert/strict";
import { CommandExitError, Sandbox, TimeoutError } from "e2b";

/**
 * Runs the command steps on `sandbox`: a plain run, streaming (the first chunk of
 * `echo a; sleep 1; echo b` arrives while the command still sleeps), a non-zero exit, and a
 * background command killed through SendSignal. `hops` names the path in the step titles.
 */
export async function commandSteps(
  t: Deno.TestContext,
  sandbox: Sandbox,
  hops: string,
): Promise<void> {
  await t.step(`commands.run('echo hi') answers hi ${hops}`, async () => {
    const r = await sandbox.commands.run("echo hi");
    assert.equal(r.stdout, "hi\n");
    assert.equal(r.exitCode, 0);
  });

  await t.step("onStdout gets the first chunk before the command ends", async () => {
    const seen: { text: string; at: number }[] = [];
    const r = await sandbox.commands.run("echo a; sleep 1; echo b", {
      onStdout: (text) => {
        seen.push({ text, at: Date.now() });
      },
    });
    const endedAt = Date.now();
    assert.equal(r.stdout, "a\nb\n");
    assert.equal(seen[0].text, "a\n");
    // The first chunk arrived while the command still slept (about a second before its end).
    assert.ok(endedAt - seen[0].at >= 500, `first chunk ${endedAt - seen[0].at} ms before end`);
  });

  await t.step("a non-zero exit throws CommandExitError with its code", async () => {
    const error = await sandbox.commands.run("echo oops >&2; exit 3").catch((e) => e);
    assert.ok(error instanceof CommandExitError, String(error));
    assert.equal(error.exitCode, 3);
    assert.equal(error.stderr, "oops\n");
    // The SDK's message is the end event's `error`, as envd words it; empty without one.
    assert.equal(error.message, "exit status 3");
  });

  await t.step("a background command is killed through SendSignal", async () => {
    const handle = await sandbox.commands.run("sleep 30", { background: true });
    const listed = await sandbox.commands.list();
    assert.ok(listed.some((p) => p.pid === handle.pid));
    assert.equal(await handle.kill(), true);
    const error = await handle.wait().catch((e) => e);
    assert.ok(error instanceof CommandExitError, String(error));
    assert.equal(await sandbox.commands.kill(handle.pid), false);
  });
}

/** The SDK's three settings, to make sandboxes of one's own. */
export interface SdkOptions {
  apiUrl: string;
  sandboxUrl: string;
  apiKey: string;
}

/** Polls `check` every 50 ms until it is true; false once `ms` passed. */
async function eventually(check: () => Promise<boolean>, ms = 5_000): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (await check()) return true;
    if (Date.now() > deadline) return false;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Bytes seen on a PTY so far, with a bounded wait for what they must come to hold. */
function terminal() {
  let seen = new Uint8Array();
  return {
    onData: (data: Uint8Array) => {
      seen = new Uint8Array([...seen, ...data]);
    },
    text: () => new TextDecoder().decode(seen),
    bytes: () => seen,
    async until(what: string, found: () => boolean): Promise<void> {
      assert.ok(await eventually(() => Promise.resolve(found())), `the PTY never showed ${what}`);
    },
  };
}

/**
 * The command steps, run the same on every door and executor: timeouts enforced by the
 * server, a sandbox killed under a running command, PTY sessions, and output that is not UTF-8.
 * `opts` makes a sandbox of its own for the kill.
 */
export async function commandFidelitySteps(
  t: Deno.TestContext,
  sandbox: Sandbox,
  opts: SdkOptions,
): Promise<void> {
  await t.step("timeoutMs: the command is killed and the SDK raises TimeoutError", async () => {
    const started = Date.now();
    const error = await sandbox.commands.run("sleep 5", { timeoutMs: 1000 }).catch((e) => e);
    assert.ok(error instanceof TimeoutError, String(error));
    assert.ok(Date.now() - started < 4_000, `run took ${Date.now() - started} ms`);
    const handle = await sandbox.commands.run("sleep 30", { background: true, timeoutMs: 1000 });
    const ended = await handle.wait().catch((e) => e);
    assert.ok(ended instanceof TimeoutError, String(ended));
    // The SDK gives up on its own at the deadline; only the server kills the command.
    const gone = await eventually(async () =>
      !(await sandbox.commands.list()).some((p) => p.pid === handle.pid)
    );
    assert.ok(gone, `process ${handle.pid} still runs past its timeout`);
  });

  await t.step(
    "a sandbox killed mid-command: the SDK says it was killed, not exit 137",
    async () => {
      const doomed = await Sandbox.create(opts);
      let up!: () => void;
      const isUp = new Promise<void>((resolve) => up = resolve);
      const handle = await doomed.commands.run("echo up; sleep 30", {
        background: true,
        onStdout: () => up(),
      });
      await isUp;
      assert.equal(await Sandbox.kill(doomed.sandboxId, opts), true);
      const error = await handle.wait().catch((e) => e);
      assert.ok(error instanceof TimeoutError, String(error));
      assert.match(error.message, /killed or reached its end of life/);
    },
  );

  await t.step("pty: create, sendInput, resize, stderr on the terminal, kill", async () => {
    const screen = terminal();
    const pty = await sandbox.pty.create({ cols: 80, rows: 24, onData: screen.onData });
    const type = (line: string) =>
      sandbox.pty.sendInput(pty.pid, new TextEncoder().encode(line + "\n"));
    // A real terminal echoes what is typed: wait for what only the output holds.
    await type("stty size");
    await screen.until("24 80", () => screen.text().includes("24 80"));
    await sandbox.pty.resize(pty.pid, { cols: 100, rows: 30 });
    await type("stty size; printf 'e%sr\\n' r >&2");
    await screen.until("30 100 and err", () => /30 100[^]*err/.test(screen.text()));
    // Bytes that are not UTF-8 reach onData as they are.
    await type("printf 'u\\xe2v\\n'");
    await screen.until(
      "the byte 0xE2",
      () => /u\xe2v/.test(String.fromCharCode(...screen.bytes())),
    );
    assert.ok((await sandbox.commands.list()).some((p) => p.pid === pty.pid));
    assert.equal(await sandbox.pty.kill(pty.pid), true);
    const killed = await pty.wait().catch((e) => e);
    assert.ok(killed instanceof CommandExitError, String(killed));
    const done = await sandbox.pty.create({ cols: 40, rows: 10, onData: () => {} });
    await sandbox.pty.sendInput(done.pid, new TextEncoder().encode("exit\n"));
    assert.equal((await done.wait()).exitCode, 0);
  });

  await t.step("output that is not UTF-8 stays bytes: decoded by the SDK, read raw", async () => {
    const r = await sandbox.commands.run("printf 'a\\xe2b'; printf '\\xe2\\x28' > /tmp/raw.bin");
    // The SDK decodes stdout as UTF-8 itself: the lone 0xE2 became U+FFFD there, not on the wire.
    assert.equal(r.stdout, "a\ufffdb");
    const raw = await sandbox.files.read("/tmp/raw.bin", { format: "bytes" });
    assert.deepEqual([...raw], [0xe2, 0x28]);
  });
}
