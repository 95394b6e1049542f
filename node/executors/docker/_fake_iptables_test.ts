/**
 * A fake iptables for the firewall and network tests: the filter table in memory, answering as
 * iptables 1.8 does.
 *
 * @module
 */
import assert from "node:assert/strict";
import type { IptablesResult, IptablesRunner } from "./_firewall.ts";

/**
 * iptables over an in-memory filter table, answering as iptables 1.8 does: `-C` 0 or 1 with
 * "Bad rule", `-I`/`-D`/`-S` on the chains. `refuse` makes every run answer as a non-root user.
 */
export class FakeIptables {
  /** Each chain's rules, as `-S` prints them after the chain name. */
  chains = new Map<string, string[]>([["INPUT", []], ["FORWARD", []]]);
  /** Every run's arguments. */
  runs: string[][] = [];
  refuse: string | null = null;

  readonly run: IptablesRunner = (args) => {
    this.runs.push(args);
    return Promise.resolve(this.#answer(args));
  };

  /** The rules of `chain` holding `text`. */
  count(chain: string, text: string): number {
    return (this.chains.get(chain) ?? []).filter((r) => r.includes(text)).length;
  }

  #answer(all: string[]): IptablesResult {
    if (this.refuse !== null) return { code: 4, stdout: "", stderr: this.refuse };
    assert.deepEqual(all.slice(0, 2), ["-w", "5"], "every run waits for the xtables lock");
    const [op, ...rest] = all.slice(2);
    if (op === "-S") {
      const lines = [...this.chains].flatMap(([c, rules]) => rules.map((r) => `-A ${c} ${r}`));
      return { code: 0, stdout: lines.join("\n") + "\n", stderr: "" };
    }
    const chain = this.chains.get(rest[0]) ?? [];
    this.chains.set(rest[0], chain);
    if (op === "-I") {
      chain.splice(Number(rest[1]) - 1, 0, quote(rest.slice(2)));
      return { code: 0, stdout: "", stderr: "" };
    }
    const rule = quote(rest.slice(1));
    const at = chain.indexOf(rule);
    if (op === "-C" || op === "-D") {
      if (at < 0) {
        return {
          code: 1,
          stdout: "",
          stderr: "iptables: Bad rule (does a matching rule exist in that chain?).\n",
        };
      }
      if (op === "-D") chain.splice(at, 1);
      return { code: 0, stdout: "", stderr: "" };
    }
    throw new Error(`The fake iptables does not know ${op}`);
  }
}

/** A rule's words as `-S` prints them (a comment with spaces in quotes). */
function quote(words: string[]): string {
  return words.map((w) => (/\s/.test(w) ? `"${w}"` : w)).join(" ");
}
