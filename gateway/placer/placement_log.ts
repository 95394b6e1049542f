/**
 * The recent placements, with their explain, for the fleet page: a ring of the last few
 * decisions (placed or not), each cut to a bounded size, so a 10,000-node fleet's rejections
 * cannot grow the gateway's memory.
 *
 * @module
 */
import type { PickResult, PlacementExplain } from "./placer.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";

/** One placement decision as the fleet page shows it. */
export interface PlacementRecord {
  /** When it was decided, ms since the epoch. */
  at: number;
  /** The team-scoped name placed (`team/name`, the bare name in the default team). */
  key: string;
  /** Whether a node was chosen. */
  ok: boolean;
  /** The chosen node, when `ok`. */
  nodeId?: string;
  /** The chosen node's score, when `ok`. */
  score?: number;
  /** The explain, with at most `maxRejections` rejections (`rejected` still counts them all). */
  explain: PlacementExplain;
}

/** Options of {@linkcode PlacementLog}. */
export interface PlacementLogOptions {
  /** Decisions kept. Default 50: what one screen shows. */
  size?: number;
  /** Rejections kept per decision. Default 20: the counts by reason say the rest. */
  maxRejections?: number;
  /** Stamps each record; the real clock by default. */
  clock?: Clock;
}

/**
 * A bounded ring of recent placement decisions, newest first on `list()`.
 *
 * @example
 * ```ts
 * import { PlacementLog } from "./placement_log.ts";
 * import { Fleet, Placer } from "@dormice/cluster/gateway";
 * const fleet = new Fleet();
 * const log = new PlacementLog({ size: 2 });
 * log.record("agent-1", new Placer({ fleet }).pick());
 * console.log(log.list()[0].ok); // false: no node has checked in
 * fleet.close();
 * ```
 */
export class PlacementLog {
  readonly #size: number;
  readonly #maxRejections: number;
  readonly #clock: Clock;
  readonly #ring: (PlacementRecord | undefined)[];
  #next = 0;

  /**
   * Builds an empty log.
   *
   * @throws {RangeError} when `size` is not a positive integer.
   */
  constructor(options: PlacementLogOptions = {}) {
    const { size = 50, maxRejections = 20, clock = systemClock } = options;
    if (!Number.isInteger(size) || size < 1) {
      throw new RangeError(
        `Cannot create PlacementLog as 'size' must be a positive integer: received ${size}`,
      );
    }
    this.#size = size;
    this.#maxRejections = maxRejections;
    this.#clock = clock;
    this.#ring = new Array(size);
  }

  /** Keeps one decision, replacing the oldest when full. */
  record(key: string, pick: PickResult): void {
    const explain = pick.explain.rejections.length > this.#maxRejections
      ? { ...pick.explain, rejections: pick.explain.rejections.slice(0, this.#maxRejections) }
      : pick.explain;
    this.#ring[this.#next] = {
      at: this.#clock.now(),
      key,
      ok: pick.ok,
      ...(pick.ok ? { nodeId: pick.node.id, score: pick.score } : {}),
      explain,
    };
    this.#next = (this.#next + 1) % this.#size;
  }

  /** The kept decisions, newest first. */
  list(): PlacementRecord[] {
    const out: PlacementRecord[] = [];
    for (let i = 1; i <= this.#size; i++) {
      const r = this.#ring[(this.#next - i + this.#size) % this.#size];
      if (r !== undefined) out.push(r);
    }
    return out;
  }
}
