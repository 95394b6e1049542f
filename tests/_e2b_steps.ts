/**
 * The e2b SDK's command steps, shared by the exam against one node and the exam through the
 * gateway: the same client calls must behave the same whichever door they come through.
 *
 * @module
 */
import assert from "node:assert/strict";
import { CommandExitError, type Sandbox } from "e2b";

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
