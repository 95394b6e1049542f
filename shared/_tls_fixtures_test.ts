// Test-only: a certificate authority made with openssl and a certificate it signs, for tests
// that serve HTTPS. Named *_test.ts so publishing excludes it; it holds no tests itself.

/** A CA and one server certificate (PEM text), and the directory they were written to. */
export interface TestCertificates {
  /** The CA's certificate: trust it (`caCerts`, `DENO_CERT`). */
  ca: string;
  /** The server's certificate chain. */
  cert: string;
  /** The server's private key. */
  key: string;
  /** Where the PEM files are (`ca.pem`, `cert.pem`, `key.pem`). */
  dir: string;
}

/** Why openssl cannot make certificates here (not installed, does not run), or null. */
export async function opensslMissing(): Promise<string | null> {
  try {
    const out = await new Deno.Command("openssl", { args: ["version"], stdout: "null" }).output();
    return out.success ? null : "openssl does not run";
  } catch {
    return "openssl is not installed";
  }
}

/**
 * The gateway's variables that serve `domain` over TLS with `certs`' certificate (its files
 * must be readable by the gateway: start it with `dir: certs.dir`).
 */
export function domainTlsEnv(certs: TestCertificates, domain: string): Record<string, string> {
  return {
    DORMICE_SANDBOX_DOMAIN: domain,
    DORMICE_GATEWAY_TLS_CERT: `${certs.dir}/cert.pem`,
    DORMICE_GATEWAY_TLS_KEY: `${certs.dir}/key.pem`,
  };
}

async function openssl(dir: string, args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", { args, cwd: dir, stdout: "null", stderr: "piped" })
    .output();
  if (!out.success) {
    throw new Error(`openssl ${args[0]} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
}

/**
 * Makes a fresh CA and a certificate for `names` (DNS names, wildcards allowed) and 127.0.0.1.
 * Requires `--allow-run=openssl` and read/write on a temporary directory.
 */
export async function makeCertificates(names: string[]): Promise<TestCertificates> {
  const dir = await Deno.makeTempDir({ prefix: "dormice-tls-" });
  await openssl(dir, [
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
    "ca.key",
    "-out",
    "ca.pem",
    "-days",
    "2",
    "-subj",
    "/CN=dormice test CA",
    "-addext",
    "basicConstraints=critical,CA:TRUE",
    "-addext",
    "keyUsage=critical,keyCertSign",
  ]);
  await openssl(dir, [
    "req",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
    "key.pem",
    "-out",
    "server.csr",
    "-subj",
    `/CN=${names[0]}`,
  ]);
  const san = [...names.map((n) => `DNS:${n}`), "IP:127.0.0.1"].join(",");
  await Deno.writeTextFile(
    `${dir}/ext.cnf`,
    `subjectAltName=${san}\nextendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n`,
  );
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    "server.csr",
    "-CA",
    "ca.pem",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    "cert.pem",
    "-days",
    "2",
    "-extfile",
    "ext.cnf",
  ]);
  const read = (f: string) => Deno.readTextFile(`${dir}/${f}`);
  return {
    ca: await read("ca.pem"),
    cert: await read("cert.pem"),
    key: await read("key.pem"),
    dir,
  };
}
