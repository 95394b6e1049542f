/**
 * What a node must offer to take a new sandbox: the placement ask, the feasibility filters in
 * the order they run, and the named reasons they reject with (Nomad's feasibility checks).
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import { poolKey } from "../../shared/pools.ts";
import type { SandboxSpec } from "../../shared/schemas.ts";

/** Why a node cannot take a new sandbox, in the order the filters run. */
export type RejectReason =
  | "down"
  | "no-reading"
  | "template"
  | "snapshot"
  | "heal"
  | "volume"
  | "egress-rules"
  | "cpu"
  | "active-limit"
  | "disk";

/** What a create asks of its node, as far as placement can tell. */
export interface PlacementAsk {
  /** The template; a node that says which templates it holds must hold it. */
  template?: string;
  /**
   * A snapshot id the create starts from (instead of `template`): only a node that advertises
   * it may take the create, since no other has its files.
   */
  snapshot?: string;
  /**
   * Nodes that answered they hold `snapshot` though their last check-in did not say so yet (a
   * snapshot taken since): they pass the snapshot filter too.
   */
  snapshotHolders?: readonly string[];
  /**
   * The create heals (gets its snapshot from other nodes): a node that takes no heal
   * (`DORMICE_SNAPSHOT_HEAL=off`) may not take it.
   */
  heal?: boolean;
  /**
   * Nodes holding an older build of `snapshot` than the newest (a template built again): one
   * that takes the create heals the newest first, so a node that takes no heal may not.
   */
  snapshotStale?: readonly string[];
  /** Volume names; a node must advertise every one. */
  volumes?: readonly string[];
  /**
   * Nodes the gateway's volume table says hold the managed volumes among `volumes` (a volume
   * created or moved since their last check-in): they pass the volume filter too.
   */
  volumeHolders?: readonly string[];
  /**
   * The node that holds the create's node-local managed volumes (the gateway's volume table):
   * only it may take the create, whatever other nodes still advertise (a copy left by a move
   * until their next check-in).
   */
  volumeNode?: string;
  /** Egress rules (addresses, domains, transforms); a node must enforce them (its check-in says). */
  egressRules?: boolean;
  /** The warm pool a claim would come from (see {@linkcode placementAsk}); none: no claim. */
  poolKey?: string;
}

/**
 * What placement needs of a create: its template (`base` when it names none, as a node
 * defaults), the volumes it asks for, whether it has egress address rules, and the pool key a
 * claim would match, or none when the spec asks for what a warm sandbox lacks (network, rules,
 * pids, volumes), as the node's pools decide.
 *
 * @example
 * ```ts
 * import { placementAsk } from "@dormice/cluster/gateway";
 * placementAsk("minimal", { cpus: 1 }); // { template: "minimal", volumes: [], poolKey: "minimal/1/-" }
 * ```
 */
export function placementAsk(template: string | undefined, spec: SandboxSpec = {}): PlacementAsk {
  const t = template ?? "base";
  const volumes = (spec.volumes ?? []).map((v) => v.name);
  const egressRules = spec.egressRules !== undefined;
  const claimable = spec.network === undefined && spec.pids === undefined &&
    volumes.length === 0 && !egressRules;
  return {
    template: t,
    volumes,
    ...(egressRules ? { egressRules } : {}),
    ...(claimable ? { poolKey: poolKey(t, { cpus: spec.cpus, memoryMB: spec.memoryMB }) } : {}),
  };
}

/** One rejected node and its named reason. */
export interface Rejection {
  /** The rejected node's id. */
  nodeId: string;
  /** The first filter it failed (the chain stops there). */
  reason: RejectReason;
  /** A sentence with the numbers and the variable that moves the limit. */
  detail: string;
}

/** The limits the filters apply. */
export interface PlacerLimits {
  /** Reject a node whose cpu used % is above this. */
  cpuLimitPct: number;
  /** Reject a node whose active + in-flight count is at or above this. */
  activeLimit: number;
  /** Reject a node whose data disk has fewer available bytes than this. */
  minDiskBytes: number;
}

/**
 * What a filter sees of one node. `pick()` reuses one object for every node (no allocation per
 * node), so a filter must not keep it.
 */
export interface FilterInput {
  /** The node being judged; its `reading` is non-null for every filter after `no-reading`. */
  node: FleetNode;
  /** Now, by the fleet's clock. */
  now: number;
  /** Placements counted against it since its last reading, not yet in `reading`. */
  inFlight: number;
  /** The Placer's limits: a filter's sentence quotes the one it applies. */
  limits: PlacerLimits;
  /** Whether the fleet calls it down at `now`. */
  down: boolean;
  /** What the create asks for (template, volumes). */
  ask: PlacementAsk;
}

/** One feasibility filter: returns a detail sentence when it rejects, `undefined` otherwise. */
export interface PlacementFilter {
  /** The reason counted in `explain.rejected` and shown with each rejection. */
  reason: RejectReason;
  /** Rejects with a sentence, or passes with `undefined`. */
  check(input: FilterInput): string | undefined;
}

/**
 * The filter chain, built in one place. Why this order: the first reason a node fails is the
 * one reported, so the cheapest and most fundamental questions come first. Down and no-reading
 * mean there is nothing current to judge by (every later filter reads the reading); template,
 * snapshot and volume next because a node without them can never serve the create, however
 * idle, so its load is not the news (egress rules likewise: a node without iptables rules never
 * serves them); cpu is a host-wide pressure signal; active-limit is our own
 * ceiling; disk last because it rarely binds and a full disk on a busy node is better reported
 * as busy.
 */
export const placementFilters: readonly PlacementFilter[] = [
  {
    reason: "down",
    check: ({ node, now, down }) =>
      down
        ? node.heardSinceStart
          ? `down: no check-in for ${
            Math.round((now - node.lastCheckIn) / 1000)
          } s (interval ${node.intervalSeconds} s)`
          : "down: not heard since the gateway started"
        : undefined,
  },
  {
    reason: "no-reading",
    check: ({ node }) => node.reading === null ? "no reading yet" : undefined,
  },
  {
    reason: "template",
    // A node that does not say (it predates capabilities) is not refused: it did not before.
    check: ({ node, ask }) =>
      ask.template !== undefined && node.templates !== null &&
        !node.templates.includes(ask.template)
        ? `lacks template '${ask.template}'`
        : undefined,
  },
  {
    reason: "snapshot",
    // Only its holders have a snapshot's files; a node that advertised only its newest ids may
    // hold an older one, and its own 404 says so if it does not.
    check: ({ node, ask }) =>
      ask.snapshot !== undefined && !node.snapshots?.has(ask.snapshot) &&
        !node.snapshotsTruncated && !ask.snapshotHolders?.includes(node.id)
        ? `lacks snapshot '${ask.snapshot}'`
        : undefined,
  },
  {
    reason: "heal",
    check: ({ node, ask }) =>
      (ask.heal || ask.snapshotStale?.includes(node.id)) && node.heals === false
        ? "takes no heal (DORMICE_SNAPSHOT_HEAL=off), and the create needs one"
        : undefined,
  },
  {
    reason: "volume",
    check: ({ node, ask }) => {
      if (ask.volumeNode !== undefined && node.id !== ask.volumeNode) {
        return `does not hold the create's volumes (they live on node '${ask.volumeNode}')`;
      }
      if (ask.volumeHolders?.includes(node.id)) return undefined;
      for (const v of ask.volumes ?? []) {
        if (!node.volumes.includes(v)) return `lacks volume '${v}'`;
      }
      return undefined;
    },
  },
  {
    reason: "egress-rules",
    check: ({ node, ask }) =>
      ask.egressRules && !node.egressRules
        ? "cannot enforce egress rules (addresses, domains, header transforms: it needs the " +
          "Docker executor with iptables and its egress proxy: DORMICE_EXECUTOR=docker, " +
          "DORMICE_SANDBOX_HOST_FIREWALL not off)"
        : undefined,
  },
  {
    reason: "cpu",
    check: ({ node, limits }) => {
      const pct = node.reading!.cpuUsedPct;
      // A first reading has no cpu figure (it needs two samples); it must not block a new node.
      return pct !== null && pct > limits.cpuLimitPct
        ? `cpu ${pct.toFixed(0)}% is above the limit ${limits.cpuLimitPct}% ` +
          `(cpuLimitPct; the gateway daemon's DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT)`
        : undefined;
    },
  },
  {
    reason: "active-limit",
    check: ({ node, inFlight, limits }) => {
      const active = node.reading!.sandboxes.active;
      return active + inFlight >= limits.activeLimit
        ? `${active} active + ${inFlight} in flight reaches the limit ${limits.activeLimit} ` +
          `(activeLimit; the gateway daemon's DORMICE_GATEWAY_NODE_ACTIVE_LIMIT)`
        : undefined;
    },
  },
  {
    reason: "disk",
    check: ({ node, limits }) => {
      const disk = node.reading!.dataDisk;
      return disk !== null && disk.availableBytes < limits.minDiskBytes
        ? `data disk has ${gb(disk.availableBytes)} GB available, below the floor ` +
          `${
            gb(limits.minDiskBytes)
          } GB (minDiskGB; the gateway daemon's DORMICE_GATEWAY_NODE_MIN_DISK_GB)`
        : undefined;
    },
  },
];

function gb(bytes: number): string {
  return (bytes / 1e9).toFixed(1);
}
