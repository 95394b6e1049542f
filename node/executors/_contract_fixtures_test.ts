/**
 * What the executor contract suites share: the helpers their cases use, and {@linkcode
 * contractSuite}, which runs one verb family's cases against `FakeExecutor` and
 * `DockerExecutor`, so the fake cannot drift from the real thing. The Docker half needs an engine
 * and the template images (`.ci/docker.sh`); with `CI=true` it never skips, off CI it skips with a
 * printed reason. The families: `contract_exec_test.ts` (exec and its handle),
 * `contract_files_test.ts` (the file verbs and watches), `contract_lifecycle_test.ts` (create,
 * destroy, pause, stats, limits).
 *
 * @module
 */
import assert from "node:assert/strict";
import { type Executor, ExecutorError, type ExecutorErrorCode } from "./contract.ts";
import { FakeExecutor } from "./fake.ts";
import { DockerExecutor } from "./docker/mod.ts";
import { dockerReadiness } from "./docker/_fixtures_test.ts";

export const encoder = new TextEncoder();
export const text = (stream: ReadableStream<Uint8Array>): Promise<string> =>
  new Response(stream).text();

/** Asserts that a promise rejects with an ExecutorError of this code. */
export async function rejectsWith(
  promise: Promise<unknown>,
  code: ExecutorErrorCode,
): Promise<void> {
  await assert.rejects(promise, (error: unknown) => {
    assert.ok(error instanceof ExecutorError, `expected an ExecutorError, got ${error}`);
    assert.equal(error.code, code, `expected '${code}', got '${error.code}': ${error.message}`);
    return true;
  });
}

/** Runs a command to its end and collects everything. */
export async function run(executor: Executor, id: string, script: string, options = {}) {
  const handle = await executor.exec(id, { cmd: ["/bin/bash", "-l", "-c", script], ...options });
  const [stdout, stderr, exit] = await Promise.all([
    text(handle.stdout),
    text(handle.stderr),
    handle.exited,
  ]);
  return { stdout, stderr, exit };
}

/** One contract case: it gets the executor and a fresh sandbox's id. */
export type Case = (executor: Executor, id: string) => Promise<void>;

/** Registers every case against one executor, each with a fresh sandbox. */
function contract(
  label: string,
  cases: Record<string, Case>,
  open: () => Promise<Executor | string>,
  { sanitize = true, template = "minimal" }: { sanitize?: boolean; template?: string } = {},
): void {
  let executor: Executor | undefined;
  let counter = 0;
  const run = Math.random().toString(36).slice(2, 8);
  for (const [name, body] of Object.entries(cases)) {
    Deno.test({
      name: `${label}: ${name}`,
      sanitizeOps: sanitize,
      sanitizeResources: sanitize,
      fn: async () => {
        if (!executor) {
          const opened = await open();
          if (typeof opened === "string") throw new Error(opened);
          executor = opened;
        }
        const id = `ct-${run}-${++counter}`;
        await executor.create({
          id,
          name: id,
          template,
          spec: { cpus: 1, memoryMB: 128, pids: 64 },
          env: { SANDBOX_VAR: "one" },
        });
        try {
          await body(executor, id);
        } finally {
          await executor.destroy(id);
          if (name === Object.keys(cases).at(-1)) {
            // The last case closes the executor, so no connection outlives the suite.
            await executor.close();
            executor = undefined;
          }
        }
      },
    });
  }
}

/**
 * Registers `cases` against both executors. Each case gets a fresh sandbox `id`, built from the
 * `minimal` template (busybox + bash: the fast image) unless the case builds another.
 */
export async function contractSuite(cases: Record<string, Case>): Promise<void> {
  // With no options, as a node builds it: the fake must refuse what Docker refuses by default.
  contract("FakeExecutor", cases, () => Promise.resolve(new FakeExecutor()));

  const onCi = Deno.env.get("CI") === "true";
  const readiness = await dockerReadiness();
  if (!readiness.ready && !onCi) {
    console.log(`executor contract: Docker half skipped: ${readiness.why}`);
  }
  const dockerNode = `contract-${Math.random().toString(36).slice(2, 8)}`;
  if (readiness.ready || onCi) {
    contract(
      "DockerExecutor",
      cases,
      () =>
        Promise.resolve(
          readiness.ready
            ? new DockerExecutor({ nodeId: dockerNode })
            : `CI=true, so the Docker contract must run, but ${readiness.why} (run .ci/docker.sh)`,
        ),
      // dockerode's node:http agent keeps its unix sockets to the engine open between calls.
      { sanitize: false },
    );
  }
}
