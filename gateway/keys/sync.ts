/**
 * Shared mode's key table: a key minted or revoked through any gateway is written to etcd
 * first, and every gateway reads the table back every second into its own in-memory
 * {@linkcode ApiKeys}, so a request's key check never waits on etcd (routed verbs keep working
 * while it is away) and a key works on every gateway within a second of its mint.
 *
 * @module
 */
import { ChangeLog, type Log, silentLog } from "../../shared/log.ts";
import { HttpError } from "../../shared/http_error.ts";
import { type EtcdClient, jsonValues } from "../etcd/client.ts";
import type { ApiKeyRecord, ApiKeys, CreateApiKeyInput, MintedApiKey } from "./keys.ts";
import { etcdHttpError } from "../etcd/answers.ts";
import { Poller } from "../etcd/poller.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";

/** Options of {@linkcode KeySync}. */
export interface KeySyncOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The fleet's key prefix; records live under `<prefix>keys/`. */
  prefix: string;
  /** This gateway's table. */
  keys: ApiKeys;
  /**
   * How often the table is read back. Default 1000 ms: a revoked key stops working on every
   * gateway within about a second.
   */
  pollMs?: number;
  /** Where etcd's outages go (once per change). */
  log?: Log;
  /**
   * How old this gateway's copy of the table may be before the keys in it are refused: 5000
   * ms. Past it, a key revoked through another gateway could still work here, so every key is
   * a 503 naming etcd until a read succeeds. Five polls: a slow read under load is not an
   * outage, and a revoke is never honoured later than this anywhere.
   */
  staleAfterMs?: number;
  /** Time source of the staleness; `systemClock` when absent. */
  clock?: Clock;
}

/**
 * Keeps an {@linkcode ApiKeys} in step with etcd. `create` and `revoke` write to etcd before
 * they answer, and refuse with a 503 naming etcd when it is away: a mint other gateways never
 * hear of would work on one door only, and a revoke they never hear of would leave the key
 * working on the others.
 *
 * @example
 * ```ts ignore
 * const sync = new KeySync({ client, prefix: "/dormice/", keys });
 * sync.start();
 * const minted = await sync.create({ team: "acme" });
 * ```
 */
export class KeySync {
  readonly #client: EtcdClient;
  readonly #prefix: string;
  readonly #keys: ApiKeys;
  readonly #changes: ChangeLog;
  /** Ids being written now: the read-back must not forget them before their write lands. */
  readonly #writing = new Set<string>();
  readonly #poller: Poller;
  readonly #staleAfterMs: number;
  readonly #clock: Clock;
  /** When the last read that succeeded began; -Infinity before the first. */
  #readAt = -Infinity;
  /** The last read's failure, for the refusal's sentence. */
  #lastError = "no read of the key table has succeeded yet";

  /** Builds the sync; nothing is read until `start()` or `syncOnce()`. */
  constructor(options: KeySyncOptions) {
    this.#client = options.client;
    this.#staleAfterMs = options.staleAfterMs ?? 5000;
    this.#clock = options.clock ?? systemClock;
    this.#prefix = `${options.prefix}keys/`;
    this.#keys = options.keys;
    this.#poller = new Poller(() => this.syncOnce(), options.pollMs ?? 1000);
    this.#changes = new ChangeLog(options.log ?? silentLog);
  }

  /**
   * Mints a key here and writes it to etcd; undone here when the write fails.
   *
   * @throws {HttpError} 400 for a bad body, 503 naming etcd when it is away.
   */
  async create(input: CreateApiKeyInput): Promise<MintedApiKey> {
    const minted = this.#keys.create(input);
    this.#writing.add(minted.id);
    try {
      await this.#client.put(
        this.#prefix + minted.id,
        JSON.stringify(this.#keys.record(minted.id)),
      );
    } catch (error) {
      this.#keys.forget(minted.id);
      throw etcdHttpError(error);
    } finally {
      this.#writing.delete(minted.id);
    }
    return minted;
  }

  /**
   * Deletes the key from etcd, then here. etcd decides whether the key exists, never this
   * gateway's copy: a key minted through another gateway a moment ago is not here yet, and
   * must not answer 404 while it works there.
   *
   * @throws {HttpError} 404 for an id etcd does not hold, 503 naming etcd when it is away.
   */
  async revoke(id: string): Promise<void> {
    let existed: boolean;
    try {
      existed = await this.#client.delete(this.#prefix + id);
    } catch (error) {
      throw etcdHttpError(error);
    }
    // Minted elsewhere and not read here yet: nothing of it to remove here.
    if (existed && this.#keys.record(id) === undefined) return;
    // The local answer (404 naming the id) is the same sentence as the embedded one.
    this.#keys.revoke(id);
  }

  /**
   * Why the keys in this gateway's copy cannot be trusted now (it is older than
   * `staleAfterMs`: a revoke through another gateway may be missing), or `undefined` when they
   * can. The gateway answers a key 503 naming etcd then, rather than serve it.
   */
  readonly unconfirmed = (): string | undefined => {
    const age = this.#clock.now() - this.#readAt;
    if (age <= this.#staleAfterMs) return undefined;
    const since = Number.isFinite(age) ? `for ${Math.round(age / 1000)} s` : "since the start";
    return `This gateway cannot confirm API keys: it has not read the key table from etcd ` +
      `${since} (${this.#lastError}), so a key revoked elsewhere may look live here. Retry ` +
      "shortly, or through another gateway; the operator should check DORMICE_GATEWAY_ETCD";
  };

  /** Reads etcd now and every `pollMs` after, until `stop()`. */
  start(): void {
    this.#poller.start();
  }

  /** Stops reading. */
  stop(): Promise<void> {
    return this.#poller.stop();
  }

  /** Applies etcd's key table here. Never rejects: an unreachable etcd keeps what is known. */
  async syncOnce(): Promise<void> {
    try {
      const asked = Date.now();
      const readAt = this.#clock.now();
      const kvs = await this.#client.range(this.#prefix);
      const seen = new Set<string>();
      for (const record of jsonValues(kvs) as ApiKeyRecord[]) {
        if (typeof record?.id !== "string" || typeof record.hash !== "string") continue;
        seen.add(record.id);
        this.#keys.adopt(record);
      }
      for (const info of this.#keys.list()) {
        if (seen.has(info.id) || this.#writing.has(info.id)) continue;
        if (Date.parse(info.createdAt) >= asked) continue;
        this.#keys.forget(info.id);
      }
      this.#readAt = Math.max(this.#readAt, readAt);
      this.#changes.report("etcd", "ok", "info", "the key table is in step with etcd", {
        keys: kvs.length,
      });
    } catch (error) {
      if (error instanceof HttpError) throw error;
      this.#lastError = (error as Error)?.message ?? String(error);
      this.#changes.report(
        "etcd",
        "failing",
        "error",
        `cannot read the key table from etcd: keys are refused (503) once the table is older ` +
          `than ${this.#staleAfterMs} ms, mints and revokes wait`,
        { error: (error as Error)?.message ?? String(error) },
      );
    }
  }
}
