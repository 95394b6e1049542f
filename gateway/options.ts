/**
 * What `createGateway` checks of its options before it builds anything, in the embedder's words:
 * each option named as it was passed (`cpuLimitPct`, not the daemon's environment variable), with
 * what was given and what to pass instead. The daemon checks its variables first
 * (`config.ts`), so it never meets these.
 *
 * @module
 */

/** The shortest fleet token the gateway takes, as the daemons require. */
export const MIN_TOKEN_LENGTH = 32;

/**
 * The options checked here, as `createGateway` takes them (its `GatewayOptions` has these and
 * more): typed loosely, since an embedder's JavaScript may pass anything.
 */
export interface CheckedGatewayOptions {
  token?: unknown;
  cpuLimitPct?: unknown;
  activeLimit?: unknown;
  minDiskGB?: unknown;
  lookupTimeoutMs?: unknown;
  lookupConcurrency?: unknown;
  fanOutTimeoutMs?: unknown;
  headTimeoutMs?: unknown;
  nodeDeadAfterMs?: unknown;
  cacheSize?: unknown;
  maxJsonBodyBytes?: unknown;
  sweepIntervalMs?: unknown;
  lookupDigests?: unknown;
  etcd?: unknown;
}

type Rule = [name: keyof CheckedGatewayOptions, ok: (n: number) => boolean, wanted: string];

const whole = (n: number) => Number.isInteger(n);
const rules: Rule[] = [
  ["cpuLimitPct", (n) => n > 0 && n <= 100, "a percentage above 0 and at most 100"],
  ["activeLimit", (n) => whole(n) && n > 0, "a positive whole number of sandboxes"],
  ["minDiskGB", (n) => Number.isFinite(n) && n >= 0, "a number of GB, 0 or more"],
  [
    "lookupTimeoutMs",
    (n) => whole(n) && n >= 1 && n <= 60_000,
    "a whole number of milliseconds from 1 to 60000",
  ],
  [
    "lookupConcurrency",
    (n) => whole(n) && n >= 1 && n <= 4096,
    "a whole number of nodes from 1 to 4096",
  ],
  ["fanOutTimeoutMs", (n) => whole(n) && n >= 1, "a positive whole number of milliseconds"],
  ["headTimeoutMs", (n) => whole(n) && n >= 1, "a positive whole number of milliseconds"],
  [
    "nodeDeadAfterMs",
    (n) => whole(n) && n >= 0,
    "0 (never) or a positive whole number of milliseconds",
  ],
  ["cacheSize", (n) => whole(n) && n >= 1, "a positive whole number of entries"],
  ["maxJsonBodyBytes", (n) => whole(n) && n >= 1, "a positive whole number of bytes"],
  [
    "sweepIntervalMs",
    (n) => whole(n) && n >= 0,
    "0 (the caller sweeps) or a positive whole number of milliseconds",
  ],
];

/**
 * Every problem with `options`, one sentence each; empty when they are fine.
 *
 * @example
 * ```ts ignore
 * gatewayOptionErrors({ token: "short", cpuLimitPct: 250 });
 * // ["token is 5 characters long: pass …", "cpuLimitPct is 250: pass a percentage …"]
 * ```
 */
export function gatewayOptionErrors(options: CheckedGatewayOptions): string[] {
  const errors: string[] = [];
  const { token } = options;
  if (typeof token !== "string" || token.length === 0) {
    errors.push(
      `token is ${token === "" ? "empty" : "missing"}: pass the fleet token (at least ` +
        `${MIN_TOKEN_LENGTH} characters), the same the nodes check in with`,
    );
  } else if (token.length < MIN_TOKEN_LENGTH) {
    errors.push(
      `token is ${token.length} characters long: pass at least ${MIN_TOKEN_LENGTH} (e.g. the ` +
        "output of 'openssl rand -hex 24'), the same the nodes check in with",
    );
  }
  for (const [name, ok, wanted] of rules) {
    const value = options[name];
    if (value === undefined) continue;
    if (typeof value !== "number" || !ok(value)) {
      errors.push(`${name} is ${describe(value)}: pass ${wanted}, or leave it out for the default`);
    }
  }
  const digests = options.lookupDigests;
  if (digests !== undefined && digests !== "on" && digests !== "off" && digests !== "sole-writer") {
    errors.push(
      `lookupDigests is ${describe(digests)}: pass "on", "off" or "sole-writer", or leave it out`,
    );
  }
  if (digests === "sole-writer" && options.etcd !== undefined) {
    errors.push(
      'lookupDigests "sole-writer" cannot go with etcd: in shared mode other gateways create ' +
        'sandboxes too, so leave lookupDigests out or pass "off"',
    );
  }
  return errors;
}

function describe(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value.slice(0, 40)) : String(value);
}
