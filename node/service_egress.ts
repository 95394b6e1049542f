/**
 * A sandbox's egress address rules changed while it runs (E2B's `updateNetwork`).
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import { ALL_TRAFFIC, type EgressRules } from "../shared/egress_rules.ts";
import { egressRulesUnserved, noEgress } from "./executors/contract.ts";
import type { SandboxRecord } from "./service_contract.ts";
import { callExecutor, type ServiceCore } from "./service_state.ts";

/**
 * Replaces the egress rules of `sandbox` (call inside its slot), in the executor first and in the
 * ledger's spec second; see `SandboxService.updateEgressRules`.
 */
export async function changeEgressRules(
  core: ServiceCore,
  sandbox: SandboxRecord,
  rules: EgressRules,
): Promise<SandboxRecord> {
  const egress = sandbox.spec.network === true || sandbox.spec.egressRules !== undefined;
  if (!egress) {
    const closed = rules.allowOut.length === 0 && rules.denyOut.includes(ALL_TRAFFIC);
    if (closed) return sandbox;
    throw new HttpError(409, noEgress(sandbox.id).message);
  }
  const set = core.executor.setEgressRules;
  if (set === undefined) throw new HttpError(409, egressRulesUnserved().message);
  if (sandbox.state !== "active" && sandbox.state !== "frozen") {
    throw new HttpError(
      409,
      `Sandbox '${sandbox.name}' is ${sandbox.state}: connect to it (Sandbox.connect) to ` +
        "resume it, then change its network",
    );
  }
  await callExecutor(() => set.call(core.executor, sandbox.id, rules, sandbox.team));
  return core.ledger.update(sandbox.id, { spec: { ...sandbox.spec, egressRules: rules } })!;
}
