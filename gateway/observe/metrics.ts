/**
 * `gateway/observe/` owns what the gateway tells its operator: the Prometheus metrics
 * (`metrics.ts`, over the hot path's own counters `inline_metrics.ts`), the lifecycle events
 * (`lifecycle.ts`) and their webhook delivery (`webhooks.ts`).
 *
 * The gateway's Prometheus metrics (`GET /metrics`, the fleet token as a bearer token), built
 * on `prom-client` with a registry of its own per gateway, so two gateways in one process (the
 * tests, an embedder) never share a series.
 *
 * Two kinds of series:
 * - counters and histograms moved inline on the request path (forwards, cache hits, lookup
 *   rounds, placements): plain series bound once (`inline_metrics.ts`), so a request costs a
 *   field increment and a `performance.now()` delta, never a label hash or an allocation;
 * - gauges read at scrape time from the Fleet, the Finder and the slots (nodes and sandboxes by
 *   state, cache entries, busy slots), so nothing is kept in step on the hot path.
 *
 * Labels carry node ids, team names, faces, statuses, outcomes and reasons: bounded sets an
 * operator names. Never a sandbox name or id (unbounded), a token or a key.
 *
 * @module
 */
import { Gauge, Registry } from "prom-client";
import {
  type CounterSeries,
  type HistogramSeries,
  InlineCounter,
  InlineHistogram,
} from "./inline_metrics.ts";
import type { Fleet } from "../fleet/fleet.ts";
import type { FinderMetrics, FindResult } from "../finder/finder.ts";
import type { PickResult, RejectReason } from "../placer/placer.ts";
import { sandboxStates } from "../../shared/schemas.ts";

/** The face a node path belongs to, as the `face` label names it. */
export type ForwardFace = "native" | "e2b_api" | "envd";

/**
 * Latency buckets of forwards and lookup rounds, in seconds: a loopback forward takes about a
 * millisecond, a Docker create a few hundred, and a lookup round at most its 2 s deadline.
 */
const latencyBuckets = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/**
 * The `face` of a path on a node: its E2B control plane, its envd, or the native verbs.
 *
 * @example
 * ```ts
 * import { faceOfPath } from "./metrics.ts";
 * faceOfPath("/e2b/envd/files?path=/a"); // "envd"
 * ```
 */
export function faceOfPath(path: string): ForwardFace {
  if (path.startsWith("/e2b/api")) return "e2b_api";
  if (path.startsWith("/e2b/envd")) return "envd";
  return "native";
}

type CounterChild = CounterSeries;
type HistogramChild = HistogramSeries;

/** Options of {@linkcode GatewayMetrics}. */
export interface GatewayMetricsOptions {
  /** The build string shown in `dormice_gateway_build_info`. */
  build?: string;
}

/**
 * The gateway's metrics. Build it first, hand it to the Finder (`metrics`) and the routing
 * rules (through their observer), then {@linkcode GatewayMetrics.observe} the parts whose state
 * the gauges read at scrape time.
 *
 * @example
 * ```ts
 * import { GatewayMetrics } from "./metrics.ts";
 * const metrics = new GatewayMetrics();
 * metrics.forwarded("/execCommand", 200, 0.002);
 * const text = await metrics.text();
 * console.log(text.includes('dormice_gateway_forwards_total{face="native",status="200"} 1')); // true
 * ```
 */
export class GatewayMetrics implements FinderMetrics {
  /** The registry every gateway series lives in; webhooks add theirs here too. */
  readonly registry: Registry = new Registry();
  readonly #forwards: InlineCounter;
  readonly #forwardChildren = new Map<ForwardFace, Map<number, CounterChild>>();
  readonly #forwardLatency: Record<ForwardFace, HistogramChild>;
  readonly #cacheHits: CounterChild;
  readonly #cacheMisses: CounterChild;
  readonly #rounds: Record<FindResult["kind"], CounterChild>;
  readonly #roundLatency: Record<FindResult["kind"], HistogramChild>;
  readonly #nodeAsks: CounterSeries;
  readonly #placed: CounterChild;
  readonly #noFit: CounterChild;
  readonly #rejections: Record<RejectReason, CounterChild>;
  #hits = 0;
  #misses = 0;
  #observed = false;

  /** Registers every series; the gauges read nothing until `observe()`. */
  constructor(options: GatewayMetricsOptions = {}) {
    const registers = [this.registry];
    new Gauge({
      name: "dormice_gateway_build_info",
      help: "Always 1; the build label names the software the gateway runs",
      labelNames: ["build"],
      registers,
    }).set({ build: options.build ?? "unknown" }, 1);
    const registry = this.registry;
    this.#forwards = new InlineCounter(registry, {
      name: "dormice_gateway_forwards_total",
      help: "Requests the gateway forwarded to a node, by face and the node's status " +
        "(502: the node did not answer)",
    });
    const forwardLatency = new InlineHistogram(registry, {
      name: "dormice_gateway_forward_duration_seconds",
      help: "Time from sending a request to a node until its answer's head arrived",
      buckets: latencyBuckets,
    });
    this.#forwardLatency = {
      native: forwardLatency.series({ face: "native" }),
      e2b_api: forwardLatency.series({ face: "e2b_api" }),
      envd: forwardLatency.series({ face: "envd" }),
    };
    const cache = new InlineCounter(registry, {
      name: "dormice_gateway_finder_cache_requests_total",
      help: "Finder cache probes that answered (hit) and callers that needed a lookup round " +
        "(miss)",
    });
    this.#cacheHits = cache.series({ result: "hit" });
    this.#cacheMisses = cache.series({ result: "miss" });
    const hitRatio = () => {
      const all = this.#hits + this.#misses;
      return all === 0 ? 0 : this.#hits / all;
    };
    new Gauge({
      name: "dormice_gateway_finder_cache_hit_ratio",
      help: "hit / (hit + miss) since the gateway started; rate() the requests counter for a " +
        "window",
      registers,
      collect() {
        this.set(hitRatio());
      },
    });
    const rounds = new InlineCounter(registry, {
      name: "dormice_gateway_lookup_rounds_total",
      help:
        "Lookup rounds (every node asked, DORMICE_GATEWAY_LOOKUP_CONCURRENCY at once) by outcome: one, none, conflict, unsure",
    });
    const roundLatency = new InlineHistogram(registry, {
      name: "dormice_gateway_lookup_round_duration_seconds",
      help: "Duration of a lookup round, bounded by DORMICE_GATEWAY_LOOKUP_TIMEOUT_MS",
      buckets: latencyBuckets,
    });
    const outcomes = ["one", "none", "conflict", "unsure"] as const;
    this.#rounds = Object.fromEntries(
      outcomes.map((o) => [o, rounds.series({ outcome: o })]),
    ) as Record<FindResult["kind"], CounterChild>;
    this.#roundLatency = Object.fromEntries(
      outcomes.map((o) => [o, roundLatency.series({ outcome: o })]),
    ) as Record<FindResult["kind"], HistogramChild>;
    this.#nodeAsks = new InlineCounter(registry, {
      name: "dormice_gateway_lookup_node_asks_total",
      help: "Nodes asked by lookup rounds (a round asks every registered node)",
    }).series({});
    const placements = new InlineCounter(registry, {
      name: "dormice_gateway_placements_total",
      help: "Placement decisions: placed on a node, or no_fit (answered 503)",
    });
    this.#placed = placements.series({ outcome: "placed" });
    this.#noFit = placements.series({ outcome: "no_fit" });
    const rejections = new InlineCounter(registry, {
      name: "dormice_gateway_placement_rejections_total",
      help: "Nodes a placement passed over, by the first filter each failed",
    });
    const reasons: RejectReason[] = [
      "down",
      "no-reading",
      "template",
      "snapshot",
      "heal",
      "volume",
      "egress-rules",
      "cpu",
      "active-limit",
      "disk",
    ];
    this.#rejections = Object.fromEntries(
      reasons.map((r) => [r, rejections.series({ reason: r })]),
    ) as Record<RejectReason, CounterChild>;
  }

  /**
   * Registers the gauges read at scrape time from the parts: nodes by state, each node's
   * sandboxes by state and check-in age, running sandboxes per team, cache entries, busy slots
   * and config-digest mismatches. Call it once.
   *
   * @throws {Error} when called twice (the series would be registered twice).
   */
  observe(parts: {
    fleet: Fleet;
    finder: { readonly cacheSize: { name: number; id: number } };
    slots: { readonly size: number };
  }): void {
    if (this.#observed) throw new Error("GatewayMetrics.observe() was already called");
    this.#observed = true;
    const { fleet, finder, slots } = parts;
    const registers = [this.registry];
    new Gauge({
      name: "dormice_gateway_nodes",
      help: "Registered nodes by state: up, or down (silent past two intervals)",
      labelNames: ["state"],
      registers,
      collect() {
        let up = 0, down = 0;
        const now = fleet.now();
        for (const node of fleet.nodes()) fleet.isDown(node, now) ? down++ : up++;
        this.set({ state: "up" }, up);
        this.set({ state: "down" }, down);
      },
    });
    new Gauge({
      name: "dormice_gateway_node_up",
      help: "1 while the node checks in, 0 once it is down",
      labelNames: ["node"],
      registers,
      collect() {
        this.reset();
        const now = fleet.now();
        for (const node of fleet.nodes()) {
          this.set({ node: node.id }, fleet.isDown(node, now) ? 0 : 1);
        }
      },
    });
    new Gauge({
      name: "dormice_gateway_node_last_check_in_age_seconds",
      help: "Seconds since each node last checked in",
      labelNames: ["node"],
      registers,
      collect() {
        this.reset();
        const now = fleet.now();
        for (const node of fleet.nodes()) {
          this.set({ node: node.id }, Math.max(0, now - node.lastCheckIn) / 1000);
        }
      },
    });
    new Gauge({
      name: "dormice_gateway_sandboxes",
      help: "Sandboxes by node and state, from each node's last check-in",
      labelNames: ["node", "state"],
      registers,
      collect() {
        this.reset();
        for (const node of fleet.nodes()) {
          if (node.reading === null) continue;
          for (const state of sandboxStates) {
            this.set({ node: node.id, state }, node.reading.sandboxes[state]);
          }
        }
      },
    });
    new Gauge({
      name: "dormice_gateway_team_running_sandboxes",
      help: "Running sandboxes (active or restoring) per team, summed over the nodes' check-ins",
      labelNames: ["team"],
      registers,
      collect() {
        this.reset();
        const sums = new Map<string, number>();
        for (const node of fleet.nodes()) {
          for (const [team, n] of Object.entries(node.reading?.teams ?? {})) {
            sums.set(team, (sums.get(team) ?? 0) + n);
          }
        }
        for (const [team, n] of sums) this.set({ team }, n);
      },
    });
    new Gauge({
      name: "dormice_gateway_finder_cache_entries",
      help: "Entries in the Finder's cache, per index (by name, by id)",
      labelNames: ["index"],
      registers,
      collect() {
        const size = finder.cacheSize;
        this.set({ index: "name" }, size.name);
        this.set({ index: "id" }, size.id);
      },
    });
    new Gauge({
      name: "dormice_gateway_busy_slots",
      help: "Names whose create or destroy slot is held or queued now",
      registers,
      collect() {
        this.set(slots.size);
      },
    });
    new Gauge({
      name: "dormice_gateway_config_digest_mismatches",
      help: "Nodes whose config digest differs from the fleet's (0 until nodes report one)",
      registers,
      collect() {
        this.set(fleet.list().filter((n) => n.configDigestMismatch).length);
      },
    });
  }

  /** `cached()` answered. */
  cacheHit(): void {
    this.#hits++;
    this.#cacheHits.value++;
  }

  /** A caller needed a round. */
  cacheMiss(): void {
    this.#misses++;
    this.#cacheMisses.value++;
  }

  /** A lookup round ended. */
  lookupRound(outcome: FindResult["kind"], seconds: number, nodes: number): void {
    this.#rounds[outcome].value++;
    this.#roundLatency[outcome].observe(seconds);
    this.#nodeAsks.value += nodes;
  }

  /** A placement was decided: counted by outcome, and each rejected node by its reason. */
  placement(pick: PickResult): void {
    (pick.ok ? this.#placed : this.#noFit).value++;
    for (const reason in pick.explain.rejected) {
      const n = pick.explain.rejected[reason as RejectReason];
      if (n > 0) this.#rejections[reason as RejectReason].value += n;
    }
  }

  /** A forward to a node ended with `status` after `seconds` (502 when it did not answer). */
  forwarded(path: string, status: number, seconds: number): void {
    const face = faceOfPath(path);
    let byStatus = this.#forwardChildren.get(face);
    if (byStatus === undefined) this.#forwardChildren.set(face, byStatus = new Map());
    let child = byStatus.get(status);
    if (child === undefined) {
      byStatus.set(status, child = this.#forwards.series({ face, status: String(status) }));
    }
    child.value++;
    this.#forwardLatency[face].observe(seconds);
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
