/**
 * An executor that times and counts every call of another one into the node's metrics, so the
 * executors themselves stay free of bookkeeping and both (fake, Docker) are measured alike.
 *
 * @module
 */
import type { ExecutorOutcome, NodeMetrics } from "../metrics.ts";
import { type Executor, ExecutorError } from "./contract.ts";
import type { SandboxSpec } from "../../shared/schemas.ts";

/**
 * The contract's calls, each measured under its own name. A record over the contract's keys, so
 * a verb added to `Executor` and not here is a type error, not a wrapper without that verb.
 * `capabilities` is left out: the node asks the executor itself, once per check-in, and the
 * wrapper does not offer it (its absence reads as "serves any template"). `legacy` and
 * `setEgressRules`, optional too, are measured only where the executor has them (see below).
 */
const measured: Record<
  Exclude<
    keyof Executor,
    | "kind"
    | "limits"
    | "close"
    | "capabilities"
    | "legacy"
    | "setEgressRules"
    | "exportImage"
    | "importImage"
    | "pushImage"
    | "pullImage"
    | "pushArchive"
    | "pullArchive"
  >,
  true
> = {
  create: true,
  destroy: true,
  exec: true,
  writeFile: true,
  readFile: true,
  listDir: true,
  stat: true,
  makeDir: true,
  move: true,
  remove: true,
  watch: true,
  pause: true,
  resume: true,
  stats: true,
  snapshot: true,
  listSnapshots: true,
  deleteSnapshot: true,
  archive: true,
  restore: true,
  list: true,
  portAddress: true,
};
const operations = Object.keys(measured) as (keyof typeof measured)[];

/**
 * Wraps `executor` so each call is counted by operation and outcome and timed (`exec` until the
 * command started, `watch` until the watch did: their runs are the caller's). `kind`, `limits`
 * and `close` pass through untouched.
 *
 * @example
 * ```ts
 * import { FakeExecutor } from "./fake.ts";
 * import { NodeMetrics } from "../metrics.ts";
 * import { instrumentExecutor } from "./instrumented.ts";
 * const metrics = new NodeMetrics();
 * const executor = instrumentExecutor(new FakeExecutor(), metrics);
 * await executor.list();
 * console.log((await metrics.text()).includes('operation="list",outcome="ok"')); // true
 * ```
 */
export function instrumentExecutor(executor: Executor, metrics: NodeMetrics): Executor {
  const wrapped: Record<string, unknown> = {
    get kind() {
      return executor.kind;
    },
    close: () => executor.close(),
    // No engine call to time: a pure function of the spec.
    limits: (spec: SandboxSpec) => executor.limits(spec),
  };
  // An executor without `legacy` has no older sandboxes, and one without `setEgressRules`
  // enforces no rules: the wrapper must not invent either verb.
  const present: (keyof Executor)[] = [...operations];
  if (executor.legacy !== undefined) present.push("legacy");
  if (executor.setEgressRules !== undefined) present.push("setEgressRules");
  for (
    const verb of [
      "exportImage",
      "importImage",
      "pushImage",
      "pullImage",
      "pushArchive",
      "pullArchive",
    ] as const
  ) {
    if (executor[verb] !== undefined) present.push(verb);
  }
  for (const operation of present) {
    const call = (executor[operation] as (...args: unknown[]) => Promise<unknown>).bind(executor);
    wrapped[operation] = async (...args: unknown[]) => {
      const started = performance.now();
      try {
        const result = await call(...args);
        metrics.executorCall(operation, "ok", (performance.now() - started) / 1000);
        return result;
      } catch (error) {
        metrics.executorCall(operation, outcomeOf(error), (performance.now() - started) / 1000);
        throw error;
      }
    };
  }
  return wrapped as unknown as Executor;
}

function outcomeOf(error: unknown): ExecutorOutcome {
  return error instanceof ExecutorError ? error.code : "error";
}
