/**
 * HTTPS through a sandbox's egress paths, measured inside the sandboxes with curl's own timers:
 * direct egress (a sandbox with egress and no rules: the engine's NAT), a domain rule (the
 * node's egress proxy reads the SNI and splices) and a header transform (the proxy terminates
 * TLS with the fleet egress CA and sends each request on over HTTPS). Each run, in every
 * sandbox: the median time to first byte of 15 fresh connections (`curl -w
 * %{time_starttransfer}`, a new TCP and TLS handshake each), and one 64 MiB download
 * (`%{speed_download}`). Prints the samples as JSON.
 *
 * The client half of bench/sections/egress_docker.ts, which makes the stand-in internet and
 * starts the gateway and the Docker node: run it through `deno task bench --only=egress-docker`.
 * Direct use: `deno run --allow-net=127.0.0.1 --allow-env --allow-read
 * bench/children/egress_bench.ts <gateway url> <fleet token> <server address> <test CA file>
 * [runs]`.
 *
 * @module
 */
import { Sandbox } from "e2b";

const [gateway, apiKey, address, caFile, runsArg = "5"] = Deno.args;
const runs = Number(runsArg);
if (!gateway || !apiKey || !address || !caFile || !Number.isInteger(runs) || runs < 1) {
  console.error(
    "Usage: egress_bench.ts <gateway url> <fleet token> <server address> <test CA file> [runs]",
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
} as const;
type Path = keyof typeof paths;

const samples: Record<string, number[]> = {};
const sandboxes = new Map<Path, Sandbox>();
const ca = await Deno.readTextFile(caFile);
try {
  for (const [path, options] of Object.entries(paths) as [Path, object][]) {
    const sandbox = await Sandbox.create("base", { ...opts, ...options });
    sandboxes.set(path, sandbox);
    await sandbox.files.write("/tmp/bench-ca.crt", ca);
    samples[`first byte, ${path}`] = [];
    samples[`64 MiB download, ${path}`] = [];
  }
  /** curl in `sandbox`: the stand-in's certificate trusted by the test CA or the fleet CA. */
  const curl = (path: Path, extra: string) =>
    `curl -sS --max-time 120 ${
      path === "header transform (TLS opened)" ? "" : "--cacert /tmp/bench-ca.crt "
    }--resolve ${NAME}:443:${address} ${extra}`;
  for (let run = 0; run < runs; run++) {
    for (const [path, sandbox] of sandboxes) {
      const firstBytes = await sandbox.commands.run(
        `for i in $(seq 15); do ${
          curl(path, `-o /dev/null -w '%{time_starttransfer}\\n' https://${NAME}/small`)
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
      samples[`first byte, ${path}`].push(times[7]);
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
