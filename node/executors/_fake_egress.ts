/**
 * The fake executor's egress rules: what each sandbox was given, kept as the Docker executor's
 * kernel rules would be enforced, with the history of every set for tests to read.
 *
 * @module
 */
import type { EgressRules } from "../../shared/egress_rules.ts";

/** Each sandbox's egress rules now, and the sets it was given before, oldest first. */
export class FakeEgress {
  #egressRules = new Map<string, EgressRules>();
  #egressHistory = new Map<string, EgressRules[]>();

  /** A copy of the rules a sandbox has now; `undefined` when it has none. */
  of(id: string): EgressRules | undefined {
    const rules = this.#egressRules.get(id);
    return rules && structuredClone(rules);
  }

  /** A copy of every rule set a sandbox was given, oldest first. */
  history(id: string): EgressRules[] {
    return structuredClone(this.#egressHistory.get(id) ?? []);
  }

  /** Gives a sandbox `rules`, replacing the ones before whole. */
  record(id: string, rules: EgressRules): void {
    this.#egressRules.set(id, structuredClone(rules));
    const history = this.#egressHistory.get(id) ?? [];
    // Bounded: a test reads the last few; the oldest go first.
    if (history.length >= 64) history.shift();
    history.push(structuredClone(rules));
    this.#egressHistory.set(id, history);
  }

  /** Forgets a sandbox's rules and their history. */
  forget(id: string): void {
    this.#egressRules.delete(id);
    this.#egressHistory.delete(id);
  }
}
