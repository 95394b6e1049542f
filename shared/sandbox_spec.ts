/**
 * A sandbox's spec on the wire: its resource limits and options ({@linkcode sandboxSpecSchema}),
 * and the bounds of its metadata and environment, which every listing copies.
 *
 * @module
 */
import { z } from "zod";
import { type VolumeMount, volumeMountSchema } from "./pools.ts";
import { type EgressRules, type EgressRulesInput, egressRulesSchema } from "./egress_rules.ts";

/** The most keys a sandbox's metadata holds. */
export const METADATA_MAX_KEYS = 64;
/** The most bytes (UTF-8) of a sandbox's metadata keys and values together: 16 KiB. */
export const METADATA_MAX_BYTES = 16 * 1024;
/** The most variables a sandbox's (or a command's) environment holds. */
export const ENV_MAX_VARS = 1000;
/** The most bytes (UTF-8) of an environment's names and values together: 256 KiB. */
export const ENV_MAX_BYTES = 256 * 1024;

const utf8 = new TextEncoder();

/**
 * A string-to-string map bounded in entries and bytes: a sandbox's metadata and environment are
 * kept in the ledger, listed, filtered and copied into every answer, so one create must not make
 * every listing of the node slow.
 */
function boundedRecord(
  key: z.ZodString,
  value: z.ZodString,
  what: string,
  maxEntries: number,
  maxBytes: number,
): z.ZodRecord<z.ZodString, z.ZodString> {
  return z.record(key, value).check((ctx) => {
    const entries = Object.entries(ctx.value);
    let bytes = 0;
    for (const [k, v] of entries) bytes += utf8.encode(k).length + utf8.encode(v).length;
    if (entries.length > maxEntries || bytes > maxBytes) {
      ctx.issues.push({
        code: "custom",
        input: ctx.value,
        message: `holds ${entries.length} ${what} of ${bytes} bytes; at most ${maxEntries} ` +
          `${what} of ${maxBytes / 1024} KiB (names and values together) are allowed: send fewer`,
      });
    }
  });
}

/** Metadata: string keys to string values, at most 64 keys and 16 KiB. */
export const metadataSchema: z.ZodRecord<z.ZodString, z.ZodString> = boundedRecord(
  z.string().max(256),
  z.string().max(4096),
  "keys",
  METADATA_MAX_KEYS,
  METADATA_MAX_BYTES,
);

/** Environment variables: names to values, at most 1,000 of them and 256 KiB. */
export const envSchema: z.ZodRecord<z.ZodString, z.ZodString> = boundedRecord(
  z.string(),
  z.string(),
  "variables",
  ENV_MAX_VARS,
  ENV_MAX_BYTES,
);

/** Most ports a sandbox may list as serving HTTPS: each is looked up on every request to a port. */
export const MAX_HTTPS_PORTS = 32;
/** envd's port: served by the fleet itself, never a sandbox's HTTPS server (as in E2B). */
const ENVD_PORT = 49983;

/**
 * Reads a sandbox's ports that serve HTTPS (E2B's `network.httpsPorts`): a list of integers
 * 1-65535, not envd's 49983, at most {@linkcode MAX_HTTPS_PORTS}; repeats are dropped, the
 * order kept. Otherwise the sentence saying what is wrong, to follow the field's name.
 *
 * @example
 * ```ts
 * import { parseHttpsPorts } from "./sandbox_spec.ts";
 * parseHttpsPorts([8443, 8443, 3000]); // { ok: true, ports: [8443, 3000] }
 * parseHttpsPorts([0]); // { ok: false, why: "holds 0, which is not a port: …" }
 * ```
 */
export function parseHttpsPorts(
  value: unknown,
): { ok: true; ports: number[] } | { ok: false; why: string } {
  if (!Array.isArray(value)) {
    return { ok: false, why: "must be a list of port numbers such as [8443]" };
  }
  if (value.length > MAX_HTTPS_PORTS) {
    return {
      ok: false,
      why: `lists ${value.length} ports, more than ${MAX_HTTPS_PORTS}: list only the ports ` +
        "whose servers speak HTTPS",
    };
  }
  for (const port of value) {
    if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65_535) {
      return {
        ok: false,
        why: `holds ${JSON.stringify(port)?.slice(0, 40)}, which is not a port: write integers ` +
          "from 1 to 65535",
      };
    }
    if (port === ENVD_PORT) {
      return {
        ok: false,
        why: `holds ${ENVD_PORT}, envd's port, which the fleet itself serves: list only the ` +
          "ports of your own HTTPS servers",
      };
    }
  }
  return { ok: true, ports: [...new Set(value as number[])] };
}

/** {@linkcode parseHttpsPorts} as a schema (native `spec.httpsPorts`). */
export const httpsPortsSchema: z.ZodType<number[], unknown> = z.unknown().transform(
  (value, ctx) => {
    const r = parseHttpsPorts(value);
    if (r.ok) return r.ports;
    ctx.addIssue({ code: "custom", message: r.why });
    return z.NEVER;
  },
);

/**
 * Resource limits and options asked for a sandbox. `network: true` gives it egress (none by
 * default); `egressRules` gives it egress judged by address rules (E2B's `network.allowOut` /
 * `denyOut`, see `egress_rules.ts`), on a node that can serve them; `privatePorts: true` makes
 * its ports require its traffic access token (E2B's `network.allowPublicTraffic: false`);
 * `httpsPorts` lists its ports whose servers speak HTTPS (E2B's `network.httpsPorts`), which
 * the node then reaches over TLS.
 */
export const sandboxSpecSchema: z.ZodObject<{
  cpus: z.ZodOptional<z.ZodNumber>;
  memoryMB: z.ZodOptional<z.ZodNumber>;
  pids: z.ZodOptional<z.ZodNumber>;
  network: z.ZodOptional<z.ZodBoolean>;
  egressRules: z.ZodOptional<z.ZodType<EgressRules, EgressRulesInput>>;
  privatePorts: z.ZodOptional<z.ZodBoolean>;
  httpsPorts: z.ZodOptional<z.ZodType<number[], unknown>>;
  env: z.ZodOptional<z.ZodRecord<z.ZodString, z.ZodString>>;
  volumes: z.ZodOptional<z.ZodArray<z.ZodType<VolumeMount>>>;
}> = z.object({
  cpus: z.number().positive().max(256).optional(),
  memoryMB: z.number().int().positive().max(1_048_576).optional(),
  pids: z.number().int().positive().max(1_000_000).optional(),
  network: z.boolean().optional(),
  egressRules: egressRulesSchema.optional(),
  privatePorts: z.boolean().optional(),
  httpsPorts: httpsPortsSchema.optional(),
  env: envSchema.optional(),
  /** Named volumes of the node (`DORMICE_VOLUMES`) and where each is mounted. */
  volumes: z.array(volumeMountSchema).max(16).optional(),
});

/** A sandbox spec: the resource limits and options asked for a sandbox. */
export interface SandboxSpec {
  /** CPU cores (fractions allowed), at most 256. */
  cpus?: number;
  /** Memory, MiB. */
  memoryMB?: number;
  /** Most processes at once. */
  pids?: number;
  /** Egress to anywhere; none by default. */
  network?: boolean;
  /** Egress judged by address rules (E2B's `network.allowOut` / `denyOut`). */
  egressRules?: EgressRules;
  /** Its ports require its traffic access token (E2B's `allowPublicTraffic: false`). */
  privatePorts?: boolean;
  /**
   * Ports whose servers speak HTTPS (E2B's `network.httpsPorts`): the node connects to them
   * with TLS, not verifying the sandbox's certificate (a self-signed one works).
   */
  httpsPorts?: number[];
  /** Environment variables. */
  env?: Record<string, string>;
  /** Named volumes of the node (`DORMICE_VOLUMES`) and where each is mounted. */
  volumes?: VolumeMount[];
}

// Written out for the documentation; fails to compile when it drifts from its schema.
const _specMatches: [SandboxSpec] extends [z.infer<typeof sandboxSpecSchema>]
  ? ([z.infer<typeof sandboxSpecSchema>] extends [SandboxSpec] ? true : false)
  : false = true;
void _specMatches;
