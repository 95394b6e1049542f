/**
 * What an E2B create asks beyond its template: the lifecycle (`lifecycle`, or the wire's
 * `autoPause` / `autoPauseMemory` / `autoResume`), `secure`, `allow_internet_access` and
 * `network` (egress, address rules, public traffic, `maskRequestHost`), resolved into what this
 * node does. An option the node cannot honour (an upstream proxy) is a 400 naming it, never a
 * silent ignore.
 *
 * @module
 */
import { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { describeZodError, type SandboxSpec } from "../../shared/schemas.ts";
import { parseHttpsPorts } from "../../shared/sandbox_spec.ts";
import {
  ALL_TRAFFIC,
  type EgressRules,
  type EgressTransform,
  parseEgressList,
  parseTransformRules,
} from "../../shared/egress_rules.ts";
import type { DeadlineAction, E2bSettings } from "../service_contract.ts";

const onTimeoutSchema = z.enum(["kill", "pause"]);

/** The create body's lifecycle and network fields, as the SDKs send them (2.x and older). */
const optionsSchema = z.object({
  autoPause: z.boolean().optional(),
  autoPauseMemory: z.boolean().optional(),
  // 2.x sends {enabled}; older SDKs {policy: "any" | "off"}.
  autoResume: z.union([
    z.object({ enabled: z.boolean() }).strict(),
    z.object({ policy: z.enum(["any", "off"]) }).strict(),
  ]).nullable().optional(),
  lifecycle: z.object({
    onTimeout: z.union([
      onTimeoutSchema,
      z.object({ action: onTimeoutSchema, keepMemory: z.boolean().optional() }).strict(),
    ]).optional(),
    autoResume: z.boolean().optional(),
  }).strict().optional(),
  secure: z.boolean().optional(),
  // The wire name; the camelCase one is accepted too, as clients write it either way.
  allow_internet_access: z.boolean().optional(),
  allowInternetAccess: z.boolean().optional(),
  // E2B's workload identity: the SDK sends it only with at least one token.
  iam: z.unknown().optional(),
  network: z.object({
    allowPublicTraffic: z.boolean().optional(),
    allowOut: z.array(z.string().max(256)).max(1000).optional(),
    denyOut: z.array(z.string().max(256)).max(1000).optional(),
    egressProxy: z.unknown().optional(),
    maskRequestHost: z.string().max(256).optional(),
    rules: z.unknown().optional(),
    httpsPorts: z.unknown().optional(),
  }).strict().nullable().optional(),
});

type E2bCreateOptions = z.infer<typeof optionsSchema>;

/** What a create's options mean on this node. */
export interface ResolvedCreateOptions {
  /** What the deadline does. */
  onTimeout: DeadlineAction;
  /** What the ledger keeps. */
  e2b: E2bSettings;
  /** The executor spec the options add (egress), merged over the create's own. */
  spec: SandboxSpec;
}

/** What a create that leaves an option out gets on this node. */
export interface CreateOptionsDefaults {
  /**
   * Egress for a create that does not say `allowInternetAccess` (E2B's cloud default), as if it
   * said `true`; false (the default): none, a sandbox has egress only when it asks.
   */
  defaultEgress?: boolean;
}

/**
 * Reads the lifecycle and network options of a create body (its other fields are left to the
 * caller) into the deadline action, the settings the ledger keeps and the spec the executor
 * gets. `lifecycle` wins over the older `autoPause` / `autoResume` fields, as in the SDK.
 * `timeoutSeconds` is the create's lifetime, kept for a resume by traffic. A create that does
 * not say `allowInternetAccess` gets egress only with `defaults.defaultEgress`
 * (`DORMICE_EGRESS_E2B_DEFAULT=on`); the ledger still records that it did not say.
 *
 * @throws {HttpError} 400 naming a malformed option, one this node cannot honour, or two that
 * contradict each other.
 * @example
 * ```ts
 * import { parseCreateOptions } from "./e2b_create_options.ts";
 * const r = parseCreateOptions({ templateID: "base", autoPause: true, autoResume: { enabled: true } }, 60);
 * r.onTimeout; // "pause"
 * r.e2b.autoResume; // true
 * ```
 */
export function parseCreateOptions(
  value: unknown,
  timeoutSeconds: number,
  { defaultEgress = false }: CreateOptionsDefaults = {},
): ResolvedCreateOptions {
  const parsed = optionsSchema.safeParse(value);
  if (!parsed.success) throw new HttpError(400, describeZodError(parsed.error));
  const body = parsed.data;
  if (body.iam !== undefined && body.iam !== null) {
    const tokens = (body.iam as { tokens?: unknown }).tokens;
    if (typeof tokens !== "object" || tokens === null || Object.keys(tokens).length > 0) {
      throw new HttpError(
        400,
        "'iam' is not supported on this fleet: no workload identity tokens are minted here; " +
          "put the credential itself in a header transform (network.rules) instead",
      );
    }
  }
  const asked = body.lifecycle?.onTimeout;
  const onTimeout: DeadlineAction = typeof asked === "string"
    ? asked
    : asked?.action ?? (body.autoPause ? "pause" : "kill");
  const keepMemory = (typeof asked === "object" ? asked.keepMemory : undefined) ??
    body.autoPauseMemory;
  const policy = body.autoResume && "policy" in body.autoResume
    ? body.autoResume.policy === "any"
    : undefined;
  const enabled = body.autoResume && "enabled" in body.autoResume
    ? body.autoResume.enabled
    : undefined;
  const autoResume = body.lifecycle?.autoResume ?? enabled ?? policy ?? false;
  if (autoResume && onTimeout === "kill") {
    throw new HttpError(
      400,
      "'autoResume' needs the timeout to pause the sandbox (lifecycle.onTimeout 'pause', or " +
        "autoPause: true): a killed sandbox cannot be resumed",
    );
  }

  const { internet, rules } = egressOf(body);
  const e2b: E2bSettings = { onTimeout, autoResume, timeoutSeconds };
  // A timeout that pauses the file system only: its deadline archives the sandbox.
  if (onTimeout === "pause" && keepMemory === false) e2b.keepMemory = false;
  if (body.secure !== undefined) e2b.secure = body.secure;
  if (internet !== undefined) e2b.allowInternetAccess = internet;
  if (body.network?.allowPublicTraffic !== undefined) {
    e2b.allowPublicTraffic = body.network.allowPublicTraffic;
  }
  if (body.network?.maskRequestHost !== undefined) {
    e2b.maskRequestHost = checkedHostMask(body.network.maskRequestHost);
  }
  const spec: SandboxSpec = rules
    ? { network: true, egressRules: rules }
    : internet ?? defaultEgress
    ? { network: true }
    : {};
  const https = body.network?.httpsPorts;
  if (https !== undefined && https !== null) {
    const r = parseHttpsPorts(https);
    if (!r.ok) throw new HttpError(400, `'network.httpsPorts' ${r.why}`);
    if (r.ports.length > 0) spec.httpsPorts = r.ports;
  }
  return { onTimeout, e2b, spec };
}

/** The placeholder E2B replaces with the port a request is for. */
const PORT_PLACEHOLDER = "${PORT}";
const HOST_AND_PORT =
  /^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::\d{1,5})?$/;

/**
 * A `network.maskRequestHost` that makes a valid Host header for every port: a host name or
 * bracketed IPv6 address, an optional port, `${PORT}` anywhere standing for the port.
 *
 * @throws {HttpError} 400 naming the value and its shape.
 */
function checkedHostMask(mask: string): string {
  if (!HOST_AND_PORT.test(mask.replaceAll(PORT_PLACEHOLDER, "1"))) {
    throw new HttpError(
      400,
      `'network.maskRequestHost' must be a host name with an optional port, ${PORT_PLACEHOLDER} ` +
        `standing for the sandbox port: received '${mask.slice(0, 80)}' (e.g. ` +
        `'localhost:${PORT_PLACEHOLDER}')`,
    );
  }
  return mask;
}

/**
 * The Host a request to `port` shows the sandbox's server under `mask`
 * (`network.maskRequestHost`), `${PORT}` replaced by the port, as E2B's proxy does.
 *
 * @example
 * ```ts
 * import { maskedHost } from "./e2b_create_options.ts";
 * maskedHost("localhost:${PORT}", 3000); // "localhost:3000"
 * ```
 */
export function maskedHost(mask: string, port: number): string {
  return mask.replaceAll(PORT_PLACEHOLDER, String(port));
}

/** What a create's network options give the sandbox. */
interface Egress {
  /** Egress at all: true, false, or undefined when nothing says. */
  internet: boolean | undefined;
  /** Address rules, when the create sent any (they give the sandbox egress). */
  rules?: EgressRules;
}

/**
 * Reads the egress a create asks for: `allowInternetAccess` and the address rules. As in E2B,
 * `allowInternetAccess: false` is `denyOut: ["0.0.0.0/0"]` with the allowed addresses kept; a
 * deny of every address and no allow is a sandbox without egress, as it always was here.
 */
function egressOf(body: E2bCreateOptions): Egress {
  const snake = body.allow_internet_access;
  const camel = body.allowInternetAccess;
  if (snake !== undefined && camel !== undefined && snake !== camel) {
    throw new HttpError(
      400,
      "'allow_internet_access' and 'allowInternetAccess' disagree: send one of them",
    );
  }
  const internet = snake ?? camel;
  const network = body.network ?? {};
  refuseUnserved(network);
  const allow = checkedList(network.allowOut, "network.allowOut");
  const deny = checkedList(network.denyOut, "network.denyOut");
  const transforms = checkedTransforms(network.rules, "network.rules");
  const allowOut = allow.cidrs;
  const denyOut = deny.cidrs;
  if (denyOut.includes(ALL_TRAFFIC) && internet === true) {
    throw new HttpError(
      400,
      `'network.denyOut' ['${ALL_TRAFFIC}'] and allowInternetAccess: true disagree: send one`,
    );
  }
  const named = withDomains({ allowOut, denyOut }, allow.domains, deny.domains, transforms);
  const byName = named.allowDomains !== undefined || named.denyDomains !== undefined ||
    named.transforms !== undefined;
  if (allowOut.length === 0 && !byName) {
    if (denyOut.length === 0) return { internet };
    // Every address denied and none allowed: no egress at all, the internal network.
    if (denyOut.includes(ALL_TRAFFIC)) return { internet: false };
    return { internet, rules: named };
  }
  if (internet === false) named.denyOut = [ALL_TRAFFIC];
  return { internet, rules: named };
}

/** `rules` with the domain lists and transforms that are not empty. */
function withDomains(
  rules: EgressRules,
  allowDomains: string[],
  denyDomains: string[],
  transforms: Record<string, EgressTransform[]>,
): EgressRules {
  return {
    ...rules,
    ...(allowDomains.length > 0 ? { allowDomains } : {}),
    ...(denyDomains.length > 0 ? { denyDomains } : {}),
    ...(Object.keys(transforms).length > 0 ? { transforms } : {}),
  };
}

/** The body of `PUT /sandboxes/{id}/network` (E2B's `SandboxNetworkUpdateConfig`). */
const updateSchema = z.object({
  allowOut: z.array(z.string().max(256)).max(1000).optional(),
  denyOut: z.array(z.string().max(256)).max(1000).optional(),
  egressProxy: z.unknown().optional(),
  rules: z.unknown().optional(),
  allow_internet_access: z.boolean().optional(),
  allowInternetAccess: z.boolean().optional(),
}).strict();

/**
 * Reads the body of E2B's `updateNetwork` (`PUT /sandboxes/{id}/network`) into the rules that
 * replace the sandbox's whole: an omitted list is cleared (E2B's "omitting a field clears
 * it"), and `allowInternetAccess: false` denies every address with the allowed ones kept.
 *
 * @throws {HttpError} 400 naming a malformed entry, a field not served, or a contradiction.
 * @example
 * ```ts
 * import { parseNetworkUpdate } from "./e2b_create_options.ts";
 * parseNetworkUpdate({ allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] });
 * // { allowOut: ["1.1.1.1/32"], denyOut: ["0.0.0.0/0"] }
 * ```
 */
export function parseNetworkUpdate(value: unknown): EgressRules {
  const parsed = updateSchema.safeParse(value);
  if (!parsed.success) throw new HttpError(400, describeZodError(parsed.error));
  const body = parsed.data;
  const snake = body.allow_internet_access;
  const camel = body.allowInternetAccess;
  if (snake !== undefined && camel !== undefined && snake !== camel) {
    throw new HttpError(
      400,
      "'allow_internet_access' and 'allowInternetAccess' disagree: send one of them",
    );
  }
  const internet = snake ?? camel;
  refuseUnserved(body, "");
  const allow = checkedList(body.allowOut, "allowOut");
  const deny = checkedList(body.denyOut, "denyOut");
  const transforms = checkedTransforms(body.rules, "rules");
  if (deny.cidrs.includes(ALL_TRAFFIC) && internet === true) {
    throw new HttpError(
      400,
      `'denyOut' ['${ALL_TRAFFIC}'] and allowInternetAccess: true disagree: send one`,
    );
  }
  return withDomains(
    { allowOut: allow.cidrs, denyOut: internet === false ? [ALL_TRAFFIC] : deny.cidrs },
    allow.domains,
    deny.domains,
    transforms,
  );
}

/** Refuses the network options this fleet does not serve yet (an upstream proxy), naming it. */
export function refuseUnserved(
  network: { egressProxy?: unknown; rules?: unknown },
  prefix = "network.",
): void {
  const unsupported = (field: string, why: string) =>
    new HttpError(
      400,
      `'${prefix}${field}' is not supported on this fleet yet: ${why}; address and domain ` +
        "rules (allowOut / denyOut) and header transforms (rules) are",
    );
  if (network.egressProxy !== undefined && network.egressProxy !== null) {
    throw unsupported("egressProxy", "egress cannot go through an upstream proxy");
  }
}

/**
 * A list of rules read into canonical CIDRs and domain patterns.
 *
 * @throws {HttpError} 400 naming the field, the entry and what is wrong with it.
 */
export function checkedList(
  entries: readonly unknown[] | undefined,
  field: string,
): { cidrs: string[]; domains: string[] } {
  const r = parseEgressList(entries ?? [], field);
  if (!r.ok) throw new HttpError(400, r.error);
  return r;
}

/**
 * E2B's `rules` read into header transforms by domain; absent or null is none.
 *
 * @throws {HttpError} 400 naming the part that is wrong.
 */
function checkedTransforms(value: unknown, field: string): Record<string, EgressTransform[]> {
  if (value === undefined || value === null) return {};
  const r = parseTransformRules(value, field);
  if (!r.ok) throw new HttpError(400, r.error);
  return r.transforms;
}
