/**
 * `deno task fleet --domain=<domain>`'s certificate step: a local certificate authority and a
 * wildcard certificate it signs, made with openssl and kept under the fleet's data dir, so the
 * gateway can serve the sandbox domain over https (the SDKs use https for every domain that is
 * not `localhost`), and what a client must do to trust and resolve it.
 *
 * @module
 */

/** The CA's lifetime: long, so a developer trusts it once. */
const CA_DAYS = 3650;
/**
 * The server certificate's: 397 days is the longest some clients (Apple's, browsers) accept for
 * a server certificate, even under a private CA.
 */
const CERT_DAYS = 397;
/** A server certificate expiring sooner than this is made again rather than reused. */
const RENEW_BEFORE_SECONDS = 7 * 24 * 3600;

/** A bare DNS name of two labels or more, lower case, no port. */
const DOMAIN = /^(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z][a-z0-9-]{0,62}$/;

/**
 * Why `domain` cannot be a fleet's sandbox domain, or `null` when it can.
 *
 * @example
 * ```ts
 * import { domainRefusal } from "./_fleet_tls.ts";
 * domainRefusal("dormice.test"); // null
 * domainRefusal("dormice.test:8443"); // a sentence: the port comes from DORMICE_GATEWAY_PORT
 * ```
 */
export function domainRefusal(domain: string): string | null {
  if (/:\d+$/.test(domain)) {
    return `--domain=${domain} carries a port: give the bare domain, and DORMICE_GATEWAY_PORT ` +
      "for a port other than 443";
  }
  if (!DOMAIN.test(domain) || domain.length > 200) {
    return `--domain=${domain} is not a lower-case domain name: write one such as dormice.test`;
  }
  return null;
}

/** Where the fleet's CA and a domain's certificate are, as absolute paths. */
export interface FleetCertificates {
  /** The CA's certificate: what clients trust (`DENO_CERT`, `NODE_EXTRA_CA_CERTS`). */
  caFile: string;
  /** The server certificate for `*.<domain>`, `api.<domain>`, `<domain>` and 127.0.0.1. */
  certFile: string;
  /** Its private key (mode 0600). */
  keyFile: string;
  /** Whether this call made the CA (clients must trust it again) or found it. */
  madeCa: boolean;
  /** Whether this call made the server certificate or reused a valid one. */
  madeCert: boolean;
}

/** openssl is missing or refused: the sentence says which and what to do. */
export class OpensslError extends Error {
  override name = "OpensslError";
}

async function openssl(dir: string, args: string[]): Promise<{ ok: boolean; stderr: string }> {
  let out: Deno.CommandOutput;
  try {
    out = await new Deno.Command("openssl", {
      args,
      cwd: dir,
      stdin: "null",
      stdout: "null",
      stderr: "piped",
    }).output();
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new OpensslError(
        "openssl is not installed, and --domain needs it to make the fleet's certificate " +
          "authority: apt-get install openssl (or brew install openssl), then run again",
      );
    }
    throw error;
  }
  return { ok: out.success, stderr: new TextDecoder().decode(out.stderr).trim() };
}

async function must(dir: string, args: string[]): Promise<void> {
  const { ok, stderr } = await openssl(dir, args);
  if (!ok) throw new OpensslError(`openssl ${args.slice(0, 2).join(" ")} failed: ${stderr}`);
}

async function exists(path: string): Promise<boolean> {
  try {
    await Deno.stat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/**
 * Makes, or reuses, a CA for `domain` and a certificate it signs, under `dir/<domain>/`
 * (`ca.pem`, `ca.key`, `cert.pem`, `key.pem`). The CA may sign names under that domain (and
 * loopback addresses) only, so trusting it system-wide vouches for nothing else; it is kept as
 * long as it is valid, so a client trusts it once; the certificate is made again when it is missing, not signed by that
 * CA, not valid for `api.<domain>` and a name under `*.<domain>`, or expiring within a week.
 * Keys are EC P-256 and readable by the owner only. `dir` must be absolute.
 *
 * Requires `--allow-run=openssl` and read/write on `dir`.
 *
 * @throws {OpensslError} when openssl is missing or fails.
 *
 * @example
 * ```ts ignore
 * import { ensureFleetCertificates } from "./_fleet_tls.ts";
 * const certs = await ensureFleetCertificates("/repo/.dormice/fleet/tls", "dormice.test");
 * console.log(certs.caFile); // /repo/.dormice/fleet/tls/dormice.test/ca.pem
 * ```
 */
export async function ensureFleetCertificates(
  dir: string,
  domain: string,
): Promise<FleetCertificates> {
  const refusal = domainRefusal(domain);
  if (refusal !== null) throw new RangeError(refusal);
  const domainDir = `${dir}/${domain}`;
  await Deno.mkdir(domainDir, { recursive: true, mode: 0o700 });
  const caFile = `${domainDir}/ca.pem`;
  const caKey = `${domainDir}/ca.key`;
  const certFile = `${domainDir}/cert.pem`;
  const keyFile = `${domainDir}/key.pem`;
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

  const caValid = await exists(caFile) && await exists(caKey) &&
    (await openssl(dir, ["x509", "-in", caFile, "-noout", "-checkend", "86400"])).ok;
  if (!caValid) {
    await must(dir, [
      "req",
      "-x509",
      ...ec,
      "-keyout",
      caKey,
      "-out",
      caFile,
      "-days",
      String(CA_DAYS),
      "-subj",
      "/CN=Dormice fleet development CA",
      "-addext",
      "basicConstraints=critical,CA:TRUE,pathlen:0",
      "-addext",
      "keyUsage=critical,keyCertSign,cRLSign",
      "-addext",
      `nameConstraints=critical,permitted;DNS:${domain},permitted;IP:127.0.0.0/255.0.0.0`,
    ]);
    await Deno.chmod(caKey, 0o600);
  }

  // `verify` checks the chain and the validity dates; the two names are the two kinds the SDK
  // reaches: the control plane and a sandbox's port.
  const verifies = async (name: string) =>
    (await openssl(dir, [
      "verify",
      "-CAfile",
      caFile,
      "-verify_hostname",
      name,
      certFile,
    ])).ok;
  const certValid = caValid && await exists(certFile) && await exists(keyFile) &&
    await verifies(`api.${domain}`) && await verifies(`49983-probe.${domain}`) &&
    (await openssl(dir, [
      "x509",
      "-in",
      certFile,
      "-noout",
      "-checkend",
      `${RENEW_BEFORE_SECONDS}`,
    ]))
      .ok;
  if (!certValid) {
    const csr = `${domainDir}/cert.csr`;
    const ext = `${domainDir}/cert.ext`;
    await must(dir, ["req", ...ec, "-keyout", keyFile, "-out", csr, "-subj", `/CN=*.${domain}`]);
    await Deno.chmod(keyFile, 0o600);
    // 127.0.0.1 too: the fleet itself and its nodes reach the gateway by address.
    await Deno.writeTextFile(
      ext,
      `subjectAltName=DNS:*.${domain},DNS:api.${domain},DNS:${domain},IP:127.0.0.1\n` +
        "extendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n" +
        "basicConstraints=critical,CA:FALSE\n",
    );
    await must(dir, [
      "x509",
      "-req",
      "-in",
      csr,
      "-CA",
      caFile,
      "-CAkey",
      caKey,
      "-CAcreateserial",
      "-out",
      certFile,
      "-days",
      String(CERT_DAYS),
      "-extfile",
      ext,
    ]);
    await Deno.remove(csr);
  }
  return { caFile, certFile, keyFile, madeCa: !caValid, madeCert: !certValid };
}

/** What {@linkcode domainInstructions} describes. */
export interface DomainInstructionsOptions {
  domain: string;
  /** The gateway's https port: 443, or another that then rides in the domain. */
  port: number;
  /** Why the gateway is not on 443, when it is not. */
  not443?: string;
  certs: FleetCertificates;
  apiKey: string;
  /** The team the key was minted for. */
  team: string;
}

/**
 * How `deno task fleet --domain` tells a client to reach it, the only client settings it prints:
 * how to trust the CA, which names must resolve to the gateway, and the SDK's two variables.
 *
 * @example
 * ```ts ignore
 * import { domainInstructions } from "./_fleet_tls.ts";
 * console.log(domainInstructions({ domain: "dormice.test", port: 443, certs, apiKey }).join("\n"));
 * ```
 */
export function domainInstructions(options: DomainInstructionsOptions): string[] {
  const { domain, port, certs, apiKey } = options;
  // The SDK builds https://<port>-<id>.<E2B_DOMAIN> and https://api.<E2B_DOMAIN>: a port other
  // than 443 has to ride in the domain, or the SDK knocks on 443.
  const sdkDomain = port === 443 ? domain : `${domain}:${port}`;
  return [
    `Point a client at the sandbox domain ${sdkDomain}, served over https with the fleet's own CA` +
    (certs.madeCa ? " (made just now)" : "") + ":",
    ...(port === 443 ? [] : [
      `  The gateway is on ${port}, not 443${options.not443 ? ` (${options.not443})` : ""}.`,
      `  The SDK builds https://<port>-<id>.<domain> with no port, so the port rides in the`,
      `  domain below; for the bare domain run as root, or with DORMICE_GATEWAY_PORT=443 and`,
      `  CAP_NET_BIND_SERVICE.`,
    ]),
    "Trust the CA in each client (Deno, Node.js, Python's httpx; REQUESTS_CA_BUNDLE for requests):",
    `  export DENO_CERT=${certs.caFile}`,
    `  export NODE_EXTRA_CA_CERTS=${certs.caFile}`,
    `  export SSL_CERT_FILE=${certs.caFile}`,
    "  or system-wide (Debian): " +
    `cp ${certs.caFile} /usr/local/share/ca-certificates/dormice-fleet.crt && update-ca-certificates`,
    `Resolve api.${domain} and *.${domain} to the gateway, 127.0.0.1:`,
    `  a DNS server with a wildcard, e.g. dnsmasq: address=/${domain}/127.0.0.1`,
    `  or /etc/hosts (no wildcards there): one line per name, added as sandboxes appear:`,
    `    127.0.0.1 api.${domain}`,
    `    127.0.0.1 49983-<sandboxId>.${domain} 8000-<sandboxId>.${domain}`,
    `  for a real domain: DNS records api.${domain} and *.${domain} pointing at the gateway`,
    `Then the SDK needs only these two (an API key of team '${options.team}', minted just now;`,
    "leave E2B_API_URL and E2B_SANDBOX_URL unset, or the SDK's signed file URLs cannot be routed):",
    `  export E2B_DOMAIN=${sdkDomain}`,
    `  export E2B_API_KEY=${apiKey}`,
  ];
}
