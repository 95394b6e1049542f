/**
 * The E2B faces' key check, in one place for the node and the gateway: the SDKs send their API
 * key as `X-API-KEY` (some clients as `Authorization: Bearer`).
 *
 * @module
 */
import type { MiddlewareHandler } from "hono";
import { HttpError } from "./http_error.ts";
import { bearerToken } from "./token.ts";

/** The credential an E2B request carries: `X-API-KEY`, else a bearer token, else `undefined`. */
export function e2bApiKey(headers: Headers): string | undefined {
  return headers.get("x-api-key") ?? bearerToken(headers.get("authorization"));
}

/**
 * A Hono middleware that lets a request through when `authorized(key)` holds and otherwise
 * answers 401 with a sentence saying which header to set.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { e2bKeyAuth } from "./e2b_auth.ts";
 * const app = new Hono();
 * app.use("*", e2bKeyAuth((key) => key === "a".repeat(32)));
 * ```
 */
export function e2bKeyAuth(authorized: (key: string) => boolean): MiddlewareHandler {
  return async (c, next) => {
    const given = e2bApiKey(c.req.raw.headers);
    if (!given || !authorized(given)) {
      throw new HttpError(
        401,
        given
          ? "The API key is not valid: set E2B_API_KEY to the fleet token (DORMICE_API_TOKEN)"
          : "The X-API-KEY header is missing: set E2B_API_KEY to the fleet token (DORMICE_API_TOKEN)",
      );
    }
    await next();
  };
}
