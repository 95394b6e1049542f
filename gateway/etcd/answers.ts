/**
 * The answer a client gets when etcd fails under a shared-mode write (a name's slot, a key's
 * mint or revoke): a 503 naming etcd with Retry-After. Kept in a file of its own because the
 * slots and the key table's replica both answer with it, and neither owns the other.
 *
 * @module
 */
import { HttpError } from "../../shared/http_error.ts";
import { EtcdRequestError, EtcdUnavailableError } from "./client.ts";

/** The Retry-After of a 503 naming etcd: a member restart or an election takes seconds. */
export const etcdRetryAfterSeconds = 2;

/**
 * Turns an etcd failure into the 503 a client sees; anything else passes through.
 *
 * @example
 * ```ts ignore
 * await slots.run(key, task).catch((e) => { throw etcdHttpError(e); });
 * ```
 */
export function etcdHttpError(error: unknown): unknown {
  if (error instanceof EtcdRequestError) {
    return new HttpError(503, `${error.message}: the gateway cannot take the name's slot`, {
      headers: { "retry-after": String(etcdRetryAfterSeconds) },
    });
  }
  if (!(error instanceof EtcdUnavailableError)) return error;
  return new HttpError(
    503,
    `${error.message}; the gateway cannot take the name's slot, and a name must never be built ` +
      "twice on a guess, so creates and destroys wait for etcd (sandboxes that exist still answer)",
    {
      headers: { "retry-after": String(etcdRetryAfterSeconds) },
      details: { etcd: error.endpoints },
    },
  );
}
