/**
 * What the fleet page shows, gathered from the gateway's parts: the nodes (the Fleet's last
 * readings), the sandboxes (every node's `listSandboxes`, merged, filtered and cut into pages;
 * one listing is shared by every viewer for two seconds, so ten open pages cost the nodes one
 * listing per refresh), the recent placements, and one sandbox's details.
 *
 * @module
 */
import type { VolumeRow } from "../../volumes/table.ts";
import type { NodeSummary } from "../../fleet/fleet.ts";
import type { GatewayParts } from "../parts.ts";
import type { PlacementRecord } from "../../placer/placement_log.ts";
import { sandboxStates } from "../../../shared/schemas.ts";

/** One sandbox row, as a node's native `listSandboxes` answers it. */
export interface ListedSandbox {
  id: string;
  name: string;
  team: string;
  state: string;
  nodeId: string;
  template: string;
  createdAt: string;
  lastActiveAt: string;
}

/** The page's filters, as its query string carries them. */
export interface FleetFilters {
  team?: string;
  state?: string;
  node?: string;
  /** 1-based. */
  page: number;
}

/** Everything one rendering of the page needs. */
export interface FleetView {
  /** When it was gathered, ms since the epoch. */
  now: number;
  nodes: NodeSummary[];
  sandboxes: {
    /** This page's rows. */
    rows: ListedSandbox[];
    /** Rows matching the filters on every page. */
    total: number;
    /** The page shown (clamped to the last one). */
    page: number;
    pages: number;
    /** Nodes whose listing failed, each with why. */
    unreachable: { nodeId: string; cause: string }[];
  };
  filters: FleetFilters;
  /** Values the filter menus offer. */
  options: { teams: string[]; states: readonly string[]; nodes: string[] };
  placements: PlacementRecord[];
  /**
   * The managed volumes (at most {@linkcode VOLUME_ROWS}, oldest first) and how many there are;
   * optional so a view built without volumes shows none.
   */
  volumes?: { rows: VolumeRow[]; total: number };
}

/** The most volumes the page lists. */
export const VOLUME_ROWS = 200;

/** One sandbox's details page. */
export interface SandboxDetails {
  id: string;
  name: string;
  team: string;
  state: string;
  nodeId: string;
  endpoint: string;
  template?: string;
  createdAt?: string;
  /** ISO 8601, or `null` when it has none (a native sandbox lives until destroyed). */
  deadlineAt: string | null;
  /** What its deadline does: `kill` or `pause`. */
  onDeadline?: string;
  cpuCount?: number;
  memoryMB?: number;
  metadata: Record<string, string>;
  /** The node's latest resource reading, or why there is none (paused, no answer). */
  metrics: {
    cpuUsedPct: number;
    memUsedBytes: number;
    memTotalBytes: number;
    diskUsedBytes: number;
  } | string;
}

/** Rows per page. */
export const PAGE_SIZE = 25;
/** How long one listing of every node serves every viewer. */
const listingTtlMs = 2000;
/** Bound of asking one node for one sandbox's details. */
const detailTimeoutMs = 3000;

interface Listing {
  at: number;
  rows: ListedSandbox[];
  unreachable: { nodeId: string; cause: string }[];
}

/**
 * Parses the page's query string; unknown states and bad page numbers fall back to no filter
 * and page 1 (the menus offer only valid values; a hand-edited URL is not an error page).
 *
 * @example
 * ```ts
 * import { parseFilters } from "./data.ts";
 * parseFilters(new URLSearchParams("team=acme&page=2")); // { team: "acme", page: 2, ... }
 * ```
 */
export function parseFilters(query: URLSearchParams): FleetFilters {
  const pick = (name: string) => {
    const v = query.get(name);
    return v === null || v === "" ? undefined : v.slice(0, 128);
  };
  const state = pick("state");
  const page = Number(query.get("page") ?? "1");
  return {
    team: pick("team"),
    state: state !== undefined && (sandboxStates as readonly string[]).includes(state)
      ? state
      : undefined,
    node: pick("node"),
    page: Number.isInteger(page) && page >= 1 ? page : 1,
  };
}

/**
 * Gathers the page's data from the gateway's parts.
 *
 * @example
 * ```ts ignore
 * const data = new FleetPageData(parts);
 * const view = await data.view(parseFilters(url.searchParams), request.signal);
 * ```
 */
export class FleetPageData {
  readonly #parts: GatewayParts;
  #listing: Promise<Listing> | undefined;
  #listingAt = 0;

  /** Reads from `parts`; holds one shared listing at most. */
  constructor(parts: GatewayParts) {
    this.#parts = parts;
  }

  /** The page's view for `filters`. */
  async view(filters: FleetFilters): Promise<FleetView> {
    const { fleet, placer, placements } = this.#parts;
    const listing = await this.#list();
    const nodes = fleet.list((id) => placer.inFlight(id));
    const matching = listing.rows.filter((s) =>
      (filters.team === undefined || s.team === filters.team) &&
      (filters.state === undefined || s.state === filters.state) &&
      (filters.node === undefined || s.nodeId === filters.node)
    );
    const pages = Math.max(1, Math.ceil(matching.length / PAGE_SIZE));
    const page = Math.min(filters.page, pages);
    return {
      now: fleet.now(),
      nodes,
      sandboxes: {
        rows: matching.slice((page - 1) * PAGE_SIZE, page * PAGE_SIZE),
        total: matching.length,
        page,
        pages,
        unreachable: listing.unreachable,
      },
      filters: { ...filters, page },
      options: {
        teams: [...new Set(listing.rows.map((s) => s.team))].sort(),
        states: sandboxStates,
        nodes: nodes.map((n) => n.id),
      },
      placements: placements.list(),
      volumes: await this.#volumes(),
    };
  }

  async #volumes(): Promise<FleetView["volumes"]> {
    const all = (await this.#parts.volumes?.table.list()) ?? [];
    return { rows: all.slice(0, VOLUME_ROWS), total: all.length };
  }

  /**
   * One sandbox's details, asked of the node that holds it (the Finder says which): its E2B
   * record for the deadline and limits, and its latest metrics (which never wake it). `null`
   * when no node has it.
   */
  async details(id: string, signal: AbortSignal): Promise<SandboxDetails | null> {
    const { routing } = this.#parts;
    const found = await routing.resolve("id", id, signal);
    if (found.kind === "none") return null;
    const { node, sandbox } = found;
    const base = `${node.endpoint}/e2b/api/sandboxes/${encodeURIComponent(id)}`;
    const ask = async (url: string): Promise<unknown> => {
      const res = await fetch(url, {
        headers: { authorization: routing.nodeHeaders.authorization },
        signal: AbortSignal.any([signal, AbortSignal.timeout(detailTimeoutMs)]),
        redirect: "manual",
      });
      const text = await res.text();
      if (!res.ok) throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`);
      return JSON.parse(text);
    };
    const [detail, metrics] = await Promise.allSettled([ask(base), ask(`${base}/metrics`)]);
    // Only the fields the page shows: the answer also carries the sandbox's envd access token.
    const d = detail.status === "fulfilled" ? detail.value as Record<string, unknown> : {};
    const endAt = typeof d.endAt === "string" ? d.endAt : null;
    const lifecycle = d.lifecycle as { onTimeout?: unknown } | undefined;
    let shown: SandboxDetails["metrics"];
    if (metrics.status === "rejected") {
      shown = `no answer from node '${node.id}' (${(metrics.reason as Error).message})`;
    } else {
      const last = (metrics.value as Record<string, number>[]).at(-1);
      shown = last === undefined ? "none: the sandbox is paused" : {
        cpuUsedPct: Number(last.cpuUsedPct) || 0,
        memUsedBytes: Number(last.memUsed) || 0,
        memTotalBytes: Number(last.memTotal) || 0,
        diskUsedBytes: Number(last.diskUsed) || 0,
      };
    }
    return {
      id: sandbox.id,
      name: sandbox.name,
      team: sandbox.team ?? "default",
      state: typeof d.state === "string" ? d.state : sandbox.state,
      nodeId: node.id,
      endpoint: node.endpoint,
      template: typeof d.templateID === "string" ? d.templateID : undefined,
      createdAt: typeof d.startedAt === "string" ? d.startedAt : undefined,
      // The node answers year 9999 for "no deadline" (E2B has no never).
      deadlineAt: endAt === null || endAt.startsWith("9999") ? null : endAt,
      onDeadline: typeof lifecycle?.onTimeout === "string" ? lifecycle.onTimeout : undefined,
      cpuCount: typeof d.cpuCount === "number" ? d.cpuCount : undefined,
      memoryMB: typeof d.memoryMB === "number" ? d.memoryMB : undefined,
      metadata: (d.metadata ?? {}) as Record<string, string>,
      metrics: shown,
    };
  }

  #list(): Promise<Listing> {
    const now = Date.now();
    if (this.#listing === undefined || now - this.#listingAt > listingTtlMs) {
      this.#listingAt = now;
      this.#listing = this.#fetchListing();
      // A failed listing must not be served to the next viewer.
      this.#listing.catch(() => this.#listing = undefined);
    }
    return this.#listing;
  }

  async #fetchListing(): Promise<Listing> {
    const { routing } = this.#parts;
    // The operator's headers: every node lists every team.
    const answers = await routing.fanOut("/listSandboxes", "{}", AbortSignal.timeout(10_000), {
      headers: routing.nodeHeaders,
    });
    const rows: ListedSandbox[] = [];
    const unreachable: { nodeId: string; cause: string }[] = [];
    for (const a of answers) {
      const list = a.ok ? (a.json as { sandboxes?: unknown })?.sandboxes : undefined;
      if (a.ok && Array.isArray(list)) rows.push(...list as ListedSandbox[]);
      else unreachable.push({ nodeId: a.node.id, cause: a.ok ? "not a list" : a.cause });
    }
    rows.sort((a, b) => b.createdAt.localeCompare(a.createdAt) || a.id.localeCompare(b.id));
    return { at: Date.now(), rows, unreachable };
  }
}
