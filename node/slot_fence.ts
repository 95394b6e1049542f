/**
 * The node's side of the slot token (`x-dormice-slot-token`, `shared/slot_token.ts`): the
 * largest token seen per name, from lookups and creates, and the refusal of a build whose token
 * is older.
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";

/** Options of {@linkcode SlotFence}. */
export interface SlotFenceOptions {
  /**
   * Most names remembered (default 100,000, a few MB); past it the name heard of least recently
   * goes first. A name forgotten is unfenced until its next token: the fence narrows the window
   * of a gateway that lost its slot, the slot is still the rule.
   */
  maxNames?: number;
}

/**
 * Remembers, per team-scoped name, the largest slot token this node has seen, and refuses a
 * build carrying an older one with a 409. Memory only: a node that restarts starts over.
 *
 * @example
 * ```ts
 * import { SlotFence } from "./slot_fence.ts";
 * const fence = new SlotFence();
 * fence.saw("agent-1", 15);
 * fence.admit("agent-1", 15); // fine: the same take
 * // fence.admit("agent-1", 10) throws a 409
 * ```
 */
export class SlotFence {
  readonly #seen = new Map<string, number>();
  readonly #max: number;

  /** Builds an empty fence. */
  constructor(options: SlotFenceOptions = {}) {
    this.#max = options.maxNames ?? 100_000;
  }

  /** How many names are remembered. */
  get size(): number {
    return this.#seen.size;
  }

  /** Remembers `token` for `key` when it is the largest seen; no token, nothing. */
  saw(key: string, token: number | undefined): void {
    if (token === undefined) return;
    const known = this.#seen.get(key);
    this.#seen.delete(key);
    this.#seen.set(key, known === undefined ? token : Math.max(known, token));
    if (this.#seen.size > this.#max) this.#seen.delete(this.#seen.keys().next().value!);
  }

  /**
   * Lets a build of `key` go on, remembering its token, or refuses it.
   *
   * @throws {HttpError} 409 when a larger token was seen for `key`: another gateway took the
   *   name's slot after this create's gateway did.
   */
  admit(key: string, token: number | undefined): void {
    const known = this.#seen.get(key);
    if (token !== undefined && known !== undefined && token < known) {
      throw new HttpError(
        409,
        `Not built: this create holds slot token ${token} for '${key}', but another gateway ` +
          `took the name's slot since (token ${known}); the gateway that sent it lost the slot ` +
          "(paused or cut off from etcd past its lease). Retry: the retry finds whatever the " +
          "other gateway built",
      );
    }
    this.saw(key, token);
  }
}
