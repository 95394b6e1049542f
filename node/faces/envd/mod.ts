/**
 * The node's envd face (E2B's in-sandbox daemon, served for every sandbox at once), mounted by
 * `createNodeApp` at `/e2b/envd`. The sandbox is picked by the `E2b-Sandbox-Id` header.
 *
 * | file | holds |
 * |---|---|
 * | `mod.ts` | {@linkcode createEnvd}: mounts `/health`, `/files` and the two Connect services |
 * | `core.ts` | the options and the state the parts share |
 * | `guard.ts` | the sandbox header and the `X-Access-Token` check |
 * | `rpc.ts` | the Connect router (and each stream's `Connect-Timeout-Ms`) and the RPC types |
 * | `request.ts` | the run-as user, keepalives, deadlines, {@linkcode resolvePath}, schemas |
 * | `dialects.ts` | the Connect and REST error dialects |
 * | `files.ts` | the REST `/files` door, signed URLs ({@linkcode handleSignedFiles}), the upload cap |
 * | `multipart.ts` | a streaming `multipart/form-data` reader: one part at a time, each a stream |
 * | `staging.ts` | {@linkcode UploadStaging}: an upload read to its end, in memory or on disk, before the executor writes it |
 * | `upload_slots.ts` | {@linkcode UploadSlots}: the bound on uploads streaming at once |
 * | `process/` | `process.Process`: one file per RPC, `processes.ts` the process table |
 * | `filesystem/` | `filesystem.Filesystem`: one file per RPC group, `watchers.ts` the watches |
 *
 * @module
 */
import { Hono } from "hono";
import type { SandboxOps } from "../../service_contract.ts";
import { type EnvdOptions, makeCore, SANDBOX_HEADER } from "./core.ts";
import { errorMessage, restError } from "./dialects.ts";
import { mountFiles } from "./files.ts";
import { admitTraffic } from "./guard.ts";
import { filesystemService } from "./filesystem/service.ts";
import { Watchers } from "./filesystem/watchers.ts";
import { processService } from "./process/service.ts";
import { mountRpcs } from "./rpc.ts";

export type { EnvdOptions } from "./core.ts";
export { handleSignedFiles } from "./files.ts";
export { UploadSlots, type UploadSlotsOptions } from "./upload_slots.ts";
export { UploadStaging, type UploadStagingOptions } from "./staging.ts";
export { resolvePath } from "./request.ts";

/**
 * Builds the envd face: `GET /health`, `GET`/`POST /files`, and the Connect RPC services
 * `process.Process` and `filesystem.Filesystem` with the JSON codec.
 *
 * Each `Start`/`Connect` stream follows its command's output: a client that hangs up stops its
 * own stream at once, while the command keeps running with its output drained (E2B's background
 * commands must survive their client, and an undrained pipe would stall or SIGPIPE the command).
 * `WatchDir` and the polled watchers report every change in the sandbox, by envd (uploads
 * through either `/files` door, MakeDir, Move, Remove) or by its commands.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { createEnvd } from "./mod.ts";
 * import { FakeExecutor } from "../../executors/fake.ts";
 * import { Ledger } from "../../ledger.ts";
 * import { SandboxService } from "../../service.ts";
 * const ops = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
 *   executor: new FakeExecutor(),
 * });
 * const app = new Hono();
 * app.route("/e2b/envd", createEnvd(ops));
 * ```
 */
export function createEnvd(ops: SandboxOps, options: EnvdOptions = {}): Hono {
  const core = makeCore(ops, options);
  const app = new Hono();

  app.get("/health", async (c) => {
    const id = c.req.header(SANDBOX_HEADER);
    if (!id) return restError(400, `The ${SANDBOX_HEADER} header is missing: name the sandbox`);
    const sandbox = ops.get({ id });
    // A paused sandbox is not running, unless this request resumes it (autoResume).
    const awake = sandbox && await admitTraffic(core, sandbox).catch(() => undefined);
    if (!awake) return restError(502, `Sandbox '${id}' is not running on this node`);
    return c.body(null, 204);
  });
  mountFiles(app, core);
  mountRpcs(app, core, [
    processService(ops, core.options.log),
    filesystemService(
      ops,
      new Watchers(ops, { maxPerSandbox: core.options.maxWatchesPerSandbox }),
    ),
  ]);

  // A catch-all route rather than notFound(): a mounted sub-app's notFound is not used.
  app.all(
    "*",
    (c) => restError(404, `No envd route ${c.req.method} ${new URL(c.req.url).pathname}`),
  );
  app.onError((error) => restError(500, errorMessage(error)));
  return app;
}
