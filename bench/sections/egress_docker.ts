/**
 * HTTPS through a sandbox's egress paths on Docker: direct egress against the node's egress
 * proxy splicing by SNI (a domain rule) and opening TLS to add a header (a header transform).
 * Makes a stand-in internet (a network namespace `egb-*` with one address in 198.18.0.0/15
 * serving HTTPS on 443 with a certificate a bench CA signs), starts a gateway and a Docker node
 * that trusts the bench CA upstream (`DORMICE_EGRESS_EXTRA_CA`) and resolves `bench.test` to the
 * namespace (`DORMICE_EGRESS_HOSTS`), and runs bench/children/egress_bench.ts as the client.
 * Skipped with the reason when it cannot run (not root, no `ip`, no engine).
 *
 * Where Debian's squid-openssl is installed, the same two jobs are measured through squid in the
 * same run (`bench/lib/squid.ts`): two more sandboxes with plain egress whose port 443 is steered
 * to squid on the host, one spliced after a peek at the SNI, one bumped with a header added.
 * Without squid those rows are left out and a note says why.
 *
 * @module
 */
import {
  benchToken,
  type Daemon,
  startDockerNode,
  startGateway,
  waitForNodeUp,
} from "../lib/fixtures.ts";
import { row, type Section } from "../lib/stats.ts";
import { type Squid, squidMissing, startSquid } from "../lib/squid.ts";
import { serveInNetns } from "../../tests/support/netns.ts";

/** Options of the egress benchmark. */
export interface EgressDockerOptions {
  /** Runs (each measures every path once). */
  runs: number;
}

const title = "Egress on Docker: HTTPS through the egress proxy against direct egress";
const FORWARD = "/proc/sys/net/ipv4/ip_forward";

async function sh(command: string): Promise<{ ok: boolean; out: string }> {
  const out = await new Deno.Command("sh", { args: ["-c", command], stdin: "null" }).output();
  const dec = new TextDecoder();
  return { ok: out.success, out: dec.decode(out.stdout) + dec.decode(out.stderr) };
}

async function must(command: string): Promise<string> {
  const r = await sh(command);
  if (!r.ok) throw new Error(`${command.slice(0, 80)} failed: ${r.out.trim().slice(-300)}`);
  return r.out;
}

/** Splits a text stream into lines. */
function splitLines(): TransformStream<string, string> {
  let rest = "";
  return new TransformStream({
    transform(chunk, out) {
      const parts = (rest + chunk).split("\n");
      rest = parts.pop()!;
      for (const p of parts) if (p.trim() !== "") out.enqueue(p);
    },
    flush(out) {
      if (rest.trim() !== "") out.enqueue(rest);
    },
  });
}

/** squid's version line, e.g. "5.7". */
async function squidVersion(): Promise<string> {
  const v = await sh("squid -v | head -1");
  return v.out.match(/Version (\S+)/)?.[1] ?? "unknown version";
}

/** Measures the egress paths; skipped when it cannot. */
export async function runEgressDocker({ runs }: EgressDockerOptions): Promise<Section> {
  const reference = "direct egress (a sandbox with egress and no rules, through the engine's " +
    "NAT) in the same run";
  if (Deno.uid() !== 0) {
    return { title, reference, rows: [], notes: [], skipped: "not root (ip netns needs it)" };
  }
  const tag = crypto.randomUUID().slice(0, 6);
  const ns = `egb-${tag}`;
  const hostEnd = `egb${tag}h`;
  const dir = await Deno.makeTempDir({ prefix: "dormice-bench-egress-" });
  const nodeId = `bench-egress-${tag}`;
  const forwardBefore = (await sh(`cat ${FORWARD}`)).out.trim();
  let server: Deno.ChildProcess | undefined;
  let gateway: Daemon | undefined;
  let node: Daemon | undefined;
  let squid: Squid | undefined;
  const noSquid = await squidMissing();
  try {
    const used = await must("ip -4 -o addr show");
    let prefix = "";
    for (let i = 0; i < 50 && prefix === ""; i++) {
      const y = crypto.getRandomValues(new Uint8Array(1))[0];
      if (!used.includes(` 198.19.${y}.`)) prefix = `198.19.${y}.`;
    }
    if (prefix === "") throw new Error("no free /24 in 198.19.0.0/16");
    const [host, address] = [`${prefix}1`, `${prefix}2`];
    const openssl = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes " +
      "-days 2";
    await must(
      `${openssl} -keyout ${dir}/ca.key -out ${dir}/ca.crt -subj '/CN=bench CA' ` +
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign",
    );
    await must(
      `${openssl} -keyout ${dir}/srv.key -out ${dir}/srv.crt -subj /CN=bench.test ` +
        `-CA ${dir}/ca.crt -CAkey ${dir}/ca.key -addext subjectAltName=DNS:bench.test ` +
        "-addext basicConstraints=critical,CA:FALSE",
    );
    if (noSquid === null) {
      await must(
        `${openssl} -keyout ${dir}/squid-ca.key -out ${dir}/squid-ca.crt ` +
          "-subj '/CN=bench squid CA' -addext basicConstraints=critical,CA:TRUE " +
          "-addext keyUsage=critical,keyCertSign",
      );
    }
    await must(
      `ip netns add ${ns} && ip link add ${hostEnd} type veth peer name egb${tag}n && ` +
        `ip link set egb${tag}n netns ${ns} && ip addr add ${host}/24 dev ${hostEnd} && ` +
        `ip link set ${hostEnd} up && ip -n ${ns} addr add ${address}/24 dev egb${tag}n && ` +
        `ip -n ${ns} link set egb${tag}n up && ip -n ${ns} route add default via ${host}`,
    );
    if (forwardBefore !== "1") await must(`echo 1 > ${FORWARD}`);
    await Deno.writeTextFile(
      `${dir}/server.ts`,
      `const cert = Deno.readTextFileSync("${dir}/srv.crt");
       const key = Deno.readTextFileSync("${dir}/srv.key");
       const chunk = new Uint8Array(1024 * 1024);
       Deno.serve({ hostname: "${address}", port: 443, cert, key, onListen() {} }, (req) => {
         if (new URL(req.url).pathname !== "/big") {
           return new Response(\`ok \${req.headers.get("x-bench-key") ?? "-"}\\n\`);
         }
         let left = 64;
         const body = new ReadableStream({
           pull(c) { if (left-- > 0) c.enqueue(chunk); else c.close(); },
         });
         return new Response(body, { headers: { "content-length": String(64 * 1024 * 1024) } });
       });
       console.log("listening");`,
    );
    server = await serveInNetns(
      ns,
      ["--allow-net", `--allow-read=${dir}`],
      `${dir}/server.ts`,
      "the stand-in server",
    );

    gateway = await startGateway([], {
      DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100",
      DORMICE_GATEWAY_NODE_MIN_DISK_GB: "0",
    });
    try {
      node = await startDockerNode(nodeId, gateway.url, {
        // The PEM itself: the node may read only its own data dir and the socket.
        DORMICE_EGRESS_EXTRA_CA: await Deno.readTextFile(`${dir}/ca.crt`),
        DORMICE_EGRESS_HOSTS: `bench.test=${address}`,
      });
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      return { title, reference, rows: [], notes: [], skipped: why.slice(-400) };
    }
    await waitForNodeUp(gateway.url, nodeId);
    const client = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "--allow-net=127.0.0.1",
        "--allow-env",
        "--allow-read",
        new URL("../children/egress_bench.ts", import.meta.url).pathname,
        gateway.url,
        benchToken,
        address,
        `${dir}/ca.crt`,
        String(runs),
        ...(noSquid === null ? ["squid", `${dir}/squid-ca.crt`] : []),
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const stderr = new Response(client.stderr).text();
    const lines: string[] = [];
    let squidFailed: string | undefined;
    const writer = client.stdin.getWriter();
    for await (
      const line of client.stdout.pipeThrough(new TextDecoderStream()).pipeThrough(splitLines())
    ) {
      lines.push(line);
      if (!line.startsWith('{"steer"')) continue;
      const steer: { path: string; ip: string; gateway: string }[] = JSON.parse(line).steer;
      try {
        const at = (p: string) => steer.find((s) => s.path === p)!;
        squid = await startSquid({
          gateway: at("splice").gateway,
          spliceIp: at("splice").ip,
          bumpIp: at("bump").ip,
          name: "bench.test",
          address,
          upstreamCa: await Deno.readTextFile(`${dir}/ca.crt`),
          ca: {
            cert: await Deno.readTextFile(`${dir}/squid-ca.crt`),
            key: await Deno.readTextFile(`${dir}/squid-ca.key`),
          },
        });
        await writer.write(new TextEncoder().encode("go\n"));
        await writer.close();
      } catch (error) {
        squidFailed = error instanceof Error ? error.message : String(error);
        await writer.write(new TextEncoder().encode("stop\n")).catch(() => {});
        await writer.close().catch(() => {});
      }
    }
    await writer.close().catch(() => {});
    const status = await client.status;
    if (!status.success) {
      const why = squidFailed ??
        (await stderr).trim().split("\n").slice(-3).join(" ");
      return { title, reference, rows: [], notes: [], skipped: why.slice(0, 400) };
    }
    const samples: Record<string, number[]> = JSON.parse(lines.at(-1)!);
    const logged = await squid?.logged();
    const rows = [];
    const paths = ["domain rule (SNI splice)", "header transform (TLS opened)"];
    if (squid !== undefined) {
      paths.push("squid, domain rule (peek, splice)", "squid, header added (ssl-bump)");
    }
    for (const [measure, unit] of [["first byte", "ms"], ["64 MiB download", "MiB/s"]]) {
      const direct = samples[`${measure}, direct`];
      rows.push(row(`${measure}, direct (reference)`, unit, direct, direct));
      for (const path of paths) {
        rows.push(row(`${measure}, ${path}`, unit, samples[`${measure}, ${path}`], direct));
        // The same sandbox's curl reading its whole system store (where the fleet CA is).
        const store = `${measure}, ${path}, curl trusting the system store`;
        if (samples[store] !== undefined) {
          rows.push(row(store, unit, samples[store], direct));
        }
      }
    }
    return {
      title,
      reference,
      rows,
      notes: [
        "Three sandboxes on the Debian base image, one per path, each running curl against a " +
        "Deno HTTPS server in a network namespace (bench.test, a certificate a bench CA signs): " +
        "direct egress; allowOut ['bench.test'] under denyOut ['0.0.0.0/0'] (ports 80/443 " +
        "steered to the node's egress proxy, which reads the SNI, resolves the name itself " +
        "and splices); the same with a header transform (the proxy terminates TLS with a " +
        "certificate the fleet egress CA signs and sends each request on over HTTPS).",
        "first byte: curl's time_starttransfer on a fresh connection (TCP + TLS handshake + " +
        "request), the median of 15 in a run; 64 MiB download: curl's speed_download of one " +
        "64 MiB response a run. Timed inside the sandbox, so the SDK's own round trips are not " +
        "in the figures. Each curl trusts one CA file (the bench CA; squid's; the fleet egress " +
        "CA for the header transform), as curl reads a whole system store (about 140 " +
        "certificates) on each connection; the header transform is measured that way as well, " +
        "the fleet CA being in the sandbox's system store (its row 'curl trusting the system " +
        "store').",
        noSquid !== null
          ? `squid rows left out: ${noSquid}.`
          : `squid: Debian's squid-openssl (${await squidVersion()}), one process (\`squid -N\`), ` +
            "two intercepting https_ports on the egress bridge's gateway, a sandbox with plain " +
            "egress steered to each by an iptables REDIRECT of its port 443: `ssl_bump peek " +
            "step1` then `splice` of ssl::server_name bench.test on one port; `bump` with " +
            "`request_header_add X-Bench-Key` on the other (certificates from " +
            "security_file_certgen, kept in memory; the upstream verified against the bench " +
            "CA). No caching (`cache deny all`), logging on (the access log proves the paths: " +
            `${logged?.splice} spliced connections and ${logged?.bump} bumped requests).`,
      ],
    };
  } catch (error) {
    const why = error instanceof Error ? error.message : String(error);
    return { title, reference, rows: [], notes: [], skipped: why.slice(0, 400) };
  } finally {
    await squid?.stop();
    await node?.stop();
    await gateway?.stop();
    await sh(`docker ps -aq --filter label=dormice.node=${nodeId} | xargs -r docker rm -f`);
    try {
      server?.kill("SIGKILL");
      await server?.status;
    } catch { /* exited already */ }
    await server?.stdout.cancel().catch(() => {});
    await sh(`ip netns del ${ns}; ip link del ${hostEnd}`);
    if (forwardBefore !== "1") await sh(`echo ${forwardBefore} > ${FORWARD}`);
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
}
