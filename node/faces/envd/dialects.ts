/**
 * The two error dialects envd answers in, in one place. The Connect RPCs answer
 * `{code:"not_found", message}`; the REST routes (`/files`, `/health`) answer E2B's
 * `{code:404, message}`. Whatever was thrown (a `ConnectError`, an `HttpError`, an
 * `ExecutorError`) becomes either; an executor error's status comes from the node's one table
 * (`executorErrorStatus`) and its Connect code from that status. Anything else is a bug: logged,
 * and answered as `internal` / 500.
 *
 * @module
 */
import { refusalHeaders } from "../../../shared/access_tokens.ts";
import type { ConnectCode } from "../../../shared/connect_codes.ts";
import { HttpError } from "../../../shared/http_error.ts";
import type { Log } from "../../../shared/log.ts";
import { executorErrorToHttp } from "../../executors/contract.ts";
import { ConnectError, statusToConnectCode } from "../connect_codec.ts";

/**
 * The REST status of a Connect code. Not the Connect protocol's own table: `unavailable` is a
 * 502 here, the status E2B's REST routes answer for a sandbox that is not running.
 */
const restStatusOfCode: Partial<Record<ConnectCode, number>> = {
  invalid_argument: 400,
  unauthenticated: 401,
  not_found: 404,
  already_exists: 409,
  unavailable: 502,
  unimplemented: 501,
  deadline_exceeded: 504,
};

/**
 * What a thrown error is in the Connect dialect.
 *
 * @example
 * ```ts
 * import { ExecutorError } from "../../executors/contract.ts";
 * import { toConnect } from "./dialects.ts";
 * toConnect(() => {}, new ExecutorError("exists", "'/tmp/a' exists")).code; // "already_exists"
 * ```
 */
export function toConnect(log: Log, thrown: unknown): { code: ConnectCode; message: string } {
  const error = executorErrorToHttp(thrown);
  if (error instanceof ConnectError) return { code: error.code, message: error.message };
  if (error instanceof HttpError) {
    return { code: statusToConnectCode(error.status), message: error.message };
  }
  log("error", "envd request failed", { error });
  return { code: "internal", message: `Internal error: ${errorMessage(error)}` };
}

/**
 * A thrown error as a REST answer `{code:<status>, message}`.
 *
 * @example
 * ```ts
 * import { ConnectError } from "../connect_codec.ts";
 * import { restErrorOf } from "./dialects.ts";
 * restErrorOf(() => {}, new ConnectError("unavailable", "No sandbox 'x'")).status; // 502
 * ```
 */
export function restErrorOf(log: Log, thrown: unknown): Response {
  const error = executorErrorToHttp(thrown);
  if (error instanceof ConnectError) {
    return restError(restStatusOfCode[error.code] ?? 500, error.message);
  }
  if (error instanceof HttpError) return restError(error.status, error.message, error.headers);
  log("error", "envd request failed", { error });
  return restError(500, `Internal error: ${errorMessage(error)}`);
}

/**
 * A REST error answer: `{code:<status>, message}` with that status.
 *
 * @example
 * ```ts
 * import { restError } from "./dialects.ts";
 * restError(400, "The E2b-Sandbox-Id header is missing: name the sandbox").status; // 400
 * ```
 */
export function restError(
  status: number,
  message: string,
  headers: Record<string, string> = {},
): Response {
  return Response.json({ code: status, message }, {
    status,
    headers: { ...refusalHeaders(message), ...headers },
  });
}

/**
 * The 415 for an RPC sent with the wrong content type, naming the one to send.
 *
 * @example
 * ```ts
 * import { unsupportedMedia } from "./dialects.ts";
 * unsupportedMedia("process.Process/Start", "application/connect+json").status; // 415
 * ```
 */
export function unsupportedMedia(route: string, wanted: string): Response {
  return new Response(
    JSON.stringify({
      code: "invalid_argument" satisfies ConnectCode,
      message: `${route} takes Content-Type ${wanted} (the Connect JSON codec)`,
    }),
    {
      status: 415,
      headers: { "content-type": "application/json", "accept-post": wanted },
    },
  );
}

/**
 * The message of anything thrown.
 *
 * @example
 * ```ts
 * import { errorMessage } from "./dialects.ts";
 * errorMessage(new Error("boom")); // "boom"
 * ```
 */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
