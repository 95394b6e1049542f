/**
 * The gateway's auth rules, in one place. One fleet token (`DORMICE_API_TOKEN`) is shared by the
 * gateway, the nodes and the operator, compared in constant time; where it is presented depends
 * on the face:
 *
 * | path | credential | checked by |
 * |---|---|---|
 * | `GET /healthz` | none: a load balancer probes it | — |
 * | the native and fleet verbs (`POST /<verb>`) | `Authorization: Bearer <token>` | {@linkcode fleetBearerGate}, and the routed verbs' fast path through {@linkcode requireFleetBearer} |
 * | `/e2b/api/…` | `X-API-KEY: <token>` (the SDK's `E2B_API_KEY`), or a bearer token | {@linkcode e2bFleetKeyAuth}, answering in E2B's `{code, message}` |
 * | `/e2b/envd/…` and the root `/files` | the client's own (`X-Access-Token`, `Authorization: Basic <user>`, a URL signature) | the node, which knows the sandbox's access token: the gateway passes them through untouched |
 *
 * The gateway forwards with the node's credentials (`GatewayRouting.nodeHeaders`); nodes trust
 * the gateway, never the client's bearer header.
 *
 * @module
 */
import type { MiddlewareHandler } from "hono";
import { e2bKeyAuth } from "../shared/e2b_auth.ts";
import { HttpError } from "../shared/http_error.ts";
import { bearerToken, tokenMatcher } from "../shared/token.ts";

/** Whether a presented token is the fleet token; `undefined` (nothing presented) never is. */
export type FleetTokenCheck = (given: string | undefined) => boolean;

/**
 * Paths the fleet bearer check leaves to a mounted face: E2B clients speak `X-API-KEY`, and an
 * answer to them must be in E2B's dialect, which the root's `{message}` 401 is not.
 */
const ownAuthPrefixes = ["/e2b/", "/files"];

/**
 * The constant-time check of a presented token against the fleet token, built once so the hot
 * path encodes nothing per request.
 *
 * @example
 * ```ts
 * import { fleetTokenCheck } from "./auth.ts";
 * const authorized = fleetTokenCheck("t".repeat(32));
 * authorized("t".repeat(32)); // true
 * authorized(undefined); // false
 * ```
 */
export function fleetTokenCheck(token: string): FleetTokenCheck {
  const matches = tokenMatcher(token);
  return (given) => given !== undefined && matches(given);
}

/**
 * Whether the fleet bearer check skips `path`: `/healthz` is open, and paths under `/e2b/` and
 * `/files` belong to faces that authenticate in their own dialect (see the table above).
 *
 * @example
 * ```ts
 * import { skipsFleetBearer } from "./auth.ts";
 * skipsFleetBearer("/e2b/api/v2/sandboxes"); // true
 * skipsFleetBearer("/acquireSandbox"); // false
 * ```
 */
export function skipsFleetBearer(path: string): boolean {
  return path === "/healthz" || ownAuthPrefixes.some((p) => path.startsWith(p));
}

/**
 * Refuses a request whose `Authorization` header does not carry the fleet token, with a 401
 * saying which header to send (and `WWW-Authenticate: Bearer`).
 *
 * @throws {HttpError} 401 when the bearer token is missing or is not the fleet token.
 *
 * @example
 * ```ts
 * import { fleetTokenCheck, requireFleetBearer } from "./auth.ts";
 * const authorized = fleetTokenCheck("t".repeat(32));
 * requireFleetBearer(`Bearer ${"t".repeat(32)}`, authorized); // passes
 * ```
 */
export function requireFleetBearer(
  header: string | null | undefined,
  authorized: FleetTokenCheck,
): void {
  const given = bearerToken(header);
  if (given === undefined) {
    throw new HttpError(
      401,
      "Missing bearer token: send the header 'Authorization: Bearer <DORMICE_API_TOKEN>'",
      { headers: { "www-authenticate": "Bearer" } },
    );
  }
  if (!authorized(given)) {
    throw new HttpError(
      401,
      "The bearer token does not match the gateway's DORMICE_API_TOKEN: send the fleet token",
      { headers: { "www-authenticate": "Bearer" } },
    );
  }
}

/**
 * The root app's middleware: every path but those {@linkcode skipsFleetBearer} names needs the
 * fleet token as a bearer token.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { fleetBearerGate, fleetTokenCheck } from "./auth.ts";
 * const app = new Hono();
 * app.use("*", fleetBearerGate(fleetTokenCheck("t".repeat(32))));
 * ```
 */
export function fleetBearerGate(authorized: FleetTokenCheck): MiddlewareHandler {
  return (c, next) => {
    const path = c.req.path;
    if (skipsFleetBearer(path)) return next();
    requireFleetBearer(c.req.header("authorization"), authorized);
    return next();
  };
}

/**
 * The E2B control plane's middleware: the SDK's `X-API-KEY` (or a bearer token) must be the
 * fleet token; otherwise a 401 whose sentence names `E2B_API_KEY`, which the face's error
 * handler answers as `{code:401, message}`.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { e2bFleetKeyAuth, fleetTokenCheck } from "./auth.ts";
 * const api = new Hono();
 * api.use("*", e2bFleetKeyAuth(fleetTokenCheck("t".repeat(32))));
 * ```
 */
export function e2bFleetKeyAuth(authorized: FleetTokenCheck): MiddlewareHandler {
  return e2bKeyAuth(authorized);
}
