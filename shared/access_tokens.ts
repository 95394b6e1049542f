/**
 * envd access tokens and the SDK's signed `/files` URLs, shared by the node (which mints them
 * and checks them) and the gateway (which checks them at its door, so an unauthenticated envd
 * request never costs a node anything).
 *
 * A sandbox's `envdAccessToken` is HMAC-SHA256 of its id under a secret derived from the fleet
 * token (base64url), so nobody stores a token and anyone holding the fleet token (every node,
 * the gateway) computes the same one for any sandbox id. The SDK signs a file URL as
 * `"v1_" + base64(sha256("<path>:<operation>:<user>:<token>[:<expiration>]"))` with the padding
 * dropped (e2b 2.51, `src/sandbox/signature.ts`); the URL carries no sandbox id, so a node finds
 * the sandbox by recomputing the signature under each of its sandboxes' tokens.
 *
 * @module
 */
import { createHash, createHmac } from "node:crypto";
import { secretIdentity } from "./config_digest.ts";
import { tokensEqual } from "./token.ts";

/**
 * Mints and checks per-sandbox envd access tokens under one node secret.
 *
 * @example
 * ```ts
 * import { AccessTokens } from "./access_tokens.ts";
 * const tokens = new AccessTokens("a node secret of at least 32 characters!!");
 * const token = tokens.forSandbox("sbx-1");
 * tokens.verify("sbx-1", token); // true
 * ```
 */
export class AccessTokens {
  #secret: string | Uint8Array;

  /**
   * Keeps the secret (at least 32 characters or bytes).
   *
   * @throws {RangeError} When the secret is shorter than 32.
   */
  constructor(secret: string | Uint8Array) {
    if (secret.length < 32) {
      throw new RangeError(
        `Cannot create AccessTokens as the secret must have at least 32 characters: received ${secret.length}`,
      );
    }
    this.#secret = secret;
  }

  /**
   * Tokens under a secret derived from the fleet token, so every node of a fleet and every
   * restart agrees on a sandbox's token without another variable; HMAC is one-way, so an
   * envd token never reveals the fleet token.
   *
   * @example
   * ```ts
   * import { AccessTokens } from "./access_tokens.ts";
   * const tokens = AccessTokens.fromFleetToken("the fleet token of at least 32 characters");
   * ```
   */
  static fromFleetToken(fleetToken: string): AccessTokens {
    return new AccessTokens(
      new Uint8Array(
        createHmac("sha256", fleetToken).update("dormice envd access tokens v1").digest(),
      ),
    );
  }

  /**
   * A fingerprint of the signing secret (never the secret): two nodes whose identities differ
   * would refuse each other's access tokens and signed URLs, so it is part of the config digest.
   */
  identity(): string {
    return secretIdentity(this.#secret);
  }

  /** The sandbox's token: HMAC-SHA256 of its id, base64url without padding. */
  forSandbox(sandboxId: string): string {
    return createHmac("sha256", this.#secret).update(sandboxId).digest("base64url");
  }

  /** True when `given` is the sandbox's token (constant time). */
  verify(sandboxId: string, given: string | null | undefined): boolean {
    if (!given) return false;
    return tokensEqual(given, this.forSandbox(sandboxId));
  }

  /**
   * The sandbox's traffic access token (its ports' `e2b-traffic-access-token`): derived like the
   * envd token under another label, so knowing one never gives the other.
   */
  forTraffic(sandboxId: string): string {
    return createHmac("sha256", this.#secret).update(`traffic\u0000${sandboxId}`).digest(
      "base64url",
    );
  }

  /** True when `given` is the sandbox's traffic access token (constant time). */
  verifyTraffic(sandboxId: string, given: string | null | undefined): boolean {
    if (!given) return false;
    return tokensEqual(given, this.forTraffic(sandboxId));
  }
}

/** What a signed `/files` URL signs. */
export interface FileSignatureInput {
  /** The `path` query value exactly as signed (`""` when absent). */
  path: string;
  /** `"read"` for GET (downloadUrl), `"write"` for POST (uploadUrl). */
  operation: "read" | "write";
  /** The `username` query value (`""` when absent). */
  user: string;
  /** The sandbox's envd access token. */
  accessToken: string;
  /** `signature_expiration` in Unix seconds, when the URL has one. */
  expiration?: number;
}

/**
 * Computes the SDK's `v1_` signature of a file URL.
 *
 * @example
 * ```ts
 * import { fileSignature } from "./access_tokens.ts";
 * fileSignature({ path: "/tmp/a", operation: "read", user: "", accessToken: "t" });
 * ```
 */
export function fileSignature(input: FileSignatureInput): string {
  const raw = input.expiration === undefined
    ? `${input.path}:${input.operation}:${input.user}:${input.accessToken}`
    : `${input.path}:${input.operation}:${input.user}:${input.accessToken}:${input.expiration}`;
  return "v1_" + createHash("sha256").update(raw).digest("base64").replace(/=+$/, "");
}

/** A signed URL's query, parsed. */
export interface SignedFileRequest {
  /** The `path` query value (`""` when absent). */
  path: string;
  /** The `username` query value (`""` when absent). */
  user: string;
  /** `"read"` for GET, `"write"` for POST. */
  operation: "read" | "write";
  /** The `signature` query value, `v1_…`. */
  signature: string;
  /** `signature_expiration`, Unix seconds. */
  expiration?: number;
}

/**
 * Parses the signature fields of a `/files` URL; returns an error sentence for a bad one.
 *
 * @example
 * ```ts
 * import { parseSignedFileUrl } from "./access_tokens.ts";
 * parseSignedFileUrl(new URL("http://n/files?path=/a&signature=v1_x"), "read");
 * ```
 */
export function parseSignedFileUrl(
  url: URL,
  operation: "read" | "write",
): { ok: true; value: SignedFileRequest } | { ok: false; error: string } {
  const signature = url.searchParams.get("signature");
  if (!signature) {
    return {
      ok: false,
      error:
        "The /files URL has no 'signature': use sandbox.downloadUrl() or uploadUrl(), or call /e2b/envd/files with the E2b-Sandbox-Id and X-Access-Token headers",
    };
  }
  if (!signature.startsWith("v1_")) {
    return { ok: false, error: "'signature' is not a v1 signature: sign the URL with the e2b SDK" };
  }
  const rawExpiration = url.searchParams.get("signature_expiration");
  let expiration: number | undefined;
  if (rawExpiration !== null) {
    if (!/^\d{1,15}$/.test(rawExpiration)) {
      return {
        ok: false,
        error: `'signature_expiration' must be Unix seconds: received '${
          rawExpiration.slice(0, 40)
        }'`,
      };
    }
    expiration = Number(rawExpiration);
  }
  return {
    ok: true,
    value: {
      path: url.searchParams.get("path") ?? "",
      user: url.searchParams.get("username") ?? "",
      operation,
      signature,
      expiration,
    },
  };
}

/**
 * True when `request` is signed with `accessToken` (constant-time compare). Expiry is checked
 * separately by the caller with {@linkcode isExpired}.
 *
 * @example
 * ```ts
 * import { fileSignature, signatureMatches } from "./access_tokens.ts";
 * const signature = fileSignature({ path: "/a", operation: "read", user: "", accessToken: "t" });
 * signatureMatches({ path: "/a", operation: "read", user: "", signature }, "t"); // true
 * ```
 */
export function signatureMatches(request: SignedFileRequest, accessToken: string): boolean {
  return tokensEqual(
    request.signature,
    fileSignature({ ...request, accessToken }),
  );
}

/**
 * True when the signed URL's expiration (Unix seconds) is before `nowMs`.
 *
 * @example
 * ```ts
 * import { isExpired } from "./access_tokens.ts";
 * isExpired({ path: "", user: "", operation: "read", signature: "v1_", expiration: 1 }, Date.now()); // true
 * ```
 */
export function isExpired(request: SignedFileRequest, nowMs: number): boolean {
  return request.expiration !== undefined && request.expiration * 1000 < nowMs;
}

/** What {@linkcode envdRequestAuthorized} reads of a request. */
export interface EnvdCredentials {
  /** The `X-Access-Token` header, when sent. */
  accessToken: string | null | undefined;
  /** The request URL: its `signature` query, when it has one, signs it instead. */
  url: URL;
  /** The HTTP method: GET is a signed read, anything else a signed write. */
  method: string;
  /** Whether a signed URL may stand in for the token (envd's REST doors, not Connect RPCs). */
  signedUrlAllowed: boolean;
}

/**
 * Whether an envd request carries sandbox `sandboxId`'s credentials: its `X-Access-Token`, or,
 * where `signedUrlAllowed`, a URL that sandbox's token signed and that has not expired.
 *
 * @example
 * ```ts
 * import { AccessTokens, envdRequestAuthorized } from "./access_tokens.ts";
 * const tokens = new AccessTokens("s".repeat(32));
 * envdRequestAuthorized(tokens, "sbx-1", {
 *   accessToken: tokens.forSandbox("sbx-1"),
 *   url: new URL("http://gw/e2b/envd/files?path=/a"),
 *   method: "GET",
 *   signedUrlAllowed: true,
 * }, Date.now()); // true
 * ```
 */
export function envdRequestAuthorized(
  tokens: AccessTokens,
  sandboxId: string,
  request: EnvdCredentials,
  nowMs: number,
): boolean {
  if (tokens.verify(sandboxId, request.accessToken)) return true;
  if (!request.signedUrlAllowed || !request.url.searchParams.has("signature")) return false;
  const signed = parseSignedFileUrl(request.url, request.method === "GET" ? "read" : "write");
  return signed.ok && !isExpired(signed.value, nowMs) &&
    signatureMatches(signed.value, tokens.forSandbox(sandboxId));
}

/**
 * The message of a signed `/files` URL its sandbox did sign but whose `signature_expiration`
 * has passed: E2B envd's own words and nothing more, since clients compare the whole answer (the
 * SDK's tests expect exactly `{"code":401,"message":"signature is already expired"}`). What to do
 * travels beside it, in the {@linkcode HINT_HEADER} header ({@linkcode refusalHeaders}).
 */
export const SIGNED_URL_EXPIRED: string = "signature is already expired";

/** The header that carries what to do when the body must keep another server's exact words. */
export const HINT_HEADER = "x-dormice-hint";

/** What to do about an expired signed URL, sent in {@linkcode HINT_HEADER}. */
export const SIGNED_URL_EXPIRED_HINT: string =
  "Ask the SDK for a fresh URL (sandbox.downloadUrl() " +
  "or uploadUrl()), with a longer useSignatureExpiration if it must stay valid longer";

/**
 * The headers that go with an {@linkcode envdRefusal} answer: the hint of an expired signed URL,
 * nothing for any other refusal (their messages say what to do themselves).
 *
 * @example
 * ```ts
 * import { refusalHeaders, SIGNED_URL_EXPIRED } from "./access_tokens.ts";
 * refusalHeaders(SIGNED_URL_EXPIRED); // { "x-dormice-hint": "Ask the SDK for a fresh URL …" }
 * ```
 */
export function refusalHeaders(message: string): Record<string, string> {
  return message === SIGNED_URL_EXPIRED ? { [HINT_HEADER]: SIGNED_URL_EXPIRED_HINT } : {};
}

/**
 * Why an envd request that {@linkcode envdRequestAuthorized} refused is refused, as one
 * sentence. Without a token, a signed URL where signatures count is judged on its own: a
 * malformed one says what is malformed, one the sandbox's token did not sign says the signature
 * does not match (a forged or altered URL never learns whether it also expired), and one it did
 * sign whose expiration has passed is {@linkcode SIGNED_URL_EXPIRED}. Anything else is
 * {@linkcode envdCredentialsRefusal}'s.
 *
 * @example
 * ```ts
 * import { AccessTokens, envdRefusal } from "./access_tokens.ts";
 * const tokens = new AccessTokens("s".repeat(32));
 * envdRefusal(tokens, "sbx-1", {
 *   accessToken: null,
 *   url: new URL("http://gw/e2b/envd/files?path=/a"),
 *   method: "GET",
 *   signedUrlAllowed: true,
 * }, Date.now()); // "Sandbox 'sbx-1' needs the X-Access-Token header: …"
 * ```
 */
export function envdRefusal(
  tokens: AccessTokens,
  sandboxId: string,
  request: EnvdCredentials,
  nowMs: number,
): string {
  if (
    !request.accessToken && request.signedUrlAllowed && request.url.searchParams.has("signature")
  ) {
    const signed = parseSignedFileUrl(request.url, request.method === "GET" ? "read" : "write");
    if (!signed.ok) return signed.error;
    if (!signatureMatches(signed.value, tokens.forSandbox(sandboxId))) {
      return signatureMismatch(sandboxId);
    }
    if (isExpired(signed.value, nowMs)) return SIGNED_URL_EXPIRED;
  }
  return envdCredentialsRefusal(sandboxId, Boolean(request.accessToken));
}

/**
 * The sentence for a signed URL whose signature its sandbox did not make: altered after signing
 * (path, username, expiration, method) or signed for another sandbox. Whether it also expired is
 * not said, so a forged URL learns nothing.
 */
function signatureMismatch(sandboxId: string): string {
  return `The /files URL's signature does not match sandbox '${sandboxId}': the URL was changed ` +
    "after signing (its path, username or signature_expiration), is used for another operation " +
    "(a download URL to upload, or the reverse) or was signed for another sandbox; ask the SDK " +
    "for a fresh URL (sandbox.downloadUrl() or uploadUrl()) and use it unchanged";
}

/**
 * The sentence for an envd request without the sandbox's credentials (the node and the gateway
 * answer it alike, a 401 in their dialect).
 *
 * @example
 * ```ts
 * import { envdCredentialsRefusal } from "./access_tokens.ts";
 * envdCredentialsRefusal("sbx-1", false); // "Sandbox 'sbx-1' needs the X-Access-Token header: …"
 * ```
 */
export function envdCredentialsRefusal(sandboxId: string, tokenSent: boolean): string {
  return tokenSent
    ? `The X-Access-Token does not belong to sandbox '${sandboxId}': use the envdAccessToken that create or connect returned`
    : `Sandbox '${sandboxId}' needs the X-Access-Token header: send the envdAccessToken that create or connect returned`;
}

/**
 * Finds which sandbox signed `request`: a remembered hint is re-verified first, then every
 * candidate is tried (one SHA-256 per candidate; each sandbox's token is derived once and
 * kept). Returns the sandbox id or undefined. The hint cache is bounded and only ever a hint.
 *
 * @example
 * ```ts
 * import { AccessTokens, SignatureLocator } from "./access_tokens.ts";
 * const locator = new SignatureLocator(new AccessTokens("x".repeat(32)));
 * // locator.find(request, ["sbx-1", "sbx-2"]);
 * ```
 */
export class SignatureLocator {
  #tokens: AccessTokens;
  #hints = new Map<string, string>();
  #maxHints: number;
  /** Tokens already derived (an HMAC costs more than the signature's hash); bounded. */
  #known = new Map<string, string>();

  #token(id: string): string {
    let token = this.#known.get(id);
    if (token === undefined) {
      token = this.#tokens.forSandbox(id);
      if (this.#known.size >= 100_000) this.#known.clear();
      this.#known.set(id, token);
    }
    return token;
  }

  /** Uses `tokens`; remembers up to `maxHints` signature → sandbox hints (default 1,000). */
  constructor(tokens: AccessTokens, { maxHints = 1_000 }: { maxHints?: number } = {}) {
    this.#tokens = tokens;
    this.#maxHints = maxHints;
  }

  /** The id of the sandbox among `candidates` whose token signed `request`, or undefined. */
  find(request: SignedFileRequest, candidates: Iterable<string>): string | undefined {
    const ids = [...candidates];
    const hint = this.#hints.get(request.signature);
    if (hint !== undefined && ids.includes(hint)) {
      if (signatureMatches(request, this.#token(hint))) return hint;
    }
    for (const id of ids) {
      if (signatureMatches(request, this.#token(id))) {
        this.#hints.delete(request.signature);
        this.#hints.set(request.signature, id);
        while (this.#hints.size > this.#maxHints) {
          this.#hints.delete(this.#hints.keys().next().value as string);
        }
        return id;
      }
    }
    return undefined;
  }
}
