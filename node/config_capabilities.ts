/**
 * The parsers of the node's capability variables: `DORMICE_POOLS` (the warm pools before any
 * `setPools`) and `DORMICE_VOLUMES` (the named volumes a create may mount). Each returns the
 * value or a refusal sentence naming the variable, the part at fault and what to write.
 *
 * @module
 */
import { MAX_POOL_WARM, MAX_POOLS, poolKey, type PoolTarget } from "../shared/pools.ts";

/** A volume the node declares. */
export interface VolumeDecl {
  /** The name a create asks for. */
  name: string;
  /** An absolute host directory (bind mount), or a Docker volume's name. */
  source: string;
  /** Mounted read-only. */
  readOnly: boolean;
}

/**
 * Parses `DORMICE_POOLS`: `template[:cpus[:memoryMB]]=warm`, comma-separated, e.g.
 * `minimal=2,base:1:512=1` (an empty size field is the node's default: `base::1024=1`).
 *
 * @example
 * ```ts
 * import { parsePools } from "./config_capabilities.ts";
 * parsePools("minimal=2,base:1:512=1");
 * // [{template:"minimal", spec:{}, warm:2}, {template:"base", spec:{cpus:1, memoryMB:512}, warm:1}]
 * ```
 */
export function parsePools(text: string | undefined): PoolTarget[] | string {
  if (text === undefined || text.trim() === "") return [];
  const out: PoolTarget[] = [];
  const seen = new Set<string>();
  for (const part of text.split(",").map((p) => p.trim()).filter((p) => p !== "")) {
    const m = /^([A-Za-z0-9][A-Za-z0-9._-]*)(?::([0-9.]*))?(?::([0-9]*))?=(\d+)$/.exec(part);
    const refuse = (why: string) =>
      `DORMICE_POOLS: '${part}' ${why}: write template[:cpus[:memoryMB]]=warm, e.g. ` +
      "minimal=2,base:1:512=1";
    if (m === null) return refuse("is not a pool");
    const [, template, cpusText, memoryText, warmText] = m;
    const spec: PoolTarget["spec"] = {};
    if (cpusText) {
      const cpus = Number(cpusText);
      if (!(cpus > 0 && cpus <= 256)) return refuse("has cpus outside 0–256");
      spec.cpus = cpus;
    }
    if (memoryText) {
      const memoryMB = Number(memoryText);
      if (!(memoryMB >= 6 && memoryMB <= 1_048_576)) {
        return refuse("has memoryMB outside 6–1048576");
      }
      spec.memoryMB = memoryMB;
    }
    const warm = Number(warmText);
    if (warm > MAX_POOL_WARM) return refuse(`asks for more than ${MAX_POOL_WARM} warm sandboxes`);
    const key = poolKey(template, spec);
    if (seen.has(key)) return refuse("is listed twice");
    seen.add(key);
    out.push({ template, spec, warm });
  }
  if (out.length > MAX_POOLS) return `DORMICE_POOLS lists more than ${MAX_POOLS} pools`;
  return out;
}

/**
 * Writes pool targets as `DORMICE_POOLS` would say them (the inverse of {@linkcode parsePools}),
 * so a log line can be pasted into the variable.
 *
 * @example
 * ```ts
 * import { formatPools } from "./config_capabilities.ts";
 * formatPools([{ template: "base", spec: { memoryMB: 1024 }, warm: 1 }]); // "base::1024=1"
 * ```
 */
export function formatPools(pools: readonly PoolTarget[]): string {
  return pools.map(({ template, spec: { cpus, memoryMB }, warm }) => {
    const size = memoryMB !== undefined
      ? `:${cpus ?? ""}:${memoryMB}`
      : cpus !== undefined
      ? `:${cpus}`
      : "";
    return `${template}${size}=${warm}`;
  }).join(",");
}

/**
 * Parses `DORMICE_VOLUMES`: `name=/host/path[:ro]` or `name=docker-volume[:ro]`,
 * comma-separated.
 *
 * @example
 * ```ts
 * import { parseVolumes } from "./config_capabilities.ts";
 * parseVolumes("data=/srv/data:ro,cache=dormice-cache");
 * // [{name:"data", source:"/srv/data", readOnly:true}, {name:"cache", source:"dormice-cache", readOnly:false}]
 * ```
 */
export function parseVolumes(text: string | undefined): VolumeDecl[] | string {
  if (text === undefined || text.trim() === "") return [];
  const out: VolumeDecl[] = [];
  for (const part of text.split(",").map((p) => p.trim()).filter((p) => p !== "")) {
    const m = /^([A-Za-z0-9][A-Za-z0-9._-]{0,63})=(\/[^:,]*|[A-Za-z0-9][A-Za-z0-9_.-]*)(:ro)?$/
      .exec(part);
    if (m === null) {
      return `DORMICE_VOLUMES: '${part}' is not a volume: write name=/host/path[:ro] or ` +
        "name=docker-volume[:ro], e.g. data=/srv/data:ro,cache=dormice-cache";
    }
    if (out.some((v) => v.name === m[1])) {
      return `DORMICE_VOLUMES: volume '${m[1]}' is declared twice: give each name once`;
    }
    out.push({ name: m[1], source: m[2], readOnly: m[3] !== undefined });
  }
  return out;
}
