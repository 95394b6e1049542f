/**
 * The executor contract for the filesystem pause (`archive`, `restore`), run against both
 * executors by `_contract_fixtures_test.ts`.
 */
import assert from "node:assert/strict";
import { type Case, contractSuite, encoder, rejectsWith, run } from "./_contract_fixtures_test.ts";
import type { CreateRequest } from "./contract.ts";

const decoder = new TextDecoder();

/** What the contract fixture built each sandbox with, for a restore under the same id. */
function requestOf(id: string): CreateRequest {
  return {
    id,
    name: id,
    template: "minimal",
    spec: { cpus: 1, memoryMB: 128, pids: 64 },
    env: { SANDBOX_VAR: "one" },
  };
}

const cases: Record<string, Case> = {
  "archive() keeps the files and removes the sandbox; restore() starts it under its id": async (
    ex,
    id,
  ) => {
    await ex.writeFile(id, "/home/user/kept.txt", encoder.encode("on disk"));
    await ex.archive(id);
    // Nothing runs: every call about it is `gone`, yet list() still names it.
    await rejectsWith(ex.readFile(id, "/home/user/kept.txt"), "gone");
    await rejectsWith(ex.stats(id), "gone");
    assert.ok((await ex.list()).includes(id), "an archived sandbox is still the executor's");
    // What was kept is no snapshot: no team's list names it.
    assert.ok(!(await ex.listSnapshots()).some((s) => s.sandboxId === id));
    await ex.restore(requestOf(id));
    assert.equal(decoder.decode(await ex.readFile(id, "/home/user/kept.txt")), "on disk");
    // A fresh start: the sandbox's environment is the request's, and commands run.
    assert.equal((await run(ex, id, "echo $SANDBOX_VAR")).stdout.trim(), "one");
    // Restored: nothing is kept any more, so a second restore has nothing to start from.
    await rejectsWith(ex.restore(requestOf(id)), "gone");
    assert.ok((await ex.list()).includes(id));
    // Archived again and destroyed: nothing is left of it.
    await ex.writeFile(id, "/home/user/kept.txt", encoder.encode("second"));
    await ex.archive(id);
    await ex.destroy(id);
    assert.ok(!(await ex.list()).includes(id), "destroy removes what archive kept");
    await rejectsWith(ex.restore(requestOf(id)), "gone");
  },
  "archive() of a paused sandbox keeps its files; restore() runs it again": async (ex, id) => {
    await ex.writeFile(id, "/tmp/frozen.txt", encoder.encode("frozen then archived"));
    await ex.pause(id);
    await ex.archive(id);
    await ex.restore(requestOf(id));
    assert.equal((await run(ex, id, "cat /tmp/frozen.txt")).stdout, "frozen then archived");
  },
  "archive() of a sandbox that is gone is `gone`; restore() of one never archived too": async (
    ex,
    id,
  ) => {
    await ex.destroy(id);
    await rejectsWith(ex.archive(id), "gone");
    await rejectsWith(ex.restore(requestOf(`${id}-never`)), "gone");
  },
};

await contractSuite(cases);
