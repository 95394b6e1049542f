/**
 * `process.Process`: wires the process RPCs (one per file) to one process table.
 *
 * | method | kind | file |
 * |---|---|---|
 * | `Start` | stream | `start.ts` |
 * | `Connect` | stream | `connect.ts` |
 * | `List` | unary | `list.ts` |
 * | `SendInput`, `CloseStdin` | unary | `input.ts` |
 * | `SendSignal` | unary | `signal.ts` |
 * | `Update` | unary | `update.ts` |
 *
 * @module
 */
import type { Log } from "../../../../shared/log.ts";
import type { SandboxOps } from "../../../service_contract.ts";
import type { EnvdService } from "../rpc.ts";
import { connect } from "./connect.ts";
import { closeStdin, sendInput } from "./input.ts";
import { list } from "./list.ts";
import { Processes } from "./processes.ts";
import { sendSignal } from "./signal.ts";
import { start } from "./start.ts";
import { update } from "./update.ts";

/**
 * The `process.Process` service over `ops`, with its own process table.
 *
 * @example
 * ```ts ignore
 * mountRpcs(app, core, [processService(core.ops, core.options.log)]);
 * ```
 */
export function processService(ops: SandboxOps, log: Log): EnvdService {
  const processes = new Processes(ops, log);
  return {
    name: "process.Process",
    stream: {
      Start: (call, sink) => start(ops, processes, call, sink),
      Connect: (call, sink) => connect(processes, call, sink),
    },
    unary: {
      List: (call) => list(ops, processes, call),
      SendInput: (call) => sendInput(processes, call),
      SendSignal: (call) => sendSignal(processes, call),
      CloseStdin: (call) => closeStdin(processes, call),
      Update: (call) => update(processes, call),
    },
  };
}
