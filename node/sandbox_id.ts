/**
 * Sandbox ids: what the node mints for a new sandbox.
 *
 * @module
 */

/** The letters of a sandbox id: what one DNS label may carry and every TLS client matches. */
const ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";
/** Characters of a sandbox id: 20, as E2B's, about 103 random bits. */
const ID_LENGTH = 20;

/**
 * Mints a sandbox id: 20 random lowercase letters and digits, as E2B's ids are. The id is the
 * left-most DNS label's tail in `<port>-<id>.<domain>`, so it holds nothing a certificate's
 * wildcard may fail to cover: OpenSSL (Python's `ssl`, curl, Go, Java) refuses to match
 * `*.<domain>` against a label with `_`, which the ids minted before (`sbx_…`) carry. Those
 * stay valid ids everywhere (see `sandboxIdSchema`).
 *
 * @example
 * ```ts
 * import { newSandboxId } from "./sandbox_id.ts";
 * newSandboxId(); // "k3v9q0z8m2c4x7w1b5n6"
 * ```
 */
export function newSandboxId(): string {
  let out = "";
  while (out.length < ID_LENGTH) {
    for (const b of crypto.getRandomValues(new Uint8Array(ID_LENGTH))) {
      // 252 is the largest multiple of 36 under 256: bytes past it would favour some letters.
      if (b < 252 && out.length < ID_LENGTH) out += ID_ALPHABET[b % 36];
    }
  }
  return out;
}
