/**
 * A sandbox's egress rules (E2B's `network.allowOut` / `network.denyOut` / `network.rules`):
 * IPv4 addresses and CIDRs, domain names (`example.com`, `*.example.com`) and per-domain header
 * transforms, read and checked once for every face, and the rule that decides a destination. As E2B's firewall does: an address matched by `allowOut` is allowed whatever
 * `denyOut` says (an allow wins over any deny, broader or not); an address matched by `denyOut`
 * and no allow is refused; anything else is allowed. `denyOut: ["0.0.0.0/0"]` with a few
 * `allowOut` entries is therefore "nothing but these".
 *
 * A domain entry is judged by the name the sandbox asks for on ports 80 and 443 (the HTTP Host,
 * the TLS SNI), which the node's egress proxy reads and resolves itself; `*.example.com` matches
 * every subdomain at any depth and not `example.com` itself. Ports (`1.2.3.4:443`) and IPv6
 * are shapes the SDK can send that this fleet does not serve: each is a refusal naming the
 * entry, never a rule silently dropped.
 *
 * @module
 */
import { z } from "zod";

/** The destination that stands for every IPv4 address (the SDK's `ALL_TRAFFIC`). */
export const ALL_TRAFFIC = "0.0.0.0/0";

/** Most entries in one list: each is a kernel rule the node writes one by one. */
export const MAX_EGRESS_RULES = 100;

/** Most domains with header transforms, and most headers one domain's rules set. */
export const MAX_TRANSFORM_DOMAINS = 100;
const MAX_TRANSFORM_HEADERS = 50;

/** What a transform rule does to a matching HTTPS request (E2B's `SandboxNetworkTransform`). */
export interface EgressTransform {
  /** Headers set on the request, each replacing a header of that name the request carries. */
  headers?: Record<string, string>;
}

/**
 * A sandbox's egress rules: address entries as canonical IPv4 CIDRs (`a.b.c.d/n`, host bits
 * 0), domain entries lowercase (`example.com`, `*.example.com`), both lists absent when empty.
 */
export interface EgressRules {
  /** Destinations allowed even where `denyOut` would refuse them. */
  allowOut: string[];
  /** Destinations refused unless `allowOut` allows them. */
  denyOut: string[];
  /** Domains allowed (by Host / SNI) even where `denyOut` would refuse their addresses. */
  allowDomains?: string[];
  /** Domains refused (by Host / SNI) unless `allowDomains` allows them. */
  denyDomains?: string[];
  /**
   * Header transforms by domain pattern (E2B's `network.rules`), applied in order to HTTPS
   * requests for a matching name: an exact name wins over wildcards, then the longest
   * wildcard; rule sets are not merged. They grant no access of their own.
   */
  transforms?: Record<string, EgressTransform[]>;
}

/** Whether `rules` need the egress proxy: a domain entry or a header transform. */
export function needsEgressProxy(rules: EgressRules): boolean {
  return (rules.allowDomains?.length ?? 0) > 0 || (rules.denyDomains?.length ?? 0) > 0 ||
    Object.keys(rules.transforms ?? {}).length > 0;
}

/**
 * Whether the domain pattern `pattern` (`example.com` or `*.example.com`) matches the host
 * name `name` (lowercase, no trailing dot): a wildcard matches subdomains at any depth, never
 * the apex.
 *
 * @example
 * ```ts
 * import { domainMatches } from "./egress_rules.ts";
 * domainMatches("*.example.com", "a.b.example.com"); // true
 * domainMatches("*.example.com", "example.com"); // false
 * ```
 */
export function domainMatches(pattern: string, name: string): boolean {
  if (pattern.startsWith("*.")) return name.endsWith(pattern.slice(1));
  return pattern === name;
}

/** The port HTTPS goes to when a URL names none: a transform key without a port applies here too. */
export const HTTPS_PORT = 443;

/** Most ports other than 443 one sandbox's transform keys may name (each is a proxy listener). */
export const MAX_TRANSFORM_PORTS = 8;

/** A canonical transform key (`api.example.com`, `*.example.com:8443`) split at its port. */
function splitKey(key: string): { pattern: string; port: number | null } {
  const m = /^(.*):(\d+)$/.exec(key);
  return m ? { pattern: m[1], port: Number(m[2]) } : { pattern: key, port: null };
}

/**
 * The transform rules for `name` reached on `port` under `transforms`. A key with a port
 * (`api.example.com:8443`) applies to that port only; one without, to any port. The exact
 * name's rules win (with the port before without), else the longest matching wildcard's (E2B's
 * precedence; with the port before without at the same length), else none. Rule sets are not
 * merged.
 *
 * @example
 * ```ts
 * import { transformsFor } from "./egress_rules.ts";
 * const t = { "api.example.com": [{ headers: { a: "any" } }], "api.example.com:8443": [{ headers: { a: "8443" } }] };
 * transformsFor(t, "api.example.com", 8443); // [{ headers: { a: "8443" } }]
 * transformsFor(t, "api.example.com", 443); // [{ headers: { a: "any" } }]
 * ```
 */
export function transformsFor(
  transforms: Record<string, EgressTransform[]> | undefined,
  name: string,
  port: number = HTTPS_PORT,
): EgressTransform[] | undefined {
  if (transforms === undefined) return undefined;
  const withPort = `${name}:${port}`;
  if (Object.hasOwn(transforms, withPort)) return transforms[withPort];
  if (Object.hasOwn(transforms, name)) return transforms[name];
  let best: string | undefined;
  let bestLength = -1;
  let bestPorted = false;
  for (const key of Object.keys(transforms)) {
    const k = splitKey(key);
    if (!k.pattern.startsWith("*.") || (k.port !== null && k.port !== port)) continue;
    if (!domainMatches(k.pattern, name)) continue;
    const ported = k.port !== null;
    if (
      k.pattern.length > bestLength || (k.pattern.length === bestLength && ported && !bestPorted)
    ) {
      best = key;
      bestLength = k.pattern.length;
      bestPorted = ported;
    }
  }
  return best === undefined ? undefined : transforms[best];
}

/**
 * The ports other than 443 that `transforms`' keys name, ascending: the node steers the
 * sandbox's connections to them through its egress proxy as it does 80 and 443.
 *
 * @example
 * ```ts
 * import { transformPorts } from "./egress_rules.ts";
 * transformPorts({ "a.example.com:8443": [], "b.example.com": [], "c.example.com:443": [] }); // [8443]
 * ```
 */
export function transformPorts(
  transforms: Record<string, EgressTransform[]> | undefined,
): number[] {
  const ports = new Set<number>();
  for (const key of Object.keys(transforms ?? {})) {
    const { port } = splitKey(key);
    if (port !== null && port !== HTTPS_PORT) ports.add(port);
  }
  return [...ports].sort((a, b) => a - b);
}

/**
 * Reads a domain entry (`Example.COM.`, `*.example.com`) into its lowercase pattern, or `null`
 * when it is not one. A bare `*`, a wildcard not leading, and single labels are not domains.
 */
export function parseDomainEntry(entry: string): string | null {
  const text = entry.trim().toLowerCase().replace(/\.$/, "");
  if (text.length > 253 || !DOMAIN.test(text)) return null;
  // One label (`localhost`) names no public destination and would shadow /etc/hosts names.
  if (!text.replace(/^\*\./, "").includes(".")) return null;
  return text;
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
      why: "is a single-label name: write a domain with a dot (example.com, *.example.com) " +
        "or an IPv4 address or CIDR",
    };
  }
  const ascii = asciiName(text);
  if (ascii !== null) {
    return {
      ok: false,
      why: `is an internationalized name: write it in its ASCII form ('${ascii}'), the form ` +
        "a TLS SNI and an HTTP Host carry",
    };
  }
  return { ok: false, why: "is not an IPv4 address or CIDR such as 8.8.8.8 or 10.0.0.0/8" };
}

/** The ASCII (punycode) form of a domain with non-ASCII letters, `null` for anything else. */
function asciiName(text: string): string | null {
  // deno-lint-ignore no-control-regex
  if (/^[\x00-\x7f]*$/.test(text) || /[\s/:@?#[\]\\%]/.test(text)) return null;
  const wild = text.startsWith("*.") ? "*." : "";
  try {
    const host = new URL(`http://${text.slice(wild.length)}/`).hostname;
    const domain = parseDomainEntry(wild + host);
    return domain !== null && domain.includes("xn--") ? domain : null;
  } catch {
    return null;
  }
}

/**
 * Reads a list of entries for `field` (e.g. `network.allowOut`) into canonical CIDRs and
 * lowercase domain patterns, duplicates dropped, or the sentence of the first bad entry naming the field and its index.
 *
 * @example
 * ```ts
 * import { parseEgressList } from "./egress_rules.ts";
 * parseEgressList(["1.1.1.1", "1.1.1.1/32", "a.example"], "network.allowOut");
 * // { ok: true, cidrs: ["1.1.1.1/32"], domains: ["a.example"] }
 * ```
 */
export function parseEgressList(
  entries: readonly unknown[],
  field: string,
): { ok: true; cidrs: string[]; domains: string[] } | { ok: false; error: string } {
  if (entries.length > MAX_EGRESS_RULES) {
    return {
      ok: false,
      error: `'${field}' has ${entries.length} entries, more than the ${MAX_EGRESS_RULES} a ` +
        "sandbox may have: join neighbouring addresses into CIDRs",
    };
  }
  const cidrs: string[] = [];
  const domains: string[] = [];
  for (const [i, entry] of entries.entries()) {
    if (typeof entry !== "string") {
      return { ok: false, error: `'${field}[${i}]' must be a string such as '8.8.8.8'` };
    }
    const domain = parseDomainEntry(entry);
    if (domain !== null) {
      if (!domains.includes(domain)) domains.push(domain);
      continue;
    }
    const r = parseEgressEntry(entry);
    if (!r.ok) return { ok: false, error: `'${field}[${i}]' '${entry.slice(0, 80)}' ${r.why}` };
    if (!cidrs.includes(r.cidr)) cidrs.push(r.cidr);
  }
  return { ok: true, cidrs, domains };
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
  /** Addresses (CIDR, IP) or domains the sandbox may reach, as sent. */
  allowOut?: string[];
  /** Addresses or domains it may not reach, as sent. */
  denyOut?: string[];
  /** Domains it may reach, as sent (the stored form; `allowOut` may carry them too). */
  allowDomains?: string[];
  /** Domains it may not reach, as sent. */
  denyDomains?: string[];
  /** Header transforms by domain, as sent (E2B's `rules` with the `transform` unwrapped). */
  transforms?: Record<string, EgressTransform[]>;
}

const listSchema = z.array(z.string().max(256)).max(MAX_EGRESS_RULES, {
  message: `at most ${MAX_EGRESS_RULES} entries: join neighbouring addresses into CIDRs`,
});

/** How the SDK's `iam.tokens.<name>` placeholders begin (`${e2b.identity.tokens.aws}`). */
const IAM_PLACEHOLDER = "${e2b.identity.tokens.";

const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$/;
/** Headers the proxy owns: setting them would break the request rather than add to it. */
const RESERVED_HEADERS = new Set([
  "host",
  "connection",
  "content-length",
  "transfer-encoding",
  "upgrade",
  "te",
  "trailer",
  "keep-alive",
  "proxy-connection",
]);

/**
 * Reads E2B's `network.rules` (`{"api.example.com": [{transform: {headers: {...}}}]}`) into
 * transforms by lowercase domain pattern, or the sentence of the first bad part naming its
 * field. Keys must be domains (the proxy terminates TLS by name), each with an optional port
 * (`api.example.com:8443`: that port only; without one, any port); header names must be HTTP
 * tokens the proxy does not own, values single-line.
 *
 * @example
 * ```ts
 * import { parseTransformRules } from "./egress_rules.ts";
 * parseTransformRules({ "API.example.com": [{ transform: { headers: { "X-Key": "k" } } }] }, "network.rules");
 * // { ok: true, transforms: { "api.example.com": [{ headers: { "X-Key": "k" } }] } }
 * ```
 */
export function parseTransformRules(
  value: unknown,
  field: string,
): { ok: true; transforms: Record<string, EgressTransform[]> } | { ok: false; error: string } {
  const fail = (error: string) => ({ ok: false as const, error });
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return fail(`'${field}' must be an object of domain to a list of rules`);
  }
  const entries = Object.entries(value);
  if (entries.length > MAX_TRANSFORM_DOMAINS) {
    return fail(`'${field}' has ${entries.length} domains, more than ${MAX_TRANSFORM_DOMAINS}`);
  }
  const transforms: Record<string, EgressTransform[]> = {};
  const ports = new Set<number>();
  for (const [key, list] of entries) {
    const at = `${field}.${key.slice(0, 80)}`;
    const ported = /^(.*):(\d{1,5})$/.exec(key.trim());
    const domain = parseDomainEntry(ported ? ported[1] : key);
    if (domain === null) {
      return fail(
        `'${at}': a rule's key must be a domain name such as 'api.example.com' or ` +
          "'*.example.com', with an optional port ('api.example.com:8443') (the egress proxy " +
          "terminates TLS by name, so addresses cannot carry transforms)",
      );
    }
    let canonical = domain;
    if (ported) {
      const port = Number(ported[2]);
      if (port < 1 || port > 65_535 || ported[2].startsWith("0")) {
        return fail(`'${at}': the port of a rule's key must be 1-65535, without leading zeros`);
      }
      if (port === 80) {
        return fail(
          `'${at}': port 80 is plain HTTP, and header transforms apply to HTTPS only: name ` +
            "the port the HTTPS server listens on, or none for 443",
        );
      }
      canonical = `${domain}:${port}`;
      if (port !== HTTPS_PORT) ports.add(port);
      if (ports.size > MAX_TRANSFORM_PORTS) {
        return fail(
          `'${field}' names more than ${MAX_TRANSFORM_PORTS} ports other than 443 in its keys: ` +
            "each is a listener of the node's egress proxy",
        );
      }
    }
    if (!Array.isArray(list) || list.length > 20) {
      return fail(`'${at}' must be a list of at most 20 rules such as [{transform: {headers}}]`);
    }
    const rules: EgressTransform[] = [];
    for (const [i, rule] of list.entries()) {
      const here = `${at}[${i}]`;
      if (typeof rule !== "object" || rule === null) return fail(`'${here}' must be an object`);
      const { transform, ...rest } = rule as { transform?: unknown };
      // The stored form is the transform itself ({headers}); the wire's wraps it.
      const t = transform ?? (Object.keys(rest).length > 0 ? rest : undefined);
      if (Object.keys(rest).some((k) => k !== "headers") && transform !== undefined) {
        return fail(`'${here}' has fields other than 'transform': only transforms are served`);
      }
      if (t === undefined) {
        rules.push({});
        continue;
      }
      if (typeof t !== "object" || t === null || Array.isArray(t)) {
        return fail(`'${here}.transform' must be an object such as {headers: {...}}`);
      }
      const { headers, ...other } = t as { headers?: unknown };
      if (Object.keys(other).length > 0) {
        return fail(
          `'${here}.transform.${Object.keys(other)[0]}' is not served: transforms set headers`,
        );
      }
      if (headers === undefined) {
        rules.push({});
        continue;
      }
      if (typeof headers !== "object" || headers === null || Array.isArray(headers)) {
        return fail(`'${here}.transform.headers' must be an object of header name to value`);
      }
      const pairs = Object.entries(headers);
      if (pairs.length > MAX_TRANSFORM_HEADERS) {
        return fail(`'${here}.transform.headers' has more than ${MAX_TRANSFORM_HEADERS} headers`);
      }
      const out: Record<string, string> = {};
      for (const [name, v] of pairs) {
        // The value is never quoted back: it is a credential.
        if (!HEADER_NAME.test(name) || RESERVED_HEADERS.has(name.toLowerCase())) {
          return fail(
            `'${here}.transform.headers' names '${name.slice(0, 80)}', which is not a header ` +
              "the proxy may set (an HTTP token, not Host, Connection, Content-Length, " +
              "Transfer-Encoding or another hop-by-hop header)",
          );
        }
        if (typeof v !== "string" || v.length > 8192 || /[\r\n\0]/.test(v)) {
          return fail(
            `'${here}.transform.headers.${name}' must be a single-line string of at most ` +
              "8192 characters",
          );
        }
        if (v.includes(IAM_PLACEHOLDER)) {
          // The SDK's transform callback writes these for E2B's proxy to fill in; sent as they
          // are, the upstream would get the placeholder for a credential.
          return fail(
            `'${here}.transform.headers.${name}' refers to a workload identity token ` +
              `(${IAM_PLACEHOLDER}<name>}), which this fleet does not mint: put the credential ` +
              "itself in the value",
          );
        }
        out[name] = v;
      }
      rules.push({ headers: out });
    }
    transforms[canonical] = rules;
  }
  return { ok: true, transforms };
}

/**
 * Native `spec.egressRules`: `{allowOut?, denyOut?, allowDomains?, denyDomains?, transforms?}`
 * read into canonical CIDRs and domain patterns; a bad entry is an issue at its own path
 * (`egressRules.allowOut.0`) saying what is wrong with it.
 */
export const egressRulesSchema: z.ZodType<EgressRules, EgressRulesInput> = z.object({
  allowOut: listSchema.optional(),
  denyOut: listSchema.optional(),
  allowDomains: listSchema.optional(),
  denyDomains: listSchema.optional(),
  transforms: z.record(z.string(), z.array(z.custom<EgressTransform>())).optional(),
}).strict().transform((value, ctx) => {
  const out: EgressRules = { allowOut: [], denyOut: [] };
  const domains = { allowOut: [] as string[], denyOut: [] as string[] };
  for (const key of ["allowOut", "denyOut"] as const) {
    const named = key === "allowOut" ? value.allowDomains : value.denyDomains;
    for (const [i, entry] of [...(value[key] ?? []), ...(named ?? [])].entries()) {
      const domain = parseDomainEntry(entry);
      if (domain !== null) {
        if (!domains[key].includes(domain)) domains[key].push(domain);
        continue;
      }
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
  if (domains.allowOut.length > 0) out.allowDomains = domains.allowOut;
  if (domains.denyOut.length > 0) out.denyDomains = domains.denyOut;
  if (value.transforms !== undefined) {
    const r = parseTransformRules(value.transforms, "transforms");
    if (!r.ok) ctx.addIssue({ code: "custom", path: ["transforms"], message: r.error });
    else if (Object.keys(r.transforms).length > 0) out.transforms = r.transforms;
  }
  return out;
});

/**
 * Whether an E2B create body asks for egress rules the node must enforce, as the node reads
 * it: any `network.allowOut` entry (address or domain), header transforms (`network.rules`), or
 * `network.denyOut` entries other than a deny of every address (which alone is a sandbox
 * without egress). For placement; the node checks the rest.
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
  const { allowOut, denyOut, rules } = network as {
    allowOut?: unknown;
    denyOut?: unknown;
    rules?: unknown;
  };
  if (list(allowOut).length > 0) return true;
  if (typeof rules === "object" && rules !== null && Object.keys(rules).length > 0) return true;
  const deny = list(denyOut);
  return deny.length > 0 && !deny.includes(ALL_TRAFFIC);
}
