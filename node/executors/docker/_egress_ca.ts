/**
 * The fleet egress CA: the certificate authority the egress proxy signs a certificate with for
 * each domain whose HTTPS requests it must open to add headers (a `network.rules` transform).
 * Every sandbox with egress trusts it (its bundle at `/etc/ssl/certs/ca-certificates.crt` gets
 * it at create), and its fingerprint is part of the config digest, so a sandbox moved or
 * resumed on another node still trusts the certificates that node's proxy shows.
 *
 * Configured (`DORMICE_EGRESS_CA_CERT` and `DORMICE_EGRESS_CA_KEY`, PEM files, the same on every
 * node), or generated once into the node's data dir (`egress-ca.crt`, `egress-ca.key`), which
 * suits one node; a fleet configures one. Certificates are made with the `openssl` binary
 * (`--allow-run=openssl`), in a directory made and removed in the data dir.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { ExecutorError } from "../contract.ts";

/** Most domain certificates kept; the oldest is dropped past it (made again on its next use). */
const MAX_LEAVES = 256;

/** Where the CA is: a certificate and its key, PEM files. */
export interface EgressCaFiles {
  /** The CA certificate (PEM). */
  certFile: string;
  /** The CA's private key (PEM). */
  keyFile: string;
}

/** A domain certificate the proxy shows, signed by the CA. */
export interface LeafCertificate {
  /** The certificate chain, PEM: the domain's then the CA's. */
  cert: string;
  /** Its private key, PEM. */
  key: string;
}

async function openssl(args: string[], what: string): Promise<void> {
  let out: Deno.CommandOutput;
  try {
    out = await new Deno.Command("openssl", {
      args,
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
      signal: AbortSignal.timeout(20_000),
    }).output();
  } catch (error) {
    throw new ExecutorError(
      "unavailable",
      `The node could not run openssl to ${what} (${(error as Error).message}): install it ` +
        "(Debian: apt-get install openssl) and grant --allow-run=openssl",
    );
  }
  if (!out.success) {
    throw new ExecutorError(
      "unavailable",
      `openssl could not ${what}: ${new TextDecoder().decode(out.stderr).trim().slice(-300)}`,
    );
  }
}

/** The fleet egress CA and the domain certificates it signs. */
export class EgressCa {
  /** The CA certificate, PEM. */
  readonly certPem: string;
  /** SHA-256 of the CA certificate's PEM text, hex: what the config digest carries. */
  readonly fingerprint: string;
  #files: EgressCaFiles;
  #workDir: string;
  #leaves = new Map<string, Promise<LeafCertificate>>();

  private constructor(files: EgressCaFiles, certPem: string, workDir: string) {
    this.#files = files;
    this.#workDir = workDir;
    this.certPem = certPem.trim() + "\n";
    this.fingerprint = createHash("sha256").update(this.certPem).digest("hex");
  }

  /**
   * The configured CA (`files`), or the one in `dataDir` (generated there on first use).
   *
   * @throws {ExecutorError} `unavailable` when the files cannot be read or made.
   */
  static async load(files: EgressCaFiles | null, dataDir: string): Promise<EgressCa> {
    if (files === null) {
      files = { certFile: `${dataDir}/egress-ca.crt`, keyFile: `${dataDir}/egress-ca.key` };
      const exists = await Deno.stat(files.certFile).then(() => true, () => false);
      if (!exists) {
        await Deno.mkdir(dataDir, { recursive: true });
        const tmp = `${files.keyFile}.${crypto.randomUUID().slice(0, 8)}`;
        await openssl([
          "req",
          "-x509",
          "-newkey",
          "ec",
          "-pkeyopt",
          "ec_paramgen_curve:prime256v1",
          "-nodes",
          "-keyout",
          tmp,
          "-out",
          `${tmp}.crt`,
          "-days",
          "3650",
          "-subj",
          "/CN=dormice egress CA",
          "-addext",
          "basicConstraints=critical,CA:TRUE",
          "-addext",
          "keyUsage=critical,keyCertSign,cRLSign",
        ], "make the egress CA");
        await Deno.chmod(tmp, 0o600);
        await Deno.rename(tmp, files.keyFile);
        await Deno.rename(`${tmp}.crt`, files.certFile);
      }
    }
    let pem: string;
    try {
      pem = await Deno.readTextFile(files.certFile);
      await Deno.stat(files.keyFile);
    } catch (error) {
      throw new ExecutorError(
        "unavailable",
        `The egress CA cannot be read (${(error as Error).message}): point ` +
          "DORMICE_EGRESS_CA_CERT and DORMICE_EGRESS_CA_KEY at readable PEM files, or unset " +
          "both to have one made in DORMICE_DATA_DIR",
      );
    }
    if (!pem.includes("-----BEGIN CERTIFICATE-----")) {
      throw new ExecutorError(
        "unavailable",
        `The egress CA certificate ${files.certFile} holds no PEM certificate`,
      );
    }
    return new EgressCa(files, pem, dataDir);
  }

  /** The certificate the proxy shows for `name` (a lowercase host name), made on first use. */
  leaf(name: string): Promise<LeafCertificate> {
    const known = this.#leaves.get(name);
    if (known !== undefined) return known;
    if (this.#leaves.size >= MAX_LEAVES) this.#leaves.delete(this.#leaves.keys().next().value!);
    const made = this.#make(name);
    this.#leaves.set(name, made);
    made.catch(() => this.#leaves.delete(name));
    return made;
  }

  async #make(name: string): Promise<LeafCertificate> {
    // In the data dir, which the node may write (it may not write /tmp under `deno task node`).
    const dir = await Deno.makeTempDir({ dir: this.#workDir, prefix: "egress-leaf-" });
    try {
      await openssl([
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        `${dir}/key.pem`,
        "-out",
        `${dir}/cert.pem`,
        "-days",
        "397",
        "-subj",
        `/CN=${name}`,
        "-CA",
        this.#files.certFile,
        "-CAkey",
        this.#files.keyFile,
        "-addext",
        `subjectAltName=DNS:${name}`,
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-addext",
        "extendedKeyUsage=serverAuth",
      ], `sign a certificate for ${name}`);
      const cert = await Deno.readTextFile(`${dir}/cert.pem`);
      return {
        cert: cert.trim() + "\n" + this.certPem,
        key: await Deno.readTextFile(`${dir}/key.pem`),
      };
    } finally {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  }
}
