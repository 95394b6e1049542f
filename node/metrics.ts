/**
 * The node's Prometheus metrics (`GET /metrics`, the fleet token as a bearer token), on
 * `prom-client` with a registry of its own per node: sandboxes by state (the ledger's census,
 * read at scrape time), executor operations by kind and outcome with their latency, engine
 * errors, check-in outcomes, the deadline scanner's kills and pauses, and the lifecycle events
 * waiting for the next check-in.
 *
 * Labels are operations, outcomes, error codes and states: never a sandbox's name or id.
 *
 * @module
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { StateCounts } from "../shared/schemas.ts";
import type { ExecutorErrorCode } from "./executors/contract.ts";

/** Latency buckets of executor calls, in seconds: a fake call takes microseconds, a Docker create up to seconds. */
const executorBuckets = [
  0.0005,
  0.001,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
  30,
];

/** How an executor call ended: `ok`, an `ExecutorError` code, or `error` (anything else). */
export type ExecutorOutcome = "ok" | ExecutorErrorCode | "error";

type CounterChild = ReturnType<Counter<string>["labels"]>;
type HistogramChild = ReturnType<Histogram<string>["labels"]>;

/** Options of {@linkcode NodeMetrics}. */
export interface NodeMetricsOptions {
  /** The ledger's census by state, read at each scrape. */
  census?: () => StateCounts;
  /** Lifecycle events waiting for the next check-in, read at each scrape. */
  pendingEvents?: () => number;
  /** The build string shown in `dormice_node_build_info`. */
  build?: string;
}

/**
 * The node's metrics.
 *
 * @example
 * ```ts
 * import { NodeMetrics } from "./metrics.ts";
 * const metrics = new NodeMetrics();
 * metrics.executorCall("create", "ok", 0.2);
 * const text = await metrics.text();
 * console.log(text.includes('dormice_node_executor_operations_total{operation="create",outcome="ok"} 1')); // true
 * ```
 */
export class NodeMetrics {
  /** The registry every node series lives in. */
  readonly registry: Registry = new Registry();
  readonly #operations: Counter<"operation" | "outcome">;
  readonly #latency: Histogram<"operation">;
  readonly #engineErrors: Counter<"code">;
  /** operation → outcome → child, bound at first use (a dozen operations, a few outcomes). */
  readonly #opChildren = new Map<string, Map<ExecutorOutcome, CounterChild>>();
  readonly #latencyChildren = new Map<string, HistogramChild>();
  readonly #checkInOk: CounterChild;
  readonly #checkInFailed: CounterChild;
  readonly #checkInFailures: Counter<string>;
  readonly #deadline: Record<"killed" | "paused" | "failed", CounterChild>;
  readonly #eventsDropped: Counter<string>;

  /** Registers every series. */
  constructor(options: NodeMetricsOptions = {}) {
    const registers = [this.registry];
    new Gauge({
      name: "dormice_node_build_info",
      help: "Always 1; the build label names the software the node runs",
      labelNames: ["build"],
      registers,
    }).set({ build: options.build ?? "unknown" }, 1);
    const census = options.census;
    new Gauge({
      name: "dormice_node_sandboxes",
      help: "Sandboxes in the node's ledger by state",
      labelNames: ["state"],
      registers,
      collect() {
        if (census === undefined) return;
        for (const [state, n] of Object.entries(census())) this.set({ state }, n);
      },
    });
    this.#operations = new Counter({
      name: "dormice_node_executor_operations_total",
      help: "Executor calls by operation and outcome (ok, an executor error code, or error)",
      labelNames: ["operation", "outcome"],
      registers,
    });
    this.#latency = new Histogram({
      name: "dormice_node_executor_operation_duration_seconds",
      help: "Duration of executor calls by operation (exec: until the command started)",
      labelNames: ["operation"],
      buckets: executorBuckets,
      registers,
    });
    this.#engineErrors = new Counter({
      name: "dormice_node_engine_errors_total",
      help: "Executor calls the engine failed: unavailable, timeout, or an unexpected error",
      labelNames: ["code"],
      registers,
    });
    for (const code of ["unavailable", "timeout", "error"]) this.#engineErrors.labels({ code });
    const checkIns = new Counter({
      name: "dormice_node_check_ins_total",
      help: "Check-in attempts with the gateway by outcome",
      labelNames: ["outcome"],
      registers,
    });
    this.#checkInOk = checkIns.labels({ outcome: "ok" });
    this.#checkInFailed = checkIns.labels({ outcome: "failed" });
    this.#checkInFailures = new Counter({
      name: "dormice_node_check_in_failures_total",
      help: "Check-ins the gateway did not accept (no answer, a redirect, or a refusal)",
      registers,
    });
    const deadline = new Counter({
      name: "dormice_node_deadline_actions_total",
      help: "What the deadline scanner did: killed or paused a sandbox past its deadline, or " +
        "failed (retried at the next scan)",
      labelNames: ["action"],
      registers,
    });
    this.#deadline = {
      killed: deadline.labels({ action: "killed" }),
      paused: deadline.labels({ action: "paused" }),
      failed: deadline.labels({ action: "failed" }),
    };
    const pending = options.pendingEvents;
    new Gauge({
      name: "dormice_node_lifecycle_events_pending",
      help: "Lifecycle events waiting to ride the next check-in",
      registers,
      collect() {
        this.set(pending?.() ?? 0);
      },
    });
    this.#eventsDropped = new Counter({
      name: "dormice_node_lifecycle_events_dropped_total",
      help: "Lifecycle events dropped because the gateway was unreachable for too long",
      registers,
    });
  }

  /** One executor call ended. */
  executorCall(operation: string, outcome: ExecutorOutcome, seconds: number): void {
    let byOutcome = this.#opChildren.get(operation);
    if (byOutcome === undefined) this.#opChildren.set(operation, byOutcome = new Map());
    let child = byOutcome.get(outcome);
    if (child === undefined) {
      byOutcome.set(outcome, child = this.#operations.labels({ operation, outcome }));
    }
    child.inc();
    let latency = this.#latencyChildren.get(operation);
    if (latency === undefined) {
      this.#latencyChildren.set(operation, latency = this.#latency.labels({ operation }));
    }
    latency.observe(seconds);
    if (outcome === "unavailable" || outcome === "timeout" || outcome === "error") {
      this.#engineErrors.labels({ code: outcome }).inc();
    }
  }

  /** A check-in attempt ended. */
  checkIn(ok: boolean): void {
    if (ok) this.#checkInOk.inc();
    else {
      this.#checkInFailed.inc();
      this.#checkInFailures.inc();
    }
  }

  /** The deadline scanner acted on one sandbox. */
  deadlineAction(action: "killed" | "paused" | "failed"): void {
    this.#deadline[action].inc();
  }

  /** Lifecycle events were dropped from a full outbox. */
  eventsDropped(n = 1): void {
    this.#eventsDropped.inc(n);
  }

  /** The exposition text (Prometheus text format 0.0.4). */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** The exposition's content type. */
  get contentType(): string {
    return this.registry.contentType;
  }
}
