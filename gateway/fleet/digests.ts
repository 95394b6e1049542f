/**
 * The fleet's config digests counted as check-ins change them, so a check-in costs the same at
 * 10 nodes and at 10,000: the reference digest (the one most nodes that are up report) and each
 * node's warning are judged again only when a node's digest changes or a node goes up or down,
 * never by walking the fleet at each check-in. Only when the reference itself changes (a
 * rolling change passing the half-way mark) is every counted node judged again.
 *
 * @module
 */

/** How a node's digest judgement is told: it parts from the reference, or agrees again. */
export interface DigestJudge {
  /** `digest` differs from `reference` (the fleet's). Called once per change of either. */
  differs(nodeId: string, digest: string, reference: string): void;
  /** The node agrees with the fleet again, went down, or left: its warning may fire afresh. */
  agrees(nodeId: string): void;
}

/**
 * Digest counts over the nodes that are up. The reference is the digest most of them report; a
 * tie keeps the reference it had (a fleet split evenly does not flap), and among digests none
 * of which was the reference the first one counted wins.
 *
 * @example
 * ```ts
 * import { DigestCounts } from "./digests.ts";
 * const warned: string[] = [];
 * const counts = new DigestCounts({ differs: (id) => warned.push(id), agrees: () => {} });
 * counts.set("a", "d1");
 * counts.set("b", "d1");
 * counts.set("c", "d2");
 * console.log(counts.reference, counts.mismatched("c"), warned); // "d1" true ["c"]
 * ```
 */
export class DigestCounts {
  readonly #judge: DigestJudge;
  /** digest → ids of the up nodes reporting it (a set that empties is deleted). */
  readonly #byDigest = new Map<string, Set<string>>();
  /** id → its counted digest: the nodes that are up and report one. */
  readonly #counted = new Map<string, string>();
  #reference: string | null = null;

  /** Tells `judge` of every change of a node's judgement. */
  constructor(judge: DigestJudge) {
    this.#judge = judge;
  }

  /** The digest most up nodes report, or `null` when none reports one. */
  get reference(): string | null {
    return this.#reference;
  }

  /** How many up nodes report a digest (diagnostics and tests). */
  get counted(): number {
    return this.#counted.size;
  }

  /**
   * Whether node `id` is counted with a digest other than the reference.
   *
   * @example
   * ```ts ignore
   * counts.mismatched("c"); // true while c's settings differ from the fleet's
   * ```
   */
  mismatched(id: string): boolean {
    const digest = this.#counted.get(id);
    return digest !== undefined && digest !== this.#reference;
  }

  /**
   * Node `id` is up and reports `digest` (`null`: none, so it is not counted). O(1) when the
   * digest is the one already counted, which is every check-in of a settled fleet.
   *
   * @example
   * ```ts ignore
   * counts.set(node.id, node.configDigest);
   * ```
   */
  set(id: string, digest: string | null): void {
    const old = this.#counted.get(id);
    if (old === (digest ?? undefined)) return;
    if (old !== undefined) this.#remove(id, old);
    if (digest !== null) {
      this.#counted.set(id, digest);
      let ids = this.#byDigest.get(digest);
      if (ids === undefined) this.#byDigest.set(digest, ids = new Set());
      ids.add(id);
    }
    if (!this.#rejudgeAll()) {
      if (digest === null) this.#judge.agrees(id);
      else this.#judgeOne(id, digest);
    }
  }

  /**
   * Node `id` went down or left: it no longer counts, and its warning is cleared.
   *
   * @example
   * ```ts ignore
   * counts.drop(node.id);
   * ```
   */
  drop(id: string): void {
    const old = this.#counted.get(id);
    if (old === undefined) return;
    this.#remove(id, old);
    this.#judge.agrees(id);
    this.#rejudgeAll();
  }

  #remove(id: string, digest: string): void {
    this.#counted.delete(id);
    const ids = this.#byDigest.get(digest)!;
    ids.delete(id);
    if (ids.size === 0) this.#byDigest.delete(digest);
  }

  /** Picks the reference again; when it changed, judges every counted node and says so. */
  #rejudgeAll(): boolean {
    let best = this.#reference === null ? 0 : this.#byDigest.get(this.#reference)?.size ?? 0;
    let reference = best === 0 ? null : this.#reference;
    // Distinct digests are few (one, and a second during a rolling change): this loop is short.
    for (const [digest, ids] of this.#byDigest) {
      if (ids.size > best) reference = digest, best = ids.size;
    }
    if (reference === this.#reference) return false;
    this.#reference = reference;
    for (const [id, digest] of this.#counted) this.#judgeOne(id, digest);
    return true;
  }

  #judgeOne(id: string, digest: string): void {
    if (digest === this.#reference || this.#reference === null) this.#judge.agrees(id);
    else this.#judge.differs(id, digest, this.#reference);
  }
}
