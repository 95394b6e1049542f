/**
 * Debian's squid-openssl as the egress bench's comparison engine: one squid process with two
 * intercepting HTTPS ports on a sandbox bridge's gateway address, `splice` (peek at the SNI,
 * splice an allowed name, terminate the rest) and `bump` (terminate TLS with a bench CA and add
 * `X-Bench-Key: k` to every request, then on over TLS verified against the stand-in's CA), and
 * the iptables rules that steer given sandboxes' port 443 to them: the same two jobs the node's
 * egress proxy does for a domain rule and a header transform. Requires root (iptables, squid's
 * own user) and the squid-openssl package (`--with-openssl`).
 *
 * @module
 */

/** Where {@linkcode startSquid} puts squid and which sandboxes it steers there. */
export interface SquidOptions {
  /** The sandbox bridge's gateway address: where a REDIRECT from the bridge delivers. */
  gateway: string;
  /** The sandbox steered to the splicing port. */
  spliceIp: string;
  /** The sandbox steered to the bumping port. */
  bumpIp: string;
  /** The one name allowed, and the address it resolves to. */
  name: string;
  address: string;
  /** The CA (PEM) the upstream's certificate is signed by. */
  upstreamCa: string;
  /** The CA (certificate and key, PEM) the bumping port signs with: the bumped sandbox trusts it. */
  ca: { cert: string; key: string };
}

/** A running squid and its steering rules. */
export interface Squid {
  /** Connections (splice) and requests (bump) squid logged on each port so far. */
  logged(): Promise<{ splice: number; bump: number }>;
  /** Removes the rules, stops squid and removes its directory. */
  stop(): Promise<void>;
}

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

/** Why squid cannot be measured here, or `null` when it can. */
export async function squidMissing(): Promise<string | null> {
  if (Deno.uid() !== 0) return "not root";
  const v = await sh("squid -v");
  if (!v.ok) return "squid is not installed (apt-get install squid-openssl)";
  if (!v.out.includes("--with-openssl")) {
    return "this squid has no OpenSSL (ssl-bump): install squid-openssl rather than squid";
  }
  if (!(await sh("test -x /usr/lib/squid/security_file_certgen")).ok) {
    return "/usr/lib/squid/security_file_certgen is missing (squid-openssl installs it)";
  }
  return null;
}

/** A port free on this machine now (the kernel's pick on loopback, released at once). */
function freePort(): number {
  const l = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (l.addr as Deno.NetAddr).port;
  l.close();
  return port;
}

/** Starts squid and steers the two sandboxes to it; throws with squid's own log on failure. */
export async function startSquid(o: SquidOptions): Promise<Squid> {
  const dir = (await must("mktemp -d /tmp/dormice-bench-squid-XXXXXX")).trim();
  const [splicePort, bumpPort, plainPort] = [freePort(), freePort(), freePort()];
  const tag = `dormice-bench-squid-${dir.slice(-6)}`;
  const rules = [
    `-t nat -I PREROUTING 1 -s ${o.spliceIp}/32 -p tcp --dport 443 -m comment --comment ${tag} ` +
    `-j REDIRECT --to-ports ${splicePort}`,
    `-t nat -I PREROUTING 1 -s ${o.bumpIp}/32 -p tcp --dport 443 -m comment --comment ${tag} ` +
    `-j REDIRECT --to-ports ${bumpPort}`,
    `-I INPUT 1 -s ${o.spliceIp}/32 -d ${o.gateway}/32 -p tcp --dport ${splicePort} ` +
    `-m conntrack --ctstate DNAT -m comment --comment ${tag} -j ACCEPT`,
    `-I INPUT 1 -s ${o.bumpIp}/32 -d ${o.gateway}/32 -p tcp --dport ${bumpPort} ` +
    `-m conntrack --ctstate DNAT -m comment --comment ${tag} -j ACCEPT`,
  ];
  const added: string[] = [];
  let child: Deno.ChildProcess | undefined;
  const stop = async () => {
    for (const r of added.reverse()) await sh(`iptables ${r.replace(/-I (\S+) 1 /, "-D $1 ")}`);
    if (child !== undefined) {
      try {
        child.kill("SIGTERM");
      } catch { /* exited already */ }
      const ended = await Promise.race([
        child.status.then(() => true),
        new Promise<false>((r) => setTimeout(() => r(false), 5_000)),
      ]);
      if (!ended) {
        try {
          child.kill("SIGKILL");
        } catch { /* exited already */ }
        await child.status;
      }
    }
    await Deno.remove(dir, { recursive: true }).catch(() => {});
  };
  try {
    await Deno.writeTextFile(`${dir}/ca.pem`, o.ca.cert);
    await Deno.writeTextFile(`${dir}/ca.key`, o.ca.key);
    await Deno.writeTextFile(`${dir}/upstream-ca.pem`, o.upstreamCa);
    await Deno.writeTextFile(`${dir}/hosts`, `${o.address} ${o.name}\n`);
    const port = (p: number, name: string) =>
      `https_port ${o.gateway}:${p} intercept ssl-bump name=${name} tls-cert=${dir}/ca.pem ` +
      `tls-key=${dir}/ca.key generate-host-certificates=on dynamic_cert_mem_cache_size=4MB`;
    await Deno.writeTextFile(
      `${dir}/squid.conf`,
      [
        `http_port 127.0.0.1:${plainPort}`,
        port(splicePort, "splice"),
        port(bumpPort, "bump"),
        `sslcrtd_program /usr/lib/squid/security_file_certgen -s ${dir}/ssl_db -M 4MB`,
        "sslcrtd_children 4 startup=1 idle=1",
        `acl sandboxes src ${o.spliceIp}/32 ${o.bumpIp}/32`,
        "acl splice_port myportname splice",
        "acl bump_port myportname bump",
        "acl step1 at_step SslBump1",
        `acl allowed ssl::server_name ${o.name}`,
        "http_access allow sandboxes",
        "http_access deny all",
        "ssl_bump peek step1",
        "ssl_bump splice splice_port allowed",
        "ssl_bump bump bump_port allowed",
        "ssl_bump terminate all",
        'request_header_add X-Bench-Key "k" bump_port',
        `tls_outgoing_options cafile=${dir}/upstream-ca.pem`,
        `hosts_file ${dir}/hosts`,
        "cache deny all",
        "cache_mem 8 MB",
        `access_log stdio:${dir}/access.log`,
        `cache_log ${dir}/cache.log`,
        `pid_filename ${dir}/squid.pid`,
        `coredump_dir ${dir}`,
        "cache_effective_user proxy",
        "pinger_enable off",
        "shutdown_lifetime 1 seconds",
        "",
      ].join("\n"),
    );
    await must(
      `/usr/lib/squid/security_file_certgen -c -s ${dir}/ssl_db -M 4MB >/dev/null && ` +
        `chmod 755 ${dir} && chown -R proxy:proxy ${dir}`,
    );
    child = new Deno.Command("squid", {
      args: ["-N", "-f", `${dir}/squid.conf`],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn();
    let exited = false;
    child.status.then(() => exited = true);
    let listening = false;
    for (let i = 0; i < 100 && !listening && !exited; i++) {
      await new Promise((r) => setTimeout(r, 200));
      const ss = await sh(`ss -ltnH 'sport = :${splicePort} or sport = :${bumpPort}'`);
      listening = ss.out.trim().split("\n").filter((l) => l.trim() !== "").length === 2;
    }
    if (!listening) {
      const log = await Deno.readTextFile(`${dir}/cache.log`).catch(() => "");
      throw new Error(
        `squid did not listen on ${o.gateway}:${splicePort} and :${bumpPort} within 20 s: ` +
          log.trim().split("\n").slice(-4).join(" | "),
      );
    }
    for (const r of rules) {
      await must(`iptables ${r}`);
      added.push(r);
    }
    return {
      async logged() {
        const log = await Deno.readTextFile(`${dir}/access.log`).catch(() => "");
        // squid's native format: time, elapsed, client, code/status, bytes, method, URL, ...
        const fields = log.split("\n").map((l) => l.trim().split(/\s+/));
        return {
          splice: fields.filter((f) => f[2] === o.spliceIp && f[3]?.startsWith("TCP_TUNNEL/"))
            .length,
          bump: fields.filter((f) => f[2] === o.bumpIp && f[5] === "GET").length,
        };
      },
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
