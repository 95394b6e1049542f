/**
 * The slot token: a number a gateway of a shared fleet sends with a name's lookups and its create
 * (`x-dormice-slot-token`), larger for every later take of the name's slot (etcd's revision of
 * the take). A node refuses to build a name for a token older than one it has already seen for
 * that name: a gateway that lost the slot (paused past its lease) cannot build a name another
 * gateway took since.
 *
 * @module
 */
import { HttpError } from "./http_error.ts";

/** The request header carrying the slot token. */
export const SLOT_TOKEN_HEADER = "x-dormice-slot-token";

/**
 * The hop marker header every request a gateway sends to a node carries (`gateway/door.ts`'s
 * `HOP_HEADER`): a create without it was made behind the gateways' back.
 */
export const HOP_MARKER_HEADER = "x-dormice-hop";

/**
 * Whether a request came to the node directly rather than through a gateway (no hop marker).
 *
 * @example
 * ```ts
 * import { cameDirect } from "./slot_token.ts";
 * cameDirect(new Headers()); // true
 * ```
 */
export function cameDirect(headers: Headers): boolean {
  return !headers.has(HOP_MARKER_HEADER);
}

/**
 * The slot token a request carries, or `undefined` when it carries none.
 *
 * @throws {HttpError} 400 when the header is not a decimal integer of at most 16 digits.
 * @example
 * ```ts
 * import { slotTokenOf } from "./slot_token.ts";
 * slotTokenOf(new Headers({ "x-dormice-slot-token": "42" })); // 42
 * slotTokenOf(new Headers()); // undefined
 * ```
 */
export function slotTokenOf(headers: Headers): number | undefined {
  const raw = headers.get(SLOT_TOKEN_HEADER);
  if (raw === null) return undefined;
  if (!/^\d{1,16}$/.test(raw)) {
    throw new HttpError(
      400,
      `X-Dormice-Slot-Token must be a decimal integer of at most 16 digits (an etcd revision), ` +
        `got '${raw.slice(0, 40)}': send the revision of the name's slot, or no header`,
    );
  }
  return Number(raw);
}
