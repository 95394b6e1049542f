/**
 * The lookup digest: a Bloom filter of the names and ids a node holds, sent in its check-in so
 * a gateway's lookup miss asks only the nodes that may hold the key (see docs/lookup-digest.md
 * for when a gateway may trust it). A Bloom filter has false positives (a node asked for
 * nothing) but no false negatives, which is the direction the Finder's truths need.
 *
 * @module
 */
import { teamScopedName } from "./teams.ts";

/** The wire form, the optional `lookupDigest` field of a check-in. */
export interface LookupDigestWire {
  /** The filter's bits, base64 (length a multiple of 8 bits). */
  bits: string;
  /** Hash functions per key. */
  hashes: number;
  /** Keys added (two per sandbox: its name and its id), for sizing and diagnostics. */
  count: number;
  /**
   * `true` when the node makes every create that did not come through a gateway (no
   * `x-dormice-hop` header) known with a check-in before it builds and again before it answers
   * (docs/lookup-digest.md, "Creates behind the gateway's back"). A gateway in lookup digest
   * mode `on` trusts only digests that say so.
   */
  directPushed?: boolean;
}

/**
 * The false positive rate nodes size their digests for: 0.1%, 14.4 bits (1.8 bytes) and 10
 * hashes per key. A miss asks about `nodes × rate` nodes by false positive, so 1% would ask
 * 100 of 10,000 nodes per miss; 0.1% asks about 10 for 1.5 times the bytes.
 */
export const NODE_DIGEST_FALSE_POSITIVE_RATE = 0.001;

/** Largest filter a check-in may carry: 2^23 bits (1 MiB), about 870,000 keys at 1%. */
export const MAX_DIGEST_BITS = 1 << 23;

/**
 * The key a sandbox name is filed under: `n:` and its team-scoped name.
 *
 * @example
 * ```ts
 * import { nameDigestKey } from "@dormice/cluster/shared";
 * nameDigestKey("red", "agent-1"); // "n:red/agent-1"
 * ```
 */
export function nameDigestKey(team: string | undefined, name: string): string {
  return `n:${teamScopedName(team, name)}`;
}

/**
 * The key a sandbox id is filed under: `i:` and the id.
 *
 * @example
 * ```ts
 * import { idDigestKey } from "@dormice/cluster/shared";
 * idDigestKey("sbx_1"); // "i:sbx_1"
 * ```
 */
export function idDigestKey(id: string): string {
  return `i:${id}`;
}

/**
 * A Bloom filter sized for `expected` keys at `falsePositiveRate` (1% by default: 9.6 bits,
 * about 1.2 bytes, and 7 hashes per key). Two 32-bit FNV-1a hashes with different seeds make
 * the k probes by double hashing (Kirsch–Mitzenmacher), so a probe costs no allocation.
 *
 * @example
 * ```ts
 * import { LookupDigest, nameDigestKey } from "@dormice/cluster/shared";
 * const digest = LookupDigest.sized(2);
 * digest.add(nameDigestKey("default", "agent-1"));
 * const wire = digest.toWire();
 * LookupDigest.fromWire(wire).mayHold(nameDigestKey("default", "agent-1")); // true
 * ```
 */
export class LookupDigest {
  readonly #bits: Uint8Array;
  readonly #m: number;
  readonly #k: number;
  #count: number;
  /** The wire's `directPushed`: creates behind the gateway's back are pushed at once. */
  readonly directPushed: boolean;

  private constructor(bits: Uint8Array, hashes: number, count: number, directPushed = false) {
    this.directPushed = directPushed;
    this.#bits = bits;
    this.#m = bits.length * 8;
    this.#k = hashes;
    this.#count = count;
  }

  /**
   * An empty filter for `expected` keys (at least 64 bits, at most {@linkcode MAX_DIGEST_BITS}:
   * past that the false positive rate grows instead of the size).
   *
   * @example
   * ```ts
   * import { LookupDigest } from "@dormice/cluster/shared";
   * LookupDigest.sized(10_000).toWire().bits.length; // 16,000 base64 characters, 12 KB
   * ```
   */
  static sized(expected: number, falsePositiveRate = 0.01): LookupDigest {
    const n = Math.max(1, expected);
    const ideal = Math.ceil(-n * Math.log(falsePositiveRate) / (Math.LN2 * Math.LN2));
    const m = Math.min(MAX_DIGEST_BITS, Math.max(64, Math.ceil(ideal / 8) * 8));
    const k = Math.min(16, Math.max(1, Math.round((m / n) * Math.LN2)));
    return new LookupDigest(new Uint8Array(m / 8), k, 0);
  }

  /**
   * Reads a check-in's digest. The schema has checked the shape; this checks the base64.
   *
   * @throws {RangeError} when `bits` is not base64 of 8 to 2^20 bytes.
   * @example
   * ```ts
   * import { LookupDigest } from "@dormice/cluster/shared";
   * LookupDigest.fromWire(LookupDigest.sized(1).toWire()).count; // 0
   * ```
   */
  static fromWire(wire: LookupDigestWire): LookupDigest {
    let bytes: Uint8Array;
    try {
      bytes = fromBase64(wire.bits);
    } catch {
      throw new RangeError("the digest's bits are not base64");
    }
    if (bytes.length < 8 || bytes.length * 8 > MAX_DIGEST_BITS) {
      throw new RangeError(
        `the digest holds ${bytes.length} bytes: it must hold 8 to ${MAX_DIGEST_BITS / 8}`,
      );
    }
    return new LookupDigest(bytes, wire.hashes, wire.count, wire.directPushed === true);
  }

  /** Keys added. */
  get count(): number {
    return this.#count;
  }

  /** Files `key` (a {@linkcode nameDigestKey} or {@linkcode idDigestKey}). */
  add(key: string): void {
    const h1 = fnv1a(key, 0x811c9dc5);
    const h2 = fnv1a(key, 0x01000193) | 1;
    for (let i = 0; i < this.#k; i++) {
      const bit = ((h1 + Math.imul(i, h2)) >>> 0) % this.#m;
      this.#bits[bit >>> 3] |= 1 << (bit & 7);
    }
    this.#count++;
  }

  /** `false` only when `key` was never added; `true` when it was, or by a false positive. */
  mayHold(key: string): boolean {
    return this.mayHoldProbe(digestProbe(key));
  }

  /**
   * {@linkcode LookupDigest.mayHold} for a key hashed once with {@linkcode digestProbe}: a round
   * over 10,000 nodes' digests hashes the key once, not 10,000 times.
   */
  mayHoldProbe(probe: DigestProbe): boolean {
    const { h1, h2 } = probe;
    for (let i = 0; i < this.#k; i++) {
      const bit = ((h1 + Math.imul(i, h2)) >>> 0) % this.#m;
      if ((this.#bits[bit >>> 3] & (1 << (bit & 7))) === 0) return false;
    }
    return true;
  }

  /** The check-in's `digest` field. */
  toWire(): LookupDigestWire {
    let binary = "";
    // In chunks: String.fromCharCode with a whole megabyte of arguments overflows the stack.
    for (let i = 0; i < this.#bits.length; i += 8192) {
      binary += String.fromCharCode(...this.#bits.subarray(i, i + 8192));
    }
    return { bits: btoa(binary), hashes: this.#k, count: this.#count };
  }
}

/**
 * Base64 to bytes: the runtime's `Uint8Array.fromBase64` where it has one. The gateway decodes
 * every check-in's digest, and `atob` with a per-character copy took 0.42 ms for a node holding
 * 400 sandboxes and 4.2 ms for 5,000 (2026-12-07), more than the rest of the check-in.
 */
function fromBase64(text: string): Uint8Array {
  const native = (Uint8Array as { fromBase64?: (text: string) => Uint8Array }).fromBase64;
  if (native !== undefined) return native.call(Uint8Array, text);
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** A key's two hashes, from {@linkcode digestProbe}. */
export interface DigestProbe {
  /** The first probe position's hash. */
  readonly h1: number;
  /** The stride between probes (odd). */
  readonly h2: number;
}

/**
 * Hashes a key once for many {@linkcode LookupDigest.mayHoldProbe} calls.
 *
 * @example
 * ```ts
 * import { digestProbe, idDigestKey, LookupDigest } from "./lookup_digest.ts";
 * LookupDigest.sized(1).mayHoldProbe(digestProbe(idDigestKey("sbx_1"))); // false
 * ```
 */
export function digestProbe(key: string): DigestProbe {
  return { h1: fnv1a(key, 0x811c9dc5), h2: fnv1a(key, 0x01000193) | 1 };
}

function fnv1a(text: string, seed: number): number {
  let h = seed;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  // A final mix, so keys that differ only in their last characters spread over every bit.
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  return h >>> 0;
}
