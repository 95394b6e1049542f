/**
 * The stand-in internet `deno task sdk-tests` gives the SDK's network tests, so running them
 * never sends a packet to a public address: a network namespace holding the public addresses the
 * tests name (`1.1.1.1`, `8.8.8.8`) and one for the public name they fetch
 * (`connectivitycheck.gstatic.com`), each serving HTTP on 80 and HTTPS on 443 with a certificate
 * signed by the fleet egress CA (which every sandbox with egress trusts), and a DNS server on
 * `8.8.8.8:53` that answers the stand-in's names and refuses every other. For the run only, the
 * host routes `1.1.1.1/32` and `8.8.8.8/32` into the namespace; `stop()` removes them, the
 * namespace and its veth pair, and puts `ip_forward` back.
 *
 * What each address answers, as the tests expect of the real ones: `1.1.1.1` a 301, `8.8.8.8` a
 * 302, `connectivitycheck.gstatic.com/generate_204` a 204; every answer carries the run's nonce
 * in `x-dormice-stand-in`, which is how {@link StandIn.verify} tells the stand-in from anything
 * else before a test runs.
 *
 * @module
 */
import { join } from "node:path";
import { freeSubnet, must, run, serveInNetns } from "../tests/support/netns.ts";

/** The public addresses routed into the stand-in for the run. */
export const STAND_IN_ADDRESSES = ["1.1.1.1", "8.8.8.8"] as const;
/** The public name the stand-in's DNS answers, with the stand-in's own address for it. */
export const STAND_IN_NAME = "connectivitycheck.gstatic.com";
/** Where the stand-in's DNS listens: the resolver sandboxes are given (`DORMICE_SANDBOX_DNS`). */
export const STAND_IN_DNS = "8.8.8.8";

const FORWARD = "/proc/sys/net/ipv4/ip_forward";

/** Why the stand-in cannot be made here, or `null` when it can. */
export async function standInReadiness(): Promise<string | null> {
  if (Deno.uid() !== 0) return "not root: a network namespace and host routes need it";
  for (
    const [tool, args] of [["ip", ["-V"]], ["openssl", ["version"]], ["sh", [
      "-c",
      "true",
    ]]] as const
  ) {
    try {
      if (!(await run(tool, [...args])).ok) return `${tool} does not run`;
    } catch {
      return `${tool} is not installed`;
    }
  }
  return null;
}

/** A running stand-in internet. */
export interface StandIn {
  /** One line per thing it set up, for the operator. */
  lines: string[];
  /** The address `connectivitycheck.gstatic.com` resolves to at the stand-in's DNS. */
  nameAddress: string;
  /** Throws unless HTTPS to each address and the DNS answer come from this stand-in. */
  verify(caPem: string): Promise<string[]>;
  /** Removes everything it made; safe to call twice. */
  stop(): Promise<void>;
}

/**
 * The stand-in DNS server's answer to `query` (one UDP message): an A record for `name` (the
 * question's case kept) pointing at `address`, no record for another type of `name`, REFUSED for
 * every other name; `null` for a message too short or malformed to answer.
 */
export function dnsAnswer(query: Uint8Array, name: string, address: string): Uint8Array | null {
  if (query.length < 17 || (query[2] & 0x80) !== 0) return null;
  let i = 12;
  const labels: string[] = [];
  while (query[i] !== 0) {
    const length = query[i];
    if (length === undefined || length > 63 || labels.length >= 127) return null;
    labels.push(new TextDecoder().decode(query.subarray(i + 1, i + 1 + length)));
    i += length + 1;
  }
  if (i + 5 > query.length) return null;
  const qtype = (query[i + 1] << 8) | query[i + 2];
  const question = query.subarray(12, i + 5);
  const known = labels.join(".").toLowerCase() === name;
  const withA = known && qtype === 1;
  // QR, AA and the query's RD; RA off; NOERROR (0) for the name, REFUSED (5) for any other.
  const head = [query[0], query[1], 0x84 | (query[2] & 0x01), known ? 0 : 5];
  const counts = [0, 1, 0, withA ? 1 : 0, 0, 0, 0, 0];
  const record = withA
    ? [0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, ...address.split(".").map(Number)]
    : [];
  const out = new Uint8Array(12 + question.length + record.length);
  out.set([...head, ...counts]);
  out.set(question, 12);
  out.set(record, 12 + question.length);
  return out;
}

/** The stand-in's server: HTTP, HTTPS and DNS in the namespace, one Deno process. */
function serverSource(dir: string, nonce: string, nameAddress: string): string {
  return `import { dnsAnswer } from ${JSON.stringify(import.meta.url)};
const cert = Deno.readTextFileSync(${JSON.stringify(`${dir}/srv.crt`)});
const key = Deno.readTextFileSync(${JSON.stringify(`${dir}/srv.key`)});
const nonce = ${JSON.stringify(nonce)};
const name = ${JSON.stringify(STAND_IN_NAME)};
const nameAddress = ${JSON.stringify(nameAddress)};
const answers = {
  "1.1.1.1": () => [301, { location: "https://one.one.one.one/" }],
  "8.8.8.8": () => [302, { location: "https://dns.google/" }],
  [nameAddress]: (path) => path === "/generate_204" ? [204, {}] : [404, {}],
};
for (const [hostname, answer] of Object.entries(answers)) {
  const handler = (req) => {
    const [status, headers] = answer(new URL(req.url).pathname);
    const body = status === 204 ? null : \`dormice stand-in \${hostname} \${nonce}\\n\`;
    return new Response(body, { status, headers: { ...headers, "x-dormice-stand-in": nonce } });
  };
  Deno.serve({ hostname, port: 80, onListen() {} }, handler);
  Deno.serve({ hostname, port: 443, cert, key, onListen() {} }, handler);
}
// DNS: A for the stand-in's name, no answer for its other types, REFUSED for every other name.
const dns = Deno.listenDatagram({ transport: "udp", hostname: ${
    JSON.stringify(STAND_IN_DNS)
  }, port: 53 });
(async () => {
  for await (const [query, from] of dns) {
    const answer = dnsAnswer(query, name, nameAddress);
    if (answer) await dns.send(answer, from).catch(() => {});
  }
})();
console.log("listening");
`;
}

/**
 * Makes the stand-in: namespace, veth pair, addresses, host routes, certificate (signed by the
 * CA at `caCert`/`caKey`) and server. Undoes what it made when a step fails.
 *
 * @throws when a public address is already routed somewhere by this host (another run's
 * stand-in, or an operator's route): the tests would not be talking to this one.
 */
export async function startStandIn(
  caCert: string,
  caKey: string,
  workDir: string,
): Promise<StandIn> {
  for (const address of STAND_IN_ADDRESSES) {
    const existing = (await must("ip", "-4", "route", "show", `${address}/32`)).trim();
    if (existing) {
      throw new Error(
        `${address}/32 is already routed on this host (${existing}): another sdk-tests run's ` +
          `stand-in? Wait for it, or remove the route (ip route del ${address}/32) if stale`,
      );
    }
  }
  const tag = crypto.randomUUID().slice(0, 6);
  const ns = `sdkn-${tag}`;
  const hostEnd = `sdkn${tag}h`;
  const nsEnd = `sdkn${tag}n`;
  const nonce = `stand-in-${crypto.randomUUID()}`;
  const dir = await Deno.makeTempDir({ dir: workDir, prefix: "stand-in-" });
  const forwardBefore = (await must("sh", "-c", `cat ${FORWARD}`)).trim();
  const undo: (() => Promise<unknown>)[] = [];
  let server: Deno.ChildProcess | undefined;
  // One cleanup however many ask (a signal handler and a finally may both): the second caller
  // waits for the first instead of returning while routes are still in place.
  let stopping: Promise<void> | undefined;
  const stop = () => stopping ??= cleanup();
  const cleanup = async () => {
    if (server) {
      try {
        server.kill("SIGKILL");
      } catch { /* gone */ }
      await server.status;
    }
    for (const step of undo.reverse()) await step().catch(() => {});
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  try {
    const { host, a, b } = await freeSubnet();
    const lines: string[] = [];
    await must("ip", "netns", "add", ns);
    undo.push(() => run("ip", ["netns", "del", ns]));
    await must("ip", "link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd);
    undo.push(() => run("ip", ["link", "del", hostEnd]));
    await must("ip", "link", "set", nsEnd, "netns", ns);
    await must("ip", "addr", "add", `${host}/29`, "dev", hostEnd);
    await must("ip", "link", "set", hostEnd, "up");
    await must("ip", "-n", ns, "addr", "add", `${a}/29`, "dev", nsEnd);
    await must("ip", "-n", ns, "addr", "add", `${b}/29`, "dev", nsEnd);
    for (const address of STAND_IN_ADDRESSES) {
      await must("ip", "-n", ns, "addr", "add", `${address}/32`, "dev", nsEnd);
    }
    await must("ip", "-n", ns, "link", "set", nsEnd, "up");
    await must("ip", "-n", ns, "link", "set", "lo", "up");
    await must("ip", "-n", ns, "route", "add", "default", "via", host);
    lines.push(`network namespace ${ns} (veth ${hostEnd} ${host} <-> ${nsEnd} ${a}, ${b})`);
    for (const address of STAND_IN_ADDRESSES) {
      await must("ip", "route", "add", `${address}/32`, "via", a, "dev", hostEnd);
      undo.push(() => run("ip", ["route", "del", `${address}/32`, "via", a, "dev", hostEnd]));
      lines.push(`host route ${address}/32 via ${a} (removed at exit)`);
    }
    if (forwardBefore !== "1") {
      await must("sh", "-c", `echo 1 > ${FORWARD}`);
      undo.push(() => run("sh", ["-c", `echo ${forwardBefore === "0" ? 0 : 1} > ${FORWARD}`]));
      lines.push("ip_forward 1 for the run (was 0)");
    }
    await must(
      "openssl",
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      `${dir}/srv.key`,
      "-out",
      `${dir}/srv.crt`,
      "-days",
      "2",
      "-subj",
      "/CN=dormice stand-in internet",
      "-CA",
      caCert,
      "-CAkey",
      caKey,
      "-addext",
      `subjectAltName=${
        STAND_IN_ADDRESSES.map((x) => `IP:${x}`).join(",")
      },IP:${b},DNS:${STAND_IN_NAME}`,
      "-addext",
      "basicConstraints=critical,CA:FALSE",
      "-addext",
      "extendedKeyUsage=serverAuth",
    );
    lines.push(
      `HTTP :80 and HTTPS :443 on ${STAND_IN_ADDRESSES.join(", ")} and ${b} (${STAND_IN_NAME}), ` +
        `certificate signed by the fleet egress CA ${caCert}`,
    );
    const serverFile = join(dir, "server.ts");
    await Deno.writeTextFile(serverFile, serverSource(dir, nonce, b));
    server = await serveInNetns(
      ns,
      ["--unstable-net", "--allow-net", `--allow-read=${dir}`],
      serverFile,
      "the stand-in's server",
    );
    lines.push(
      `DNS on ${STAND_IN_DNS}:53: ${STAND_IN_NAME} -> ${b}, every other name REFUSED ` +
        `(sandboxes get it as their resolver: DORMICE_SANDBOX_DNS=${STAND_IN_DNS})`,
    );
    const verify = async (caPem: string): Promise<string[]> => {
      const client = Deno.createHttpClient({ caCerts: [caPem] });
      const seen: string[] = [];
      try {
        for (const address of STAND_IN_ADDRESSES) {
          const url = `https://${address}/`;
          let got: string;
          try {
            const r = await fetch(url, {
              client,
              redirect: "manual",
              signal: AbortSignal.timeout(5_000),
            });
            await r.body?.cancel();
            got = r.headers.get("x-dormice-stand-in") === nonce
              ? "ok"
              : `status ${r.status} without this run's nonce`;
            if (got === "ok") seen.push(`${url} -> ${r.status} from the stand-in`);
          } catch (error) {
            got = (error as Error).message;
          }
          if (got !== "ok") {
            throw new Error(
              `${url} did not reach the stand-in (${got}): refusing to run tests that would ` +
                `reach ${address} elsewhere. Check \`ip route get ${address}\``,
            );
          }
        }
      } finally {
        client.close();
      }
      const answer = await Deno.resolveDns(STAND_IN_NAME, "A", {
        nameServer: { ipAddr: STAND_IN_DNS, port: 53 },
        signal: AbortSignal.timeout(5_000),
      }).catch((error) => [`error: ${(error as Error).message}`]);
      if (answer.join() !== b) {
        throw new Error(
          `the stand-in's DNS at ${STAND_IN_DNS} answered ${STAND_IN_NAME} with ` +
            `${JSON.stringify(answer)}, not ${b}`,
        );
      }
      seen.push(`${STAND_IN_NAME} at ${STAND_IN_DNS}:53 -> ${b}`);
      return seen;
    };
    return { lines, nameAddress: b, verify, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
