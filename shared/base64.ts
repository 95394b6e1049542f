/**
 * Standard base64 (A–Z, a–z, 0–9, `+`, `/`, `=` padding, no whitespace) checked and decoded in
 * linear time. A regular expression of base64 quanta backtracks by the quantum: V8 threw
 * "Maximum call stack size exceeded" on 8 MiB of it, and a request answered 500. The runtime's
 * own decoder (`Uint8Array.fromBase64`, strict) checks and decodes at memory speed; the node
 * decodes a file's content a slice at a time and lets its event loop run between slices.
 *
 * @module
 */
import { LoopBudget, type LoopBudgetOptions } from "./event_loop.ts";

/** Characters of base64 decoded at once by {@linkcode decodeBase64InSlices}: 512 KiB. */
export const BASE64_SLICE_CHARS = 512 * 1024;

interface FromBase64 {
  fromBase64(text: string, options: { lastChunkHandling: "strict" }): Uint8Array<ArrayBuffer>;
}
const decoder = Uint8Array as unknown as FromBase64;

/** `text` decoded, or `undefined` when it is not standard base64 (whitespace is not). */
function strictDecode(text: string): Uint8Array<ArrayBuffer> | undefined {
  if (text.length % 4 !== 0) return undefined;
  let bytes: Uint8Array<ArrayBuffer>;
  try {
    bytes = decoder.fromBase64(text, { lastChunkHandling: "strict" });
  } catch {
    return undefined;
  }
  // The runtime skips ASCII whitespace; whole quanta of it would leave fewer bytes than this.
  const padding = text.endsWith("==") ? 2 : text.endsWith("=") ? 1 : 0;
  return bytes.length === (text.length / 4) * 3 - padding ? bytes : undefined;
}

/**
 * Whether `text` is standard base64 with its padding, in linear time.
 *
 * @example
 * ```ts
 * import { isStandardBase64 } from "./base64.ts";
 * isStandardBase64("aGk="); // true
 * isStandardBase64("aGk"); // false
 * ```
 */
export function isStandardBase64(text: string): boolean {
  return strictDecode(text) !== undefined;
}

/**
 * Decodes standard base64 `text` a slice of {@linkcode BASE64_SLICE_CHARS} at a time, yielding
 * to the event loop between slices once a slice of time is used.
 *
 * @throws {RangeError} when `text` is not standard base64, naming the slice where it stops being.
 * @example
 * ```ts
 * import { decodeBase64InSlices } from "./base64.ts";
 * await decodeBase64InSlices("aGk="); // Uint8Array [104, 105]
 * ```
 */
export async function decodeBase64InSlices(
  text: string,
  budget: LoopBudgetOptions = {},
): Promise<Uint8Array<ArrayBuffer>> {
  if (text.length % 4 !== 0) {
    throw new RangeError(
      `Cannot decode base64 as its length (${text.length}) is not a multiple of 4: pad it with '='`,
    );
  }
  const padding = text.endsWith("==") ? 2 : text.endsWith("=") ? 1 : 0;
  const out = new Uint8Array((text.length / 4) * 3 - padding);
  const loop = new LoopBudget(budget);
  let written = 0;
  for (let at = 0; at < text.length; at += BASE64_SLICE_CHARS) {
    await loop.pass();
    const end = Math.min(text.length, at + BASE64_SLICE_CHARS);
    const slice = text.slice(at, end);
    // Padding belongs to the last slice only.
    const bytes = end < text.length && slice.endsWith("=") ? undefined : strictDecode(slice);
    if (bytes === undefined) {
      throw new RangeError(
        `Cannot decode base64 as characters ${at} to ${end - 1} are not standard base64 ` +
          "(A–Z, a–z, 0–9, '+', '/', '=' padding at the end, no whitespace)",
      );
    }
    out.set(bytes, written);
    written += bytes.length;
  }
  return out;
}
