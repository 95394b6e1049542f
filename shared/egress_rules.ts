/**
 * A sandbox's egress address rules (E2B's `network.allowOut` / `network.denyOut`): IPv4
 * addresses and CIDRs, read and checked once for every face, and the rule that decides a
 * destination. As E2B's firewall does: an address matched by `allowOut` is allowed whatever
 * `denyOut` says (an allow wins over any deny, broader or not); an address matched by `denyOut`
 * and no allow is refused; anything else is allowed. `denyOut: ["0.0.0.0/0"]` with a few
 * `allowOut` entries is therefore "nothing but these".
 *
 * Domain names (`example.com`, `*.example.com`), ports (`1.2.3.4:443`) and IPv6 are shapes the
 * SDK can send that this fleet does not serve yet: each is a refusal naming the entry, never a
 * rule silently dropped.
 *
 * @module
 */
import { z } from "zod";

/** The destination that stands for every IPv4 address (the SDK's `ALL_TRAFFIC`). */
export const ALL_TRAFFIC = "0.0.0.0/0";

/** Most entries in one list: each is a kernel rule the node writes one by one. */
export const MAX_EGRESS_RULES = 100;

/** A sandbox's address rules, each entry a canonical IPv4 CIDR (`a.b.c.d/n`, host bits 0). */
export interface EgressRules {
  /** Destinations allowed even where `denyOut` would refuse them. */
  allowOut: string[];
  /** Destinations refused unless `allowOut` allows them. */
  denyOut: string[];
}

/** What an entry that is not an IPv4 address or CIDR is, for its refusal. */
const DOMAIN = /^(?:\*\.)?(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)*[A-Za-z][A-Za-z0-9-]*$/;

/**
 * Reads one entry into a canonical CIDR, or a sentence saying what is wrong with it.
 *
 * @example
 * ```ts
 * import { parseEgressEntry } from "./egress_rules.ts";
 * parseEgressEntry("8.8.8.8"); // { ok: true, cidr: "8.8.8.8/32" }
 * parseEgressEntry("10.1.2.3/8"); // { ok: true, cidr: "10.0.0.0/8" }
 * ```
 */
export function parseEgressEntry(
  entry: string,
): { ok: true; cidr: string } | { ok: false; why: string } {
  const text = entry.trim();
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?:\/(\d{1,2}))?$/.exec(text);
  if (m) {
    const octets = m.slice(1, 5).map(Number);
    if (octets.some((o, i) => o > 255 || (m[i + 1].length > 1 && m[i + 1].startsWith("0")))) {
      return { ok: false, why: "is not an IPv4 address (four numbers 0-255, no leading zeros)" };
    }
    const bits = m[5] === undefined ? 32 : Number(m[5]);
    if (bits > 32 || (m[5] !== undefined && m[5].length > 1 && m[5].startsWith("0"))) {
      return { ok: false, why: "has a prefix length outside 0-32" };
    }
    const value = octets.reduce((acc, o) => acc * 256 + o, 0);
    // 0.0.0.0 alone is no destination (E2B refuses it too); 0.0.0.0/0 is every one.
    if (value === 0 && bits !== 0) {
      return {
        ok: false,
        why: `is the unspecified address: write ${ALL_TRAFFIC} for every address`,
      };
    }
    const size = 2 ** (32 - bits);
    const base = Math.floor(value / size) * size;
    const canonical = [24, 16, 8, 0].map((s) => Math.floor(base / 2 ** s) % 256).join(".");
    return { ok: true, cidr: `${canonical}/${bits}` };
  }
  if (text.includes(":") && /^[0-9A-Fa-f:.[\]/]+$/.test(text) && text.split(":").length > 2) {
    return {
      ok: false,
      why: "is an IPv6 address: sandboxes here have IPv4 egress only, so write IPv4 rules",
    };
  }
  if (/^[^:]+:\d*(?:-\d+)?$/.test(text)) {
    return {
      ok: false,
      why: "names a port: rules by port are not served on this fleet yet, so write the " +
        "address or CIDR alone (every port)",
    };
  }
  if (DOMAIN.test(text)) {
    return {
      ok: false,
      why: "is a domain name: domain rules are not served on this fleet yet, so write the " +
        "IPv4 addresses or CIDRs the domain uses",
    };
  }
  return { ok: false, why: "is not an IPv4 address or CIDR such as 8.8.8.8 or 10.0.0.0/8" };
}

/**
 * Reads a list of entries for `field` (e.g. `network.allowOut`) into canonical CIDRs, duplicates
 * dropped, or the sentence of the first bad entry naming the field and its index.
 *
 * @example
 * ```ts
 * import { parseEgressList } from "./egress_rules.ts";
 * parseEgressList(["1.1.1.1", "1.1.1.1/32"], "network.allowOut"); // { ok: true, cidrs: ["1.1.1.1/32"] }
 * ```
 */
export function parseEgressList(
  entries: readonly unknown[],
  field: string,
): { ok: true; cidrs: string[] } | { ok: false; error: string } {
  if (entries.length > MAX_EGRESS_RULES) {
    return {
      ok: false,
      error: `'${field}' has ${entries.length} entries, more than the ${MAX_EGRESS_RULES} a ` +
        "sandbox may have: join neighbouring addresses into CIDRs",
    };
  }
  const cidrs: string[] = [];
  for (const [i, entry] of entries.entries()) {
    if (typeof entry !== "string") {
      return { ok: false, error: `'${field}[${i}]' must be a string such as '8.8.8.8'` };
    }
    const r = parseEgressEntry(entry);
    if (!r.ok) return { ok: false, error: `'${field}[${i}]' '${entry.slice(0, 80)}' ${r.why}` };
    if (!cidrs.includes(r.cidr)) cidrs.push(r.cidr);
  }
  return { ok: true, cidrs };
}

/**
 * Whether `rules` let a sandbox reach `address` (an IPv4 address): allowed by `allowOut`, else
 * refused by `denyOut`, else allowed. The kernel rules the Docker executor writes decide the
 * same way; this is their reference, for tests and for the fake executor.
 *
 * @example
 * ```ts
 * import { egressAllows } from "./egress_rules.ts";
 * const rules = { allowOut: ["198.18.0.1/32"], denyOut: ["0.0.0.0/0"] };
 * egressAllows(rules, "198.18.0.1"); // true
 * egressAllows(rules, "198.18.0.2"); // false
 * ```
 */
export function egressAllows(rules: EgressRules, address: string): boolean {
  const r = parseEgressEntry(address);
  if (!r.ok) throw new TypeError(`Cannot judge '${address}' as it ${r.why}`);
  const value = toNumber(r.cidr);
  const within = (cidr: string) => {
    const bits = Number(cidr.split("/")[1]);
    const size = 2 ** (32 - bits);
    return Math.floor(value / size) === Math.floor(toNumber(cidr) / size);
  };
  if (rules.allowOut.some(within)) return true;
  return !rules.denyOut.some(within);
}

function toNumber(cidr: string): number {
  return cidr.split("/")[0].split(".").reduce((acc, o) => acc * 256 + Number(o), 0);
}

/** The wire shape of {@linkcode EgressRules} before it is read: lists of entries as sent. */
export interface EgressRulesInput {
  /** Addresses (CIDR, IP or host name) the sandbox may reach, as sent. */
  allowOut?: string[];
  /** Addresses it may not reach, as sent. */
  denyOut?: string[];
}

const listSchema = z.array(z.string().max(256)).max(MAX_EGRESS_RULES, {
  message: `at most ${MAX_EGRESS_RULES} entries: join neighbouring addresses into CIDRs`,
});

/**
 * Native `spec.egressRules`: `{allowOut?, denyOut?}` read into canonical CIDRs; a bad entry is
 * an issue at its own path (`egressRules.allowOut.0`) saying what is wrong with it.
 */
export const egressRulesSchema: z.ZodType<EgressRules, EgressRulesInput> = z.object({
  allowOut: listSchema.optional(),
  denyOut: listSchema.optional(),
}).strict().transform((value, ctx) => {
  const out: EgressRules = { allowOut: [], denyOut: [] };
  for (const key of ["allowOut", "denyOut"] as const) {
    for (const [i, entry] of (value[key] ?? []).entries()) {
      const r = parseEgressEntry(entry);
      if (!r.ok) {
        ctx.addIssue({
          code: "custom",
          path: [key, i],
          message: `'${entry.slice(0, 80)}' ${r.why}`,
        });
      } else if (!out[key].includes(r.cidr)) out[key].push(r.cidr);
    }
  }
  return out;
});

/**
 * Whether an E2B create body asks for address rules the node must enforce, as the node reads
 * it: any `network.allowOut` entry, or `network.denyOut` entries other than a deny of every
 * address (which alone is a sandbox without egress). For placement; the node checks the rest.
 *
 * @example
 * ```ts
 * import { asksForEgressRules } from "./egress_rules.ts";
 * asksForEgressRules({ network: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] } }); // true
 * asksForEgressRules({ network: { denyOut: ["0.0.0.0/0"] } }); // false
 * ```
 */
export function asksForEgressRules(body: Record<string, unknown>): boolean {
  const network = body.network;
  if (typeof network !== "object" || network === null) return false;
  const list = (v: unknown) =>
    Array.isArray(v) ? v.map((e) => (typeof e === "string" ? e.trim() : e)) : [];
  const { allowOut, denyOut } = network as { allowOut?: unknown; denyOut?: unknown };
  if (list(allowOut).length > 0) return true;
  const deny = list(denyOut);
  return deny.length > 0 && !deny.includes(ALL_TRAFFIC);
}
