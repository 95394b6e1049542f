/**
 * The E2B control-plane routes the SDKs call that this fleet does not build yet. Until they
 * exist, node and gateway answer each with a 501 in E2B's `{code, message}` shape and a
 * sentence saying what to do instead: a 404 would read as "sandbox not found" in the SDK. A
 * route about one sandbox (`namesSandbox`) looks that sandbox up first, so one that does not
 * exist (killed, or never made) is E2B's 404, as the SDK's tests expect of a fork of a killed
 * sandbox; the 501 is for an existing one.
 *
 * Deleting a template (`DELETE /templates/:id` with an id that is not a snapshot's) is answered
 * by {@linkcode TEMPLATE_DELETE_NOT_BUILT}: the route itself deletes snapshots.
 *
 * @module
 */

/** One route not built yet: its method, its path (Hono syntax) and the sentence it answers. */
export interface UnbuiltE2bRoute {
  /** The HTTP method. */
  method: "GET" | "POST" | "PUT" | "DELETE";
  /** The path below the control plane's root, with `:id` for a path segment. */
  path: string;
  /** What the 501 says. */
  message: string;
  /** The path's `:id` is a sandbox, looked up before the 501 (a missing one is a 404). */
  namesSandbox: boolean;
}

/**
 * The routes, in the order the SDK documents them.
 *
 * @example
 * ```ts
 * import { unbuiltE2bRoutes } from "./e2b_unbuilt.ts";
 * unbuiltE2bRoutes.length; // 0: every route the SDK calls is built
 * ```
 */
export const unbuiltE2bRoutes: readonly UnbuiltE2bRoute[] = [];

const patterns = unbuiltE2bRoutes.map((route) => ({
  route,
  regex: new RegExp(`^${route.path.replace(/:id/g, "[^/]+")}$`),
}));

/**
 * The not-built route that `method` and `path` (below the control plane's root, still
 * percent-encoded) ask for, or undefined.
 *
 * @example
 * ```ts
 * import { unbuiltE2bRoute } from "./e2b_unbuilt.ts";
 * unbuiltE2bRoute("PUT", "/sandboxes/sbx_1/network"); // undefined: built
 * unbuiltE2bRoute("GET", "/sandboxes/sbx_1"); // undefined
 * ```
 */
export function unbuiltE2bRoute(method: string, path: string): UnbuiltE2bRoute | undefined {
  return patterns.find((p) => p.route.method === method && p.regex.test(path))?.route;
}

/** The 501 of `DELETE /templates/:id` for an id that is not a snapshot's. */
export const TEMPLATE_DELETE_NOT_BUILT: string =
  "Deleting templates is not built on this fleet: a node's templates are its DORMICE_TEMPLATES " +
  "(this route deletes snapshots, whose ids start with 'snap-')";
