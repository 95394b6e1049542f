/**
 * What a {@linkcode SandboxService} is built from.
 *
 * @module
 */
import type { SandboxRecord } from "./service_contract.ts";
import type { Clock } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import type { NameQueue } from "../shared/name_queue.ts";
import type { Executor } from "./executors/contract.ts";
import type { Ledger } from "./ledger.ts";
import type { MetricsHistory } from "./metrics_history.ts";
import type { WarmPools } from "./pools.ts";
import type { SlotFence } from "./slot_fence.ts";

/** What a pushed check-in names of a create made behind the gateways' back. */
export interface DirectCreate {
  /** The sandbox's team. */
  team: string;
  /** The sandbox's name. */
  name: string;
  /** Its id, once built (the push after the build). */
  id?: string;
}

/** Options of `SandboxService` (node/service.ts). */
export interface SandboxServiceOptions {
  /** The ledger the service reads and writes every row in. */
  ledger: Ledger;
  /** Runs the sandboxes the ledger records. */
  executor: Executor;
  /** One slot per name; pass one in to share it with another face. */
  queue?: NameQueue;
  /** The largest slot token seen per name (shared mode's gateways send them); a fresh one by default. */
  fence?: SlotFence;
  /**
   * Makes a create behind the gateway's back (`AcquireRequest.direct`) known to the gateway at
   * once: called with the name's slot held, once before the build (the busy slot is in the
   * digest; a rejection refuses the create) and once after it (the new row and id are; a
   * rejection there is only logged). The node's app passes its check-in loop's
   * `pushDirectCreate`; none by default (a node without a gateway).
   */
  announceDirect?: (what: string, created: DirectCreate) => Promise<void>;
  /**
   * Called once a sandbox is paused to disk (with its row, state `archived`), inside its slot:
   * the node's app pushes the kept files to the registry there. A rejection is logged.
   */
  onArchived?: (sandbox: SandboxRecord) => Promise<void>;
  /** Stamps creation, idle and deadline times; `systemClock` when absent. */
  clock?: Clock;
  /** Where lifecycle events and failures are logged; `silentLog` when absent. */
  log?: Log;
  /** The template when a create names none. */
  defaultTemplate?: string;
  /** The cap per stream of `execCommand` (1 MiB: big enough for logs, small enough for JSON). */
  maxOutputBytes?: number;
  /** Each sandbox's recent samples (the `MetricsSampler` fills it); a new one when absent. */
  history?: MetricsHistory;
  /**
   * How long `execCommand` waits for a command's output to end once its timeout killed it (5 s):
   * a descendant that escaped the kill (one that dropped the executor's marker from its
   * environment) may hold the output open for as long as it lives.
   */
  killGraceMs?: number;
  /** Warm pools a create claims from before it builds cold; none when absent. */
  pools?: WarmPools;
}
