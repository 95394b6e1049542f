/**
 * The name an unnamed E2B create is given, made in one place for the node and the gateway.
 *
 * @module
 */

/**
 * A fresh sandbox name for an E2B create that sent none: `e2b-` and 20 random hex digits (80 bits,
 * so two gateways never make the same one).
 *
 * @example
 * ```ts
 * import { randomSandboxName } from "./random_name.ts";
 * randomSandboxName(); // e.g. "e2b-3f9a0c1d2e4b5a697887"
 * ```
 */
export function randomSandboxName(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(10));
  return "e2b-" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}
