/**
 * Shared mode's second source of nodes for a lookup round: the nodes the key's record of recent
 * creates names beyond those the digests kept, read under half the round's deadline, and asking
 * them once read (every node the digests skipped when the record cannot be read).
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import type { Log } from "../../shared/log.ts";
import type { LookupAnswer } from "./lookup_client.ts";
import type { FinderTimers, RecentLookup } from "./options.ts";
import type { FindBy } from "./outcomes.ts";

/** Shared mode: the nodes a key's record adds to a round, once read, and those it may add. */
export interface MoreNodes {
  /** The nodes to ask beyond the digests' (never rejects). */
  nodes: Promise<FleetNode[]>;
  /** Every node the digests skipped: unheard when the record is not read in time. */
  skipped: FleetNode[];
}

/** What reading a key's record needs of the Finder. */
export interface RecordReading {
  /** Where the records of recent creates are read. */
  recent: RecentLookup;
  /** The Finder's timers, for the record's own deadline. */
  timers: FinderTimers;
  /** The lookup round's deadline, ms; the record gets half of it. */
  timeoutMs: number;
  /** Where a record that cannot be read is logged. */
  log: Log;
}

/**
 * Shared mode: the nodes a round must ask beyond `asked` by the key's records: the nodes they
 * name, or, when the record cannot be read within half the lookup deadline, every node the
 * digests skipped (asked in the half left, as mode `off` would).
 */
export function recordedNodes(
  reading: RecordReading,
  by: FindBy,
  key: string,
  alive: FleetNode[],
  asked: FleetNode[],
): MoreNodes {
  const askedIds = new Set(asked.map((n) => n.id));
  const skipped = alive.filter((n) => !askedIds.has(n.id));
  let timer: unknown;
  const late = new Promise<never>((_, reject) => {
    const ms = reading.timeoutMs / 2;
    timer = reading.timers.setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
  });
  const read = reading.recent.nodesFor(by, key);
  const nodes = Promise.race([read, late]).then(
    (ids) => skipped.filter((n) => ids.includes(n.id)),
    (error) => {
      reading.log("warn", "cannot read the record of recent creates: asking every node", {
        by,
        key,
        cause: error instanceof Error ? error.message : String(error),
      });
      return skipped;
    },
  ).finally(() => reading.timers.clearTimeout(timer));
  read.catch(() => {});
  late.catch(() => {});
  return { nodes, skipped };
}

/**
 * Waits for the nodes a record adds and asks them. A record not read before the deadline
 * leaves every node the digests skipped unheard ("not asked"): the round is unsure.
 */
export async function askRecorded(
  more: MoreNodes,
  signal: AbortSignal,
  fanOut: (list: FleetNode[]) => Promise<LookupAnswer[]>,
): Promise<{ nodes: FleetNode[]; answers: LookupAnswer[] }> {
  let onAbort!: () => void;
  const aborted = new Promise<"aborted">((resolve) => {
    onAbort = () => resolve("aborted");
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
  });
  try {
    const list = await Promise.race([more.nodes, aborted]);
    if (list === "aborted") {
      const cause = "not asked: the record of recent creates in etcd was not read in time";
      return {
        nodes: more.skipped,
        answers: more.skipped.map(() => ({ kind: "silent", cause })),
      };
    }
    return { nodes: list, answers: await fanOut(list) };
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}
