/**
 * The fleet-invariant config digest: each node hashes the settings that must be the same on
 * every node, and the gateway compares the digests and warns about a node set apart.
 *
 * @module
 */
import { createHash, createHmac } from "node:crypto";

/** The settings every node of a fleet must share. */
export interface FleetInvariants {
  /** Template name to image (`DORMICE_TEMPLATES`): a template must mean one image fleet-wide. */
  templates: ReadonlyMap<string, string> | Readonly<Record<string, string>>;
  /** The sandbox domain (`DORMICE_SANDBOX_DOMAIN`), or `null` when unset. */
  sandboxDomain: string | null;
  /**
   * Who signs sandbox access tokens and signed URLs: a fingerprint of the signing secret, never
   * the secret (see {@linkcode secretIdentity}).
   */
  signingSecretId: string;
  /**
   * How long a snapshot lives, ms (`DORMICE_SNAPSHOT_TTL_HOURS`): a healed copy on a node with
   * another TTL would outlive or predecease the rest. 0 or absent: none (left out of the digest,
   * so a fleet without one keeps its digest).
   */
  snapshotTtlMs?: number;
  /** The snapshots' registry (`DORMICE_SNAPSHOT_REGISTRY`); `null` or absent: none (left out). */
  snapshotRegistry?: string | null;
  /**
   * The fleet egress CA's fingerprint: sandboxes trust the CA they were made with, so a sandbox
   * moved or resumed on a node with another CA would refuse its header transforms. `null` or
   * absent without one (digests then stay as they were before the CA existed).
   */
  egressCa?: string | null;
  /**
   * Whether an E2B create that does not say `allowInternetAccess` gets egress
   * (`DORMICE_EGRESS_E2B_DEFAULT=on`): the same create must not get egress on one node and none
   * on the next. False or absent: off (left out, so a fleet that never sets it keeps its digest).
   */
  e2bDefaultEgress?: boolean;
}

/**
 * A fingerprint of a secret: the first 16 hex digits of its SHA-256, enough to tell two secrets
 * apart and useless for finding either.
 *
 * @example
 * ```ts
 * import { secretIdentity } from "./config_digest.ts";
 * secretIdentity(new TextEncoder().encode("s")).length; // 16
 * ```
 */
export function secretIdentity(secret: Uint8Array | string): string {
  return createHash("sha256").update(secret).digest("hex").slice(0, 16);
}

/**
 * The digest: HMAC-SHA256, keyed by the fleet token, of the invariants in a canonical form
 * (templates sorted by name), as hex. Keyed so that a digest on the wire gives nothing to
 * brute-force a short sandbox domain or a template map from.
 *
 * @example
 * ```ts
 * import { configDigest } from "./config_digest.ts";
 * const token = "t".repeat(32);
 * const a = configDigest({ templates: { base: "dormice-base:latest" }, sandboxDomain: null,
 *   signingSecretId: "x" }, token);
 * const b = configDigest({ templates: { base: "dormice-base:v2" }, sandboxDomain: null,
 *   signingSecretId: "x" }, token);
 * console.log(a === b); // false: the template means another image
 * ```
 */
export function configDigest(invariants: FleetInvariants, fleetToken: string): string {
  const entries = invariants.templates instanceof Map
    ? [...invariants.templates]
    : Object.entries(invariants.templates);
  const canonical = JSON.stringify({
    v: 1,
    templates: entries.sort(([a], [b]) => a < b ? -1 : a > b ? 1 : 0),
    sandboxDomain: invariants.sandboxDomain,
    signingSecretId: invariants.signingSecretId,
    ...(invariants.snapshotTtlMs ? { snapshotTtlMs: invariants.snapshotTtlMs } : {}),
    ...(invariants.snapshotRegistry ? { snapshotRegistry: invariants.snapshotRegistry } : {}),
    ...(invariants.egressCa ? { egressCa: invariants.egressCa } : {}),
    ...(invariants.e2bDefaultEgress ? { e2bDefaultEgress: true } : {}),
  });
  return createHmac("sha256", fleetToken).update(canonical).digest("hex");
}

/** The outcome of {@linkcode compareDigests}. */
export interface DigestComparison {
  /** The digest most nodes report (ties: the one the earliest-listed node reports); `null` when none reports one. */
  reference: string | null;
  /** Nodes whose digest differs from the reference (a node reporting none is not counted). */
  mismatched: Set<string>;
}

/**
 * Compares the digests nodes report: the majority is the reference and every node with another
 * digest is a mismatch. A majority, not the gateway's own view, because the gateway does not
 * hold the nodes' settings; in a rolling change the minority is the one called out, which is
 * the transient an operator expects to see.
 *
 * @example
 * ```ts
 * import { compareDigests } from "./config_digest.ts";
 * const r = compareDigests([["a", "d1"], ["b", "d1"], ["c", "d2"], ["d", undefined]]);
 * console.log(r.reference, [...r.mismatched]); // "d1" ["c"]
 * ```
 */
export function compareDigests(
  nodes: Iterable<readonly [nodeId: string, digest: string | undefined]>,
): DigestComparison {
  const counts = new Map<string, number>();
  const listed: [string, string][] = [];
  for (const [id, digest] of nodes) {
    if (digest === undefined) continue;
    listed.push([id, digest]);
    counts.set(digest, (counts.get(digest) ?? 0) + 1);
  }
  let reference: string | null = null;
  let best = 0;
  // Map keeps insertion order, so the first digest reaching the top count wins a tie.
  for (const [digest, n] of counts) if (n > best) reference = digest, best = n;
  const mismatched = new Set<string>();
  for (const [id, digest] of listed) if (digest !== reference) mismatched.add(id);
  return { reference, mismatched };
}
