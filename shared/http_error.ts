/**
 * One error type carrying an HTTP status; each face turns it into its own dialect in one place.
 *
 * @module
 */

/**
 * An error that becomes an HTTP answer: `status`, a sentence saying what is wrong and what to do,
 * and optional headers (e.g. `Retry-After`) and extra body fields.
 *
 * @example
 * ```ts
 * import { HttpError } from "@dormice/cluster/shared";
 * throw new HttpError(404, "No sandbox named 'a': acquire it first with acquireSandbox");
 * ```
 */
export class HttpError extends Error {
  /** The HTTP status. */
  readonly status: number;
  /** Extra response headers. */
  readonly headers: Record<string, string>;
  /** Extra fields for the body (beside `message`). */
  readonly details: Record<string, unknown>;
  /** Builds the error. */
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
}
