/**
 * Constant-time comparison of secrets, and the fleet token's bearer check built on it.
 *
 * @module
 */
import { HttpError } from "./http_error.ts";

const encoder = new TextEncoder();

/**
 * Compares two secrets in time that depends only on their lengths, byte by byte on their UTF-8
 * encodings, so an attacker cannot learn a token one character at a time.
 *
 * @example
 * ```ts
 * import { tokensEqual } from "@dormice/cluster/shared";
 * tokensEqual("a".repeat(32), "a".repeat(32)); // true
 * ```
 */
export function tokensEqual(given: string, expected: string): boolean {
  const a = encoder.encode(given);
  const b = encoder.encode(expected);
  // Always walk the expected secret's full length so timing does not reveal a common prefix.
  let diff = a.length ^ b.length;
  for (let i = 0; i < b.length; i++) diff |= (a[i] ?? 0) ^ b[i];
  return diff === 0;
}

/**
 * A constant-time check against one secret known in advance, for a hot path: like
 * {@linkcode tokensEqual} without encoding either side on every call. It compares UTF-16 code
 * units, in time that depends only on the two lengths.
 *
 * @example
 * ```ts
 * import { tokenMatcher } from "./token.ts";
 * const matches = tokenMatcher("a".repeat(32));
 * matches("a".repeat(32)); // true
 * ```
 */
export function tokenMatcher(expected: string): (given: string) => boolean {
  const n = expected.length;
  return (given: string): boolean => {
    let diff = given.length ^ n;
    // Always walk the expected secret's full length so timing does not reveal a common prefix.
    for (let i = 0; i < n; i++) diff |= given.charCodeAt(i) ^ expected.charCodeAt(i);
    return diff === 0;
  };
}

/**
 * Whether `header` is `Bearer` (any case), one space and a token of visible ASCII: the shape
 * clients send, whose token the pattern below would find as `header.slice(7)`. Checked by code
 * units, as the regular expression's match array and its strings were most of what a routed
 * request's authentication allocated.
 */
function plainBearer(header: string): boolean {
  if (header.length < 8 || header.charCodeAt(6) !== 32) return false;
  for (let i = 0; i < 6; i++) {
    if ((header.charCodeAt(i) | 0x20) !== "bearer".charCodeAt(i)) return false;
  }
  for (let i = 7; i < header.length; i++) {
    const c = header.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

/**
 * Reads a bearer token from an `Authorization` header value, or `undefined`.
 *
 * @example
 * ```ts
 * import { bearerToken } from "@dormice/cluster/shared";
 * bearerToken("Bearer abc"); // "abc"
 * ```
 */
export function bearerToken(header: string | null | undefined): string | undefined {
  if (!header) return undefined;
  if (plainBearer(header)) return header.slice(7);
  const m = /^Bearer\s+(.+)$/i.exec(header.trim());
  return m ? m[1].trim() : undefined;
}

/**
 * Requires the fleet token as `Authorization: Bearer <token>`, the check both the gateway and
 * every node put before their fleet verbs. A missing token and a wrong one are each a 401 with
 * `WWW-Authenticate: Bearer` and a sentence saying what to send; `holder` names whose
 * `DORMICE_API_TOKEN` a wrong one failed to match (`"the gateway's"`, `"this node's"`), so an
 * operator knows which side's setting differs. `matches` is the side's constant-time check.
 * `route` (`"GET /metrics"`, `"listNodes"`) names a route that takes the fleet token only where
 * a client's API key opens the others, so the sentence cannot be read as asking for a key.
 *
 * @throws {HttpError} 401 when the bearer token is missing or does not match.
 * @example
 * ```ts
 * import { requireFleetBearer, tokenMatcher } from "./token.ts";
 * const matches = tokenMatcher("t".repeat(32));
 * requireFleetBearer(`Bearer ${"t".repeat(32)}`, matches, "this node's"); // passes
 * ```
 */
export function requireFleetBearer(
  header: string | null | undefined,
  matches: (given: string) => boolean,
  holder: string,
  route?: string,
): void {
  const given = bearerToken(header);
  const send = "the header 'Authorization: Bearer <DORMICE_API_TOKEN>'";
  if (given === undefined) {
    throw new HttpError(
      401,
      route === undefined
        ? `Missing bearer token: send ${send}`
        : `Missing bearer token: ${route} takes the fleet token (DORMICE_API_TOKEN) only, ` +
          `not an API key: send ${send}`,
      { headers: { "www-authenticate": "Bearer" } },
    );
  }
  if (!matches(given)) {
    throw new HttpError(
      401,
      route === undefined
        ? `The bearer token does not match ${holder} DORMICE_API_TOKEN: send the fleet token`
        : `The bearer token does not match ${holder} DORMICE_API_TOKEN, and ${route} takes ` +
          `the fleet token only: send ${send}`,
      { headers: { "www-authenticate": "Bearer" } },
    );
  }
}
