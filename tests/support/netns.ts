/**
 * What the Docker network tests share to build their stand-in internet: running a command,
 * whether this host can (root, `ip`, `iptables`, the engine's DOCKER-USER chain), and a /29 in
 * 198.18.0.0/15 (the benchmarking range) that no interface of the host uses.
 *
 * @module
 */

/** Runs `cmd` with `args`; its exit and its stdout and stderr together. */
export async function run(cmd: string, args: string[]): Promise<{ ok: boolean; out: string }> {
  const out = await new Deno.Command(cmd, { args, stdin: "null", stdout: "piped", stderr: "piped" })
    .output();
  const dec = new TextDecoder();
  return { ok: out.success, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

/** Runs `cmd`; its output, or an error naming the command and what it printed. */
export async function must(cmd: string, ...args: string[]): Promise<string> {
  const r = await run(cmd, args);
  if (!r.ok) throw new Error(`${cmd} ${args.join(" ")} failed: ${r.out.trim()}`);
  return r.out;
}

/**
 * Why a test that needs the node's iptables rules (and, with `netns`, a network namespace and a
 * veth pair) cannot run here, or `null` when it can.
 */
export async function netnsReadiness(netns = true): Promise<string | null> {
  if (Deno.uid() !== 0) {
    return netns
      ? "not root: ip netns, a veth pair and iptables rules need it"
      : "not root: the node's iptables rules need it";
  }
  const tools: [string, string[]][] = netns
    ? [["ip", ["-V"]], ["iptables", ["-V"]], ["bash", ["--version"]]]
    : [["iptables", ["-V"]]];
  for (const [tool, args] of tools) {
    try {
      if (!(await run(tool, args)).ok) return `${tool} does not run`;
    } catch {
      return `${tool} is not installed`;
    }
  }
  if (!(await run("iptables", ["-w", "5", "-S", "DOCKER-USER"])).ok) {
    return "the engine's DOCKER-USER chain is missing (dockerd --iptables=false?)";
  }
  return null;
}

/** A /29 in 198.18.0.0/15 no interface of the host has an address in: host end, A and B. */
export async function freeSubnet(): Promise<{ host: string; a: string; b: string }> {
  const used = await must("ip", "-4", "-o", "addr", "show");
  for (let attempt = 0; attempt < 50; attempt++) {
    const [x, y] = crypto.getRandomValues(new Uint8Array(2));
    const prefix = `198.${18 + (x & 1)}.${y}.`;
    if (used.includes(` ${prefix}`)) continue;
    const base = (x >> 1) & 0xf8;
    return { host: `${prefix}${base + 1}`, a: `${prefix}${base + 2}`, b: `${prefix}${base + 3}` };
  }
  throw new Error("No free /29 in 198.18.0.0/15 after 50 picks");
}

/** How long a server started in a namespace may take to say it listens. */
const LISTEN_MS = 20_000;

/**
 * Starts `deno run --quiet <flags> <file>` inside the network namespace `ns` (stdout piped, no
 * colour) and waits, at most 20 s, for its first output to say `listening`; the rest of its
 * stdout is drained. The caller kills the server it gets back.
 *
 * @throws naming `what` when the server does not say it listens in time (it is killed first).
 */
export async function serveInNetns(
  ns: string,
  flags: string[],
  file: string,
  what: string,
): Promise<Deno.ChildProcess> {
  const server = new Deno.Command("ip", {
    args: ["netns", "exec", ns, Deno.execPath(), "run", "--quiet", ...flags, file],
    stdin: "null",
    stdout: "piped",
    stderr: "inherit",
    env: { NO_COLOR: "1" },
  }).spawn();
  const reader = server.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const ready = await Promise.race([
    reader.read(),
    new Promise<null>((r) => timer = setTimeout(() => r(null), LISTEN_MS)),
  ]);
  clearTimeout(timer);
  if (!ready?.value?.includes("listening")) {
    try {
      server.kill("SIGKILL");
    } catch { /* gone */ }
    await server.status;
    throw new Error(`${what} did not say it listens within ${LISTEN_MS / 1000} s`);
  }
  (async () => {
    try {
      while (!(await reader.read()).done) { /* drain */ }
    } catch { /* closed */ }
  })();
  return server;
}
