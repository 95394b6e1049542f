/**
 * A sandbox's deadline: set again when a create-or-wake asks, and, come, the sandbox killed, frozen,
 * or paused to disk as its deadline action says.
 *
 * @module
 */
import { ExecutorError } from "./executors/contract.ts";
import type { AcquireRequest, SandboxRecord } from "./service_contract.ts";
import { callExecutor, markLost, recordPause, type ServiceCore } from "./service_state.ts";

/** The service's own steps a deadline may take: each tells the sandbox's running commands. */
export interface DeadlineSteps {
  /** Archives the sandbox (its files kept, its processes ended). */
  archiveNow(sandbox: SandboxRecord): Promise<SandboxRecord>;
  /** Destroys the sandbox's executor half and its row. */
  destroyNow(sandbox: SandboxRecord): Promise<void>;
}

/**
 * Applies the deadline of sandbox `id` when it has come (call inside the sandbox's slot):
 * `"skipped"` when it has not, the row is gone, or the sandbox was found gone (marked lost).
 */
export async function expireAtDeadline(
  core: ServiceCore,
  id: string,
  steps: DeadlineSteps,
): Promise<"killed" | "paused" | "skipped"> {
  const sandbox = core.ledger.byId(id);
  if (!sandbox || sandbox.deadlineAt === null || sandbox.deadlineAt > core.clock.now()) {
    return "skipped";
  }
  if (
    sandbox.deadlineAction === "pause" &&
    (sandbox.e2b.keepMemory === false || sandbox.state === "archived")
  ) {
    if (sandbox.state === "archived") {
      core.ledger.update(id, { deadlineAt: null, deadlineAction: null });
    } else {
      // A frozen sandbox's files can be kept too: the engine commits a paused container.
      try {
        await steps.archiveNow(sandbox);
      } catch (error) {
        if (!(error instanceof ExecutorError && error.code === "gone")) throw error;
        markLost(core, sandbox, error.message);
        return "skipped";
      }
    }
    core.log("info", "sandbox paused to disk at its deadline", { name: sandbox.name, id });
    return "paused";
  }
  if (sandbox.deadlineAction === "pause") {
    const write = () =>
      core.ledger.update(id, { state: "frozen", deadlineAt: null, deadlineAction: null });
    if (sandbox.state === "frozen") write();
    else {
      try {
        await callExecutor(() => core.executor.pause(id));
      } catch (error) {
        if (!(error instanceof ExecutorError && error.code === "gone")) throw error;
        // Nothing left to pause: the row is marked lost, which clears the deadline.
        markLost(core, sandbox, error.message);
        return "skipped";
      }
      await recordPause(core, sandbox, write);
    }
    core.log("info", "sandbox paused at its deadline", { name: sandbox.name, id });
    return "paused";
  }
  await steps.destroyNow(sandbox);
  core.log("info", "sandbox killed at its deadline", { name: sandbox.name, id });
  return "killed";
}

/**
 * The row of `sandbox`, woken by a create-or-wake, with the lifecycle `request` asks for: its
 * deadline and its E2B lifecycle settings. A built sandbox keeps its network: only the lifecycle
 * follows the new request.
 */
export function renewLifecycle(
  core: ServiceCore,
  sandbox: SandboxRecord,
  request: AcquireRequest,
): SandboxRecord {
  const { deadline, e2b } = request;
  if (!deadline && !e2b) return sandbox;
  const { onTimeout, autoResume, timeoutSeconds } = e2b ?? {};
  return core.ledger.update(sandbox.id, {
    ...(deadline &&
      { deadlineAt: core.clock.now() + deadline.ms, deadlineAction: deadline.action }),
    ...(e2b && { e2b: { ...sandbox.e2b, onTimeout, autoResume, timeoutSeconds } }),
  })!;
}
