/**
 * Connect RPC error codes and their HTTP statuses, shared by the node's envd face and the
 * gateway's envd routing so both answer in one dialect.
 *
 * @module
 */

/** The Connect error codes (the string form that travels in `{code, message}`). */
export type ConnectCode =
  | "canceled"
  | "unknown"
  | "invalid_argument"
  | "deadline_exceeded"
  | "not_found"
  | "already_exists"
  | "permission_denied"
  | "resource_exhausted"
  | "failed_precondition"
  | "aborted"
  | "out_of_range"
  | "unimplemented"
  | "internal"
  | "unavailable"
  | "data_loss"
  | "unauthenticated";

/** HTTP status of each Connect code, from the Connect protocol specification. */
const statusOfCode: Record<ConnectCode, number> = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  out_of_range: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  data_loss: 500,
  unauthenticated: 401,
};

/**
 * The HTTP status a unary Connect error travels with.
 *
 * @example
 * ```ts
 * import { connectCodeToStatus } from "./connect_codes.ts";
 * connectCodeToStatus("not_found"); // 404
 * ```
 */
export function connectCodeToStatus(code: ConnectCode): number {
  return statusOfCode[code];
}

/**
 * The Connect code that best names an HTTP status (for errors raised as `HttpError`).
 *
 * @example
 * ```ts
 * import { statusToConnectCode } from "./connect_codes.ts";
 * statusToConnectCode(409); // "already_exists"
 * ```
 */
export function statusToConnectCode(status: number): ConnectCode {
  switch (status) {
    case 400:
    case 413:
    case 422:
      return "invalid_argument";
    case 401:
      return "unauthenticated";
    case 403:
      return "permission_denied";
    case 404:
      return "not_found";
    case 409:
      return "already_exists";
    // 410: a sandbox whose container was lost; retrying will not help until it is destroyed.
    case 410:
    case 412:
      return "failed_precondition";
    // 507: the node's data disk is full (the Connect code for "out of space").
    case 429:
    case 507:
      return "resource_exhausted";
    case 499:
      return "canceled";
    case 501:
      return "unimplemented";
    case 502:
    case 503:
      return "unavailable";
    case 504:
      return "deadline_exceeded";
    default:
      return status >= 500 ? "internal" : "unknown";
  }
}
