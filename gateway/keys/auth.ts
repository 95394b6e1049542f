/**
 * The gateway's auth rules, in one place. Two kinds of credential:
 *
 * - the **fleet token** (`DORMICE_API_TOKEN`), shared by the gateway, the nodes and the operator,
 *   compared in constant time. It alone opens the fleet's verbs (`checkIn`, `listNodes`,
 *   `removeNode`, `setPools`) and the key verbs (`createApiKey`, `listApiKeys`,
 *   `revokeApiKey`); on the client verbs it is the operator: team `default` for names, any
 *   sandbox by id, every team in listings;
 * - **API keys** (`e2b_` + 40 hex, minted by `createApiKey`, see `keys.ts`): a client's, bound to
 *   one team; on a fleet verb it is a 403.
 *
 * Where a credential is presented depends on the face:
 *
 * | path | credential | checked by |
 * |---|---|---|
 * | `GET /healthz` | none: a load balancer probes it | — |
 * | `GET /metrics` | `Authorization: Bearer <fleet token>` (Prometheus' `bearer_token`) | {@linkcode callerGate} (a key is a 403) |
 * | `/ui`, `/ui/…` (the fleet page) | a session cookie from its login form, which takes the fleet token | `gateway/faces/ui/session.ts` |
 * | the native and fleet verbs (`POST /<verb>`) | `Authorization: Bearer <key or token>` | {@linkcode callerGate}, and the routed verbs' fast path through {@linkcode requireCaller} |
 * | `/e2b/api/…` | `X-API-KEY: <key or token>` (the SDK's `E2B_API_KEY`), or a bearer | {@linkcode requireE2bCaller}, answering in E2B's `{code, message}` |
 * | `/e2b/envd/…` and the root `/files` | the sandbox's envd access token (`X-Access-Token`, or a URL signature on `/files`), checked at the gateway's E2B face before any node hears of it (the tokens derive from the fleet token) and again by the node; an `X-API-KEY` if sent scopes the sandbox to its team | the E2B face, and {@linkcode optionalE2bCaller} |
 *
 * The gateway forwards with the node's credentials (`GatewayRouting.nodeHeaders`) and names a
 * key's team in `X-Dormice-Team`; nodes trust the gateway, never the client's headers. A key is
 * never logged: its id is.
 *
 * @module
 */
import type { MiddlewareHandler } from "hono";
import { API_KEY_PATTERN, type ApiKeyInfo, type ApiKeys } from "./keys.ts";
import { e2bApiKey, e2bKeyAuth } from "../../shared/e2b_auth.ts";
import { HttpError } from "../../shared/http_error.ts";
import { DEFAULT_TEAM } from "../../shared/teams.ts";
import { bearerToken, requireFleetBearer, tokenMatcher } from "../../shared/token.ts";
import { octets } from "../../shared/http1/mod.ts";

/** Who sent a request: the operator (the fleet token) or a client's API key. */
export type Caller =
  | { readonly kind: "operator" }
  | { readonly kind: "key"; readonly key: ApiKeyInfo };

/** Names the caller a presented credential stands for; `undefined` when it stands for none. */
export type CallerCheck = (given: string | undefined) => Caller | undefined;

/** The operator: one object, so the fast path allocates nothing for the fleet token. */
export const OPERATOR: Caller = Object.freeze({ kind: "operator" });

/**
 * The verbs only the fleet token opens: a node's check-in and the fleet's own bookkeeping could
 * be forged with anything less (a fake node that reports 256 idle cores receives every
 * placement, other teams' bodies included), and the key verbs mint and revoke credentials.
 */
export const fleetOnlyVerbs: readonly string[] = [
  "checkIn",
  "listNodes",
  "removeNode",
  "setPools",
  "createApiKey",
  "listApiKeys",
  "revokeApiKey",
  // Copies a volume between nodes: the operator's.
  "moveVolume",
  // GET /metrics: a scrape shows every team's counts, so it is the operator's.
  "metrics",
];

/**
 * The check of a presented credential: the fleet token (constant time) is the operator, a live
 * key is its caller. With `unconfirmed` (shared mode: why this gateway's copy of the key table
 * cannot be trusted now), a key is refused while it says so.
 *
 * @throws {HttpError} 503 with its sentence, for a key while `unconfirmed` gives one.
 *
 * @example
 * ```ts
 * import { callerCheck } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const keys = new ApiKeys();
 * const identify = callerCheck("t".repeat(32), keys);
 * identify("t".repeat(32))?.kind; // "operator"
 * identify(keys.create({ team: "acme" }).key)?.kind; // "key"
 * keys.close();
 * ```
 */
export function callerCheck(
  token: string,
  keys: ApiKeys,
  unconfirmed?: () => string | undefined,
): CallerCheck {
  const fleet = fleetTokenCheck(token);
  return (given) => {
    if (given === undefined) return undefined;
    if (fleet(given)) return OPERATOR;
    if (unconfirmed !== undefined && API_KEY_PATTERN.test(given)) {
      const why = unconfirmed();
      if (why !== undefined) throw new HttpError(503, why, { headers: { "retry-after": "2" } });
    }
    const key = keys.verify(given);
    return key === undefined ? undefined : { kind: "key", key };
  };
}

/**
 * Who the `Authorization` value in `b[from, to)` stands for, read from its bytes: what
 * {@linkcode identify} makes of `bearerToken` of its text.
 */
export type BearerBytesCheck = (b: Uint8Array, from: number, to: number) => Caller | undefined;

/**
 * The bytes lane's caller check: `Bearer` (any case), one space and the fleet token are compared
 * as bytes, in time that depends only on the lengths, with no string made (decoding the value,
 * slicing the token and comparing it were a tenth of a routed request's JavaScript). Anything
 * else, a key above all, is decoded and asked of `identify`, so the answer is always that check's.
 *
 * @example
 * ```ts
 * import { bearerBytesCheck, callerCheck } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const keys = new ApiKeys();
 * const token = "t".repeat(32);
 * const check = bearerBytesCheck(token, callerCheck(token, keys));
 * check(new TextEncoder().encode(`Bearer ${token}`), 0, 39)?.kind; // "operator"
 * keys.close();
 * ```
 */
export function bearerBytesCheck(token: string, identify: CallerCheck): BearerBytesCheck {
  // Only a token of visible ASCII is one byte a character, as `bearerToken` reads it plainly.
  const expected = /^[\x21-\x7e]+$/.test(token) ? new TextEncoder().encode(token) : undefined;
  const n = token.length;
  const decoded = decodedBearerCheck(identify);
  return (b, from, to) => {
    if (expected !== undefined && to - from === n + 7 && b[from + 6] === 32) {
      let diff = 0;
      for (let i = 0; i < 6; i++) diff |= (b[from + i] | 0x20) ^ BEARER[i];
      for (let i = 0; i < n; i++) diff |= b[from + 7 + i] ^ expected[i];
      if (diff === 0) return OPERATOR;
    }
    return decoded(b, from, to);
  };
}

/**
 * The check of an `Authorization` value given as bytes that decodes it and asks `identify`:
 * what {@linkcode bearerBytesCheck} falls back to, and the bytes lane's check when the gateway's
 * parts give it none.
 *
 * @example
 * ```ts
 * import { callerCheck, decodedBearerCheck } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const keys = new ApiKeys();
 * const token = "t".repeat(32);
 * const check = decodedBearerCheck(callerCheck(token, keys));
 * check(new TextEncoder().encode(`Bearer ${token}`), 0, 39)?.kind; // "operator"
 * keys.close();
 * ```
 */
export function decodedBearerCheck(identify: CallerCheck): BearerBytesCheck {
  return (b, from, to) => identify(bearerToken(octets(b, from, to)));
}

/** `bearer`, lowercase, as bytes. */
const BEARER = new TextEncoder().encode("bearer");

/**
 * The team a caller names sandboxes in: its key's, or `default` for the operator.
 *
 * @example
 * ```ts
 * import { OPERATOR, teamOf } from "./auth.ts";
 * teamOf(OPERATOR); // "default"
 * ```
 */
export function teamOf(caller: Caller): string {
  return caller.kind === "key" ? caller.key.team : DEFAULT_TEAM;
}

/**
 * The team a caller's ids and listings are limited to, or `undefined` for the operator, who
 * reaches every team's sandboxes.
 *
 * @example
 * ```ts
 * import { OPERATOR, scopeOf } from "./auth.ts";
 * scopeOf(OPERATOR); // undefined
 * ```
 */
export function scopeOf(caller: Caller): string | undefined {
  return caller.kind === "key" ? caller.key.team : undefined;
}

/**
 * The caller behind an `Authorization: Bearer` header, or a 401 saying what to send.
 *
 * @throws {HttpError} 401 when the bearer is missing, or neither the fleet token nor a live key.
 *
 * @example
 * ```ts
 * import { callerCheck, requireCaller } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const identify = callerCheck("t".repeat(32), new ApiKeys());
 * requireCaller(`Bearer ${"t".repeat(32)}`, identify).kind; // "operator"
 * ```
 */
export function requireCaller(header: string | null | undefined, identify: CallerCheck): Caller {
  const given = bearerToken(header);
  if (given === undefined) {
    throw new HttpError(
      401,
      "Missing bearer token: send the header 'Authorization: Bearer <API key>' with a key " +
        "from the operator (createApiKey)",
      { headers: { "www-authenticate": "Bearer" } },
    );
  }
  const caller = identify(given);
  if (caller === undefined) {
    throw new HttpError(
      401,
      "The bearer token is not a live API key (it is unknown or was revoked) nor the gateway's " +
        "DORMICE_API_TOKEN: ask the operator for a key (createApiKey)",
      { headers: { "www-authenticate": "Bearer" } },
    );
  }
  return caller;
}

/**
 * Refuses a client key on a verb only the fleet token opens.
 *
 * @throws {HttpError} 403 naming the verb when `caller` is a key.
 *
 * @example
 * ```ts
 * import { OPERATOR, requireOperator } from "./auth.ts";
 * requireOperator(OPERATOR, "listNodes"); // passes
 * ```
 */
export function requireOperator(caller: Caller, verb: string): void {
  if (caller.kind === "operator") return;
  throw new HttpError(
    403,
    `${verb} takes the fleet token (DORMICE_API_TOKEN) only, and this request carries the API ` +
      `key '${caller.key.id}' of team '${caller.key.team}': an API key cannot call the fleet's ` +
      "own verbs",
  );
}

/**
 * The caller of an E2B control-plane request (`X-API-KEY`, else a bearer), or a 401 whose
 * sentence names `E2B_API_KEY` (the face answers it as `{code:401, message}`).
 *
 * @throws {HttpError} 401 when no credential is sent or it stands for no caller.
 *
 * @example
 * ```ts
 * import { callerCheck, requireE2bCaller } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const identify = callerCheck("t".repeat(32), new ApiKeys());
 * requireE2bCaller(new Headers({ "x-api-key": "t".repeat(32) }), identify).kind; // "operator"
 * ```
 */
export function requireE2bCaller(headers: Headers, identify: CallerCheck): Caller {
  const given = e2bApiKey(headers);
  const caller = identify(given);
  if (caller !== undefined) return caller;
  throw new HttpError(
    401,
    given
      ? "The API key is not valid (unknown or revoked): set E2B_API_KEY to a key from the " +
        "operator (createApiKey)"
      : "The X-API-KEY header is missing: set E2B_API_KEY to a key from the operator (createApiKey)",
  );
}

/**
 * The caller of an envd request when it names one (`X-API-KEY`); `undefined` when it sends no
 * key, since the SDK authenticates envd with the sandbox's own access token, which the node
 * checks.
 *
 * @throws {HttpError} 401 when a key is sent and is not valid.
 *
 * @example
 * ```ts
 * import { callerCheck, optionalE2bCaller } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const identify = callerCheck("t".repeat(32), new ApiKeys());
 * optionalE2bCaller(new Headers(), identify); // undefined
 * ```
 */
export function optionalE2bCaller(headers: Headers, identify: CallerCheck): Caller | undefined {
  const given = headers.get("x-api-key");
  if (given === null) return undefined;
  const caller = identify(given);
  if (caller !== undefined) return caller;
  throw new HttpError(
    401,
    "The X-API-KEY is not valid (unknown or revoked): set E2B_API_KEY to a key from the operator",
  );
}

/**
 * The root app's middleware: every path but those {@linkcode skipsFleetBearer} names needs a
 * bearer credential; the fleet-only verbs need the fleet token (a key is a 403). The caller is
 * handed to `remember` for the verb's handler.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { callerCheck, callerGate } from "./auth.ts";
 * import { ApiKeys } from "./keys.ts";
 * const callers = new WeakMap();
 * const app = new Hono();
 * app.use("*", callerGate(callerCheck("t".repeat(32), new ApiKeys()), (r, c) => callers.set(r, c)));
 * ```
 */
export function callerGate(
  identify: CallerCheck,
  remember: (request: Request, caller: Caller) => void,
): MiddlewareHandler {
  return (c, next) => {
    const path = c.req.path;
    if (skipsFleetBearer(path)) return next();
    const header = c.req.header("authorization");
    const verb = path.slice(1);
    if (!fleetOnlyVerbs.includes(verb)) {
      remember(c.req.raw, requireCaller(header, identify));
      return next();
    }
    // A fleet-only route's 401 must ask for the fleet token, not a key (which is a 403 here).
    const given = bearerToken(header);
    const caller = given === undefined ? undefined : identify(given);
    if (caller?.kind === "key") requireOperator(caller, verb);
    const route = verb === "metrics" ? "GET /metrics" : verb;
    requireFleetBearer(header, () => caller !== undefined, "the gateway's", route);
    remember(c.req.raw, caller!);
    return next();
  };
}

/** Whether a presented token is the fleet token; `undefined` (nothing presented) never is. */
export type FleetTokenCheck = (given: string | undefined) => boolean;

/**
 * Paths the fleet bearer check leaves to a mounted face: E2B clients speak `X-API-KEY`, and an
 * answer to them must be in E2B's dialect, which the root's `{message}` 401 is not.
 */
const ownAuthPrefixes = ["/e2b/", "/files"];

/**
 * The constant-time check of a presented token against the fleet token, built once so the hot
 * path encodes nothing per request.
 *
 * @example
 * ```ts
 * import { fleetTokenCheck } from "./auth.ts";
 * const authorized = fleetTokenCheck("t".repeat(32));
 * authorized("t".repeat(32)); // true
 * authorized(undefined); // false
 * ```
 */
export function fleetTokenCheck(token: string): FleetTokenCheck {
  const matches = tokenMatcher(token);
  return (given) => given !== undefined && matches(given);
}

/**
 * Whether the fleet bearer check skips `path`: `/healthz` is open, and paths under `/e2b/` and
 * `/files` belong to faces that authenticate in their own dialect (see the table above).
 *
 * @example
 * ```ts
 * import { skipsFleetBearer } from "./auth.ts";
 * skipsFleetBearer("/e2b/api/v2/sandboxes"); // true
 * skipsFleetBearer("/acquireSandbox"); // false
 * ```
 */
export function skipsFleetBearer(path: string): boolean {
  return path === "/healthz" || ownAuthPrefixes.some((p) => path.startsWith(p)) ||
    // The fleet page: a browser sends the session cookie its login form set (`gateway/faces/ui/session.ts`).
    path === "/ui" || path.startsWith("/ui/");
}

/**
 * The root app's middleware: every path but those {@linkcode skipsFleetBearer} names needs the
 * fleet token as a bearer token.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { fleetBearerGate, fleetTokenCheck } from "./auth.ts";
 * const app = new Hono();
 * app.use("*", fleetBearerGate(fleetTokenCheck("t".repeat(32))));
 * ```
 */
export function fleetBearerGate(authorized: FleetTokenCheck): MiddlewareHandler {
  return (c, next) => {
    const path = c.req.path;
    if (skipsFleetBearer(path)) return next();
    requireFleetBearer(c.req.header("authorization"), authorized, "the gateway's");
    return next();
  };
}

/**
 * The E2B control plane's middleware: the SDK's `X-API-KEY` (or a bearer token) must be the
 * fleet token; otherwise a 401 whose sentence names `E2B_API_KEY`, which the face's error
 * handler answers as `{code:401, message}`.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { e2bFleetKeyAuth, fleetTokenCheck } from "./auth.ts";
 * const api = new Hono();
 * api.use("*", e2bFleetKeyAuth(fleetTokenCheck("t".repeat(32))));
 * ```
 */
export function e2bFleetKeyAuth(authorized: FleetTokenCheck): MiddlewareHandler {
  return e2bKeyAuth(authorized);
}
