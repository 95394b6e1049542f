/**
 * The fleet page's sessions: its login form takes the fleet token once and answers with a
 * random session id in an HttpOnly, SameSite=Strict cookie, so the token never sits in the
 * browser (no script can read the cookie, no other site can send it, and it is not the token:
 * logging out or restarting the gateway ends it). Sessions live in memory, bounded in count and
 * in age.
 *
 * @module
 */
import { type Clock, systemClock } from "../../../shared/clock.ts";

/** The session cookie's name. */
export const SESSION_COOKIE = "dormice_session";

/** Options of {@linkcode UiSessions}. */
export interface UiSessionsOptions {
  /** A session ends this long after login. Default 12 h: a working day, then log in again. */
  ttlMs?: number;
  /**
   * Sessions kept at most; the oldest goes first. Default 1,000: far more operators than a fleet
   * has, and a loop of logins cannot grow the gateway's memory.
   */
  max?: number;
  /** Time source; the real clock by default. */
  clock?: Clock;
}

/**
 * Live sessions of the fleet page.
 *
 * @example
 * ```ts
 * import { UiSessions } from "./session.ts";
 * const sessions = new UiSessions();
 * const id = sessions.open();
 * sessions.valid(id); // true
 * sessions.close(id);
 * sessions.valid(id); // false
 * ```
 */
export class UiSessions {
  readonly #ttlMs: number;
  readonly #max: number;
  readonly #clock: Clock;
  /** id → expiry; insertion order is login order, so the first key is the oldest. */
  readonly #sessions = new Map<string, number>();

  /** Builds an empty set of sessions. */
  constructor(options: UiSessionsOptions = {}) {
    this.#ttlMs = options.ttlMs ?? 12 * 3600 * 1000;
    this.#max = Math.max(1, options.max ?? 1000);
    this.#clock = options.clock ?? systemClock;
  }

  /** Seconds a new session lasts (the cookie's Max-Age). */
  get ttlSeconds(): number {
    return Math.floor(this.#ttlMs / 1000);
  }

  /** Opens a session (after the fleet token was checked) and returns its id. */
  open(): string {
    const bytes = crypto.getRandomValues(new Uint8Array(32));
    const id = btoa(String.fromCharCode(...bytes)).replace(/\+/g, "-").replace(/\//g, "_")
      .replace(/=+$/, "");
    while (this.#sessions.size >= this.#max) {
      this.#sessions.delete(this.#sessions.keys().next().value!);
    }
    this.#sessions.set(id, this.#clock.now() + this.#ttlMs);
    return id;
  }

  /** Whether `id` names a live session; an expired one is forgotten. */
  valid(id: string | undefined): boolean {
    if (id === undefined) return false;
    const expires = this.#sessions.get(id);
    if (expires === undefined) return false;
    if (expires <= this.#clock.now()) {
      this.#sessions.delete(id);
      return false;
    }
    return true;
  }

  /** Ends a session (logout). */
  close(id: string | undefined): void {
    if (id !== undefined) this.#sessions.delete(id);
  }

  /** Live sessions (expired ones not yet seen count until they are). */
  get size(): number {
    return this.#sessions.size;
  }
}

/**
 * The `Set-Cookie` value for session `id` (or an expired one that clears it when `id` is null).
 * Path `/ui` so no other route of the gateway ever receives it; Secure over HTTPS.
 *
 * @example
 * ```ts
 * import { sessionCookie } from "./session.ts";
 * sessionCookie("abc", { secure: false, maxAgeSeconds: 60 });
 * // "dormice_session=abc; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=60"
 * ```
 */
export function sessionCookie(
  id: string | null,
  options: { secure: boolean; maxAgeSeconds: number },
): string {
  return `${SESSION_COOKIE}=${id ?? ""}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=${
    id === null ? 0 : options.maxAgeSeconds
  }${options.secure ? "; Secure" : ""}`;
}

/**
 * The session id a request's `Cookie` header carries, if any.
 *
 * @example
 * ```ts
 * import { sessionOf } from "./session.ts";
 * sessionOf(new Headers({ cookie: "a=1; dormice_session=xyz" })); // "xyz"
 * ```
 */
export function sessionOf(headers: Headers): string | undefined {
  const cookie = headers.get("cookie");
  if (cookie === null) return undefined;
  for (const part of cookie.split(";")) {
    const eq = part.indexOf("=");
    if (eq !== -1 && part.slice(0, eq).trim() === SESSION_COOKIE) {
      const value = part.slice(eq + 1).trim();
      return value === "" ? undefined : value;
    }
  }
  return undefined;
}
