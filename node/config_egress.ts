/**
 * The node's egress proxy settings (domain rules and header transforms), read from the
 * environment with refusals an operator can act on.
 *
 * | variable | default | meaning |
 * |---|---|---|
 * | `DORMICE_EGRESS_CA_CERT` | unset | the fleet egress CA certificate (PEM file), the same on every node; with `DORMICE_EGRESS_CA_KEY` |
 * | `DORMICE_EGRESS_CA_KEY` | unset | the fleet egress CA's private key (PEM file); both unset: one is made in `DORMICE_DATA_DIR` (`egress-ca.crt`, `egress-ca.key`) |
 * | `DORMICE_EGRESS_EXTRA_CA` | unset | more CA certificates the proxy trusts for upstreams of header transforms (besides Deno's root store): a PEM file's path, or the PEM text itself |
 * | `DORMICE_EGRESS_HOSTS` | unset | `name=IPv4,…`: names the proxy resolves to these addresses rather than asking DNS (private upstreams, tests) |
 * | `DORMICE_SANDBOX_DNS` | unset | `IPv4,…`: the DNS servers sandboxes with egress ask (the engine's resolver in each forwards to them); unset: the engine's choice, the host's resolvers |
 *
 * @module
 */
import { parseEgressEntry } from "../shared/egress_rules.ts";

/** What the egress variables say. */
export interface EgressSettings {
  /** The configured CA files, or `null` for one made in the data dir. */
  ca: { certFile: string; keyFile: string } | null;
  /** The extra upstream CA certificates, PEM, one per entry. */
  extraCa: string[];
  /** Names resolved by the proxy itself. */
  hosts: Map<string, string>;
  /** The resolvers sandboxes with egress ask; empty for the engine's. */
  sandboxDns: string[];
}

/** The names this file reads (for allow-lists). */
export const EGRESS_VARIABLES = [
  "DORMICE_EGRESS_CA_CERT",
  "DORMICE_EGRESS_CA_KEY",
  "DORMICE_EGRESS_EXTRA_CA",
  "DORMICE_EGRESS_HOSTS",
  "DORMICE_SANDBOX_DNS",
];

/**
 * Reads the egress settings through `get`; a list of refusals when one is wrong.
 *
 * @example
 * ```ts
 * import { readEgressSettings } from "./config_egress.ts";
 * const r = readEgressSettings((name) => ({ DORMICE_EGRESS_HOSTS: "a.test=198.18.0.2" })[name]);
 * if (!Array.isArray(r)) r.hosts.get("a.test"); // "198.18.0.2"
 * ```
 */
export function readEgressSettings(
  get: (name: string) => string | undefined,
): EgressSettings | string[] {
  const refusals: string[] = [];
  const certFile = get("DORMICE_EGRESS_CA_CERT");
  const keyFile = get("DORMICE_EGRESS_CA_KEY");
  if ((certFile === undefined) !== (keyFile === undefined)) {
    refusals.push(
      "DORMICE_EGRESS_CA_CERT and DORMICE_EGRESS_CA_KEY go together: set both (the fleet " +
        "egress CA's certificate and key, PEM files) or neither (one is made in DORMICE_DATA_DIR)",
    );
  }
  const extraCa: string[] = [];
  const extraFile = get("DORMICE_EGRESS_EXTRA_CA");
  if (extraFile !== undefined) {
    try {
      const text = extraFile.trimStart().startsWith("-----BEGIN")
        ? extraFile
        : Deno.readTextFileSync(extraFile);
      extraCa.push(
        ...text.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [],
      );
      if (extraCa.length === 0) throw new Error("it holds no PEM certificate");
    } catch (error) {
      refusals.push(
        `DORMICE_EGRESS_EXTRA_CA='${extraFile.slice(0, 80)}' cannot be used ` +
          `(${(error as Error).message}): point it at a readable PEM file of CA certificates, ` +
          "or set it to the PEM text",
      );
    }
  }
  const hosts = new Map<string, string>();
  for (const pair of (get("DORMICE_EGRESS_HOSTS") ?? "").split(",")) {
    if (pair.trim() === "") continue;
    const [name, ip] = pair.split("=").map((x) => x.trim());
    const address = parseEgressEntry(ip ?? "");
    if (!name || !address.ok || !address.cidr.endsWith("/32")) {
      refusals.push(
        `DORMICE_EGRESS_HOSTS entry '${pair.slice(0, 80)}' is not name=IPv4 (e.g. ` +
          "api.internal=10.0.0.7)",
      );
      continue;
    }
    hosts.set(name.toLowerCase().replace(/\.$/, ""), address.cidr.slice(0, -3));
  }
  const sandboxDns: string[] = [];
  for (const entry of (get("DORMICE_SANDBOX_DNS") ?? "").split(",")) {
    if (entry.trim() === "") continue;
    const address = parseEgressEntry(entry.trim());
    if (!address.ok || !address.cidr.endsWith("/32")) {
      refusals.push(
        `DORMICE_SANDBOX_DNS entry '${entry.slice(0, 80)}' is not an IPv4 address (e.g. ` +
          "DORMICE_SANDBOX_DNS=10.0.0.53,10.0.0.54)",
      );
      continue;
    }
    sandboxDns.push(address.cidr.slice(0, -3));
  }
  if (refusals.length > 0) return refusals;
  return {
    sandboxDns,
    ca: certFile && keyFile ? { certFile, keyFile } : null,
    extraCa,
    hosts,
  };
}
