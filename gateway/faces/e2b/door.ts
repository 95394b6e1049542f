/**
 * What every E2B face of the gateway checks at its door and how each answers an error: the path
 * below the mount, a sandbox id no node could hold (400), envd's credentials (401), a miss in
 * E2B's wording (404), and the one place an error becomes E2B's `{code:<int>, message}` (a
 * throw that is not an `HttpError` is logged and called a bug). Kept apart so the control plane
 * (`control.ts`) and envd (`envd.ts`) refuse alike.
 *
 * @module
 */
import type { Context } from "hono";
import type { FindOne } from "../../finder/finder.ts";
import type { GatewayParts } from "../parts.ts";
import {
  envdRefusal,
  envdRequestAuthorized,
  refusalHeaders,
} from "../../../shared/access_tokens.ts";
import { HttpError } from "../../../shared/http_error.ts";
import { sandboxIdSchema } from "../../../shared/schemas.ts";

/** The header the SDK names the sandbox with on every envd request. */
export const SANDBOX_ID_HEADER: string = "e2b-sandbox-id";

/**
 * `locate` by id, with E2B's wording for a miss (another team's sandbox is a miss too).
 *
 * @throws {HttpError} 404 ({@linkcode notFound}), and the routing's 409, 503 or 499.
 * @example
 * ```ts ignore
 * const found = await locate(parts, id, request.signal, scopeOf(caller));
 * ```
 */
export async function locate(
  parts: GatewayParts,
  id: string,
  signal: AbortSignal,
  team?: string,
): Promise<FindOne> {
  const r = await parts.routing.resolve("id", id, signal, team);
  if (r.kind === "none") throw notFound(id);
  return r;
}

/**
 * E2B's 404 for a sandbox id no node holds.
 *
 * @example
 * ```ts ignore
 * if (answer === null) throw notFound(id);
 * ```
 */
export function notFound(id: string): HttpError {
  return new HttpError(
    404,
    `Sandbox '${id}' not found on any node of the fleet: it was killed, or never existed`,
  );
}

/**
 * The request's path below the face's mount point, still percent-encoded.
 *
 * @example
 * ```ts ignore
 * const rest = suffix(c); // "/sandboxes/abc/pause" under /e2b/api
 * ```
 */
export function suffix(c: Context): string {
  const pathname = new URL(c.req.url).pathname;
  // In a sub-app's catch-all the route path is `<mount>/*`.
  const mount = c.req.routePath.replace(/\/?\*$/, "");
  const rest = pathname.startsWith(mount) ? pathname.slice(mount.length) : pathname;
  return rest === "" ? "/" : rest;
}

/**
 * envd's credentials checked at the gateway's door, as the node would check them (the same
 * tokens, derived from the fleet token): a request without them costs no lookup round and
 * reaches no node, so random sandbox ids with no token are a flood of cheap 401s.
 *
 * @throws {HttpError} 401 naming what is missing or wrong.
 * @example
 * ```ts ignore
 * requireCredentials(parts, id, c.req.raw, true);
 * ```
 */
export function requireCredentials(
  parts: GatewayParts,
  id: string,
  request: Request,
  signedUrlAllowed: boolean,
): void {
  const credentials = {
    accessToken: request.headers.get("x-access-token"),
    url: new URL(request.url),
    method: request.method,
    signedUrlAllowed,
  };
  const now = Date.now();
  if (!envdRequestAuthorized(parts.accessTokens, id, credentials, now)) {
    const refusal = envdRefusal(parts.accessTokens, id, credentials, now);
    throw new HttpError(401, refusal, { headers: refusalHeaders(refusal) });
  }
}

/**
 * An id no node can hold is refused at the door (a 400 in the face's dialect) before it costs a
 * lookup round: every node would refuse it anyway, with the same shared rules.
 *
 * @throws {HttpError} 400 naming the id and what is wrong with it.
 * @example
 * ```ts ignore
 * const id = checkedId(c.req.header("e2b-sandbox-id") ?? "");
 * ```
 */
export function checkedId(id: string): string {
  const r = sandboxIdSchema.safeParse(id);
  if (r.success) return r.data;
  const shown = id.length > 60 ? `${id.slice(0, 60)}…` : id;
  throw new HttpError(
    400,
    `'${shown}' is not a sandbox id: ${r.error.issues[0].message}`,
  );
}

/**
 * A path segment percent-decoded; bad encoding is a 400, not a bug.
 *
 * @example
 * ```ts ignore
 * const id = checkedId(decodeSegment(match[1]));
 * ```
 */
export function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new HttpError(400, `The sandbox id '${segment.slice(0, 60)}' is badly percent-encoded`);
  }
}

/**
 * What an E2B or Connect error answer is built from: an `HttpError` as thrown, a 499 when the
 * client already left, and anything else logged with its stack and called a bug (a 500).
 *
 * @example
 * ```ts ignore
 * const e = httpErrorOrBug(error, request, parts);
 * ```
 */
export function httpErrorOrBug(error: unknown, request: Request, parts: GatewayParts): HttpError {
  if (error instanceof HttpError) return error;
  if (request.signal.aborted) return new HttpError(499, "The client closed the request");
  parts.log("error", "unexpected error in the gateway's E2B face", {
    error: error instanceof Error ? error.stack ?? error.message : String(error),
  });
  return new HttpError(
    500,
    `The gateway failed unexpectedly (${(error as Error)?.message ?? error}): this is a bug; ` +
      "the gateway's log has the details",
  );
}

/**
 * The one place an error becomes E2B's `{code:<int>, message}`.
 *
 * @example
 * ```ts ignore
 * app.onError((error, c) => e2bError(error, c.req.raw, parts));
 * ```
 */
export function e2bError(error: unknown, request: Request, parts: GatewayParts): Response {
  const e = httpErrorOrBug(error, request, parts);
  return Response.json({ ...e.details, code: e.status, message: e.message }, {
    status: e.status,
    headers: e.headers,
  });
}
