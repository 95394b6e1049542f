/**
 * One error type carrying an HTTP status; each face turns it into its own dialect in one place.
 *
 * @module
 */
import { HTTPException } from "hono/http-exception";
import { type Log, silentLog } from "./log.ts";

/**
 * An error that becomes an HTTP answer: `status`, a sentence saying what is wrong and what to do,
 * and optional headers (e.g. `Retry-After`) and extra body fields.
 *
 * @example
 * ```ts
 * import { HttpError } from "@dormice/cluster/shared";
 * const error = new HttpError(404, "No sandbox named 'a': acquire it first with acquireSandbox");
 * console.log(error.status); // 404
 * ```
 */
export class HttpError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** Extra response headers. */
  readonly headers: Record<string, string>;
  /** Extra fields for the body (beside `message`). */
  readonly details: Record<string, unknown>;
  /** An error with `status` and the sentence; `headers` and `details` go into the answer. */
  constructor(
    status: number,
    message: string,
    options: { headers?: Record<string, string>; details?: Record<string, unknown> } = {},
  ) {
    super(message);
    this.name = "HttpError";
    this.status = status;
    this.headers = options.headers ?? {};
    this.details = options.details ?? {};
  }
  /**
   * The error as the native dialect answers it: `{message}` plus `details`, with `status` and
   * `headers`. Hono's default error handler answers with this, so an `HttpError` the library
   * throws inside a host Hono app keeps its status rather than becoming a 500.
   */
  getResponse(): Response {
    return Response.json({ ...this.details, message: this.message }, {
      status: this.status,
      headers: this.headers,
    });
  }
}

/**
 * The native dialect's answer for an error: `{message}` (plus an HttpError's details and
 * headers) with its status; a Hono HTTPException keeps its status; anything else is logged with
 * its stack and answered as a 500 that says it is a bug of `who` ("node" or "gateway").
 *
 * @example
 * ```ts
 * import { HttpError, messageResponse } from "./http_error.ts";
 * const res = messageResponse(new HttpError(404, "No sandbox named 'a'"), "node");
 * console.log(res.status); // 404
 * ```
 */
export function messageResponse(error: unknown, who: string, log: Log = silentLog): Response {
  if (error instanceof HttpError) return error.getResponse();
  if (error instanceof HTTPException) {
    return Response.json({ message: error.message || "The request was refused" }, {
      status: error.status,
    });
  }
  log("error", `unexpected error in the ${who}`, {
    error: error instanceof Error ? error.stack ?? error.message : String(error),
  });
  return Response.json({
    message: `The ${who} failed unexpectedly (${(error as Error)?.message ?? error}): ` +
      `this is a bug; the ${who}'s log has the details`,
  }, { status: 500 });
}
