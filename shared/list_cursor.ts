/**
 * The E2B list cursor both the nodes and the gateway speak: a position in the order every node
 * lists sandboxes in (start time, then id). Because the order is the same everywhere, the
 * gateway can merge nodes' pages and hand out a cursor each node understands.
 *
 * @module
 */
import { HttpError } from "./http_error.ts";

/** A position in the listing order. */
export interface ListCursor {
  /** The row's start time, ISO 8601. */
  createdAt: string;
  /** The row's sandbox id, breaking ties between equal start times. */
  id: string;
}

/**
 * Orders rows by start time, then id, so paging stays stable while sandboxes come and go.
 *
 * @example
 * ```ts
 * import { compareListCursors } from "./list_cursor.ts";
 * compareListCursors({ createdAt: "2026-01-01T00:00:00Z", id: "a" },
 *   { createdAt: "2026-01-01T00:00:00Z", id: "b" }); // -1
 * ```
 */
export function compareListCursors(a: ListCursor, b: ListCursor): number {
  const t = Date.parse(a.createdAt) - Date.parse(b.createdAt);
  if (t !== 0) return t;
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/**
 * The `x-next-token` form: base64url of `[createdAt, id]`.
 *
 * @example
 * ```ts
 * import { decodeListCursor, encodeListCursor } from "./list_cursor.ts";
 * const token = encodeListCursor({ createdAt: "2026-01-01T00:00:00Z", id: "sbx_1" });
 * decodeListCursor(token, "node").id; // "sbx_1"
 * ```
 */
export function encodeListCursor(cursor: ListCursor): string {
  return btoa(JSON.stringify([cursor.createdAt, cursor.id])).replace(/=+$/, "")
    .replace(/\+/g, "-").replace(/\//g, "_");
}

/**
 * Reads a `nextToken`; `issuer` ("node" or "gateway") names who hands them out in the 400.
 *
 * @throws {HttpError} 400 when the token is not one this side issued.
 * @example
 * ```ts
 * import { decodeListCursor } from "./list_cursor.ts";
 * decodeListCursor("WyIyMDI2LTAxLTAxVDAwOjAwOjAwWiIsImEiXQ", "node"); // { createdAt: "2026-01-01T00:00:00Z", id: "a" }
 * ```
 */
export function decodeListCursor(token: string, issuer: string): ListCursor {
  try {
    const b64 = token.replace(/-/g, "+").replace(/_/g, "/");
    const [createdAt, id] = JSON.parse(atob(b64 + "=".repeat((4 - (b64.length % 4)) % 4)));
    if (typeof createdAt === "string" && typeof id === "string" && !isNaN(Date.parse(createdAt))) {
      return { createdAt, id };
    }
  } catch { /* answered below */ }
  throw new HttpError(
    400,
    `'nextToken' is not a token this ${issuer} issued: start from the first page`,
  );
}
