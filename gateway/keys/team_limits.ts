/**
 * A key's limits, checked where a new sandbox is placed: `maxSandboxes` (the team's running
 * sandboxes across the fleet) and `createsPerMinute` (the key's rate). Both answer 429 with a
 * sentence naming the limit, which the E2B SDKs turn into their rate-limit error. Only the rate
 * carries Retry-After: time clears it, while only a kill clears `maxSandboxes`, so that one is
 * answered as E2B answers its concurrency limit, with no retry invited (the JS SDK retries a 429
 * that carries Retry-After for up to 15 s before it raises).
 *
 * @module
 */
import type { NodeDirectory } from "../fleet/fleet.ts";
import type { ApiKeyInfo } from "./keys.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { HttpError } from "../../shared/http_error.ts";
import type { RateBucket, TeamLedger, TeamRecord } from "./team_ledger.ts";

/** What the routing reports back about one admitted create. */
export interface Admission {
  /**
   * The create went to `nodeId` and was not refused (a 2xx, a 5xx or no answer: it may exist).
   * `ledgerSeq` is the node's change number its answer named (`x-dormice-ledger-seq`), if any.
   */
  placed(nodeId: string, ledgerSeq?: number): void;
  /** Nothing was built: no node fitted, or the node refused it (4xx). */
  cancel(): void;
}

/** Options of {@linkcode TeamLimits}. */
export interface TeamLimitsOptions {
  /** The nodes whose readings carry each team's running count. */
  fleet: NodeDirectory;
  /** The rate's clock; the real one by default. */
  clock?: Clock;
  /**
   * Where the creates of keys with limits are counted across gateways (shared mode's etcd);
   * absent, this gateway counts alone.
   */
  ledger?: TeamLedger;
}

interface NodeDelta {
  /** The reading these changes are counted since. */
  seq: number;
  /** team → placements minus destroys since that reading, of the changes the node numbered not. */
  teams: Map<string, number>;
  /** The changes the node numbered, each counted until a reading of that number or later. */
  numbered: Numbered[];
}

/** One create (+1) or destroy (-1) whose answer named the node's ledger change number. */
interface Numbered {
  team: string;
  n: number;
  /** The node's change number after it. */
  at: number;
  /** When this gateway heard of it (its clock), for the age bound. */
  heard: number;
}

/**
 * How long a numbered change is counted at most without a reading that counts it (10 minutes):
 * a node whose readings never catch up (its clock set back across a restart) cannot pin a
 * team's count for good, and the list per node stays bounded.
 */
const NUMBERED_MAX_AGE_MS = 10 * 60_000;
/** The most numbered changes kept per node; past it the oldest go first. */
const NUMBERED_MAX = 10_000;

/**
 * Whether a numbered change is still to be added to its node's reading: within the age bound,
 * and not counted by the reading, which says so by its number (`counted`) or, when it carries
 * none, by having come before the change (`sinceReading`), as for an unnumbered one.
 */
function uncounted(
  e: Numbered,
  counted: number | undefined,
  sinceReading: boolean,
  now: number,
): boolean {
  if (now - e.heard > NUMBERED_MAX_AGE_MS) return false;
  return counted === undefined ? sinceReading : counted < e.at;
}

type Bucket = RateBucket;

/**
 * How long after the reading that counts a team record the record is kept (5 s): every gateway
 * reads the node table back once a second, so by then each one has that reading.
 */
const RECORD_GRACE_MS = 5000;

/** A bucket of `perMinute` tokens refilled to `now`. */
function refilled(bucket: Bucket, perMinute: number, now: number): Bucket {
  const tokens = Math.min(perMinute, bucket.tokens + ((now - bucket.at) * perMinute) / 60_000);
  return { tokens, at: now };
}

/** The 429 of a key past its rate, with the seconds until its next token. */
function rateRefusal(keyId: string, perMinute: number, tokens: number): HttpError {
  const msPerToken = 60_000 / perMinute;
  const wait = Math.max(1, Math.ceil(((1 - tokens) * msPerToken) / 1000));
  return new HttpError(
    429,
    `Key '${keyId}' created ${perMinute} sandboxes within the last minute, its limit ` +
      `(createsPerMinute ${perMinute}): retry in ${wait} s`,
    { headers: { "retry-after": String(wait) } },
  );
}

/** The 429 of a team at its key's `maxSandboxes`, E2B's sentence first. */
function fullRefusal(key: ApiKeyInfo, team: string, running: number): HttpError {
  // E2B's sentence first: clients match on it to tell this limit from a rate.
  return new HttpError(
    429,
    `You have reached the maximum number of concurrent E2B sandboxes ` +
      `(${key.maxSandboxes}). Team '${team}' runs ${running}, the limit of its key ` +
      `'${key.id}' (maxSandboxes ${key.maxSandboxes}): kill one first, or ask the ` +
      "operator for a higher limit",
  );
}

/** What the team records add to the count: per node until its reading counts them, or flat. */
export interface RecordCount {
  /** Per node id, the records its reading does not count yet. */
  perNode: Map<string, number>;
  /** Records counted whatever the readings say. */
  flat: number;
}

/** Buckets beyond this many are swept of full ones (a full bucket is the same as none). */
const MAX_BUCKETS = 10_000;

const nothing: Admission = { placed() {}, cancel() {} };

/**
 * Holds teams to their keys' limits without a second copy of the truth: a team's running count
 * is what each node said in its last reading, plus the gateway's own placements and minus its
 * own destroys on that node that reading does not count, plus the creates still in flight. A
 * check-in makes the count exact again; between two, it follows this gateway's own work.
 *
 * Which changes a reading counts: a node numbers its ledger's changes, names the number after a
 * create or a destroy on its answer, and sends the number its counts were read at in each
 * reading. A reading taken before a create but heard after its answer (the two travel apart)
 * has a smaller number, so the create is still added to it. A node that numbers nothing is
 * taken to count everything done before its next reading.
 *
 * The rate is a token bucket per key: `createsPerMinute` tokens, one back every
 * `60 / createsPerMinute` seconds, so a burst up to the limit passes and the average holds.
 *
 * @example
 * ```ts
 * import { Fleet } from "../fleet/fleet.ts";
 * import { TeamLimits } from "./team_limits.ts";
 * const fleet = new Fleet();
 * const limits = new TeamLimits({ fleet });
 * limits.running("acme"); // 0
 * fleet.close();
 * ```
 */
export class TeamLimits {
  #fleet: NodeDirectory;
  #clock: Clock;
  #deltas = new Map<string, NodeDelta>();
  #pending = new Map<string, number>();
  #buckets = new Map<string, Bucket>();
  #ledger: TeamLedger | undefined;

  /** Builds the limits over `fleet`'s readings. */
  constructor(options: TeamLimitsOptions) {
    this.#fleet = options.fleet;
    this.#clock = options.clock ?? systemClock;
    this.#ledger = options.ledger;
  }

  /**
   * The team's running sandboxes across the fleet, as far as this gateway knows; `records`
   * adds the shared ledger's creates (shared mode).
   */
  running(team: string, records?: RecordCount): number {
    let total = (this.#pending.get(team) ?? 0) + (records?.flat ?? 0);
    const now = this.#clock.now();
    for (const node of this.#fleet.nodes()) {
      const reported = node.reading?.teams?.[team] ?? 0;
      const delta = this.#deltas.get(node.id);
      let since = 0;
      if (delta !== undefined) {
        const sinceReading = delta.seq === node.readingSeq;
        if (sinceReading) since = delta.teams.get(team) ?? 0;
        const counted = node.reading?.ledgerSeq;
        for (const e of delta.numbered) {
          if (e.team === team && uncounted(e, counted, sinceReading, now)) since += e.n;
        }
      }
      since += records?.perNode.get(node.id) ?? 0;
      total += Math.max(0, reported + since);
    }
    return total;
  }

  /**
   * Lets a create by `key` for `team` go on, or refuses it, as {@linkcode admit} does; with a
   * ledger (shared mode) and a key that has limits, counted where every gateway sees it: the
   * team's creates in flight or not yet in a reading, through any gateway, and the key's rate
   * as one bucket for the whole fleet.
   *
   * @throws {HttpError} what {@linkcode admit} throws; 503 naming etcd when the ledger cannot be
   *   read or written.
   */
  async enter(key: ApiKeyInfo | undefined, team: string): Promise<Admission> {
    const ledger = this.#ledger;
    if (
      key === undefined || ledger === undefined ||
      (key.maxSandboxes === null && key.createsPerMinute === null)
    ) return this.admit(key, team);
    const perMinute = key.createsPerMinute;
    const rate = perMinute === null ? undefined : { keyId: key.id, perMinute };
    const entry = await ledger.admit(team, rate, (records, stored) => {
      const now = this.#clock.now();
      const { count, drop } = this.#weigh(records, now);
      if (key.maxSandboxes !== null) {
        const running = this.running(team, count);
        if (running >= key.maxSandboxes) throw fullRefusal(key, team, running);
      }
      if (perMinute === null) return { drop };
      const bucket = refilled(stored ?? { tokens: perMinute, at: now }, perMinute, now);
      if (bucket.tokens < 1) throw rateRefusal(key.id, perMinute, bucket.tokens);
      return { drop, bucket: { tokens: bucket.tokens - 1, at: now } };
    });
    return {
      placed: (nodeId, ledgerSeq) => void entry.placed(nodeId, ledgerSeq),
      cancel: () => void entry.cancel(),
    };
  }

  /**
   * What the team's records add: one in flight counts flat; one placed counts on its node until
   * that node's reading counts it (by its change number, or, for a node that numbers nothing, by
   * being accepted after it). A record counted by a reading every gateway has had time to read,
   * one on a node the fleet no longer has, or one past the age bound is dropped.
   */
  #weigh(records: TeamRecord[], now: number): { count: RecordCount; drop: string[] } {
    const count: RecordCount = { perNode: new Map(), flat: 0 };
    const drop: string[] = [];
    for (const r of records) {
      if (now - r.t > NUMBERED_MAX_AGE_MS) {
        drop.push(r.key);
        continue;
      }
      if (r.node === undefined) {
        count.flat++;
        continue;
      }
      const node = this.#fleet.get(r.node);
      if (node === undefined) {
        // A node this gateway has not heard of yet counts flat for a while; one removed, never.
        if (now - r.t > RECORD_GRACE_MS) drop.push(r.key);
        else count.flat++;
        continue;
      }
      const seq = node.reading?.ledgerSeq;
      const uncounted = node.reading === null ||
        (r.at !== undefined && seq !== undefined ? seq < r.at : node.lastCheckIn < r.t);
      if (uncounted) count.perNode.set(node.id, (count.perNode.get(node.id) ?? 0) + 1);
      else if (now - node.lastCheckIn >= RECORD_GRACE_MS) drop.push(r.key);
    }
    return { count, drop };
  }

  /**
   * Lets a create by `key` for `team` go on, counting it in flight, or refuses it. A caller with
   * no key (the operator) has no limits.
   *
   * @throws {HttpError} 429 when the team is at `maxSandboxes` (no Retry-After: waiting does not
   *   clear it), 429 with Retry-After when the key is past `createsPerMinute`.
   */
  admit(key: ApiKeyInfo | undefined, team: string): Admission {
    if (key === undefined) return nothing;
    if (key.maxSandboxes !== null) {
      const running = this.running(team);
      if (running >= key.maxSandboxes) throw fullRefusal(key, team, running);
    }
    if (key.createsPerMinute !== null) this.#take(key.id, key.createsPerMinute);
    this.#pending.set(team, (this.#pending.get(team) ?? 0) + 1);
    let settled = false;
    const settle = () => {
      if (settled) return false;
      settled = true;
      const left = (this.#pending.get(team) ?? 1) - 1;
      if (left > 0) this.#pending.set(team, left);
      else this.#pending.delete(team);
      return true;
    };
    return {
      placed: (nodeId, ledgerSeq) => {
        if (settle()) this.#add(nodeId, team, 1, ledgerSeq);
      },
      cancel: () => {
        if (settle() && key.createsPerMinute !== null) this.#giveBack(key.id, key.createsPerMinute);
      },
    };
  }

  /**
   * A sandbox of `team` on `nodeId` was destroyed through this gateway; `ledgerSeq` is the node's
   * change number its answer named, if any.
   */
  destroyed(nodeId: string, team: string, ledgerSeq?: number): void {
    this.#add(nodeId, team, -1, ledgerSeq);
  }

  #add(nodeId: string, team: string, n: number, ledgerSeq: number | undefined): void {
    const node = this.#fleet.get(nodeId);
    if (node === undefined) return;
    let delta = this.#deltas.get(nodeId);
    if (delta === undefined) {
      delta = { seq: node.readingSeq, teams: new Map(), numbered: [] };
      this.#deltas.set(nodeId, delta);
    } else if (delta.seq !== node.readingSeq) {
      // A new reading already counts every unnumbered change before it; the numbered ones it
      // counts are dropped, the rest kept until one does.
      delta.seq = node.readingSeq;
      delta.teams = new Map();
      const counted = node.reading?.ledgerSeq;
      const now = this.#clock.now();
      delta.numbered = delta.numbered.filter((e) => uncounted(e, counted, false, now));
    }
    if (ledgerSeq !== undefined && Number.isSafeInteger(ledgerSeq) && ledgerSeq >= 0) {
      delta.numbered.push({ team, n, at: ledgerSeq, heard: this.#clock.now() });
      if (delta.numbered.length > NUMBERED_MAX) delta.numbered.shift();
    } else delta.teams.set(team, (delta.teams.get(team) ?? 0) + n);
    // Nodes removed from the fleet leave their deltas behind: drop them while passing by.
    if (this.#deltas.size > this.#fleetSize()) {
      for (const id of this.#deltas.keys()) {
        if (this.#fleet.get(id) === undefined) this.#deltas.delete(id);
      }
    }
  }

  #fleetSize(): number {
    let n = 0;
    for (const _ of this.#fleet.nodes()) n++;
    return n;
  }

  #take(keyId: string, perMinute: number): void {
    const now = this.#clock.now();
    const bucket = this.#refill(keyId, perMinute, now);
    if (bucket.tokens < 1) throw rateRefusal(keyId, perMinute, bucket.tokens);
    bucket.tokens -= 1;
  }

  #giveBack(keyId: string, perMinute: number): void {
    const bucket = this.#buckets.get(keyId);
    if (bucket !== undefined) bucket.tokens = Math.min(perMinute, bucket.tokens + 1);
  }

  #refill(keyId: string, perMinute: number, now: number): Bucket {
    let bucket = this.#buckets.get(keyId);
    if (bucket === undefined) {
      if (this.#buckets.size >= MAX_BUCKETS) this.#sweep(now);
      bucket = { tokens: perMinute, at: now };
      this.#buckets.set(keyId, bucket);
      return bucket;
    }
    Object.assign(bucket, refilled(bucket, perMinute, now));
    return bucket;
  }

  /** Drops buckets that have had a minute to fill up again: they are the same as none. */
  #sweep(now: number): void {
    for (const [id, b] of this.#buckets) if (now - b.at >= 60_000) this.#buckets.delete(id);
  }
}
