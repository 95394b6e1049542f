/**
 * Each sandbox's egress address rules (`spec.egressRules`, E2B's `network.allowOut` /
 * `denyOut`) as iptables rules in the kernel, where the sandbox's packets leave its bridge for
 * the world: Docker's `DOCKER-USER` chain, which the engine jumps to first in FORWARD and never
 * flushes. One jump per sandbox, matched by the egress bridge and the container's address
 * (sandboxes hold no NET_ADMIN or NET_RAW, so they cannot take another address), leads to the
 * sandbox's dispatch chain, whose single rule leads to the chain holding its rules:
 *
 * ```
 * DOCKER-USER: -i <bridge> -s <ip>/32 -m comment --comment dormice:<instance>:<id> -j DMN-<h>
 * DMN-<h>:     -j DMN-<h>-a                     (or -b: the one holding the current rules)
 * DMN-<h>-a:   -d <allowed> -j RETURN ...       (allow: on to Docker's own rules)
 *              -d <denied> -j REJECT ...        (deny: refused at once, every protocol)
 * ```
 *
 * An allow wins over any deny (it is matched first), and what neither names passes, as in E2B.
 * New rules are built in the other chain of the pair, then swapped in by replacing the dispatch
 * chain's one rule (`-R`: one atomic table update), then the old chain is removed: there is never
 * a moment with no rules or with both sets. Every chain only RETURNs or REJECTs, so rules left
 * behind by a failure can only refuse, never let through.
 *
 * A sandbox with domain rules or header transforms also has its TCP connections to ports 80
 * and 443 steered to the node's egress proxy (`_egress_proxy.ts`), in the `nat` table, except
 * those to addresses its `allowOut` allows (reached direct, as without domain rules):
 *
 * ```
 * nat PREROUTING: -i <bridge> -s <ip>/32 -m comment --comment dormice:<instance>:<id> -j DMN-<h>-n
 * DMN-<h>-n:      -d <allowed> -j RETURN ...
 *                 -p tcp -m multiport --dports 80,443 -j REDIRECT --to-ports <proxy>
 *                 -p tcp --dport <P> -j REDIRECT --to-ports <proxy for P> ...
 * filter INPUT:   -i <bridge> -p tcp --dport <proxy> -m conntrack --ctstate DNAT -j ACCEPT
 *                 (and one per proxy listener for a port P)
 * ```
 *
 * A port P other than 80 and 443 is steered when a transform key names it
 * (`api.example.com:8443`), to a listener of the proxy's own for P (a REDIRECT loses the port
 * the sandbox connected to); once no sandbox's rules name P, the listener closes and its INPUT
 * rule goes (`unlisten`).
 *
 * The INPUT rule lets only redirected connections through the host firewall to the proxy; a
 * sandbox connecting to the proxy's port itself is still dropped. Steered connections never
 * pass FORWARD, so the proxy judges them by the same address rules as well as the domains. Chain names carry a hash of the
 * executor's instance id and the sandbox id, so two nodes on one engine never touch each other's.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { ExecutorError } from "../contract.ts";
import type { EgressRules } from "../../../shared/egress_rules.ts";
import {
  callIptables,
  IPTABLES,
  type IptablesResult,
  type IptablesRunner,
  runIptables,
} from "./_firewall.ts";

/** The chain Docker jumps to first in FORWARD and leaves to its users. */
export const DOCKER_USER = "DOCKER-USER";

/** The chains of one sandbox. */
export interface EgressChains {
  /** The chain the jump leads to; its one rule leads to the current rules. */
  dispatch: string;
  /** The two chains the rules alternate between. */
  pair: [string, string];
  /** The jump's comment: `dormice:<instance>:<id>`, spaces-free so `-S` prints it bare. */
  comment: string;
}

/** Options of {@linkcode EgressFirewall}. */
export interface EgressFirewallOptions {
  /** What the chains are scoped by (the executor's `dormice.instance`). */
  instanceId: string;
  /** Runs iptables; the real binary by default. */
  run?: IptablesRunner;
  /** Bound of one iptables run, ms (it waits up to 5 s for the xtables lock). */
  timeoutMs?: number;
}

/** The per-sandbox egress rules, written, swapped and removed with iptables. */
export class EgressFirewall {
  #instanceId: string;
  #run: IptablesRunner;
  #timeoutMs: number;

  constructor({ instanceId, run = runIptables, timeoutMs = 10_000 }: EgressFirewallOptions) {
    this.#instanceId = instanceId;
    this.#run = run;
    this.#timeoutMs = timeoutMs;
  }

  /** The chain names of sandbox `id`: `DMN-` + 16 hex digits (+ `-a`/`-b`), under 29 chars. */
  chains(id: string): EgressChains {
    const h = createHash("sha256").update(`${this.#instanceId}/${id}`).digest("hex").slice(0, 16);
    const dispatch = `DMN-${h}`;
    return {
      dispatch,
      pair: [`${dispatch}-a`, `${dispatch}-b`],
      comment: `dormice:${this.#instanceId}:${id}`,
    };
  }

  /**
   * Makes `rules` the sandbox's: built in a fresh chain, swapped in atomically, the old chain
   * removed; the jump for `bridge` and `ip` put in place if it is missing (a first apply, or a
   * firewall reload that flushed it).
   *
   * @throws {ExecutorError} `unavailable` when iptables cannot do it; the rules in force before
   * (if any) are then still in force.
   */
  async apply(id: string, ip: string, bridge: string, rules: EgressRules): Promise<void> {
    const { dispatch, pair, comment } = this.chains(id);
    const current = await this.#target(dispatch, pair);
    const next = current === pair[0] ? pair[1] : pair[0];
    await this.#fresh(next);
    for (const cidr of rules.allowOut) {
      await this.#must(["-A", next, "-d", cidr, "-j", "RETURN"]);
    }
    for (const cidr of rules.denyOut) {
      // REJECT rather than DROP: a refused connection fails at once instead of hanging until
      // the program's own timeout, and says why (administratively prohibited).
      await this.#must([
        "-A",
        next,
        "-d",
        cidr,
        "-j",
        "REJECT",
        "--reject-with",
        "icmp-admin-prohibited",
      ]);
    }
    if (current === null) {
      await this.#fresh(dispatch);
      await this.#must(["-A", dispatch, "-j", next]);
    } else {
      await this.#must(["-R", dispatch, "1", "-j", next]);
    }
    const jump = ["-i", bridge, "-s", `${ip}/32`, "-m", "comment", "--comment", comment];
    if (!(await this.#has(DOCKER_USER, [...jump, "-j", dispatch]))) {
      // First, ahead of the engine's RETURN and of an operator's own ACCEPT rules.
      await this.#must(["-I", DOCKER_USER, "1", ...jump, "-j", dispatch]);
    }
    if (current !== null) await this.#drop(current);
  }

  /**
   * Steers the sandbox's connections to ports 80 and 443 to the proxy at `port` on the bridge
   * (addresses in `allowOut` excepted), or stops steering them when `port` is `null`. The new
   * rules are put in above the old ones, which are then removed: every connection meanwhile is
   * steered by the old rules or the new.
   *
   * @throws {ExecutorError} `unavailable` when iptables cannot do it.
   */
  async steer(
    id: string,
    ip: string,
    bridge: string,
    port: number | null,
    allowOut: readonly string[],
    /** Ports other than 80 and 443 to steer, each to its own listener of the proxy. */
    extra: ReadonlyMap<number, number> = new Map(),
  ): Promise<void> {
    const { dispatch, comment } = this.chains(id);
    const chain = `${dispatch}-n`;
    const jump = ["-i", bridge, "-s", `${ip}/32`, "-m", "comment", "--comment", comment];
    if (port === null) {
      await this.#unsteer(comment, chain);
      return;
    }
    const accept = proxyAccept(bridge, port, PROXY_COMMENT);
    // Ahead of the host firewall's DROP for the bridge.
    if (!(await this.#has("INPUT", accept))) {
      await this.#must(["-I", "INPUT", "1", ...accept]);
      // The rule of a proxy port this bridge had before (a node process since restarted).
      const input = await this.#iptables(["-S", "INPUT"]);
      for (const line of input.code === 0 ? input.stdout.split("\n") : []) {
        const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
        const i = words.indexOf("-i");
        const p = words.indexOf("--dport");
        if (words[0] !== "-A" || i < 0 || words[i + 1] !== bridge || p < 0) continue;
        if (words.includes(PORT_COMMENT)) {
          // A listener of a node process since restarted: this one's are added below.
          await this.#must(["-D", ...words.slice(1)]);
          continue;
        }
        if (!words.includes(PROXY_COMMENT) || words[p + 1] === String(port)) continue;
        await this.#must(["-D", ...words.slice(1)]);
      }
    }
    for (const listener of extra.values()) {
      const own = proxyAccept(bridge, listener, PORT_COMMENT);
      if (!(await this.#has("INPUT", own))) await this.#must(["-I", "INPUT", "1", ...own]);
    }
    const made = await this.#iptables(["-t", "nat", "-N", chain]);
    let old = 0;
    if (made.code !== 0) {
      if (!/exists/i.test(made.stderr)) throw this.#refusal(["-t", "nat", "-N"], said(made));
      const listing = await this.#iptables(["-t", "nat", "-S", chain]);
      if (listing.code !== 0) throw this.#refusal(["-t", "nat", "-S"], said(listing));
      old = listing.stdout.split("\n").filter((l) => l.startsWith("-A ")).length;
    }
    // The new rules go in above the old, which are then deleted from below them: there is never
    // a moment without a REDIRECT (an emptied chain would let the sandbox's ports 80 and 443
    // past the proxy, to whatever its address rules allow, e.g. a domain it denies).
    const rules = [
      ...allowOut.map((cidr) => ["-d", cidr, "-j", "RETURN"]),
      ["-p", "tcp", "-m", "multiport", "--dports", "80,443", "-j", "REDIRECT", "--to-ports"]
        .concat(String(port)),
      ...[...extra].map(([to, listener]) => [
        "-p",
        "tcp",
        "--dport",
        String(to),
        "-j",
        "REDIRECT",
        "--to-ports",
        String(listener),
      ]),
    ];
    for (const [i, rule] of rules.entries()) {
      await this.#must(["-t", "nat", "-I", chain, String(i + 1), ...rule]);
    }
    for (let i = 0; i < old; i++) {
      await this.#must(["-t", "nat", "-D", chain, String(rules.length + 1)]);
    }
    if (!(await this.#has("PREROUTING", [...jump, "-j", chain], "nat"))) {
      // First, ahead of Docker's own DOCKER jump for published ports.
      await this.#must(["-t", "nat", "-I", "PREROUTING", "1", ...jump, "-j", chain]);
    }
  }

  /**
   * Removes the host firewall's way in to proxy listeners for transform keys' ports that were
   * closed (no sandbox's rules name their port any more; `EgressProxy.release`), each on its
   * bridge; what is gone is no error. The REDIRECTs to them went with their sandboxes' `steer`.
   *
   * @throws {ExecutorError} `unavailable` when iptables cannot do it.
   */
  async unlisten(closed: readonly { iface: string; listener: number }[]): Promise<void> {
    for (const { iface, listener } of closed) {
      const own = proxyAccept(iface, listener, PORT_COMMENT);
      while (await this.#has("INPUT", own)) await this.#must(["-D", "INPUT", ...own]);
    }
  }

  /** Removes the sandbox's nat jumps (by comment) and its nat chain; what is gone is no error. */
  async #unsteer(comment: string, chain: string): Promise<boolean> {
    const listing = await this.#iptables(["-t", "nat", "-S", "PREROUTING"]);
    if (listing.code !== 0) throw this.#refusal(["-t", "nat", "-S"], said(listing));
    let removed = false;
    for (const line of listing.stdout.split("\n")) {
      const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
      if (words[0] !== "-A" || !words.includes(comment) || words.at(-1) !== chain) continue;
      await this.#must(["-t", "nat", "-D", ...words.slice(1)]);
      removed = true;
    }
    const flushed = await this.#iptables(["-t", "nat", "-F", chain]);
    if (flushed.code === 0) {
      await this.#must(["-t", "nat", "-X", chain]);
      removed = true;
    } else if (!noChain(flushed)) throw this.#refusal(["-t", "nat", "-F"], said(flushed));
    return removed;
  }

  /**
   * Removes the sandbox's jump and chains (after its container is gone); what is already gone
   * is no error.
   *
   * @returns whether anything was removed.
   * @throws {ExecutorError} `unavailable` when iptables cannot do it.
   */
  async remove(id: string): Promise<boolean> {
    const { dispatch, pair, comment } = this.chains(id);
    const steered = await this.#unsteer(comment, `${dispatch}-n`);
    const listing = await this.#iptables(["-S", DOCKER_USER]);
    if (listing.code !== 0) {
      // No DOCKER-USER (an engine run with --iptables=false): no rules were ever applied.
      if (missing(listing)) return false;
      throw this.#refusal(["-S", DOCKER_USER], said(listing));
    }
    let removed = false;
    for (const line of listing.stdout.split("\n")) {
      // iptables-nft prints a comment in quotes even without spaces; ours has none.
      const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
      if (words[0] !== "-A" || !words.includes(comment) || words.at(-1) !== dispatch) continue;
      await this.#must(["-D", ...words.slice(1)]);
      removed = true;
    }
    // Most sandboxes have no rules: one more look, and no chain to drop.
    if (!removed) {
      const probe = await this.#iptables(["-S", dispatch]);
      if (probe.code !== 0 && missing(probe)) return steered;
    }
    for (const chain of [dispatch, ...pair]) removed = (await this.#drop(chain)) || removed;
    return removed;
  }

  /**
   * Removes every jump of this instance on `bridge`, and the chains they lead to: what is left
   * of sandboxes removed behind the node's back (a `docker rm`, a node killed and its containers
   * cleaned up) once their network goes. Another instance's rules are left alone.
   *
   * @returns how many sandboxes' rules were removed.
   * @throws {ExecutorError} `unavailable` when iptables cannot do it.
   */
  async removeBridge(bridge: string): Promise<number> {
    const listing = await this.#iptables(["-S", DOCKER_USER]);
    if (listing.code !== 0) {
      if (missing(listing)) return 0;
      throw this.#refusal(["-S", DOCKER_USER], said(listing));
    }
    const own = `dormice:${this.#instanceId}:`;
    let removed = 0;
    for (const line of listing.stdout.split("\n")) {
      const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
      const i = words.indexOf("-i");
      if (words[0] !== "-A" || i < 0 || words[i + 1] !== bridge) continue;
      const comment = words.find((w) => w.startsWith(own));
      const dispatch = words.at(-1)!;
      if (comment === undefined || !/^DMN-[0-9a-f]{16}$/.test(dispatch)) continue;
      await this.#must(["-D", ...words.slice(1)]);
      for (const chain of [dispatch, `${dispatch}-a`, `${dispatch}-b`]) await this.#drop(chain);
      removed++;
    }
    // Steering of those sandboxes (nat), and the bridge's way in to the proxy (INPUT).
    const nat = await this.#iptables(["-t", "nat", "-S", "PREROUTING"]);
    for (const line of nat.code === 0 ? nat.stdout.split("\n") : []) {
      const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
      const i = words.indexOf("-i");
      const chain = words.at(-1)!;
      if (words[0] !== "-A" || i < 0 || words[i + 1] !== bridge) continue;
      if (!words.some((w) => w.startsWith(own)) || !/^DMN-[0-9a-f]{16}-n$/.test(chain)) continue;
      await this.#must(["-t", "nat", "-D", ...words.slice(1)]);
      const flushed = await this.#iptables(["-t", "nat", "-F", chain]);
      if (flushed.code === 0) await this.#must(["-t", "nat", "-X", chain]);
    }
    const input = await this.#iptables(["-S", "INPUT"]);
    for (const line of input.code === 0 ? input.stdout.split("\n") : []) {
      const words = line.trim().split(/\s+/).map((w) => w.replace(/^"(.*)"$/, "$1"));
      const i = words.indexOf("-i");
      if (words[0] !== "-A" || i < 0 || words[i + 1] !== bridge) continue;
      // The proxy's own for 80 and 443, and those of its listeners for transform keys' ports.
      if (!words.some((w) => w === PROXY_COMMENT || w === PORT_COMMENT)) {
        continue;
      }
      await this.#must(["-D", ...words.slice(1)]);
    }
    return removed;
  }

  /** The chain of `pair` the dispatch chain leads to; `null` when there is no dispatch chain. */
  async #target(dispatch: string, pair: [string, string]): Promise<string | null> {
    const r = await this.#iptables(["-S", dispatch]);
    if (r.code !== 0) {
      if (missing(r)) return null;
      throw this.#refusal(["-S", dispatch], said(r));
    }
    for (const line of r.stdout.split("\n")) {
      const target = /^-A \S+ -j (\S+)\s*$/.exec(line.trim())?.[1];
      if (target === pair[0] || target === pair[1]) return target;
    }
    // A dispatch chain leading nowhere (a failure between its making and its rule): make both.
    return null;
  }

  /** Makes `chain`, or empties it when it exists (left by an apply that failed midway). */
  async #fresh(chain: string): Promise<void> {
    const r = await this.#iptables(["-N", chain]);
    if (r.code === 0) return;
    if (!/exists/i.test(r.stderr)) throw this.#refusal(["-N", chain], said(r));
    await this.#must(["-F", chain]);
  }

  /** Empties and deletes `chain`; false when it did not exist. */
  async #drop(chain: string): Promise<boolean> {
    const flushed = await this.#iptables(["-F", chain]);
    if (flushed.code !== 0) {
      if (noChain(flushed)) return false;
      throw this.#refusal(["-F", chain], said(flushed));
    }
    await this.#must(["-X", chain]);
    return true;
  }

  /** Whether `rule` is in `chain` of `table` (`iptables -C`: 0 yes, 1 no). */
  async #has(chain: string, rule: string[], table = "filter"): Promise<boolean> {
    const args = [...(table === "filter" ? [] : ["-t", table]), "-C", chain, ...rule];
    const r = await this.#iptables(args);
    if (r.code === 0) return true;
    if (r.code === 1 && /does a matching rule exist|bad rule/i.test(r.stderr)) return false;
    throw this.#refusal(args, said(r));
  }

  async #must(args: string[]): Promise<void> {
    const r = await this.#iptables(args);
    if (r.code !== 0) throw this.#refusal(args, said(r));
  }

  #iptables(args: string[]): Promise<IptablesResult> {
    return callIptables(this.#run, args, this.#timeoutMs, (what) => this.#refusal(args, what));
  }

  #refusal(args: string[], what: string): ExecutorError {
    return new ExecutorError(
      "unavailable",
      `The node could not write a sandbox's egress rules (${IPTABLES} ${
        args.slice(0, 2).join(" ")
      } … said: ${what}): it needs root, ${IPTABLES} and --allow-run=${IPTABLES}, and the ` +
        `Docker engine's own iptables rules (its ${DOCKER_USER} chain; not dockerd ` +
        "--iptables=false). The rules in force before, if any, still are; try again",
    );
  }
}

/** The comment on the INPUT rule of the proxy's own listener (ports 80 and 443). */
const PROXY_COMMENT = "dormice:egress-proxy";
/** The comment on the INPUT rule of a transform key's port listener. */
const PORT_COMMENT = "dormice:egress-proxy-port";

/**
 * The INPUT rule letting connections redirected on `bridge` in to the proxy's `listener`,
 * marked with `comment` (the proxy's own listener's, or a port listener's).
 */
function proxyAccept(bridge: string, listener: number, comment: string): string[] {
  return [
    "-i",
    bridge,
    "-p",
    "tcp",
    "--dport",
    String(listener),
    "-m",
    "conntrack",
    "--ctstate",
    "DNAT",
    "-m",
    "comment",
    "--comment",
    comment,
    "-j",
    "ACCEPT",
  ];
}

function said(r: IptablesResult): string {
  return r.stderr.trim() || `exit code ${r.code}`;
}

/**
 * Whether `-S <chain>` says the chain does not exist (iptables-nft calls a missing chain
 * "incompatible"; a real foreign chain by that name then fails the `-N` that follows).
 */
function missing(r: IptablesResult): boolean {
  return noChain(r) || (r.code === 1 && /incompatible/.test(r.stderr));
}

function noChain(r: IptablesResult): boolean {
  return r.code === 1 && /no chain|does not exist|doesn't exist/i.test(r.stderr);
}
