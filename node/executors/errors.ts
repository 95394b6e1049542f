/**
 * The one error type executors throw, the HTTP status of each of its codes (which every face
 * answers with), and the sentences of its common cases.
 *
 * @module
 */
import { HttpError } from "../../shared/http_error.ts";

/** Error codes an executor raises; {@linkcode executorErrorStatus} gives each its HTTP status. */
export type ExecutorErrorCode =
  | "not_found" // a file or directory (or an image) does not exist
  | "gone" // the sandbox itself does not exist: destroyed, never created, or removed behind the node's back
  | "exists" // the path already exists where a new one is needed
  | "not_dir" // a path component is a file
  | "is_dir" // a file operation on a directory
  | "invalid" // bad argument (unknown template, relative path, ...)
  | "unavailable" // the engine did not answer in time or is down
  | "timeout"; // a call ran past its own deadline

/**
 * The one error type executors throw for expected failures; faces map `code` to a status.
 *
 * @example
 * ```ts
 * import { ExecutorError } from "@dormice/cluster/node";
 * const error = new ExecutorError("not_found", "Cannot read '/tmp/a': no such file or directory");
 * console.log(error.code); // "not_found": the faces answer 404
 * ```
 */
export class ExecutorError extends Error {
  /** What went wrong, for mapping to a status. */
  readonly code: ExecutorErrorCode;
  /** Builds the error with a sentence saying what is wrong and what to do. */
  constructor(code: ExecutorErrorCode, message: string) {
    super(message);
    this.name = "ExecutorError";
    this.code = code;
  }
}

/**
 * The HTTP status of each executor error code, the one table every face answers with (the envd
 * face derives its Connect code from it with `statusToConnectCode`). A 503, not a 502, for an
 * engine that is down: the node itself answered, and the client may retry. A 410 for a sandbox
 * the executor no longer has: the service reads it as a sandbox lost behind the node's back,
 * marks its row and answers its own 410 sentence.
 *
 * @example
 * ```ts
 * import { executorErrorStatus } from "@dormice/cluster/node";
 * executorErrorStatus.exists; // 409
 * ```
 */
export const executorErrorStatus: Readonly<Record<ExecutorErrorCode, number>> = {
  not_found: 404,
  gone: 410,
  exists: 409,
  not_dir: 400,
  is_dir: 400,
  invalid: 400,
  unavailable: 503,
  timeout: 504,
};

/**
 * Turns an `ExecutorError` into an `HttpError` with its status from
 * {@linkcode executorErrorStatus} and the same sentence; anything else is returned unchanged, so
 * a face can call it first and then handle `HttpError` alone.
 *
 * @example
 * ```ts
 * import { ExecutorError, executorErrorToHttp } from "./errors.ts";
 * executorErrorToHttp(new ExecutorError("not_found", "/a does not exist")); // HttpError 404
 * ```
 */
export function executorErrorToHttp(error: unknown): unknown {
  if (error instanceof ExecutorError) {
    return new HttpError(executorErrorStatus[error.code], error.message);
  }
  return error;
}

/**
 * The sentence of a snapshot name a team already uses (a 409).
 *
 * @example
 * ```ts
 * import { snapshotNameTaken } from "./errors.ts";
 * snapshotNameTaken("base-ready", "snap-aaaaaaaaaaaaaaaaaaaa").code; // "exists"
 * ```
 */
export function snapshotNameTaken(name: string, existing: string): ExecutorError {
  return new ExecutorError(
    "exists",
    `Snapshot name '${name}' is already used by this team's snapshot ${existing}: choose ` +
      `another name, or delete that snapshot first`,
  );
}

/**
 * The sentence of a snapshot this node does not hold for the team (a 404: another team's is
 * as absent as one never taken).
 *
 * @example
 * ```ts
 * import { snapshotNotFound } from "./errors.ts";
 * snapshotNotFound("snap-aaaaaaaaaaaaaaaaaaaa").code; // "not_found"
 * ```
 */
export function snapshotNotFound(idOrName: string): ExecutorError {
  return new ExecutorError(
    "not_found",
    `Snapshot '${idOrName}' not found on this node: list your team's snapshots ` +
      `(GET /snapshots) for their ids and names`,
  );
}

/**
 * The sentence of a create asking for a volume the node does not declare (a 400: another node
 * may have it, and the gateway's placement would have sent it there).
 *
 * @example
 * ```ts
 * import { unknownVolume } from "./errors.ts";
 * unknownVolume("data", ["cache"]).code; // "invalid"
 * ```
 */
export function unknownVolume(name: string, declared: readonly string[]): ExecutorError {
  return new ExecutorError(
    "invalid",
    `Volume '${name}' is not on this node: it declares ${
      declared.length === 0 ? "no volumes" : declared.join(", ")
    } (DORMICE_VOLUMES); create through the gateway, which places on a node that has it`,
  );
}

/**
 * The refusal of a create asking for egress address rules on an executor that cannot enforce
 * them (the gateway's placement would have sent it to one that can).
 *
 * @example
 * ```ts
 * import { egressRulesUnserved } from "./errors.ts";
 * egressRulesUnserved().code; // "invalid"
 * ```
 */
export function egressRulesUnserved(): ExecutorError {
  return new ExecutorError(
    "invalid",
    "This node cannot enforce egress address rules (network.allowOut / denyOut): it needs the " +
      "Docker executor with its iptables rules on (DORMICE_SANDBOX_HOST_FIREWALL not off); " +
      "create through the gateway, which places on a node that can, or leave the rules out",
  );
}

/**
 * The refusal of new egress rules for a sandbox made without egress: its network has no route
 * out for the rules to open.
 *
 * @example
 * ```ts
 * import { noEgress } from "./errors.ts";
 * noEgress("sbx1").code; // "invalid"
 * ```
 */
export function noEgress(id: string): ExecutorError {
  return new ExecutorError(
    "invalid",
    `Sandbox '${id}' was made without egress (no allowInternetAccess: true and no address ` +
      "rules), so there is no route out for rules to open: create it with allowInternetAccess: " +
      "true, or with the rules (e.g. denyOut ['0.0.0.0/0'] and the addresses in allowOut)",
  );
}
