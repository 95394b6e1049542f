/**
 * The status table every face answers executor errors with. The executor contract itself, run
 * against both executors, is in `contract_exec_test.ts`, `contract_files_test.ts` and
 * `contract_lifecycle_test.ts`.
 */
import assert from "node:assert/strict";
import { HttpError } from "../../shared/http_error.ts";
import { ExecutorError, type ExecutorErrorCode, executorErrorToHttp } from "./contract.ts";

Deno.test("executorErrorToHttp() keeps the sentence and answers each code's status", () => {
  const expected: Record<ExecutorErrorCode, number> = {
    not_found: 404,
    gone: 410,
    exists: 409,
    not_dir: 400,
    is_dir: 400,
    invalid: 400,
    unavailable: 503,
    timeout: 504,
  };
  for (const [code, status] of Object.entries(expected) as [ExecutorErrorCode, number][]) {
    const converted = executorErrorToHttp(new ExecutorError(code, `sentence for ${code}`));
    assert.ok(converted instanceof HttpError, code);
    assert.equal(converted.status, status, code);
    assert.equal(converted.message, `sentence for ${code}`);
  }
  const other = new TypeError("not an executor error");
  assert.equal(executorErrorToHttp(other), other);
});
