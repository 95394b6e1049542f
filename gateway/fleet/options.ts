/**
 * What a `Fleet` is built from, and how one check-in is applied.
 *
 * @module
 */
import type { DatabaseSync } from "node:sqlite";
import type { CheckIn } from "../../shared/schemas.ts";
import type { Clock } from "../../shared/clock.ts";
import type { Log } from "../../shared/log.ts";
import type { FleetNode } from "./node.ts";

/** Options for `Fleet` (fleet.ts). */
export interface FleetOptions {
  /**
   * Where the node table lives. The server passes the handle from
   * `openExclusiveDatabase(path, "DORMICE_GATEWAY_DB")`; the default is a private in-memory
   * database (closed by `close()`).
   */
  database?: DatabaseSync;
  /** Time source; the real clock by default. */
  clock?: Clock;
  /** Where events go; silent by default. */
  log?: Log;
  /**
   * A node is down once silent for more than this many of its own intervals. Default 2: one late
   * check-in (a GC pause, a slow network, a busy gateway) must not flap a node out of placement;
   * two in a row is a pattern worth acting on.
   */
  downAfterIntervals?: number;
  /**
   * A node silent this long (ms, by its last check-in, the time every gateway sees) is declared
   * dead: its sandboxes are taken as gone with it, lookups no longer wait on it, and the names
   * it held may be built elsewhere. `0` (the default here; the server's default is 10 minutes,
   * `DORMICE_GATEWAY_NODE_DEAD_AFTER_S`) never declares one: a silent node then blocks the names
   * it may hold until `removeNode`. A dead node that checks in again is up again with whatever
   * its ledger holds.
   */
  deadAfterMs?: number;
  /**
   * A second endpoint may take over a live id once the old reporter has been silent this many of
   * its intervals. Default 1: a reporter that is alive checks in within one interval, so a full
   * interval of silence means it stopped, and the node really moved.
   */
  moveAfterIntervals?: number;
  /**
   * Called when a new id checks in for the first time. Runs synchronously inside `checkIn()`,
   * after the node is stored and before `checkIn()` returns; it must not throw (a throw is caught
   * and logged) and should not call back into the Fleet. Start async work without awaiting it.
   */
  onJoin?: (node: FleetNode) => void;
  /**
   * Called once when a node that was up is found down. Runs synchronously inside `sweep()` (the
   * server calls it on a timer), with the same rules as `onJoin`. A node loaded from the
   * database that never checked in with this process was never up, so it gets no `onDown`.
   */
  onDown?: (node: FleetNode) => void;
  /**
   * Called once `removeNode` has dropped a node, so whoever keeps state per node (the Finder's
   * cache and failing-node log, the Placer's in-flight counts) can let it go. Same rules as
   * `onJoin`.
   */
  onRemove?: (node: FleetNode) => void;
  /**
   * Whether an endpoint is the gateway itself (see `isOwnAddress`): such a check-in is refused
   * with a 400, since every lookup and forward to it would come back to the gateway.
   */
  isOwnEndpoint?: (endpoint: string) => boolean;
  /**
   * Called after every check-in this gateway accepted itself (not a replicated one), with the
   * time it was accepted at: shared mode writes it to etcd for the other gateways. Same rules as
   * `onJoin`.
   */
  onCheckIn?: (body: CheckIn, at: number) => void;
}

/** Options of `Fleet.checkIn` (fleet.ts). */
export interface CheckInApply {
  /**
   * When the check-in was accepted (ms since the epoch): another gateway's time, read from
   * etcd, for a replicated one. The Fleet's clock by default.
   */
  at?: number;
  /**
   * A check-in another gateway already accepted (shared mode): applied as is, without the
   * live-id refusal (that gateway judged it) and without `onCheckIn`.
   */
  replicated?: boolean;
  /**
   * The gateway's own check-in route parsed the body already (with the schema the check runs):
   * it is not checked a second time. A host passing bodies it received leaves this unset.
   */
  parsed?: boolean;
}
