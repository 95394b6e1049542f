/**
 * Constant-time comparison of secrets.
 *
 * @module
 */

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
 * import { tokenMatcher } from "@dormice/cluster/shared";
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
  const m = /^Bearer\s+(.+)$/i.exec(header.trim());
  return m ? m[1].trim() : undefined;
}
