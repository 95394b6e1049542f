/**
 * `process.Process/List`: the sandbox's running commands, with their config and tag.
 *
 * @module
 */
import type { SandboxOps } from "../../../service_contract.ts";
import type { RpcCall } from "../rpc.ts";
import type { Processes } from "./processes.ts";

/**
 * Serves `List` for one call.
 *
 * @example
 * ```ts ignore
 * const rpc: UnaryRpc = (call) => list(ops, processes, call);
 * ```
 */
export function list(ops: SandboxOps, processes: Processes, call: RpcCall): Promise<unknown> {
  const { sandbox } = call;
  const processList = [...ops.commands({ id: sandbox.id })].map(([pid, { request }]) => {
    const tag = processes.tagOf(sandbox.id, pid);
    return {
      config: {
        cmd: request.cmd[0] ?? "",
        args: request.cmd.slice(1),
        envs: request.env ?? {},
        ...(request.cwd ? { cwd: request.cwd } : {}),
      },
      pid,
      ...(tag ? { tag } : {}),
    };
  });
  return Promise.resolve({ processes: processList });
}
