/**
 * A team's creates where every gateway of a shared fleet sees them (etcd), so `maxSandboxes` and
 * `createsPerMinute` hold across the fleet, not per gateway. {@linkcode TeamLimits} decides;
 * this file only reads and writes, one transaction per admitted create.
 *
 * @module
 */
import { HttpError } from "../../shared/http_error.ts";
import type { Clock } from "../../shared/clock.ts";
import {
  type EtcdClient,
  type EtcdCompare,
  type EtcdKv,
  type EtcdOp,
  EtcdRequestError,
  EtcdUnavailableError,
} from "../etcd/client.ts";
import type { EtcdSession } from "../etcd/session.ts";

/** One create of a team, as every gateway reads it from etcd. */
export interface TeamRecord {
  /** Its etcd key. */
  key: string;
  /** The node it went to; absent while the create is on its way (in flight). */
  node?: string;
  /** The node's ledger change number after it, when the node's answer named one. */
  at?: number;
  /** When it was written (ms since the epoch, the writing gateway's clock). */
  t: number;
}

/** A key's rate bucket as stored: `tokens` left at time `at` (ms since the epoch). */
export interface RateBucket {
  /** Creates left in the bucket at `at`. */
  tokens: number;
  /** When `tokens` was counted, ms since the epoch. */
  at: number;
}

/** What the caller decided about one create, given the team's records and the key's bucket. */
export interface LedgerVerdict {
  /** The key's bucket with this create's token taken; `undefined` when the key has no rate. */
  bucket?: RateBucket;
  /** Keys of records every gateway has had time to see counted by a reading: deleted. */
  drop: string[];
}

/** One admitted create's record, told what became of the create. */
export interface LedgerEntry {
  /** The create went to `node` (it may exist): the record says where, until a reading counts it. */
  placed(node: string, at?: number): Promise<void>;
  /** Nothing was built: the record goes, and the key's token comes back. */
  cancel(): Promise<void>;
}

/** Where a team's creates are counted across gateways. */
export interface TeamLedger {
  /**
   * Reads the team's records and the rate's bucket, lets `decide` judge them (it throws to refuse),
   * and writes this create's record and the new bucket in one transaction that holds only if no
   * gateway wrote either in between; otherwise reads again.
   *
   * @throws what `decide` throws; {@linkcode HttpError} 503 naming etcd when it cannot be asked.
   */
  admit(
    team: string,
    rate: { keyId: string; perMinute: number } | undefined,
    decide: (records: TeamRecord[], bucket: RateBucket | undefined) => LedgerVerdict,
  ): Promise<LedgerEntry>;
}

/** Options of {@linkcode EtcdTeamLedger}. */
export interface EtcdTeamLedgerOptions {
  /** The client to the cluster. */
  client: EtcdClient;
  /** The gateway's lease: records and buckets go with it when the gateway dies. */
  session: EtcdSession;
  /** The fleet's key prefix, e.g. `/dormice/`. */
  prefix: string;
  /** Time source of the records' `t`; the caller's clock. */
  clock: Clock;
  /**
   * Most transactions one admission tries while other gateways keep writing the same team
   * (default 64): each failed one means another create was admitted, so a burst of N creates
   * of one team settles within N tries each.
   */
  maxAttempts?: number;
}

/** The Retry-After of a 503 naming etcd. */
const retryAfterSeconds = 2;

function toRecord(kv: EtcdKv): TeamRecord | undefined {
  try {
    const v = JSON.parse(kv.value);
    if (typeof v?.t !== "number") return undefined;
    return {
      key: kv.key,
      ...(typeof v.node === "string" ? { node: v.node } : {}),
      ...(Number.isSafeInteger(v.at) ? { at: v.at } : {}),
      t: v.t,
    };
  } catch {
    return undefined;
  }
}

function toBucket(kv: EtcdKv | undefined): RateBucket | undefined {
  if (kv === undefined) return undefined;
  try {
    const v = JSON.parse(kv.value);
    return typeof v?.tokens === "number" && typeof v?.at === "number" ? v : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The 503 a client sees when the team's count cannot be read or written; anything else passes
 * through.
 */
function ledgerHttpError(error: unknown, team: string): unknown {
  if (!(error instanceof EtcdUnavailableError) && !(error instanceof EtcdRequestError)) {
    return error;
  }
  return new HttpError(
    503,
    `${error.message}; the gateway cannot count team '${team}''s sandboxes across the fleet ` +
      "(its key has limits), so the create waits for etcd: retry",
    { headers: { "retry-after": String(retryAfterSeconds) } },
  );
}

/**
 * The team ledger in etcd: a record per admitted create at `<prefix>teams/<team>/<uuid>` and a
 * bucket per rate-limited key at `<prefix>rates/<keyId>`, both tied to the writing gateway's
 * lease. The check and the write are one transaction compared on the team's whole range and on
 * the bucket's revision: two gateways that read the same count cannot both write on it.
 *
 * Records live until a reading every gateway has seen counts them (the caller lists them in
 * `drop` at the team's next create) or their gateway's lease ends; buckets, until their gateway's
 * lease ends (a bucket that goes is a full one, the same as none a minute later).
 *
 * @example
 * ```ts ignore
 * const ledger = new EtcdTeamLedger({ client, session, prefix: "/dormice/", clock });
 * const entry = await ledger.admit("acme", undefined, (records) => ({ drop: [] }));
 * await entry.placed("node-1", 42);
 * ```
 */
export class EtcdTeamLedger implements TeamLedger {
  readonly #client: EtcdClient;
  readonly #session: EtcdSession;
  readonly #prefix: string;
  readonly #clock: Clock;
  readonly #maxAttempts: number;

  /** Builds the ledger; nothing is written until the first `admit`. */
  constructor(options: EtcdTeamLedgerOptions) {
    this.#client = options.client;
    this.#session = options.session;
    this.#prefix = options.prefix;
    this.#clock = options.clock;
    this.#maxAttempts = options.maxAttempts ?? 64;
  }

  async admit(
    team: string,
    rate: { keyId: string; perMinute: number } | undefined,
    decide: (records: TeamRecord[], bucket: RateBucket | undefined) => LedgerVerdict,
  ): Promise<LedgerEntry> {
    const dir = `${this.#prefix}teams/${team}/`;
    const rateKey = rate && `${this.#prefix}rates/${rate.keyId}`;
    for (let attempt = 1;; attempt++) {
      let lease: string;
      let read;
      try {
        lease = await this.#session.lease();
        read = await this.#client.txn([], [
          { op: "range", key: dir, prefix: true },
          ...(rateKey ? [{ op: "range" as const, key: rateKey }] : []),
        ]);
      } catch (error) {
        throw ledgerHttpError(error, team);
      }
      const records = read.ranges[0].map(toRecord).filter((r) => r !== undefined);
      const bucketKv = rateKey ? read.ranges[1][0] : undefined;
      const verdict = decide(records, toBucket(bucketKv));
      const key = `${dir}${crypto.randomUUID()}`;
      const compare: EtcdCompare[] = [
        // No key of the team's written since the read (new or changed); one deleted only
        // lowers the count, so it is no reason to read again.
        {
          key: dir,
          prefix: true,
          target: "MOD",
          result: "LESS",
          revision: String(Number(read.revision) + 1),
        },
      ];
      const ops: EtcdOp[] = [
        { op: "put", key, value: JSON.stringify({ t: this.#clock.now() }), lease },
        ...verdict.drop.map((k) => ({ op: "delete" as const, key: k })),
      ];
      if (rateKey && verdict.bucket) {
        compare.push({
          key: rateKey,
          target: "MOD",
          result: "EQUAL",
          revision: bucketKv?.modRevision ?? "0",
        });
        ops.push({ op: "put", key: rateKey, value: JSON.stringify(verdict.bucket), lease });
      }
      try {
        const written = await this.#client.txn(compare, ops);
        if (written.succeeded) return this.#entry(key, rateKey, rate?.perMinute, lease);
      } catch (error) {
        if (error instanceof EtcdRequestError && error.leaseNotFound) {
          await this.#session.invalidate(lease);
          continue;
        }
        throw ledgerHttpError(error, team);
      }
      if (attempt >= this.#maxAttempts) {
        throw new HttpError(
          503,
          `Team '${team}''s count changed under ${attempt} tries in a row (other gateways ` +
            "admitting its creates at the same time): retry",
          { headers: { "retry-after": "1" } },
        );
      }
      // Gateways that lost the same race spread out before reading again.
      await new Promise((r) => setTimeout(r, Math.random() * 10 * Math.min(attempt, 5)));
    }
  }

  #entry(
    key: string,
    rateKey: string | undefined,
    perMinute: number | undefined,
    lease: string,
  ): LedgerEntry {
    let settled = false;
    return {
      placed: async (node, at) => {
        if (settled) return;
        settled = true;
        const record = { node, ...(at === undefined ? {} : { at }), t: this.#clock.now() };
        // Only while the record is still there (its lease alive): a put would bring back one
        // that went with its lease, under a lease that no longer exists.
        await this.#client.txn(
          [{ key, target: "CREATE", result: "NOT_EQUAL", revision: "0" }],
          [{ op: "put", key, value: JSON.stringify(record), lease }],
        ).catch(() => {});
      },
      cancel: async () => {
        if (settled) return;
        settled = true;
        await this.#client.delete(key).catch(() => {});
        if (rateKey !== undefined && perMinute !== undefined) {
          await this.#giveBack(rateKey, perMinute, lease).catch(() => {});
        }
      },
    };
  }

  /** Puts the token back into the bucket, compared on its revision; a few tries at most. */
  async #giveBack(rateKey: string, perMinute: number, lease: string): Promise<void> {
    for (let i = 0; i < 5; i++) {
      const kv = await this.#client.get(rateKey);
      const bucket = toBucket(kv ?? undefined);
      if (kv === null || bucket === undefined) return;
      const tokens = Math.min(perMinute, bucket.tokens + 1);
      const r = await this.#client.txn(
        [{ key: rateKey, target: "MOD", result: "EQUAL", revision: kv.modRevision }],
        [{ op: "put", key: rateKey, value: JSON.stringify({ ...bucket, tokens }), lease }],
      );
      if (r.succeeded) return;
    }
  }
}
