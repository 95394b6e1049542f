/**
 * A loopback port that drops SYNs, for the benchmarks that need a node whose connect hangs (no
 * RST either): `iptables -I INPUT -p tcp --dport P --syn -j DROP`, removed when done and on
 * Ctrl-C or SIGTERM, since a killed benchmark would otherwise leave the rule behind.
 *
 * @module
 */

function ruleArgs(action: "-I" | "-D", port: number): string[] {
  return [action, "INPUT", "-p", "tcp", "--dport", String(port), "--syn", "-j", "DROP"];
}

/** Why SYNs cannot be dropped here, or `undefined` when they can. */
export async function synDropUnavailable(): Promise<string | undefined> {
  if (Deno.uid() !== 0) return "not root, so iptables cannot drop SYNs on a loopback port";
  try {
    const out = await new Deno.Command("iptables", { args: ["-S", "INPUT"], stdout: "null" })
      .output();
    if (!out.success) return "iptables -S INPUT failed (no netfilter in this container?)";
  } catch {
    return "iptables is not installed";
  }
  return undefined;
}

/** Starts dropping SYNs to `port`; the returned function stops it (call it in `finally`). */
export async function dropSyns(port: number): Promise<() => Promise<void>> {
  const out = await new Deno.Command("iptables", {
    args: ruleArgs("-I", port),
    stdout: "null",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`iptables -I failed: ${new TextDecoder().decode(out.stderr).trim()}`);
  }
  // Ctrl-C would skip the caller's finally: remove the rule on the way out then too.
  const onSignal = () => {
    new Deno.Command("iptables", { args: ruleArgs("-D", port) }).outputSync();
    Deno.exit(130);
  };
  Deno.addSignalListener("SIGINT", onSignal);
  Deno.addSignalListener("SIGTERM", onSignal);
  return async () => {
    Deno.removeSignalListener("SIGINT", onSignal);
    Deno.removeSignalListener("SIGTERM", onSignal);
    const done = await new Deno.Command("iptables", {
      args: ruleArgs("-D", port),
      stdout: "null",
      stderr: "piped",
    }).output();
    if (!done.success) {
      throw new Error(`iptables -D failed: ${new TextDecoder().decode(done.stderr).trim()}`);
    }
  };
}
