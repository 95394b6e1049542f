/**
 * The executor contract for a sandbox's lifecycle (pause and resume, stats and limits, destroy,
 * create's refusals), run against both executors by `_contract_fixtures_test.ts`.
 */
import assert from "node:assert/strict";
import { type Case, contractSuite, encoder, rejectsWith, run } from "./_contract_fixtures_test.ts";

const cases: Record<string, Case> = {
  "pause() and resume() freeze and thaw the sandbox": async (ex, id) => {
    await ex.pause(id);
    await ex.pause(id); // twice is not an error
    await ex.resume(id);
    await ex.resume(id);
    assert.equal((await run(ex, id, "echo awake")).stdout, "awake\n");
  },
  "stats() reads resource use": async (ex, id) => {
    const stats = await ex.stats(id);
    assert.ok(stats.takenAt > 0);
    assert.ok(stats.cpuCount >= 1);
    assert.ok(stats.cpuUsedPct >= 0);
    assert.ok(stats.memoryUsedBytes > 0);
    assert.ok(stats.memoryLimitBytes === 0 || stats.memoryLimitBytes >= stats.memoryUsedBytes);
    assert.ok(stats.diskUsedBytes >= 0);
  },
  "limits() are the spec's own, and stats() report the same": async (ex, id) => {
    // The suite builds every sandbox with 1 cpu and 128 MiB.
    const limits = ex.limits({ cpus: 1, memoryMB: 128 });
    assert.deepEqual(limits, { cpus: 1, memoryMB: 128 });
    const stats = await ex.stats(id);
    assert.equal(stats.cpuCount, Math.ceil(limits.cpus));
    assert.equal(stats.memoryLimitBytes, limits.memoryMB * 1024 * 1024);
    const defaults = ex.limits({});
    assert.ok(defaults.cpus > 0 && defaults.memoryMB > 0, JSON.stringify(defaults));
    assert.deepEqual(ex.limits({ cpus: 0.5 }), { cpus: 0.5, memoryMB: defaults.memoryMB });
  },
  "destroy() is idempotent and the sandbox is gone after it": async (ex, id) => {
    assert.ok((await ex.list()).includes(id));
    await ex.destroy(id);
    await ex.destroy(id);
    assert.ok(!(await ex.list()).includes(id));
    await rejectsWith(ex.exec(id, { cmd: ["/bin/bash", "-c", "true"] }), "gone");
    await rejectsWith(ex.readFile(id, "/tmp/x"), "gone");
    await rejectsWith(ex.writeFile(id, "/tmp/x", encoder.encode("x")), "gone");
    await rejectsWith(ex.stats(id), "gone");
    await rejectsWith(ex.resume(id), "gone");
  },
  "create() refuses an id that exists and an unknown template": async (ex, id) => {
    const request = { id, name: "again", template: "base", spec: {}, env: {} };
    await rejectsWith(ex.create(request), "exists");
    const unknown = ex.create({ ...request, id: `${id}-other`, template: "no-such-template" });
    await rejectsWith(unknown, "invalid");
    // One sentence on both executors: a caller tested on the fake reads what Docker would say.
    await unknown.catch((error) =>
      assert.match(
        error.message,
        /^Template 'no-such-template' is not known on this node: use one of base\b.*\(DORMICE_TEMPLATES\)$/,
      )
    );
    assert.ok(!(await ex.list()).includes(`${id}-other`));
  },
  "setEgressRules() replaces a sandbox's rules, running on; one without egress is invalid": async (
    ex,
    id,
  ) => {
    assert.equal((await ex.capabilities?.())?.egressRules, true, "both enforce rules by default");
    const set = ex.setEgressRules!.bind(ex);
    // Made without egress (the suite's sandboxes): no route out for rules to open.
    await rejectsWith(set(id, { allowOut: ["1.1.1.1/32"], denyOut: [] }), "invalid");
    const ruled = `${id}-ruled`;
    await ex.create({
      id: ruled,
      name: ruled,
      template: "minimal",
      spec: { egressRules: { allowOut: ["198.18.0.1/32"], denyOut: ["0.0.0.0/0"] } },
      env: {},
    });
    try {
      const before = await ex.exec(ruled, { cmd: ["sh", "-c", "sleep 30"] });
      await set(ruled, { allowOut: ["198.18.0.2/32"], denyOut: ["0.0.0.0/0"] });
      await set(ruled, { allowOut: [], denyOut: [] });
      // The sandbox and its command ran on through both replacements.
      assert.equal((await run(ex, ruled, "echo still")).stdout, "still\n");
      await before.kill("SIGKILL");
      assert.notEqual((await before.exited).exitCode, 0, "it was still running to be killed");
    } finally {
      await ex.destroy(ruled);
    }
    await rejectsWith(set(ruled, { allowOut: [], denyOut: [] }), "gone");
  },
};

await contractSuite(cases);
