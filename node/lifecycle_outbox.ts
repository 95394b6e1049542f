/**
 * Lifecycle events the node saw on its own (its deadline scanner's kills and pauses), held for
 * the next check-in so the gateway's webhook hears of them with no client watching. Bounded:
 * while the gateway is unreachable the oldest go first (counted), since a gateway back after an
 * hour wants the latest state.
 *
 * @module
 */
import { MAX_CHECK_IN_EVENTS, type NodeLifecycleEvent } from "../shared/schemas.ts";
import type { SandboxRecord } from "./service_contract.ts";

/** Options of {@linkcode LifecycleOutbox}. */
export interface LifecycleOutboxOptions {
  /**
   * Events kept at most. Default 1,000: ten check-ins' worth, and a few hundred kilobytes at
   * worst.
   */
  max?: number;
  /** Hears of each event dropped from a full outbox (the node's metrics count them). */
  onDrop?: (event: NodeLifecycleEvent) => void;
}

/**
 * The outbox: `add` as things happen, `batch` into a check-in body, `delivered` once the
 * gateway accepted it (an event stays until then, and keeps its id so a re-send is known).
 *
 * @example
 * ```ts
 * import { LifecycleOutbox } from "./lifecycle_outbox.ts";
 * const outbox = new LifecycleOutbox();
 * outbox.add({ id: "e1", type: "timed_out", at: Date.now(), reason: "timeout", detail: "…",
 *   sandbox: { id: "sbx_1", name: "agent-1", team: "default" } });
 * const sent = outbox.batch();
 * outbox.delivered(sent);
 * console.log(outbox.size); // 0
 * ```
 */
export class LifecycleOutbox {
  readonly #max: number;
  readonly #onDrop?: (event: NodeLifecycleEvent) => void;
  #events: NodeLifecycleEvent[] = [];

  /** Builds an empty outbox. */
  constructor(options: LifecycleOutboxOptions = {}) {
    this.#max = Math.max(1, options.max ?? 1000);
    this.#onDrop = options.onDrop;
  }

  /** Events waiting. */
  get size(): number {
    return this.#events.length;
  }

  /** Keeps `event` for the next check-in, dropping the oldest when full. */
  add(event: NodeLifecycleEvent): void {
    this.#events.push(event);
    while (this.#events.length > this.#max) this.#onDrop?.(this.#events.shift()!);
  }

  /** The oldest events, as many as one check-in carries. */
  batch(): NodeLifecycleEvent[] {
    return this.#events.slice(0, MAX_CHECK_IN_EVENTS);
  }

  /** Forgets the events of an accepted check-in (by id: some may have been dropped meanwhile). */
  delivered(sent: readonly NodeLifecycleEvent[]): void {
    if (sent.length === 0) return;
    const ids = new Set(sent.map((e) => e.id));
    this.#events = this.#events.filter((e) => !ids.has(e.id));
  }
}

/**
 * The event for what the deadline scanner did to `sandbox` (its row as it was before): a kill is
 * `timed_out`, a pause is `paused`, both for the reason `timeout`.
 *
 * @example
 * ```ts ignore
 * outbox.add(scannerEvent(row, "killed", Date.now()));
 * ```
 */
export function scannerEvent(
  sandbox: SandboxRecord,
  outcome: "killed" | "paused",
  at: number,
): NodeLifecycleEvent {
  const deadline = sandbox.deadlineAt === null
    ? ""
    : ` (${new Date(sandbox.deadlineAt).toISOString()})`;
  return {
    id: crypto.randomUUID(),
    type: outcome === "killed" ? "timed_out" : "paused",
    at,
    sandbox: { id: sandbox.id, name: sandbox.name, team: sandbox.team },
    reason: "timeout",
    detail: outcome === "killed"
      ? `Killed by the node's deadline scanner: its timeout${deadline} passed`
      : `Paused by the node's deadline scanner: its timeout${deadline} passed (autoPause)`,
  };
}
