/**
 * What envd reads from a request besides its message: the run-as user, the keepalive interval,
 * the call's deadline, paths resolved as envd resolves them, and a message checked against its schema.
 *
 * @module
 */
import type { Context } from "hono";
import { posix } from "node:path";
import type { z } from "zod";
import { describeZodError } from "../../../shared/schemas.ts";
import { ConnectError } from "../connect_codec.ts";
import { DEFAULT_USER } from "./core.ts";

/** The SDK's header asking for keepalive events every N seconds on a stream. */
const KEEPALIVE_HEADER = "Keepalive-Ping-Interval";

/**
 * The run-as user: `Authorization: Basic base64("<user>:")`, or E2B's default user.
 *
 * @throws {ConnectError} `unauthenticated` when the header is not base64 or names no valid user.
 * @example
 * ```ts ignore
 * app.post("/x", (c) => c.text(userOf(c))); // "user" when no Authorization header is sent
 * ```
 */
export function userOf(c: Context): string {
  const header = c.req.header("authorization");
  if (!header) return DEFAULT_USER;
  const m = /^Basic\s+(\S+)$/i.exec(header.trim());
  if (!m) return DEFAULT_USER;
  let decoded: string;
  try {
    decoded = atob(m[1]);
  } catch {
    throw new ConnectError("unauthenticated", "The Authorization header is not valid base64");
  }
  const user = decoded.split(":")[0];
  if (!user) return DEFAULT_USER;
  if (!/^[A-Za-z_][A-Za-z0-9_.-]{0,31}$/.test(user)) {
    throw new ConnectError("unauthenticated", `'${user.slice(0, 40)}' is not a valid user name`);
  }
  return user;
}

/**
 * The keepalive interval a stream asked for, ms, or `undefined` for none.
 *
 * @example
 * ```ts ignore
 * keepaliveOf(c); // 5000 for "Keepalive-Ping-Interval: 5"
 * ```
 */
export function keepaliveOf(c: Context): number | undefined {
  const raw = Number(c.req.header(KEEPALIVE_HEADER));
  // A floor of one second keeps a silly header from flooding the stream.
  return Number.isFinite(raw) && raw > 0 ? Math.max(raw, 1) * 1000 : undefined;
}

/** Connect's deadline header: the ms the client allows the whole call. */
const TIMEOUT_HEADER = "Connect-Timeout-Ms";

/**
 * The longest deadline honoured as given, ms: 2^31 - 1 (about 24.8 days), the most a timer holds
 * (a longer one fires at once). Longer deadlines are clamped to it, since no sandbox lives that
 * long; Connect itself allows up to 10 digits.
 */
export const MAX_DEADLINE_MS = 2 ** 31 - 1;

/**
 * The deadline a call's client set with `Connect-Timeout-Ms`, ms, or `undefined` for none (no
 * header, or `0`, which envd reads as "no timeout"). A value over {@linkcode MAX_DEADLINE_MS} is
 * clamped to it.
 *
 * @throws {ConnectError} `invalid_argument` when the header is not 1 to 10 digits (Connect's
 * grammar), as envd refuses it.
 * @example
 * ```ts ignore
 * deadlineOf(c); // 60000 for "Connect-Timeout-Ms: 60000"
 * ```
 */
export function deadlineOf(c: Context): number | undefined {
  const raw = c.req.header(TIMEOUT_HEADER);
  if (raw === undefined) return undefined;
  if (!/^\d{1,10}$/.test(raw)) {
    throw new ConnectError(
      "invalid_argument",
      `The ${TIMEOUT_HEADER} header must be a whole number of milliseconds, 1 to 10 digits ` +
        `(0 for none): received '${raw.slice(0, 40)}'`,
    );
  }
  const ms = Number(raw);
  return ms === 0 ? undefined : Math.min(ms, MAX_DEADLINE_MS);
}

/**
 * Resolves a path as envd does: `~` and relative paths start at the user's home.
 *
 * @throws {ConnectError} `invalid_argument` naming `field` when the path is empty.
 * @example
 * ```ts
 * import { resolvePath } from "./request.ts";
 * resolvePath("notes.txt", "user", "path"); // "/home/user/notes.txt"
 * ```
 */
export function resolvePath(path: string, user: string, field: string): string {
  if (!path) throw new ConnectError("invalid_argument", `'${field}' is required`);
  if (path.includes("\0")) throw new ConnectError("invalid_argument", `'${field}' contains NUL`);
  const home = user === "root" ? "/root" : `/home/${user}`;
  let abs = path;
  if (path === "~") abs = home;
  else if (path.startsWith("~/")) abs = home + path.slice(1);
  else if (!path.startsWith("/")) abs = `${home}/${path}`;
  const normal = posix.normalize(abs);
  return normal.length > 1 && normal.endsWith("/") ? normal.slice(0, -1) : normal;
}

/**
 * Checks an RPC's message against its schema.
 *
 * @throws {ConnectError} `invalid_argument` naming the field at fault.
 * @example
 * ```ts
 * import { z } from "zod";
 * import { parseMessage } from "./request.ts";
 * parseMessage(z.object({ path: z.string() }), { path: "/tmp" }); // { path: "/tmp" }
 * ```
 */
export function parseMessage<T>(schema: z.ZodType<T>, message: unknown): T {
  const r = schema.safeParse(message);
  if (!r.success) throw new ConnectError("invalid_argument", describeZodError(r.error, "request"));
  return r.data;
}
