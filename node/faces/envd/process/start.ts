/**
 * `process.Process/Start`: runs a command in the sandbox and streams its start, output and end.
 * The command outlives the stream: a client that hangs up leaves it running (reach it again
 * with `Connect`, stop it with `SendSignal`). But not its deadline: as in envd, the stream's
 * `Connect-Timeout-Ms` (the SDKs send 60 s unless told otherwise, none for `timeoutMs: 0`) is
 * the command's timeout, and the command is killed when it passes.
 *
 * With `pty: {size: {cols, rows}}` the command runs on a terminal of that size (E2B's PTY):
 * its output comes as `pty` data, its input through `SendInput` with `input.pty`, and `Update`
 * resizes it.
 *
 * @module
 */
import { z } from "zod";
import type { ExecRequest } from "../../../executors/contract.ts";
import type { SandboxOps } from "../../../service_contract.ts";
import type { StreamSink } from "../../connect_codec.ts";
import { parseMessage, resolvePath } from "../request.ts";
import type { RpcCall } from "../rpc.ts";
import { follow, type Processes } from "./processes.ts";

/** A terminal dimension as envd takes it: a uint32 it narrows to 16 bits; 0 is refused here. */
const cells = z.number().int().min(1).max(65_535);

/** E2B's `PTY` message: `{size: {cols, rows}}`. */
export const ptySchema: z.ZodType<{ size: { cols: number; rows: number } }> = z.object({
  size: z.object({ cols: cells, rows: cells }),
});

const startSchema = z.object({
  process: z.object({
    cmd: z.string().min(1),
    args: z.array(z.string()).optional(),
    envs: z.record(z.string(), z.string()).optional(),
    cwd: z.string().optional(),
  }),
  pty: ptySchema.optional(),
  tag: z.string().optional(),
  stdin: z.boolean().optional(),
});

/**
 * Serves `Start` for one call.
 *
 * @throws {ConnectError} `invalid_argument` for a bad message.
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
  const user = call.user();
  const request: ExecRequest = {
    cmd: [body.process.cmd, ...(body.process.args ?? [])],
    env: body.process.envs,
    cwd: body.process.cwd ? resolvePath(body.process.cwd, user, "process.cwd") : undefined,
    user,
    stdin: body.stdin ?? false,
    ...(body.pty ? { tty: { cols: body.pty.size.cols, rows: body.pty.size.rows } } : {}),
    ...(call.deadlineMs === undefined ? {} : { timeoutMs: call.deadlineMs }),
  };
  const handle = await ops.startCommand({ id: call.sandbox.id }, request);
  const hub = processes.open(call.sandbox.id, handle, {
    tag: body.tag,
    tty: body.pty !== undefined,
  });
  // No await between open() and follow(): follow() sends the start event and subscribes
  // before the pump's first read resolves, so no output can slip ahead of the start event.
  await follow(hub, sink, { keepaliveMs: call.keepaliveMs(), ownDeadlineMs: call.deadlineMs });
}
