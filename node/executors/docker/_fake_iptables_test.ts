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
 * "Bad rule", `-I`/`-D`/`-S` on the chains, and for user chains `-N`/`-X`/`-F`/`-A`/`-R` and
 * `-S <chain>`. `refuse` makes every run answer as a non-root user; `after` is called after
 * every run that changed something (a test checks an invariant at each step there).
 */
export class FakeIptables {
  /** Each chain's rules, as `-S` prints them after the chain name. */
  chains = new Map<string, string[]>([["INPUT", []], ["FORWARD", []]]);
  /** Every run's arguments. */
  runs: string[][] = [];
  refuse: string | null = null;
  /** Called after each run that changed the table. */
  after: ((args: string[]) => void) | null = null;
  /** Makes the next run whose arguments include this word fail as iptables would. */
  failOn: string | null = null;

  readonly run: IptablesRunner = (args) => {
    this.runs.push(args);
    if (this.failOn !== null && args.includes(this.failOn)) {
      this.failOn = null;
      return Promise.resolve({ code: 4, stdout: "", stderr: "iptables: Resource busy (fake)." });
    }
    const answer = this.#answer(args);
    if (answer.code === 0 && !["-S", "-C"].includes(args[2])) this.after?.(args);
    return Promise.resolve(answer);
  };

  /** The rules of `chain` holding `text`. */
  count(chain: string, text: string): number {
    return (this.chains.get(chain) ?? []).filter((r) => r.includes(text)).length;
  }

  #answer(all: string[]): IptablesResult {
    if (this.refuse !== null) return { code: 4, stdout: "", stderr: this.refuse };
    assert.deepEqual(all.slice(0, 2), ["-w", "5"], "every run waits for the xtables lock");
    if (all[2] === "-t") {
      // Another table: its chains kept as `<table>:<chain>`, shown without the prefix.
      const table = all[3];
      if (table === "filter") return this.#answer([...all.slice(0, 2), ...all.slice(4)]);
      const named = (w: string, i: number, ws: string[]) =>
        (i === 1 || ws[i - 1] === "-j") && /^[A-Z]/.test(w) && w !== "REDIRECT" &&
          w !== "RETURN"
          ? `${table}:${w}`
          : w;
      if (!this.chains.has(`${table}:PREROUTING`)) this.chains.set(`${table}:PREROUTING`, []);
      const r = this.#answer([...all.slice(0, 2), ...all.slice(4).map(named)]);
      return { ...r, stdout: r.stdout.replaceAll(`${table}:`, "") };
    }
    const [op, ...rest] = all.slice(2);
    const noChain = {
      code: 1,
      stdout: "",
      stderr: "iptables: No chain/target/match by that name.\n",
    };
    const ok = { code: 0, stdout: "", stderr: "" };
    if (op === "-S" && rest.length === 1) {
      const rules = this.chains.get(rest[0]);
      if (rules === undefined) {
        return {
          code: 1,
          stdout: "",
          stderr: `iptables v1.8.9 (nf_tables): chain \`${
            rest[0]
          }' in table \`filter' is incompatible, use 'nft' tool.\n`,
        };
      }
      const lines = [`-N ${rest[0]}`, ...rules.map((r) => `-A ${rest[0]} ${r}`)];
      return { code: 0, stdout: lines.join("\n") + "\n", stderr: "" };
    }
    if (op === "-N") {
      if (this.chains.has(rest[0])) {
        return { code: 1, stdout: "", stderr: "iptables: Chain already exists.\n" };
      }
      this.chains.set(rest[0], []);
      return ok;
    }
    if (op === "-F" || op === "-X") {
      const rules = this.chains.get(rest[0]);
      if (rules === undefined) return noChain;
      if (op === "-F") rules.length = 0;
      else {
        const used = [...this.chains.values()].some((c) =>
          c.some((r) => r.endsWith(`-j ${rest[0]}`))
        );
        if (rules.length > 0 || used) {
          return { code: 1, stdout: "", stderr: "iptables: Directory not empty.\n" };
        }
        this.chains.delete(rest[0]);
      }
      return ok;
    }
    if (op === "-A" || op === "-R") {
      const rules = this.chains.get(rest[0]);
      if (rules === undefined) return noChain;
      const words = op === "-A" ? rest.slice(1) : rest.slice(2);
      const target = words[words.indexOf("-j") + 1];
      const builtin = ["RETURN", "REJECT", "DROP", "ACCEPT", "REDIRECT"];
      if (!builtin.includes(target) && !this.chains.has(target)) {
        return noChain;
      }
      if (op === "-A") rules.push(quote(words));
      else rules[Number(rest[1]) - 1] = quote(words);
      return ok;
    }
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
    if (op === "-D" && rest.length === 2 && /^\d+$/.test(rest[1])) {
      const n = Number(rest[1]);
      if (n < 1 || n > chain.length) {
        return { code: 1, stdout: "", stderr: "iptables: Index of deletion too big.\n" };
      }
      chain.splice(n - 1, 1);
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
      return ok;
    }
    throw new Error(`The fake iptables does not know ${op}`);
  }
}

/**
 * A rule's words as `-S` prints them: a comment in quotes, with or without spaces (as
 * iptables-nft 1.8.9 prints it), any other word with spaces in quotes.
 */
function quote(words: string[]): string {
  return words.map((w, i) => (/\s/.test(w) || words[i - 1] === "--comment" ? `"${w}"` : w))
    .join(" ");
}
