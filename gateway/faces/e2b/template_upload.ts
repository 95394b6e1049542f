/**
 * The token of a template build's upload URL (`PUT /templates/{id}/files/{hash}/upload/{token}`,
 * which carries no key): the build's node, its id, its team and the one file hash it was issued
 * for, signed with HMAC-SHA256 under the fleet's derived secret (`AccessTokens`), so every
 * gateway of the fleet, and a gateway after its restart, checks it alone and knows where the
 * upload goes. It expires {@linkcode UPLOAD_TOKEN_TTL_MS} after it was issued (the SDK uploads
 * right after asking); whether it is spent sooner (the build's steps arrived) is the node's to say.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { AccessTokens } from "../../../shared/access_tokens.ts";
import { tokensEqual } from "../../../shared/token.ts";

/** What an upload token grants. */
export interface UploadGrant {
  /** The node that builds. */
  node: string;
  /** The build's id. */
  build: string;
  /** The team that requested the build. */
  team: string;
  /** The file hash the URL was issued for. */
  hash: string;
}

/** How long an upload URL stays good after it was issued: an hour. */
export const UPLOAD_TOKEN_TTL_MS = 60 * 60_000;

/** The longest token read (a longer one is refused unread). */
const MAX_TOKEN_CHARS = 2048;
/** What the signed text starts with: no sandbox id holds a NUL, so no envd token is one. */
const LABEL = "dormice template upload v1\u0000";

/**
 * The upload token of `grant` for `templateId`, issued at `now` (ms since the epoch).
 *
 * @example
 * ```ts
 * import { AccessTokens } from "../../../shared/access_tokens.ts";
 * import { signUpload, verifyUpload } from "./template_upload.ts";
 * const keys = new AccessTokens("a fleet secret of at least 32 characters!");
 * const grant = { node: "n1", build: "b1", team: "t", hash: "ab" };
 * const token = signUpload(keys, "snap-1", grant, Date.now());
 * const found = verifyUpload(keys, "snap-1", token, Date.now());
 * if (typeof found === "object") found.node; // "n1"
 * ```
 */
export function signUpload(
  keys: AccessTokens,
  templateId: string,
  grant: UploadGrant,
  now: number,
): string {
  const expires = Math.floor(now) + UPLOAD_TOKEN_TTL_MS;
  const payload = Buffer.from(
    JSON.stringify([grant.node, grant.build, grant.team, grant.hash, expires]),
  ).toString("base64url");
  return `${payload}.${keys.forSandbox(`${LABEL}${templateId}\u0000${payload}`)}`;
}

/**
 * The grant of an upload token for `templateId` at `now`: `"expired"` when it was signed so but
 * its hour is over, undefined when it is not one signed so.
 */
export function verifyUpload(
  keys: AccessTokens,
  templateId: string,
  token: string,
  now: number,
): UploadGrant | "expired" | undefined {
  if (token.length > MAX_TOKEN_CHARS) return undefined;
  const [payload, mac, extra] = token.split(".");
  if (!payload || !mac || extra !== undefined) return undefined;
  if (!tokensEqual(mac, keys.forSandbox(`${LABEL}${templateId}\u0000${payload}`))) {
    return undefined;
  }
  try {
    const [node, build, team, hash, expires] = JSON.parse(
      Buffer.from(payload, "base64url").toString("utf8"),
    );
    if ([node, build, team, hash].some((v) => typeof v !== "string")) return undefined;
    if (!Number.isSafeInteger(expires)) return undefined;
    // A token from a clock far ahead is no better than an expired one.
    if (now >= expires || expires - now > UPLOAD_TOKEN_TTL_MS * 2) return "expired";
    return { node, build, team, hash };
  } catch {
    return undefined;
  }
}
