/**
 * `process.Process/Start`: runs a command in the sandbox and streams its start, output and end.
 * The command outlives the stream: a client that hangs up leaves it running (reach it again
 * with `Connect`, stop it with `SendSignal`). But not its deadline: as in envd, the stream's
 * `Connect-Timeout-Ms` (the SDKs send 60 s unless told otherwise, none for `timeoutMs: 0`) is
 * the command's timeout, and the command is killed when it passes.
 *
 * @module
 */
import { z } from "zod";
import type { ExecRequest } from "../../../executors/contract.ts";
import type { SandboxOps } from "../../../service_contract.ts";
import { ConnectError, type StreamSink } from "../../connect_codec.ts";
import { parseMessage, resolvePath } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { follow, type Processes } from "./processes.ts";

const startSchema = z.object({
  process: z.object({
    cmd: z.string().min(1),
    args: z.array(z.string()).optional(),
    envs: z.record(z.string(), z.string()).optional(),
    cwd: z.string().optional(),
  }),
  pty: z.unknown().optional(),
  tag: z.string().optional(),
  stdin: z.boolean().optional(),
});

/**
 * Serves `Start` for one call.
 *
 * @throws {ConnectError} `unimplemented` for a pty session, `invalid_argument` for a bad message.
 * @example
 * ```ts ignore
 * const rpc: StreamRpc = (call, sink) => start(ops, processes, call, sink);
 * ```
 */
export async function start(
  ops: SandboxOps,
  processes: Processes,
  call: RpcCall,
  sink: StreamSink,
): Promise<void> {
  const body = parseMessage(startSchema, call.message);
  if (body.pty) {
    throw new ConnectError(
      "unimplemented",
      "PTY sessions are not supported by this node: run the command without a pty",
    );
  }
  const user = call.user();
  const request: ExecRequest = {
    cmd: [body.process.cmd, ...(body.process.args ?? [])],
    env: body.process.envs,
    cwd: body.process.cwd ? resolvePath(body.process.cwd, user, "process.cwd") : undefined,
    user,
    stdin: body.stdin ?? false,
    ...(call.deadlineMs === undefined ? {} : { timeoutMs: call.deadlineMs }),
  };
  const handle = await ops.startCommand({ id: call.sandbox.id }, request);
  // No await between open() and follow(): follow() sends the start event and subscribes
  // before the pump's first read resolves, so no output can slip ahead of the start event.
  await follow(processes.open(call.sandbox.id, handle, body.tag), sink, {
    keepaliveMs: call.keepaliveMs(),
    ownDeadlineMs: call.deadlineMs,
  });
}
