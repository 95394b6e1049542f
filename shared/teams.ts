/**
 * Teams on the wire: how a gateway tells a node whose request it forwards, and the alphabet of
 * a team name. A node trusts {@linkcode TEAM_HEADER} only on a request that carries the fleet
 * token (the gateway's own requests); a request without it comes from the operator, who sees
 * every team by id and in listings and names sandboxes in {@linkcode DEFAULT_TEAM}.
 *
 * @module
 */
import { z } from "zod";
import { HttpError } from "./http_error.ts";
import { describeZodError } from "./schemas.ts";

/** The header a gateway names the caller's team with on every request it forwards to a node. */
export const TEAM_HEADER = "x-dormice-team";

/**
 * The team of a sandbox created with the fleet token (the operator), and of every row a ledger
 * held before teams existed.
 */
export const DEFAULT_TEAM = "default";

/**
 * A team name: 1–64 characters of `[A-Za-z0-9._-]`, starting with a letter or digit. Never a
 * `/`, so `team/name` is an unambiguous key for a sandbox name within its team.
 *
 * @example
 * ```ts
 * import { teamSchema } from "./teams.ts";
 * teamSchema.parse("acme-prod"); // "acme-prod"
 * ```
 */
export const teamSchema: z.ZodString = z.string()
  .min(1, "a team needs at least 1 character")
  .max(64, "a team has at most 64 characters")
  .regex(
    /^[A-Za-z0-9][A-Za-z0-9._-]*$/,
    "a team uses only letters, digits, '.', '_' and '-', and starts with a letter or digit",
  );

/**
 * The team a forwarded request names, or `undefined` when it names none (the operator). Call
 * it only after the fleet token was checked: a client cannot be allowed to pick its own team.
 *
 * @throws {HttpError} 400 when the header is present but not a team name.
 *
 * @example
 * ```ts
 * import { teamOfRequest } from "./teams.ts";
 * teamOfRequest(new Headers({ "x-dormice-team": "acme" })); // "acme"
 * teamOfRequest(new Headers()); // undefined
 * ```
 */
export function teamOfRequest(headers: Headers): string | undefined {
  const raw = headers.get(TEAM_HEADER);
  if (raw === null) return undefined;
  const r = teamSchema.safeParse(raw);
  if (!r.success) throw new HttpError(400, describeZodError(r.error, "'X-Dormice-Team'"));
  return r.data;
}

/**
 * The key of a sandbox name within its team, for slots and caches: the bare name in
 * {@linkcode DEFAULT_TEAM} (so a fleet without keys keys exactly as before), `team/name`
 * otherwise.
 *
 * @example
 * ```ts
 * import { teamScopedName } from "./teams.ts";
 * teamScopedName("acme", "agent-1"); // "acme/agent-1"
 * teamScopedName("default", "agent-1"); // "agent-1"
 * ```
 */
export function teamScopedName(team: string | undefined, name: string): string {
  return team === undefined || team === DEFAULT_TEAM ? name : `${team}/${name}`;
}

/**
 * Splits a key made by {@linkcode teamScopedName} back into its team and name.
 *
 * @example
 * ```ts
 * import { splitTeamScopedName } from "./teams.ts";
 * splitTeamScopedName("acme/agent-1"); // { team: "acme", name: "agent-1" }
 * ```
 */
export function splitTeamScopedName(key: string): { team: string; name: string } {
  const slash = key.indexOf("/");
  return slash === -1
    ? { team: DEFAULT_TEAM, name: key }
    : { team: key.slice(0, slash), name: key.slice(slash + 1) };
}
