/**
 * What `deno task fleet` reads from its environment and arguments beyond the gateway's own
 * variables: how many nodes and their ids, where their ports and etcd's start, and how much it
 * prints. Kept apart from `fleet.ts` so every refusal is a tested sentence.
 *
 * @module
 */
import { nodeIdSchema } from "../shared/schemas.ts";

/** The fleet's settings, defaults filled in. */
export interface FleetSettings {
  /** The nodes' ids, in start order (`DORMICE_FLEET_NODE_IDS`; `node-a,node-b`). */
  nodeIds: string[];
  /** The first port the nodes may take, the next free ones from there (`DORMICE_FLEET_NODE_PORT`; 3676). */
  nodePort: number;
  /** The first port `--shared`'s etcd may take, client then peer (`DORMICE_FLEET_ETCD_PORT`; 2379). */
  etcdPort: number;
  /** `--verbose`: the children log at `info` and Deno's own progress lines show. */
  verbose: boolean;
}

/** The variables {@linkcode fleetSettings} reads, so the task's `--allow-env` can name them. */
export const fleetSettingsVariables = [
  "DORMICE_FLEET_NODE_IDS",
  "DORMICE_FLEET_NODE_PORT",
  "DORMICE_FLEET_ETCD_PORT",
] as const;

/** Most nodes one fleet starts: each is a process of its own on this machine. */
const MAX_NODES = 8;

/**
 * Reads the fleet's settings, or the sentences refusing them.
 *
 * @example
 * ```ts
 * import { fleetSettings } from "./_fleet_settings.ts";
 * const env = new Map([["DORMICE_FLEET_NODE_IDS", "laptop-a,laptop-b,laptop-c"]]);
 * const settings = fleetSettings(env, []);
 * console.log("refusals" in settings ? settings.refusals : settings.nodeIds.length); // 3
 * ```
 */
export function fleetSettings(
  env: { get(name: string): string | undefined },
  args: string[],
): FleetSettings | { refusals: string[] } {
  const refusals: string[] = [];
  const idsText = env.get("DORMICE_FLEET_NODE_IDS") || "node-a,node-b";
  const nodeIds = idsText.split(",").map((id) => id.trim());
  for (const id of nodeIds) {
    const parsed = nodeIdSchema.safeParse(id);
    if (!parsed.success) {
      refusals.push(
        `DORMICE_FLEET_NODE_IDS='${idsText}' holds '${id}', which is not a node id: ` +
          `${parsed.error.issues[0].message}; write ids separated by commas, such as node-a,node-b`,
      );
    }
  }
  const repeated = nodeIds.find((id, i) => nodeIds.indexOf(id) !== i);
  if (repeated !== undefined) {
    refusals.push(
      `DORMICE_FLEET_NODE_IDS='${idsText}' names '${repeated}' twice: the gateway takes a node ` +
        "id for one node only, so give each node its own",
    );
  }
  if (nodeIds.length > MAX_NODES) {
    refusals.push(
      `DORMICE_FLEET_NODE_IDS='${idsText}' names ${nodeIds.length} nodes: a fleet on one ` +
        `machine starts at most ${MAX_NODES}`,
    );
  }
  const port = (name: string, fallback: number): number => {
    const text = env.get(name);
    if (text === undefined || text === "") return fallback;
    const value = Number(text);
    if (!/^\d+$/.test(text) || value < 1024 || value > 65_000) {
      refusals.push(
        `${name}='${text}' is not a port from 1024 to 65000: write one such as ${fallback}`,
      );
    }
    return value;
  };
  const nodePort = port("DORMICE_FLEET_NODE_PORT", 3676);
  const etcdPort = port("DORMICE_FLEET_ETCD_PORT", 2379);
  const known = new Set(["--shared", "--verbose"]);
  for (const arg of args) {
    if (!known.has(arg) && !arg.startsWith("--domain=")) {
      refusals.push(
        `deno task fleet does not know '${arg}': it takes --shared, --domain=<domain> and --verbose`,
      );
    }
  }
  if (refusals.length > 0) return { refusals };
  return { nodeIds, nodePort, etcdPort, verbose: args.includes("--verbose") };
}
