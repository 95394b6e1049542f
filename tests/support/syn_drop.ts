/**
 * A loopback port that drops SYNs, for the tests and benchmarks that need a node whose connect
 * hangs (no RST either): `iptables -I INPUT -p tcp --dport P --syn -j DROP`, removed when done
 * and on Ctrl-C or SIGTERM, since a killed run would otherwise leave the rule behind. The rule's
 * packet counter says whether a SYN was really dropped: a connect that was refused instead (a
 * rule that did not match) counts nothing.
 *
 * Needs root and a working iptables: with `CI=true` their absence is a failure, not a skip.
 *
 * @module
 */

const decoder = new TextDecoder();

function ruleArgs(action: "-I" | "-D", port: number): string[] {
  return [action, "INPUT", "-p", "tcp", "--dport", String(port), "--syn", "-j", "DROP"];
}

/** Why SYNs cannot be dropped here, or `undefined` when they can. */
export async function synDropUnavailable(): Promise<string | undefined> {
  if (Deno.uid() !== 0) return "not root, so iptables cannot drop SYNs on a loopback port";
  try {
    const out = await new Deno.Command("iptables", {
      args: ["-w", "-S", "INPUT"],
      stdout: "null",
      stderr: "null",
    }).output();
    if (!out.success) return "iptables -S INPUT failed (no netfilter in this container?)";
  } catch {
    return "iptables is not installed";
  }
  return undefined;
}

/** Whether a test that drops SYNs runs: skipped with a printed reason off CI, failed on CI. */
export interface SynDropGate {
  /** Skip it: SYNs cannot be dropped here and this is not CI. */
  skip: boolean;
  /** Fail it with this sentence: `CI=true`, yet SYNs cannot be dropped. */
  failure: string | null;
}

/**
 * Decides whether `what` runs: with `CI=true` it never skips, since CI runs as root with
 * iptables (a skipped case there would pass while proving nothing).
 *
 * @example
 * ```ts ignore
 * const gate = await synDropGate("the SYN-drop case");
 * await t.step({ name: "…", ignore: gate.skip, fn() { if (gate.failure) throw new Error(gate.failure); } });
 * ```
 */
export async function synDropGate(what: string): Promise<SynDropGate> {
  const why = await synDropUnavailable();
  if (why === undefined) return { skip: false, failure: null };
  if (Deno.env.get("CI") === "true") {
    return { skip: false, failure: `CI=true, so ${what} must run, but ${why}` };
  }
  console.log(`${what} skipped: ${why}`);
  return { skip: true, failure: null };
}

/**
 * Runs `iptables -w <args>` and answers its output. `-w` waits for the xtables lock, which
 * another test changing rules on this machine may hold for a moment.
 *
 * @throws {Error} naming the action and iptables' own sentence when it fails.
 */
async function iptables(args: string[]): Promise<string> {
  const out = await new Deno.Command("iptables", {
    args: ["-w", ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`iptables ${args[0]} failed: ${decoder.decode(out.stderr).trim()}`);
  }
  return decoder.decode(out.stdout);
}

/** Starts dropping SYNs to `port`; the returned function stops it (call it in `finally`). */
export async function dropSyns(port: number): Promise<() => Promise<void>> {
  await iptables(ruleArgs("-I", port));
  // Ctrl-C would skip the caller's finally: remove the rule on the way out then too.
  const onSignal = () => {
    new Deno.Command("iptables", { args: ["-w", ...ruleArgs("-D", port)] }).outputSync();
    Deno.exit(130);
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  return async () => {
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
    await iptables(ruleArgs("-D", port));
  };
}

/** Packets the SYN-dropping rule for `port` has matched, or NaN when it is not there. */
export async function droppedSyns(port: number): Promise<number> {
  const listed = await iptables(["-L", "INPUT", "-v", "-n", "-x"]).catch(() => "");
  const rule = new RegExp(`\\bDROP\\b.*\\bdpt:${port}\\b`);
  for (const line of listed.split("\n")) {
    if (rule.test(line)) return Number(line.trim().split(/\s+/)[0]);
  }
  return NaN;
}
