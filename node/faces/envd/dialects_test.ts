import assert from "node:assert/strict";
import type { ConnectCode } from "../../../shared/connect_codes.ts";
import { ExecutorError, type ExecutorErrorCode } from "../../executors/contract.ts";
import { ConnectError } from "../connect_codec.ts";
import { restErrorOf, toConnect } from "./dialects.ts";

const silent = () => {};

Deno.test("toConnect() and restErrorOf() give each executor error its Connect code and status", async () => {
  // The table envd kept before it derived the Connect code from executorErrorStatus.
  const expected: Record<ExecutorErrorCode, [ConnectCode, number]> = {
    not_found: ["not_found", 404],
    gone: ["failed_precondition", 410],
    exists: ["already_exists", 409],
    not_dir: ["invalid_argument", 400],
    is_dir: ["invalid_argument", 400],
    invalid: ["invalid_argument", 400],
    unavailable: ["unavailable", 503],
    timeout: ["deadline_exceeded", 504],
  };
  for (const [code, [connect, status]] of Object.entries(expected)) {
    const error = new ExecutorError(code as ExecutorErrorCode, `sentence for ${code}`);
    assert.deepEqual(toConnect(silent, error), { code: connect, message: `sentence for ${code}` });
    const rest = restErrorOf(silent, error);
    assert.equal(rest.status, status, code);
    assert.deepEqual(await rest.json(), { code: status, message: `sentence for ${code}` });
  }
});

Deno.test("restErrorOf() answers a ConnectError with E2B's REST status, a bug with a logged 500", async () => {
  const unavailable = restErrorOf(silent, new ConnectError("unavailable", "No sandbox 'x'"));
  assert.equal(unavailable.status, 502);
  await unavailable.body?.cancel();
  const logged: string[] = [];
  const bug = restErrorOf((_level, msg) => logged.push(msg), new Error("boom"));
  assert.equal(bug.status, 500);
  assert.deepEqual(await bug.json(), { code: 500, message: "Internal error: boom" });
  assert.deepEqual(logged, ["envd request failed"]);
});
