/**
 * The sentence the gateway's 404 ends with, read off the routes the root app really holds, so
 * a face mounted or left out (`mountE2b`, the operator's view) is named exactly when it answers.
 *
 * @module
 */

/** One route as Hono lists it in `app.routes`. */
export interface RouteEntry {
  readonly method: string;
  readonly path: string;
}

const oneSegment = /^\/[A-Za-z][\w-]*$/;

function list(items: string[]): string {
  return items.length <= 1
    ? items.join("")
    : `${items.slice(0, -1).join(", ")} and ${items[items.length - 1]}`;
}

/**
 * Says what the gateway answers: `POST /<verb>` for each verb, the `GET` pages, the paths that
 * take both (the `/files` door) and the mounted prefixes (`/e2b/api/`). A middleware's `/*` and a
 * verb's 405 catch-all (`ALL /<verb>`) name nothing new and are left out; so are the sub-paths
 * of a listed page (`/ui/login` under `GET /ui`).
 *
 * @example
 * ```ts
 * import { describeRoutes } from "./route_summary.ts";
 * describeRoutes([
 *   { method: "GET", path: "/healthz" },
 *   { method: "POST", path: "/listNodes" },
 *   { method: "ALL", path: "/listNodes" },
 *   { method: "ALL", path: "/e2b/api/*" },
 * ]); // "POST /<verb> for listNodes; GET /healthz; and everything under /e2b/api/"
 * ```
 */
export function describeRoutes(routes: readonly RouteEntry[]): string {
  const methods = new Map<string, Set<string>>();
  const prefixes: string[] = [];
  for (const { method, path } of routes) {
    if (oneSegment.test(path)) {
      if (!methods.has(path)) methods.set(path, new Set());
      methods.get(path)!.add(method);
    } else if (path.endsWith("/*") && path !== "/*") {
      const prefix = path.slice(0, -1);
      if (!prefixes.includes(prefix)) prefixes.push(prefix);
    }
  }
  const verbs: string[] = [];
  const pages: string[] = [];
  const both: string[] = [];
  for (const [path, set] of methods) {
    if (set.has("GET") && set.has("POST")) both.push(path);
    else if (set.has("POST")) verbs.push(path.slice(1));
    else if (set.has("GET")) pages.push(path);
  }
  const covered = [...pages, ...both].map((p) => `${p}/`);
  const under = prefixes.filter((p) => !covered.includes(p));
  const parts = [
    verbs.length > 0 ? `POST /<verb> for ${verbs.join(", ")}` : "",
    pages.length > 0 ? `GET ${list(pages)}` : "",
    both.length > 0 ? `GET and POST ${list(both)}` : "",
    under.length > 0 ? `everything under ${list(under)}` : "",
  ].filter((s) => s !== "");
  return parts.length <= 1
    ? parts.join("")
    : `${parts.slice(0, -1).join("; ")}; and ${parts[parts.length - 1]}`;
}
