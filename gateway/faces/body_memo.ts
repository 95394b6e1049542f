/**
 * What a verb's schema made of a small body seen lately, found again by the body's exact bytes.
 * A client that polls a sandbox sends the same body again and again; finding it by its bytes
 * costs the lane less than `JSON.parse` and the schema, which on the wire
 * (`bench/probes/perf_split.ts`) was the largest of the lane's calls out of JavaScript into the
 * runtime.
 *
 * @module
 */
import { octets } from "../../shared/http1/mod.ts";

/** Options of {@linkcode BodyMemo}. */
export interface BodyMemoOptions {
  /** Slots kept (a power of two): 1024 by default. A body takes the slot its bytes hash to. */
  slots?: number;
  /** The longest body remembered: 256 bytes by default. */
  maxBytes?: number;
  /** Where `bytes` go: a seeded 32-bit FNV-1a by default (a test gives one that collides). */
  slotOf?: (bytes: Uint8Array) => number;
}

interface Entry<V> {
  verb: unknown;
  /** The body's bytes, one char each (only ASCII bodies are kept). */
  text: string;
  value: V;
}

/**
 * Bodies by their bytes, each with what a verb's schema made of it (frozen, as every later
 * request with the same bytes gets the same object). A slot holds one body: a body that hashes
 * to a taken slot replaces it, so the memo never holds more than `slots` bodies. A hit is the
 * same verb and every byte equal; the slot is only where to look.
 *
 * @example
 * ```ts
 * import { BodyMemo } from "./body_memo.ts";
 * const memo = new BodyMemo<{ name: string }>();
 * const body = new TextEncoder().encode('{"name":"a"}');
 * memo.get("getSandboxMetrics", body); // undefined
 * memo.remember("getSandboxMetrics", body, { name: "a" });
 * memo.get("getSandboxMetrics", body); // { name: "a" }
 * ```
 */
export class BodyMemo<V extends object> {
  readonly #slots: (Entry<V> | undefined)[];
  readonly #mask: number;
  readonly #maxBytes: number;
  readonly #slotOf: (bytes: Uint8Array) => number;

  constructor(options: BodyMemoOptions = {}) {
    const slots = options.slots ?? 1024;
    if (!Number.isInteger(slots) || slots < 1 || (slots & (slots - 1)) !== 0) {
      throw new RangeError(
        `Cannot make the body memo: 'slots' must be a power of two, received ${slots}`,
      );
    }
    this.#slots = new Array(slots);
    this.#mask = slots - 1;
    this.#maxBytes = options.maxBytes ?? 256;
    const seed = crypto.getRandomValues(new Uint32Array(1))[0];
    this.#slotOf = options.slotOf ?? ((bytes) => fnv1a(bytes, seed));
  }

  /** What `verb`'s schema made of exactly these bytes lately, or undefined. */
  get(verb: unknown, bytes: Uint8Array): V | undefined {
    const n = bytes.length;
    if (n === 0 || n > this.#maxBytes) return undefined;
    const seen = this.#slots[this.#slotOf(bytes) & this.#mask];
    if (seen === undefined || seen.verb !== verb || seen.text.length !== n) return undefined;
    const text = seen.text;
    for (let i = 0; i < n; i++) if (text.charCodeAt(i) !== bytes[i]) return undefined;
    return seen.value;
  }

  /**
   * Remembers `value` as what `verb`'s schema made of `bytes` (an ASCII body of at most
   * `maxBytes`; any other is not kept). `value` is frozen, with everything in it.
   */
  remember(verb: unknown, bytes: Uint8Array, value: V): void {
    const n = bytes.length;
    if (n === 0 || n > this.#maxBytes) return;
    for (let i = 0; i < n; i++) if (bytes[i] > 127) return;
    const text = octets(bytes, 0, n);
    this.#slots[this.#slotOf(bytes) & this.#mask] = { verb, text, value: deepFreeze(value) };
  }
}

/** A 32-bit FNV-1a of `bytes` under `seed`. */
function fnv1a(bytes: Uint8Array, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < bytes.length; i++) h = Math.imul(h ^ bytes[i], 0x01000193);
  return h >>> 0;
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const inner of Object.values(value)) deepFreeze(inner);
  }
  return value;
}
