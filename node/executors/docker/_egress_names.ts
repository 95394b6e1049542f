/**
 * What the egress proxy reads and judges of a sandbox's connection before it goes anywhere: the
 * TLS SNI of a ClientHello, the `Host` of an HTTP request head, the name cleaned, and the verdict
 * of a sandbox's rules on a name (and on the address it resolved to).
 *
 * @module
 */
import {
  domainMatches,
  egressAllows,
  type EgressRules,
  parseEgressEntry,
} from "../../../shared/egress_rules.ts";

/** What the proxy decides for a name under a sandbox's rules. */
export type Verdict = "allow" | "deny" | "address";

/**
 * How `rules` judge the host name `name`: allowed by a domain in `allowDomains`, refused by one
 * in `denyDomains`, else left to the address it resolves to (`"address"`).
 *
 * @example
 * ```ts
 * import { judgeName } from "./_egress_names.ts";
 * judgeName({ allowOut: [], denyOut: ["0.0.0.0/0"], allowDomains: ["*.a.test"] }, "x.a.test"); // "allow"
 * ```
 */
export function judgeName(rules: EgressRules, name: string): Verdict {
  if (rules.allowDomains?.some((p) => domainMatches(p, name))) return "allow";
  if (rules.denyDomains?.some((p) => domainMatches(p, name))) return "deny";
  return "address";
}

/**
 * The server name of a TLS ClientHello record (`data` starting with the record header), `""`
 * for a hello without one, `null` when `data` is not a whole ClientHello record yet, or
 * `undefined` when it is not TLS at all.
 */
export function sniOf(data: Uint8Array): string | null | undefined {
  if (data.length < 1 || data[0] !== 0x16) return undefined;
  if (data.length < 5) return null;
  const end = 5 + ((data[3] << 8) | data[4]);
  if (data.length < end) return null;
  let p = 5;
  const need = (n: number) => p + n <= end;
  if (!need(4) || data[p] !== 1) return undefined;
  p += 4 + 2 + 32;
  if (!need(1)) return undefined;
  p += 1 + data[p];
  if (!need(2)) return undefined;
  p += 2 + ((data[p] << 8) | data[p + 1]);
  if (!need(1)) return undefined;
  p += 1 + data[p];
  if (!need(2)) return "";
  const extEnd = Math.min(end, p + 2 + ((data[p] << 8) | data[p + 1]));
  p += 2;
  while (p + 4 <= extEnd) {
    const type = (data[p] << 8) | data[p + 1];
    const len = (data[p + 2] << 8) | data[p + 3];
    p += 4;
    if (type === 0 && p + 5 <= extEnd) {
      const nameLen = (data[p + 3] << 8) | data[p + 4];
      if (data[p + 2] !== 0 || p + 5 + nameLen > extEnd) return undefined;
      return new TextDecoder().decode(data.subarray(p + 5, p + 5 + nameLen));
    }
    p += len;
  }
  return "";
}

/**
 * The `Host` of an HTTP request head in `data`, without its port; `null` when the head is not
 * complete yet, `undefined` when it has no Host or is not HTTP.
 */
export function hostOf(data: Uint8Array): string | null | undefined {
  const text = new TextDecoder("latin1").decode(data);
  const end = text.indexOf("\r\n\r\n");
  if (end < 0) return /^[A-Z]{3,10} /.test(text) || text.length < 10 ? null : undefined;
  const m = /\r\nhost:[ \t]*([^\r\n]*)/i.exec(text.slice(0, end + 2));
  if (!m) return undefined;
  return m[1].trim().replace(/:\d+$/, "");
}

/** Lowercase, no trailing dot; `null` for what is no host name or IPv4 address. */
export function cleanName(name: string): string | null {
  const n = name.toLowerCase().replace(/\.$/, "");
  return /^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$/.test(n) ? n : null;
}

/** Whether `name` is an IPv4 literal. */
export function isIpv4(name: string): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(name) && parseEgressEntry(name).ok;
}

/** Whether `rules` let a sandbox reach `name` at `ip` (judged by name, else by address). */
export function allows(rules: EgressRules, name: string, ip: string): boolean {
  const verdict = isIpv4(name) ? "address" : judgeName(rules, name);
  return verdict === "allow" || (verdict === "address" && egressAllows(rules, ip));
}
