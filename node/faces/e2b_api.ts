/**
 * The node's E2B control plane (the API the `e2b` SDK calls with `E2B_API_URL`): create (its
 * lifecycle and network options read by `e2b_create_options.ts`), connect/resume, timeout,
 * refresh, get, list, kill, pause and metrics, with E2B's `{code, message}` errors and
 * `X-API-KEY` auth. The routes are in `e2b_sandbox_routes.ts`, `e2b_list_routes.ts` and
 * `e2b_snapshot_routes.ts`; what they share in `e2b_face.ts`.
 *
 * @module
 */
import { Hono } from "hono";
import { unbuiltE2bRoutes } from "../../shared/e2b_unbuilt.ts";
import { HttpError } from "../../shared/http_error.ts";
import { e2bKeyAuth } from "../../shared/e2b_auth.ts";
import { tokensEqual } from "../../shared/token.ts";
import { executorErrorToHttp } from "../executors/contract.ts";
import type { SandboxOps } from "../service_contract.ts";
import { type E2bApiOptions, E2bFace, errorText } from "./e2b_face.ts";
import { listRoutes } from "./e2b_list_routes.ts";
import { sandboxRoutes } from "./e2b_sandbox_routes.ts";
import { snapshotRoutes } from "./e2b_snapshot_routes.ts";
import { templateBuildRoutes } from "./e2b_template_routes.ts";

export { type E2bApiOptions, e2bState, SANDBOX_DOMAIN_HEADER } from "./e2b_face.ts";
export { parseMetadataQuery } from "./e2b_list_routes.ts";

/**
 * Builds the E2B control plane; `createNodeApp` mounts it at `/e2b/api`.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { createE2bApi } from "./e2b_api.ts";
 * import { FakeExecutor } from "../executors/fake.ts";
 * import { Ledger } from "../ledger.ts";
 * import { SandboxService } from "../service.ts";
 * const ops = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
 *   executor: new FakeExecutor(),
 * });
 * const app = new Hono();
 * app.route("/e2b/api", createE2bApi(ops, { apiToken: "t".repeat(32) }));
 * ```
 */
export function createE2bApi(ops: SandboxOps, options: E2bApiOptions): Hono {
  const face = new E2bFace(ops, options);
  const app = new Hono();
  app.use("*", e2bKeyAuth((key) => tokensEqual(key, options.apiToken)));
  sandboxRoutes(app, face);
  listRoutes(app, face);
  snapshotRoutes(app, face, options.builds?.tags);
  templateBuildRoutes(app, face, options.builds, options.templates ?? (() => Promise.resolve([])));

  for (const route of unbuiltE2bRoutes) {
    app.on(route.method, route.path, (c) => {
      // A sandbox that does not exist is a 404 first (see shared/e2b_unbuilt.ts).
      if (route.namesSandbox) face.mustGet(c, c.req.param("id")!);
      return c.json({ code: 501, message: route.message }, 501);
    });
  }

  // A catch-all route rather than notFound(): a mounted sub-app's notFound is not used.
  app.all("*", (c) =>
    c.json({
      code: 404,
      message: `No E2B API route ${c.req.method} ${new URL(c.req.url).pathname} on this node`,
    }, 404));
  app.onError((thrown, c) => {
    const error = executorErrorToHttp(thrown);
    if (error instanceof HttpError) {
      for (const [k, v] of Object.entries(error.headers)) c.header(k, v);
      return c.json(
        { ...error.details, code: error.status, message: error.message },
        error.status as 400,
      );
    }
    face.log("error", "E2B API request failed", { path: c.req.path, error });
    return c.json({ code: 500, message: `Internal error: ${errorText(error)}` }, 500);
  });
  return app;
}
