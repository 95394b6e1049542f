/**
 * The host side of sandbox isolation: one iptables INPUT rule per sandbox bridge that drops every
 * connection a sandbox opens to an address of this machine (the bridge's gateway address, the
 * machine's own addresses, other bridges' addresses), while replies to connections the node
 * opens into sandboxes (the ports door) still pass. Docker has no setting for this: its rules
 * filter traffic forwarded between networks (FORWARD), never traffic addressed to the host
 * (INPUT), and its options that take the host's address off a bridge also take away the node's
 * route to sandbox ports.
 *
 * The rule is named by its bridge and a comment naming its network, so `-C` finds it again after
 * a restart (no duplicates), and it is removed with its network.
 *
 * @module
 */
import { ExecutorError } from "../contract.ts";

/** The binary the rules are made with; `--allow-run` must name it. */
export const IPTABLES = "iptables";

/** The variable that turns the rules off (the node's opt-out). */
export const HOST_FIREWALL_VARIABLE = "DORMICE_SANDBOX_HOST_FIREWALL";

/** What one iptables run said. */
export interface IptablesResult {
  /** Exit code: 0 done (or the rule exists, for `-C`), 1 the rule does not exist. */
  code: number;
  /** What it printed on stdout. */
  stdout: string;
  /** What it printed on stderr (the reason, when it failed). */
  stderr: string;
}

/** Runs iptables with `args`; aborted by `signal`. */
export type IptablesRunner = (args: string[], signal: AbortSignal) => Promise<IptablesResult>;

const decoder = new TextDecoder();

/** The real runner: `iptables` from PATH. Requires `--allow-run=iptables`. */
export const runIptables: IptablesRunner = async (args, signal) => {
  const out = await new Deno.Command(IPTABLES, {
    args,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
    signal,
  }).output();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
};

/** Options of {@linkcode HostFirewall}. */
/**
 * Runs `iptables -w 5 <args>` within `timeoutMs`; a run that cannot start, or does not end in
 * time, becomes the caller's refusal naming why (not permitted, not installed, no answer).
 */
export async function callIptables(
  run: IptablesRunner,
  args: string[],
  timeoutMs: number,
  refusal: (what: string) => ExecutorError,
): Promise<IptablesResult> {
  // -w: wait for the xtables lock Docker holds while it writes its own rules, not fail at once.
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const r = await run(["-w", "5", ...args], signal);
    // A run killed at its deadline ends with a signal's exit code rather than an error.
    if (signal.aborted) throw signal.reason;
    return r;
  } catch (error) {
    if (error instanceof Deno.errors.NotCapable) {
      throw refusal(`this process may not run it: ${error.message}`);
    }
    if (error instanceof Deno.errors.NotFound) {
      throw refusal(`${IPTABLES} is not installed (Debian: apt-get install iptables)`);
    }
    if (error instanceof DOMException && error.name === "TimeoutError") {
      throw refusal(`no answer within ${timeoutMs} ms`);
    }
    throw refusal(error instanceof Error ? error.message : String(error));
  }
}

export interface HostFirewallOptions {
  /** Runs iptables; the real binary by default (tests pass a fake chain). */
  run?: IptablesRunner;
  /**
   * Bound of one iptables run, ms. iptables itself waits up to 5 s for the xtables lock (`-w 5`)
   * that Docker takes while it changes its own rules; 10 s leaves room for that and a slow start.
   */
  timeoutMs?: number;
}

/** The INPUT rules of sandbox bridges, installed and removed with iptables. */
export class HostFirewall {
  #run: IptablesRunner;
  #timeoutMs: number;

  constructor({ run = runIptables, timeoutMs = 10_000 }: HostFirewallOptions = {}) {
    this.#run = run;
    this.#timeoutMs = timeoutMs;
  }

  /**
   * The rule for `bridge`, after the chain. Everything that is not a reply to a connection the
   * host opened is dropped: new connections (TCP, UDP, ICMP) and packets conntrack cannot place.
   */
  static rule(bridge: string, network: string): string[] {
    return [
      "-i",
      bridge,
      "-m",
      "conntrack",
      "!",
      "--ctstate",
      "ESTABLISHED,RELATED",
      "-m",
      "comment",
      "--comment",
      `dormice ${network}: sandboxes may not connect to this host`,
      "-j",
      "DROP",
    ];
  }

  /**
   * Asks iptables whether the rule of `bridge` exists: an answer either way shows the node may
   * manage the rules (the binary runs, the process is root, the match modules load).
   *
   * @throws {ExecutorError} `unavailable` naming what failed and the two ways out.
   */
  async check(bridge: string, network: string): Promise<void> {
    await this.#has("INPUT", HostFirewall.rule(bridge, network));
  }

  /**
   * Installs the rule of `bridge` first in INPUT unless it is there already (a node restarted
   * over its own network finds its rule and adds none).
   *
   * @returns whether it was installed now.
   * @throws {ExecutorError} `unavailable` when iptables cannot do it.
   */
  async guard(bridge: string, network: string): Promise<boolean> {
    const rule = HostFirewall.rule(bridge, network);
    if (await this.#has("INPUT", rule)) return false;
    // First, so that an operator's own ACCEPT rules further down cannot let a sandbox through.
    await this.#must(["-I", "INPUT", "1", ...rule]);
    return true;
  }

  /**
   * Removes every copy of the rule of `bridge` (one normally; more only if two processes raced
   * to install it).
   *
   * @returns how many were removed.
   * @throws {ExecutorError} `unavailable` when iptables cannot do it.
   */
  async unguard(bridge: string, network: string): Promise<number> {
    const rule = HostFirewall.rule(bridge, network);
    let removed = 0;
    // Bounded: a chain never holds more copies than processes that raced to install one.
    while (removed < 16 && await this.#has("INPUT", rule)) {
      await this.#must(["-D", "INPUT", ...rule]);
      removed++;
    }
    return removed;
  }

  /**
   * Checks that the engine installed its inter-container DROP rule for `bridge` (a network made
   * with `enable_icc=false`): an engine run with `--iptables=false` accepts the option and
   * installs nothing, and then sandboxes on the bridge reach each other. Docker 20–27 put the
   * rule in FORWARD and later versions in a chain of their own, so every chain is searched.
   *
   * @throws {ExecutorError} `unavailable` when the rule is missing.
   */
  async verifyNoInterContainer(bridge: string, network: string): Promise<void> {
    const listing = await this.#must(["-S"]);
    const words = (line: string) => ` ${line.trim()} `;
    const found = listing.stdout.split("\n").some((line) =>
      words(line).includes(` -i ${bridge} `) && words(line).includes(` -o ${bridge} `) &&
      words(line).includes(" -j DROP ")
    );
    if (!found) {
      throw new ExecutorError(
        "unavailable",
        `The Docker engine installed no rule keeping the sandboxes on network ${network} (bridge ` +
          `${bridge}) from reaching each other, though it was made with ` +
          "com.docker.network.bridge.enable_icc=false: run dockerd with its iptables rules on (the " +
          "default; not --iptables=false), then create the sandbox again",
      );
    }
  }

  /** Whether `rule` is in `chain` (`iptables -C`: 0 yes, 1 no). */
  async #has(chain: string, rule: string[]): Promise<boolean> {
    const args = ["-C", chain, ...rule];
    const r = await this.#iptables(args);
    if (r.code === 0) return true;
    if (r.code === 1 && /does a matching rule exist|bad rule/i.test(r.stderr)) return false;
    throw this.#refusal(args, r.stderr.trim() || `exit code ${r.code}`);
  }

  async #must(args: string[]): Promise<IptablesResult> {
    const r = await this.#iptables(args);
    if (r.code !== 0) throw this.#refusal(args, r.stderr.trim() || `exit code ${r.code}`);
    return r;
  }

  #iptables(args: string[]): Promise<IptablesResult> {
    return callIptables(this.#run, args, this.#timeoutMs, (what) => this.#refusal(args, what));
  }

  #refusal(args: string[], said: string): ExecutorError {
    return new ExecutorError(
      "unavailable",
      `The node cannot manage the firewall rule that keeps sandboxes from connecting to this ` +
        `machine (${IPTABLES} ${args.slice(0, 2).join(" ")} … said: ${said}): run the node as ` +
        `root with ${IPTABLES} installed and --allow-run=${IPTABLES} (deno task node and ` +
        `deploy/dormice-node.service grant it), or set ${HOST_FIREWALL_VARIABLE}=off to run ` +
        "without it (sandboxes then reach every service listening on this machine)",
    );
  }
}
