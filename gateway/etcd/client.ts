/**
 * `gateway/etcd/` owns the gateway's talk with etcd in shared mode: the client and the lease
 * session (`client.ts`), the loop the replicas read with (`poller.ts`) and the 503 a client gets
 * when etcd fails under a write (`answers.ts`).
 *
 * A small etcd v3 client over etcd's own HTTP/JSON gateway (`POST /v3/kv/range`, `/v3/kv/txn`,
 * `/v3/lease/grant`, …) with `fetch`, and the gateway's lease session.
 *
 * Why not `npm:etcd3`: it works under Deno, but brings gRPC (`@grpc/grpc-js`, protobufjs) into
 * the gateway's graph for six calls, and its deadlines live in gRPC's own channel state. Over
 * `fetch` every call is bounded by one `AbortSignal` (connect included, DESIGN §11), a member
 * that refuses is skipped at once, and the embedded default pulls in nothing new.
 *
 * @module
 */
import { describeFetchFailure } from "../../shared/fetch_failure.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";

/**
 * Thrown when no member of the etcd cluster answered within the bound. The gateway turns it into
 * a 503 with Retry-After naming etcd: a name must never be built twice on a guess.
 *
 * @example
 * ```ts
 * import { EtcdUnavailableError } from "./client.ts";
 * const e = new EtcdUnavailableError(["http://127.0.0.1:2379"], ["ECONNREFUSED"]);
 * console.log(e.message.startsWith("etcd is unreachable")); // true
 * ```
 */
export class EtcdUnavailableError extends Error {
  /** The members asked. */
  readonly endpoints: readonly string[];
  /** Why it failed, with each member's cause. */
  readonly causes: readonly string[];
  /**
   * Whether the call spent its whole bound on members that were there but did not answer (no
   * leader, no quorum), rather than being refused at once.
   */
  readonly timedOut: boolean;
  /** Why it failed, with each member's cause; `timedOut` when the whole bound was spent. */
  constructor(endpoints: readonly string[], causes: string[], timedOut = false) {
    super(
      `etcd is unreachable (DORMICE_GATEWAY_ETCD=${endpoints.join(",")}): ${causes.join("; ")}`,
    );
    this.name = "EtcdUnavailableError";
    this.endpoints = endpoints;
    this.causes = causes;
    this.timedOut = timedOut;
  }
}

/**
 * Thrown when etcd answered but refused the request (a 4xx: an expired lease, a bad request).
 *
 * @example
 * ```ts
 * import { EtcdRequestError } from "./client.ts";
 * const e = new EtcdRequestError("/v3/kv/put", 404, "etcdserver: requested lease not found");
 * console.log(e.leaseNotFound); // true
 * ```
 */
export class EtcdRequestError extends Error {
  /** etcd's HTTP status. */
  readonly status: number;
  /** Whether etcd no longer knows the lease the request named. */
  readonly leaseNotFound: boolean;
  /** The call, etcd's status and its answer. */
  constructor(path: string, status: number, text: string) {
    super(`etcd refused ${path} (${status}): ${text.slice(0, 300)}`);
    this.name = "EtcdRequestError";
    this.status = status;
    this.leaseNotFound = /lease not found/i.test(text);
  }
}

/** A key and its value as etcd stores them (key and value decoded as UTF-8). */
export interface EtcdKv {
  /** The key. */
  key: string;
  /** The value. */
  value: string;
  /** The revision that created the key. */
  createRevision: string;
  /** The revision that last changed it. */
  modRevision: string;
  /** The lease it is tied to, if any. */
  lease?: string;
}

/** One comparison of {@linkcode EtcdClient.txn}: `target` of `key` (or every key under it). */
export interface EtcdCompare {
  /** The key compared (or the prefix, with `prefix`). */
  key: string;
  /** Whether `key` is a prefix: the comparison holds for every key under it. */
  prefix?: boolean;
  /** What of the key is compared: its last change, its creation or its value. */
  target: "MOD" | "CREATE" | "VALUE";
  /** How it must compare for the comparison to hold. */
  result: "EQUAL" | "NOT_EQUAL" | "LESS" | "GREATER";
  /** The revision compared with (`MOD`, `CREATE`); "0" for a key that does not exist. */
  revision?: string;
  /** The value compared with (`VALUE`). */
  value?: string;
}

/** One operation of {@linkcode EtcdClient.txn}. */
export type EtcdOp =
  | { op: "put"; key: string; value: string; lease?: string }
  | { op: "delete"; key: string; prefix?: boolean }
  | { op: "range"; key: string; prefix?: boolean };

/** What {@linkcode EtcdClient.txn} answers. */
export interface EtcdTxnResult {
  /** Whether every comparison held (the success ops ran). */
  succeeded: boolean;
  /** The store's revision after the transaction. */
  revision: string;
  /** The keys each range op of the branch that ran read, in op order. */
  ranges: EtcdKv[][];
}

/** Options of {@linkcode EtcdClient}. */
export interface EtcdClientOptions {
  /** The members' client URLs (`DORMICE_GATEWAY_ETCD`), e.g. `["http://10.0.0.1:2379"]`. */
  endpoints: readonly string[];
  /**
   * Bound of one call across every member. Default 5000 ms: a leader election settles in about
   * one election timeout (1 s by default), but a split vote on a loaded machine takes a few
   * rounds (measured: over 3 s with two members left on 2 busy cores), and a call made while
   * the leader dies must still succeed; a cluster that lost its quorum is reported within 5 s,
   * and one whose members all refuse at once.
   */
  timeoutMs?: number;
  /** The HTTP client; the global `fetch` by default. */
  fetch?: typeof fetch;
  /**
   * Once a call waited out its whole bound with no member answering (a cluster without quorum),
   * how often a call is let through to ask again: 1000 ms. Every other call in between fails at
   * once, so while the cluster has no quorum a create is a 503 at once, not after the bound.
   */
  probeEveryMs?: number;
  /** Time source of the probes; `systemClock` when absent. */
  clock?: Clock;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** Base64 of the UTF-8 bytes of `text`: the JSON gateway's form of keys and values. */
function b64(text: string | Uint8Array): string {
  const bytes = typeof text === "string" ? encoder.encode(text) : text;
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function unb64(text: string | undefined): string {
  if (!text) return "";
  const s = atob(text);
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return decoder.decode(bytes);
}

/** The end of the key range holding every key that starts with `prefix`. */
function prefixEnd(prefix: string): string {
  const bytes = encoder.encode(prefix);
  for (let i = bytes.length - 1; i >= 0; i--) {
    if (bytes[i] < 0xff) {
      const end = bytes.slice(0, i + 1);
      end[i]++;
      return b64(end);
    }
  }
  return b64(new Uint8Array([0]));
}

/** A JSON value of etcd's gateway API, as parsed (the API's shapes are not typed here). */
// deno-lint-ignore no-explicit-any
export type Json = any;

// deno-lint-ignore no-explicit-any
function toKv(raw: any): EtcdKv {
  return {
    key: unb64(raw.key),
    value: unb64(raw.value),
    createRevision: raw.create_revision ?? "0",
    modRevision: raw.mod_revision ?? "0",
    lease: raw.lease,
  };
}

/**
 * The calls the gateway makes, each one bounded, each one tried on the next member when one
 * refuses or answers 5xx (a follower without a leader, a member shutting down). A 4xx is etcd
 * refusing the request itself and is thrown as is.
 *
 * Requires `--allow-net` to the members.
 *
 * @example
 * ```ts ignore
 * const etcd = new EtcdClient({ endpoints: ["http://127.0.0.1:2379"] });
 * await etcd.put("/dormice/a", "1");
 * console.log((await etcd.get("/dormice/a"))?.value); // "1"
 * ```
 */
export class EtcdClient {
  /** The members, in the order first tried. */
  readonly endpoints: readonly string[];
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;
  /** The member that answered last: asked first next time, so a dead one costs one refusal. */
  #current = 0;
  readonly #probeEveryMs: number;
  readonly #clock: Clock;
  /** Why the last call found no member, while etcd is known unreachable; else undefined. */
  #down: readonly string[] | undefined;
  /** When the last call that asked the members (the probe, while down) began. */
  #lastAsked = -Infinity;

  /** Builds the client; nothing is sent until the first call. */
  constructor(options: EtcdClientOptions) {
    if (options.endpoints.length === 0) {
      throw new TypeError("Cannot create EtcdClient as 'endpoints' is empty: pass at least one");
    }
    this.endpoints = options.endpoints;
    this.#timeoutMs = options.timeoutMs ?? 5000;
    this.#fetch = options.fetch ?? globalThis.fetch;
    this.#probeEveryMs = options.probeEveryMs ?? 1000;
    this.#clock = options.clock ?? systemClock;
  }

  /** Whether the last call that asked the members waited out its bound with none answering. */
  get unreachable(): boolean {
    return this.#down !== undefined;
  }

  /**
   * POSTs `body` to `path` on a member and returns its JSON answer. While etcd is known
   * unreachable (the last call waited out its bound with no member answering), one call a
   * `probeEveryMs` asks the members again and the others fail at once; a probe that is answered
   * ends that.
   *
   * @throws {EtcdUnavailableError} when no member answered within the bound, or at once while
   *   etcd is known unreachable and a probe was made less than `probeEveryMs` ago.
   */
  async call(path: string, body: Json, signal?: AbortSignal): Promise<Json> {
    const now = this.#clock.now();
    if (this.#down !== undefined && now - this.#lastAsked < this.#probeEveryMs) {
      throw new EtcdUnavailableError(this.endpoints, [
        ...this.#down,
        `not asked again: no member answered ${Math.round(now - this.#lastAsked)} ms ago, ` +
        `and one call every ${this.#probeEveryMs} ms asks until one does`,
      ]);
    }
    this.#lastAsked = now;
    try {
      const answer = await this.#ask(path, body, signal);
      this.#down = undefined;
      return answer;
    } catch (error) {
      // Only a call that waited out its bound makes the next ones fail at once: a refused
      // connection costs nothing to try again, and one lost answer is no outage.
      if (error instanceof EtcdUnavailableError) {
        this.#down = error.timedOut ? error.causes : undefined;
      } else if (error instanceof EtcdRequestError) this.#down = undefined;
      throw error;
    }
  }

  /** `call` on the members, in turn, within the call bound. */
  async #ask(path: string, body: Json, signal?: AbortSignal): Promise<Json> {
    const deadline = Date.now() + this.#timeoutMs;
    const causes: string[] = [];
    let answeredBusy = false;
    for (let attempt = 0;; attempt++) {
      const i = (this.#current + attempt) % this.endpoints.length;
      const endpoint = this.endpoints[i];
      const left = deadline - Date.now();
      if (left <= 0) break;
      // One member may hang rather than refuse (a follower whose leader just died holds a
      // proposal until the election ends): it gets a share of the bound, so the others are
      // asked in time.
      const share = Math.max(250, Math.floor(this.#timeoutMs / this.endpoints.length));
      const bound = signal
        ? AbortSignal.any([signal, AbortSignal.timeout(Math.min(left, share))])
        : AbortSignal.timeout(Math.min(left, share));
      try {
        const res = await this.#fetch(endpoint + path, {
          method: "POST",
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
          signal: bound,
        });
        const text = await res.text();
        if (res.status >= 500) {
          answeredBusy = true;
          causes.push(`${endpoint} answered ${res.status}: ${text.slice(0, 200)}`);
        } else if (res.status >= 400) {
          throw new EtcdRequestError(path, res.status, text);
        } else {
          this.#current = i;
          return JSON.parse(text);
        }
      } catch (error) {
        if (signal?.aborted) throw error;
        if (error instanceof EtcdRequestError) throw error;
        // A member that took its whole share is alive and waiting (for a leader, say), like
        // one answering 5xx: worth asking again; only a refused connection says it is gone.
        if ((error as Error)?.name === "TimeoutError") answeredBusy = true;
        causes.push(`${endpoint}: ${describeFetchFailure(error)}`);
      }
      const cycled = (attempt + 1) % this.endpoints.length === 0;
      if (cycled) {
        // Every member refused the connection: etcd is down, and saying so now beats waiting.
        // A member that answered 5xx may be electing a leader, which settles within a second.
        if (!answeredBusy) break;
        answeredBusy = false;
        await new Promise((r) => setTimeout(r, Math.min(100, Math.max(0, deadline - Date.now()))));
      }
    }
    throw new EtcdUnavailableError(
      this.endpoints,
      causes.slice(-this.endpoints.length),
      Date.now() >= deadline,
    );
  }

  /** The key's value, or `null`. */
  async get(key: string): Promise<EtcdKv | null> {
    const r = await this.call("/v3/kv/range", { key: b64(key) });
    return r.kvs?.length ? toKv(r.kvs[0]) : null;
  }

  /** Every key under `prefix`, in key order. */
  async range(prefix: string): Promise<EtcdKv[]> {
    const r = await this.call("/v3/kv/range", { key: b64(prefix), range_end: prefixEnd(prefix) });
    return (r.kvs ?? []).map(toKv);
  }

  /** Writes `value` under `key`, tied to `lease` when given. Returns the new revision. */
  async put(key: string, value: string, lease?: string): Promise<string> {
    const r = await this.call("/v3/kv/put", {
      key: b64(key),
      value: b64(value),
      ...(lease ? { lease } : {}),
    });
    return r.header?.revision ?? "0";
  }

  /** Deletes `key`; resolves whether it existed. */
  async delete(key: string): Promise<boolean> {
    const r = await this.call("/v3/kv/deleterange", { key: b64(key) });
    return Number(r.deleted ?? 0) > 0;
  }

  /**
   * Creates `key` with `value` (tied to `lease`) only if it does not exist, and returns the key
   * as it stands after the call: holding `value` when this call (or an earlier try of it)
   * created it, another holder's value otherwise.
   */
  async createIfAbsent(key: string, value: string, lease?: string): Promise<EtcdKv> {
    const r = await this.call("/v3/kv/txn", {
      compare: [{ target: "CREATE", key: b64(key), create_revision: "0" }],
      success: [{ request_put: { key: b64(key), value: b64(value), ...(lease ? { lease } : {}) } }],
      // Read the holder back: a retried call whose first try was applied after it timed out
      // finds its own value there, and holds the key (otherwise it would wait on itself).
      failure: [{ request_range: { key: b64(key) } }],
    });
    const revision = r.header?.revision ?? "0";
    if (r.succeeded) {
      return { key, value, createRevision: revision, modRevision: revision, lease };
    }
    const held = r.responses?.[0]?.response_range?.kvs?.[0];
    // The compare and the read are one transaction, so a failed create always finds a holder.
    return held ? toKv(held) : { key, value: "", createRevision: "0", modRevision: "0" };
  }

  /**
   * Deletes `key` only while it holds `value` (a compare-and-delete): a key that lapsed and
   * was written again by someone else is left alone. Returns whether it deleted.
   */
  async deleteIfValue(key: string, value: string): Promise<boolean> {
    const r = await this.call("/v3/kv/txn", {
      compare: [{ target: "VALUE", key: b64(key), value: b64(value) }],
      success: [{ request_delete_range: { key: b64(key) } }],
      failure: [],
    });
    return r.succeeded === true;
  }

  /**
   * One transaction: when every comparison holds, `success` runs, else `failure`. A comparison
   * or delete with `prefix` covers every key that starts with `key` (a comparison over a range
   * holds when every key in it satisfies it, and holds for an empty range). Returns whether the
   * comparisons held, the revision after it, and the keys each range op read, in op order.
   */
  async txn(
    compare: readonly EtcdCompare[],
    success: readonly EtcdOp[],
    failure: readonly EtcdOp[] = [],
  ): Promise<EtcdTxnResult> {
    const r = await this.call("/v3/kv/txn", {
      compare: compare.map((c) => ({
        target: c.target,
        result: c.result,
        key: b64(c.key),
        ...(c.prefix ? { range_end: prefixEnd(c.key) } : {}),
        ...(c.target === "MOD" ? { mod_revision: c.revision ?? "0" } : {}),
        ...(c.target === "CREATE" ? { create_revision: c.revision ?? "0" } : {}),
        ...(c.target === "VALUE" ? { value: b64(c.value ?? "") } : {}),
      })),
      success: success.map(txnOp),
      failure: failure.map(txnOp),
    });
    const succeeded = r.succeeded === true;
    const ops = succeeded ? success : failure;
    // deno-lint-ignore no-explicit-any
    const responses: any[] = r.responses ?? [];
    const ranges: EtcdKv[][] = [];
    ops.forEach((op, i) => {
      if (op.op === "range") ranges.push((responses[i]?.response_range?.kvs ?? []).map(toKv));
    });
    return { succeeded, revision: r.header?.revision ?? "0", ranges };
  }

  /** Grants a lease of `ttlSeconds`; returns its id (a decimal string: int64 exceeds a number). */
  async grant(ttlSeconds: number): Promise<string> {
    const r = await this.call("/v3/lease/grant", { TTL: String(ttlSeconds) });
    if (!r.ID) throw new Error(`etcd granted no lease: ${r.error ?? JSON.stringify(r)}`);
    return r.ID;
  }

  /** Renews `lease`; returns its new TTL in seconds, 0 when it had already expired. */
  async keepAlive(lease: string): Promise<number> {
    const r = await this.call("/v3/lease/keepalive", { ID: lease });
    return Number(r.result?.TTL ?? 0);
  }

  /** Revokes `lease`, deleting every key tied to it. */
  async revoke(lease: string): Promise<void> {
    await this.call("/v3/lease/revoke", { ID: lease });
  }
}

/**
 * The values of `kvs` parsed as JSON, in order, leaving out any that is not JSON: a replica
 * reads records another gateway wrote, and one it cannot read is skipped, not fatal. The caller
 * still checks each record's fields.
 *
 * @example
 * ```ts ignore
 * for (const record of jsonValues(await etcd.range("/dormice/nodes/"))) console.log(record);
 * ```
 */
export function jsonValues(kvs: readonly EtcdKv[]): unknown[] {
  const values: unknown[] = [];
  for (const kv of kvs) {
    try {
      values.push(JSON.parse(kv.value));
    } catch {
      // Not a record of ours: left alone.
    }
  }
  return values;
}

function txnOp(op: EtcdOp): Json {
  const key = b64(op.key);
  const range_end = "prefix" in op && op.prefix ? prefixEnd(op.key) : undefined;
  if (op.op === "put") {
    return { request_put: { key, value: b64(op.value), ...(op.lease ? { lease: op.lease } : {}) } };
  }
  if (op.op === "delete") {
    return { request_delete_range: { key, ...(range_end ? { range_end } : {}) } };
  }
  return { request_range: { key, ...(range_end ? { range_end } : {}) } };
}
