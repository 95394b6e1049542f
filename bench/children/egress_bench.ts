/**
 * HTTPS through a sandbox's egress paths, measured inside the sandboxes with curl's own timers:
 * direct egress (a sandbox with egress and no rules: the engine's NAT), a domain rule (the
 * node's egress proxy reads the SNI and splices) and a header transform (the proxy terminates
 * TLS with the fleet egress CA and sends each request on over HTTPS). Each run, in every
 * sandbox: the median time to first byte of 15 fresh connections (`curl -w
 * %{time_starttransfer}`, a new TCP and TLS handshake each), and one 64 MiB download
 * (`%{speed_download}`); the header transform's first byte again with curl trusting the system
 * store rather than one CA file. Prints the samples as JSON.
 *
 * With `squid` as its last argument it measures two more sandboxes, with plain egress, whose
 * port 443 the section steers to Debian's squid-openssl on the host: one spliced after a peek at
 * the SNI, one bumped (squid terminates TLS with its own CA and adds a header). Once those
 * sandboxes exist it prints `{"steer":[{"path","ip","gateway"}...]}` on a line and waits for a
 * line on stdin (the section's go) before it measures.
 *
 * The client half of bench/sections/egress_docker.ts, which makes the stand-in internet and
 * starts the gateway and the Docker node: run it through `deno task bench --only=egress-docker`.
 * Direct use: `deno run --allow-net=127.0.0.1 --allow-env --allow-read
 * bench/children/egress_bench.ts <gateway url> <fleet token> <server address> <test CA file>
 * [runs] [squid <squid CA file>]`.
 *
 * @module
 */
import { Sandbox } from "e2b";

const [gateway, apiKey, address, caFile, runsArg = "5", squidArg, squidCaFile] = Deno.args;
const runs = Number(runsArg);
const squid = squidArg === "squid";
if (
  !gateway || !apiKey || !address || !caFile || !Number.isInteger(runs) || runs < 1 ||
  (squidArg !== undefined && (!squid || !squidCaFile))
) {
  console.error(
    "Usage: egress_bench.ts <gateway url> <fleet token> <server address> <test CA file> [runs] " +
      "[squid <squid CA file>]",
  );
  Deno.exit(2);
}
const opts = {
  apiUrl: `${gateway}/e2b/api`,
  sandboxUrl: `${gateway}/e2b/envd`,
  apiKey,
  timeoutMs: 600_000,
};
const NAME = "bench.test";
const paths = {
  direct: { allowInternetAccess: true },
  "domain rule (SNI splice)": { network: { allowOut: [NAME], denyOut: ["0.0.0.0/0"] } },
  "header transform (TLS opened)": {
    network: {
      allowOut: [NAME],
      denyOut: ["0.0.0.0/0"],
      rules: { [NAME]: [{ transform: { headers: { "X-Bench-Key": "k" } } }] },
    },
  },
  /** Plain egress; the section steers its port 443 to squid's splicing port. */
  "squid, domain rule (peek, splice)": { allowInternetAccess: true },
  /** Plain egress; the section steers its port 443 to squid's bumping port. */
  "squid, header added (ssl-bump)": { allowInternetAccess: true },
} as const;
type Path = keyof typeof paths;
const SQUID_BUMP: Path = "squid, header added (ssl-bump)";
/** The header transform's first byte with curl trusting the sandbox's system store. */
const SYSTEM_STORE = "header transform (TLS opened), curl trusting the system store";

const samples: Record<string, number[]> = {};
const sandboxes = new Map<Path, Sandbox>();
const ca = await Deno.readTextFile(caFile);
/** Where a sandbox with egress finds the fleet egress CA (also in its system store). */
const FLEET_CA = "/usr/local/share/ca-certificates/dormice-egress.crt";
/**
 * curl in `sandbox`, trusting one CA file as every path does: the test CA, squid's, or the fleet
 * CA (the header transform). With `systemStore` the header transform's trusts the system store
 * instead, where the sandbox's create put the fleet CA, as a user's client would; curl then reads
 * the whole store (about 140 certificates) on each connection, so that is a row of its own.
 */
const curl = (path: Path, extra: string, systemStore = false) =>
  `curl -sS --max-time 120 ${
    path !== "header transform (TLS opened)"
      ? "--cacert /tmp/bench-ca.crt "
      : systemStore
      ? ""
      : `--cacert ${FLEET_CA} `
  }--resolve ${NAME}:443:${address} ${extra}`;
try {
  for (const [path, options] of Object.entries(paths) as [Path, object][]) {
    if (!squid && path.startsWith("squid")) continue;
    const sandbox = await Sandbox.create("base", { ...opts, ...options });
    sandboxes.set(path, sandbox);
    // squid's bumping port signs with its own CA: that one sandbox trusts it instead.
    const trusted = path === SQUID_BUMP ? await Deno.readTextFile(squidCaFile) : ca;
    await sandbox.files.write("/tmp/bench-ca.crt", trusted);
    samples[`first byte, ${path}`] = [];
    samples[`64 MiB download, ${path}`] = [];
  }
  if (squid) {
    const steer = [];
    for (const [path, sandbox] of sandboxes) {
      if (!path.startsWith("squid")) continue;
      const at = await sandbox.commands.run(
        "hostname -I | cut -d' ' -f1; ip -4 route show default | cut -d' ' -f3",
      );
      const [ip, gateway] = at.stdout.trim().split("\n");
      steer.push({ path: path === SQUID_BUMP ? "bump" : "splice", ip, gateway });
    }
    console.log(JSON.stringify({ steer }));
    const stdin = Deno.stdin.readable.getReader();
    const go = new TextDecoder().decode((await stdin.read()).value);
    // Read no further: a pending read of stdin would keep this process from exiting.
    await stdin.cancel();
    if (!go.startsWith("go")) throw new Error(`the section said ${go || "nothing"}`);
  }
  // The paths that add a header are checked to add it, so neither is measured doing less (the
  // header transform's trusting the sandbox's system store, as a user's client would).
  for (const path of ["header transform (TLS opened)", SQUID_BUMP] as const) {
    const sandbox = sandboxes.get(path);
    if (sandbox === undefined) continue;
    const said = await sandbox.commands.run(curl(path, `https://${NAME}/small`, true));
    if (said.stdout.trim() !== "ok k") throw new Error(`${path}: the server saw ${said.stdout}`);
  }
  /** The median time to first byte of 15 fresh connections of `path`, ms. */
  const firstByte = async (path: Path, sandbox: Sandbox, systemStore = false) => {
    const firstBytes = await sandbox.commands.run(
      `for i in $(seq 15); do ${
        curl(path, `-o /dev/null -w '%{time_starttransfer}\\n' https://${NAME}/small`, systemStore)
      }; done`,
      { timeoutMs: 300_000 },
    );
    const times = firstBytes.stdout.trim().split("\n").map((s) => Number(s) * 1000).sort((
      a,
      b,
    ) => a - b);
    if (times.length !== 15 || times.some((t) => !Number.isFinite(t) || t <= 0)) {
      throw new Error(`${path}: curl said ${firstBytes.stdout.slice(0, 300)}`);
    }
    return times[7];
  };
  for (let run = 0; run < runs; run++) {
    for (const [path, sandbox] of sandboxes) {
      samples[`first byte, ${path}`].push(await firstByte(path, sandbox));
      if (path === "header transform (TLS opened)") {
        (samples[`first byte, ${SYSTEM_STORE}`] ??= []).push(
          await firstByte(path, sandbox, true),
        );
      }
      const big = await sandbox.commands.run(
        curl(path, `-o /dev/null -w '%{size_download} %{speed_download}' https://${NAME}/big`),
        { timeoutMs: 300_000 },
      );
      const [size, speed] = big.stdout.trim().split(" ").map(Number);
      if (size !== 64 * 1024 * 1024) throw new Error(`${path}: downloaded ${big.stdout}`);
      samples[`64 MiB download, ${path}`].push(speed / 1024 / 1024);
    }
  }
} finally {
  for (const sandbox of sandboxes.values()) await sandbox.kill().catch(() => {});
}
console.log(JSON.stringify(samples));
