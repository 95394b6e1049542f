/**
 * The `sandbox_ids` list of E2B's `GET /sandboxes/metrics`, read alike by a node and by the
 * gateway that fans the call out to the nodes.
 *
 * @module
 */
import { HttpError } from "./http_error.ts";

/** Most ids one `GET /sandboxes/metrics` may name (E2B's `maxItems`). */
export const MAX_METRICS_IDS = 100;

/**
 * The ids of `sandbox_ids` (comma-separated, the parameter possibly repeated), each once.
 *
 * @throws {HttpError} 400 when none is given, more than {@linkcode MAX_METRICS_IDS}, or one over
 * 256 characters.
 * @example
 * ```ts
 * import { parseSandboxIds } from "./e2b_metrics_ids.ts";
 * parseSandboxIds(["a,b", "a"]); // ["a", "b"]
 * ```
 */
export function parseSandboxIds(values: string[] | undefined): string[] {
  const ids = [
    ...new Set((values ?? []).flatMap((v) => v.split(",")).map((v) => v.trim()).filter(Boolean)),
  ];
  if (ids.length === 0) {
    throw new HttpError(400, "'sandbox_ids' is required: a comma-separated list of sandbox ids");
  }
  if (ids.length > MAX_METRICS_IDS) {
    throw new HttpError(
      400,
      `'sandbox_ids' names ${ids.length} sandboxes: at most ${MAX_METRICS_IDS} per call, so ` +
        "split the list",
    );
  }
  if (ids.some((id) => id.length > 256)) {
    throw new HttpError(400, "'sandbox_ids' has an id over 256 characters");
  }
  return ids;
}
