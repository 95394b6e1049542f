/**
 * What an embedder hands the {@linkcode Finder} (`finder.ts`): its options, the metrics and timer
 * hooks, shared mode's reader of recent creates, the lookup digest mode, and one call's options.
 *
 * @module
 */
import type { FetchHandler } from "../../shared/fetch_handler.ts";
import type { NodeDirectory } from "../fleet/fleet.ts";
import type { Clock } from "../../shared/clock.ts";
import type { Log } from "../../shared/log.ts";
import type { FindBy, FindResult } from "./outcomes.ts";

/** What the Finder tells its metrics hook; every method is cheap enough for the hot path. */
export interface FinderMetrics {
  /** `cached()` answered from the cache. */
  cacheHit(): void;
  /** A caller needed a lookup round (shared or not). */
  cacheMiss(): void;
  /** A lookup round ended with `outcome` after `seconds`, having asked `nodes` nodes. */
  lookupRound(outcome: FindResult["kind"], seconds: number, nodes: number): void;
}

/** Timer functions, injectable so tests fire the deadline themselves. */
export interface FinderTimers {
  /** Like `setTimeout`: schedules `fn`, returning a handle for `clearTimeout`. */
  setTimeout(fn: () => void, ms: number): unknown;
  /** Like `clearTimeout`: the round finished before its deadline. */
  clearTimeout(handle: unknown): void;
}

/** Options for {@linkcode Finder}. */
export interface FinderOptions {
  /** The nodes to ask (a `Fleet`). */
  fleet: NodeDirectory;
  /** The fleet token, sent as `Authorization: Bearer <token>` to every node. */
  token: string;
  /**
   * One deadline for a whole lookup round, connect included. Default 2000 ms
   * (`DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS`): a healthy node answers in milliseconds, and a client
   * waits at most this long before hearing that a node is silent, where a plain connect timeout
   * would hold it 10 s for a SYN that never comes back.
   */
  timeoutMs?: number;
  /**
   * Cache entries per index (one index by name, one by id). Default 100,000: an entry is a few
   * hundred bytes, so each index stays in the tens of megabytes while covering every live
   * sandbox of a large fleet; a miss only costs one round.
   */
  cacheSize?: number;
  /**
   * The HTTP client; the global `fetch` by default. Any `(request) => Response` handler serves,
   * e.g. `(r) => app.request(r)` of a Hono app.
   */
  fetch?: FetchHandler;
  /** Time source for the round's duration in logs; the real clock by default. */
  clock?: Clock;
  /** Where events go; silent by default. */
  log?: Log;
  /** Timer functions for the deadline; the globals by default. */
  timers?: FinderTimers;
  /**
   * Lookups in flight to one node at once; the rest queue (first in, first out) and their wait
   * counts against the round's deadline. Default 16: a burst of 1,000 acquires over 10 nodes
   * otherwise opens about 10,000 connections at once, and the nodes spend longer than the
   * deadline accepting them, so whole rounds come back unsure (measured: 41-50% of a 1,000
   * burst failed; with 16 per node none did, at 2.5x the throughput).
   */
  maxLookupsPerNode?: number;
  /**
   * Nodes asked at once by one lookup round (`DORMICE_GATEWAY_LOOKUP_CONCURRENCY`) until answers
   * have been timed, and the least width after; the next node is asked as soon as one answers.
   * Default 128: at 10,000 nodes a round that asked all at once opened 10,000 connections
   * together and heard none of them within the deadline. A round of more nodes is wider when the
   * nodes answered slowly of late: wide enough to ask them all in half its deadline at the
   * latency of the fastest tenth of the recent answers, at most `lookupConcurrencyMax` (`round_width.ts`). A node not yet
   * asked when the deadline passes counts as not heard: the round is `unsure`, and the answer
   * says how many were not asked.
   */
  lookupConcurrency?: number;
  /**
   * The most nodes one round asks at once, however slowly they answer: 1,024 by default (or
   * `lookupConcurrency` if larger). At 10,000 nodes answering 40 ms late a round needs about
   * 410 asks at once to end in 1 s; the cap bounds the connections a cold round opens together.
   */
  lookupConcurrencyMax?: number;
  /** Counts cache hits and misses and times lookup rounds (`GatewayMetrics`); none by default. */
  metrics?: FinderMetrics;
  /**
   * The gateway's id in the hop marker every lookup carries, so a lookup that comes back to the
   * gateway is refused (see `gateway/door.ts`). A fresh random id by default; `createGateway`
   * passes its own, the one its door checks.
   */
  hopMarker?: string;
  /**
   * Whether a miss may skip nodes whose check-in digest says they cannot hold the key:
   * `"off"` (the Finder's default; `createGateway` defaults to `"on"`) asks every node; `"on"`
   * skips them when their digest says they push creates made behind the gateway's back
   * (`directPushed`), which is sound for one gateway, and for several with `recent`;
   * `"sole-writer"` skips them on the operator's word that nothing else creates there.
   * docs/lookup-digest.md has the argument and the cases where every node is asked anyway.
   */
  lookupDigests?: LookupDigestMode;
  /**
   * Shared mode (several gateways): where the records of every gateway's recent creates are
   * read (`RecentCreates`). With it, a miss in mode `on` reads the key's one record and asks the
   * node it names whatever that node's digest says, and trusts a digest while its node's last
   * check-in is at most `trustMs` old (docs/lookup-digest.md, "Several gateways"). The record is
   * read while the digests' nodes are asked, under the same deadline; one that cannot be read
   * makes the miss ask every node, and one not read before the deadline makes it unsure.
   */
  recent?: RecentLookup;
}

/** Shared mode's records of recent creates, as the Finder reads them. */
export interface RecentLookup {
  /**
   * The nodes recent creates of `key` went to (empty when none is recorded).
   *
   * @throws when the records cannot be read: the miss then asks every node.
   */
  nodesFor(by: FindBy, key: string): Promise<string[]>;
  /** How old a node's last check-in may be for its digest to be trusted, in ms. */
  readonly trustMs: number;
}

/**
 * How a lookup miss uses the nodes' digests (docs/lookup-digest.md): `off` asks every node;
 * `sole-writer` skips by digest on the operator's word that this gateway is the one way
 * sandboxes are created on its nodes; `on` skips by digest only the nodes that push creates made
 * behind the gateway's back (`lookupDigest.directPushed`) and asks the others.
 */
export type LookupDigestMode = "off" | "sole-writer" | "on";

/** Options for one call. */
export interface FindOptions {
  /**
   * The client's signal. When it aborts, this call rejects with its reason; the shared round
   * goes on for other callers and is aborted (stopping the nodes' work) once every caller left.
   */
  signal?: AbortSignal;
  /**
   * Start a new round even when one for this key is in flight (later callers may share it).
   * `confirm()` always does: a round that began before a creator entered its name's slot may
   * predate a create that an earlier holder of the slot made, and must not let it build twice.
   */
  fresh?: boolean;
  /**
   * The creator's slot token (shared mode, `SlotHold.token`): sent with every lookup of the
   * round (`x-dormice-slot-token`), so each node asked refuses from then on a build of the name
   * by a gateway whose take is older.
   */
  slotToken?: string;
}

/** The global timers, the Finder's default. */
export const defaultTimers: FinderTimers = {
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (handle) => clearTimeout(handle as number),
};
