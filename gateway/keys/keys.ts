/**
 * `gateway/keys/` owns who may call what: the key table (`keys.ts`), the auth rules (`auth.ts`), a
 * team's limits (`team_limits.ts`) and their fleet-wide ledger (`team_ledger.ts`), the key table's
 * replica through etcd in shared mode (`sync.ts`) and the operator's command line (`cli.ts`, `deno
 * task keys`).
 *
 * The key table: API keys the gateway mints for clients, so the fleet token never has to leave
 * the operator's hands. A key belongs to a team and may carry limits; it is stored only as its
 * SHA-256 hash, in the same database as the Fleet's node table, and only its id is ever logged.
 *
 * Why a plain SHA-256 and not a slow password hash: a key is 160 random bits, not something a
 * person chose, so there is no dictionary to try; a stolen table is as hard to reverse as
 * guessing a key outright, and a fast hash keeps every request's check to microseconds.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { DatabaseSync, type StatementSync } from "node:sqlite";
import { z } from "zod";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { HttpError } from "../../shared/http_error.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import { describeZodError } from "../../shared/schemas.ts";
import { teamSchema } from "../../shared/teams.ts";
import { tokenMatcher } from "../../shared/token.ts";

/**
 * The key format: `e2b_` and 40 lowercase hex digits (160 bits). The E2B Python SDK refuses any
 * key that does not match `^e2b_[0-9a-f]+$` before it sends a request; this is stricter.
 */
export const API_KEY_PATTERN: RegExp = /^e2b_[0-9a-f]{40}$/;

/** A key as `listApiKeys` shows it: everything but the key itself. */
export interface ApiKeyInfo {
  /** The key's id (`key_` and 16 hex digits): what `revokeApiKey` takes and logs name. */
  id: string;
  /** The team whose sandboxes the key creates and sees. */
  team: string;
  /** The operator's note on whom the key is for; `null` when none was given. */
  label: string | null;
  /** The team's running sandboxes the key may bring it to; `null` for no limit. */
  maxSandboxes: number | null;
  /** New sandboxes this key may create per minute; `null` for no limit. */
  createsPerMinute: number | null;
  /** When it was minted, ISO 8601. */
  createdAt: string;
  /** When it last authenticated a request, ISO 8601 (to the minute); `null` when never. */
  lastUsedAt: string | null;
}

/** What `createApiKey` answers: the key's info and, this once, the key. */
export interface MintedApiKey extends Omit<ApiKeyInfo, "lastUsedAt"> {
  /** The key: shown in this answer only, stored as its hash. */
  key: string;
}

/** What {@linkcode ApiKeys.create} takes: the body of `createApiKey`. */
export interface CreateApiKeyInput {
  /** The team the key's sandboxes belong to. */
  team: string;
  /** A note for people (at most 200 characters); none by default. */
  label?: string;
  /** The most running sandboxes the key's team may hold (1 to 1,000,000); no bound by default. */
  maxSandboxes?: number;
  /** The most creates a minute for the key's team (1 to 100,000); no bound by default. */
  createsPerMinute?: number;
}

/** The body of `createApiKey`. */
export const createApiKeySchema: z.ZodObject<{
  team: z.ZodString;
  label: z.ZodOptional<z.ZodString>;
  maxSandboxes: z.ZodOptional<z.ZodNumber>;
  createsPerMinute: z.ZodOptional<z.ZodNumber>;
}, z.core.$strict> = z.object({
  team: teamSchema,
  label: z.string().max(200, "a label has at most 200 characters").optional(),
  maxSandboxes: z.number().int("must be a whole number").min(1, "must be at least 1")
    .max(1_000_000, "must be at most 1000000").optional(),
  createsPerMinute: z.number().int("must be a whole number").min(1, "must be at least 1")
    .max(100_000, "must be at most 100000").optional(),
}).strict();

type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const _inputMatches: Same<CreateApiKeyInput, z.infer<typeof createApiKeySchema>> = true;

/** The body of `revokeApiKey`. */
export const revokeApiKeySchema: z.ZodObject<{ id: z.ZodString }, z.core.$strict> = z.object({
  id: z.string().min(1).max(64),
}).strict();

/** Options of {@linkcode ApiKeys}. */
export interface ApiKeysOptions {
  /** The gateway's database (the Fleet's); a private in-memory one by default. */
  database?: DatabaseSync;
  /** Stamps `createdAt` and `lastUsedAt`; the real clock by default. */
  clock?: Clock;
  /** Where mints and revocations go, by key id; silent by default. */
  log?: Log;
  /**
   * Where a key verified lately is remembered, so the next request with it needs no hash: a
   * seeded 32-bit FNV-1a by default. Two keys may share a slot (a test gives a function that
   * makes them): each is still compared whole.
   */
  slotOf?: (key: string) => number;
}

/** A key as shared mode stores it in etcd: its hash and settings, never the key. */
export interface ApiKeyRecord {
  /** The key's id (what `listApiKeys` shows and `revokeApiKey` takes). */
  id: string;
  /** The key's hash ({@linkcode hashApiKey}). */
  hash: string;
  /** The team it stands for. */
  team: string;
  /** A label for people, or `null`. */
  label: string | null;
  /** The team's most running sandboxes, or `null` for no limit. */
  max_sandboxes: number | null;
  /** The team's most creates per minute, or `null` for no limit. */
  creates_per_minute: number | null;
  /** When it was minted, ms since the epoch. */
  created_at: number;
}

interface Row extends ApiKeyRecord {
  last_used_at: number | null;
}

const schema = `CREATE TABLE IF NOT EXISTS gateway_api_keys (
  id TEXT PRIMARY KEY,
  hash TEXT NOT NULL UNIQUE,
  team TEXT NOT NULL,
  label TEXT,
  max_sandboxes INTEGER,
  creates_per_minute INTEGER,
  created_at INTEGER NOT NULL,
  last_used_at INTEGER
)`;

/**
 * `lastUsedAt` is written at most this often per key: a write per request would cost every
 * routed request a disk sync, and an operator asks "used today?", not "used this second?".
 */
const LAST_USED_RESOLUTION_MS = 60_000;

/** Keys verified lately that `verify` knows without hashing; the oldest go past this many. */
const RECENT_KEYS = 4096;

/**
 * A 32-bit FNV-1a of `key` under `seed` (a per-process secret): where a key verified lately is
 * looked for. Not a check of the key: a slot's key is still compared whole, in constant time.
 */
function slotOf(key: string, seed: number): number {
  let h = (0x811c9dc5 ^ seed) >>> 0;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

/**
 * The SHA-256 of a key, hex: what the table stores and looks up.
 *
 * @example
 * ```ts
 * import { hashApiKey } from "./keys.ts";
 * hashApiKey("e2b_" + "0".repeat(40)).length; // 64
 * ```
 */
export function hashApiKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

/**
 * The key table. Every key is held in memory by hash (a request's check is one hash and one
 * `Map` hit, and for a key verified lately a `Map` hit and a constant-time compare), loaded at
 * start and kept in step with the table by `create` and `revoke`; the table holds only hashes,
 * so a copy of the database authenticates nobody (the keys verified lately are in memory only).
 *
 * @example
 * ```ts
 * import { ApiKeys } from "./keys.ts";
 * const keys = new ApiKeys();
 * const minted = keys.create({ team: "acme", maxSandboxes: 10 });
 * keys.verify(minted.key)?.team; // "acme"
 * keys.revoke(minted.id);
 * keys.verify(minted.key); // undefined
 * keys.close();
 * ```
 */
export class ApiKeys {
  #db: DatabaseSync;
  #ownsDb: boolean;
  #clock: Clock;
  #log: Log;
  #byHash = new Map<string, Row>();
  #byId = new Map<string, Row>();
  /**
   * Keys verified lately, by `slotOf`: a routed request's key is then a Map hit and a
   * constant-time compare, not a SHA-256 (0.75 µs, about a sixth of the lane's JavaScript). An entry
   * counts only while its row is still the live one for its hash, so a revoke takes effect at
   * once; a key whose slot another key took is hashed again.
   */
  #recent = new Map<number, { matches: (given: string) => boolean; row: Row }>();
  #slotOf: (key: string) => number;
  /** Each live key's info as `verify` last answered it, and the last use it names. */
  #infos = new WeakMap<Row, { at: number | null; info: ApiKeyInfo }>();
  #insert: StatementSync;
  #delete: StatementSync;
  #touch: StatementSync;

  /** Opens (creating if needed) the key table and loads every key's hash. */
  constructor(options: ApiKeysOptions = {}) {
    this.#db = options.database ?? new DatabaseSync(":memory:");
    this.#ownsDb = options.database === undefined;
    this.#clock = options.clock ?? systemClock;
    this.#log = options.log ?? silentLog;
    const seed = crypto.getRandomValues(new Uint32Array(1))[0];
    this.#slotOf = options.slotOf ?? ((key) => slotOf(key, seed));
    this.#db.exec(schema);
    this.#insert = this.#db.prepare(
      `INSERT INTO gateway_api_keys (id, hash, team, label, max_sandboxes, creates_per_minute,
        created_at, last_used_at) VALUES (?, ?, ?, ?, ?, ?, ?, NULL)`,
    );
    this.#delete = this.#db.prepare("DELETE FROM gateway_api_keys WHERE id = ?");
    this.#touch = this.#db.prepare("UPDATE gateway_api_keys SET last_used_at = ? WHERE id = ?");
    const rows = this.#db.prepare("SELECT * FROM gateway_api_keys").all() as unknown as Row[];
    for (const row of rows) this.#index({ ...row });
  }

  /** How many keys the table holds. */
  get size(): number {
    return this.#byId.size;
  }

  /**
   * Mints a key (`createApiKey`): the answer carries the key, which is never shown again.
   *
   * @throws {HttpError} 400 naming each wrong field (`createApiKeySchema`'s rules: a team of
   *   letters, digits, '.', '_' and '-', whole positive bounds), checked at run time too, since a
   *   body parsed from JSON reaches here.
   */
  create(input: CreateApiKeyInput): MintedApiKey {
    const r = createApiKeySchema.safeParse(input, { reportInput: true });
    if (!r.success) {
      throw new HttpError(
        400,
        `Cannot create the API key: ${describeZodError(r.error, "the input")}`,
      );
    }
    const { team, label = null, maxSandboxes = null, createsPerMinute = null } = r.data;
    const key = `e2b_${hex(20)}`;
    const row: Row = {
      id: `key_${hex(8)}`,
      hash: hashApiKey(key),
      team,
      label,
      max_sandboxes: maxSandboxes,
      creates_per_minute: createsPerMinute,
      created_at: this.#clock.now(),
      last_used_at: null,
    };
    this.#store(row);
    this.#log("info", "API key created", { keyId: row.id, team, maxSandboxes, createsPerMinute });
    const { lastUsedAt: _, ...info } = infoOf(row);
    return { ...info, key };
  }

  /** Every key (`listApiKeys`), oldest first, without the keys themselves. */
  list(): ApiKeyInfo[] {
    return [...this.#byId.values()].sort((a, b) =>
      a.created_at - b.created_at || (a.id < b.id ? -1 : 1)
    )
      .map(infoOf);
  }

  /**
   * Revokes a key (`revokeApiKey`): its next request is a 401. The row is deleted, so the table
   * grows only with live keys.
   *
   * @throws {HttpError} 404 naming the id when no key has it.
   */
  revoke(id: string): void {
    const row = this.#byId.get(id);
    if (row === undefined) {
      throw new HttpError(
        404,
        `No API key with id '${id.slice(0, 64)}': listApiKeys shows the ids of every live key`,
      );
    }
    this.#delete.run(id);
    this.#byId.delete(id);
    this.#byHash.delete(row.hash);
    this.#log("info", "API key revoked", { keyId: id, team: row.team });
  }

  /**
   * The key's info when `key` is a live key, `undefined` otherwise; records its use. Only a
   * string of the key format is hashed, so a fleet token or garbage costs nothing.
   */
  verify(key: string): ApiKeyInfo | undefined {
    if (!API_KEY_PATTERN.test(key)) return undefined;
    const slot = this.#slotOf(key);
    const seen = this.#recent.get(slot);
    let row: Row | undefined;
    if (seen !== undefined && this.#byHash.get(seen.row.hash) === seen.row && seen.matches(key)) {
      row = seen.row;
    } else {
      row = this.#byHash.get(hashApiKey(key));
      if (row === undefined) return undefined;
      if (seen === undefined && this.#recent.size >= RECENT_KEYS) {
        this.#recent.delete(this.#recent.keys().next().value!);
      }
      this.#recent.set(slot, { matches: tokenMatcher(key), row });
    }
    const now = this.#clock.now();
    if (row.last_used_at === null || now - row.last_used_at >= LAST_USED_RESOLUTION_MS) {
      row.last_used_at = now;
      try {
        this.#touch.run(now, row.id);
      } catch (error) {
        // A full disk must not lock every client out: only the bookkeeping is lost.
        this.#log("warn", "could not record an API key's last use", {
          keyId: row.id,
          error: (error as Error).message,
        });
      }
    }
    // Made again only when its last use was recorded (once a minute at most): the two ISO dates
    // were half of a verify that found its key remembered.
    const made = this.#infos.get(row);
    if (made !== undefined && made.at === row.last_used_at) return made.info;
    const info = Object.freeze(infoOf(row));
    this.#infos.set(row, { at: row.last_used_at, info });
    return info;
  }

  /**
   * The stored form of key `id` (its hash, never the key), for shared mode to write to etcd;
   * `undefined` when no key has it.
   *
   * @example
   * ```ts
   * import { ApiKeys } from "./keys.ts";
   * const keys = new ApiKeys();
   * const record = keys.record(keys.create({ team: "t" }).id)!;
   * console.log(record.hash.length); // 64
   * keys.close();
   * ```
   */
  record(id: string): ApiKeyRecord | undefined {
    const row = this.#byId.get(id);
    if (row === undefined) return undefined;
    const { last_used_at: _, ...record } = row;
    return record;
  }

  /**
   * Adds a key another gateway minted (shared mode), unless it is already here. Returns whether
   * it was added.
   *
   * @example
   * ```ts ignore
   * keys.adopt(JSON.parse(kv.value));
   * ```
   */
  adopt(record: ApiKeyRecord): boolean {
    if (this.#byId.has(record.id) || this.#byHash.has(record.hash)) return false;
    const row: Row = { ...record, last_used_at: null };
    this.#store(row);
    return true;
  }

  /**
   * Drops a key another gateway revoked (shared mode); nothing when it is not here.
   *
   * @example
   * ```ts ignore
   * keys.forget("key_0123456789abcdef");
   * ```
   */
  forget(id: string): void {
    const row = this.#byId.get(id);
    if (row === undefined) return;
    this.#delete.run(id);
    this.#byId.delete(id);
    this.#byHash.delete(row.hash);
    this.#log("info", "API key revoked by another gateway", { keyId: id, team: row.team });
  }

  /** Closes the database when the table opened it itself (the in-memory default). */
  close(): void {
    if (this.#ownsDb && this.#db.isOpen) this.#db.close();
  }

  /** Writes a new row to the table and to the in-memory indexes. */
  #store(row: Row): void {
    this.#insert.run(
      row.id,
      row.hash,
      row.team,
      row.label,
      row.max_sandboxes,
      row.creates_per_minute,
      row.created_at,
    );
    this.#index(row);
  }

  #index(row: Row): void {
    this.#byId.set(row.id, row);
    this.#byHash.set(row.hash, row);
  }
}

function infoOf(row: Row): ApiKeyInfo {
  return {
    id: row.id,
    team: row.team,
    label: row.label,
    maxSandboxes: row.max_sandboxes === null ? null : Number(row.max_sandboxes),
    createsPerMinute: row.creates_per_minute === null ? null : Number(row.creates_per_minute),
    createdAt: new Date(Number(row.created_at)).toISOString(),
    lastUsedAt: row.last_used_at === null ? null : new Date(Number(row.last_used_at)).toISOString(),
  };
}

function hex(bytes: number): string {
  return Array.from(
    crypto.getRandomValues(new Uint8Array(bytes)),
    (b) => b.toString(16).padStart(2, "0"),
  )
    .join("");
}
