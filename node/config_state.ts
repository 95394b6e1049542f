/**
 * The node's settings for what it keeps besides its sandboxes: snapshots (the disk floor they
 * must leave, the registry they are pushed to, the heals that fetch them, how long they live),
 * template builds, and volumes (named ones a create mounts, managed ones under a root); read
 * from the environment with refusals an operator can act on, for `loadNodeConfig` (config.ts).
 *
 * | variable | default | meaning |
 * |---|---|---|
 * | `DORMICE_TEMPLATE_BUILDS` | `2` | template builds at once on this node (0 to 64; 0 builds none); one more is a 429 |
 * | `DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS` | `1800` | one template build's bound, s (1 to 86400); past it the build fails naming the setting |
 * | `DORMICE_TEMPLATE_CONTEXT_LIMIT_MB` | `256` | cap of one uploaded template file context (`copy`), MB (1 to 65536); a larger upload is a 413 |
 * | `DORMICE_SNAPSHOT_MIN_DISK_GB` | `1` | the data disk's floor for snapshots, GB (0 to 100000; 0 checks none): a snapshot that would leave less available on the disk of `DORMICE_DATA_DIR` is refused with a 507 |
 * | `DORMICE_SNAPSHOT_REGISTRY` | unset (none) | `host:port` of an OCI registry (plain HTTP): every snapshot is pushed there when taken and pulled from there by a node that lacks it, so a create from it works while the node that took it is down |
 * | `DORMICE_SNAPSHOT_HEAL_TIMEOUT_SECONDS` | `600` | time budget of one heal (getting an image this node lacks from the registry or from the nodes holding it), seconds, 1 to 86400 |
 * | `DORMICE_SNAPSHOT_TTL_HOURS` | `720` (30 days) | hours a snapshot lives from when it was taken (0 to 87600; 0 keeps it until deleted, refused with heals on and no registry): past it every node deletes its copy and the registry's; part of the config digest, so a node set apart is reported |
 * | `DORMICE_SNAPSHOT_HEAL` | `on` | `on` or `off`: whether this node heals (gets a snapshot it lacks from the nodes holding it) and serves its snapshots to other nodes' heals; off, it says so in its check-in and the gateway sends it no heal |
 * | `DORMICE_SNAPSHOT_HEAL_MAX_GB` | `20` | the most one heal reads from another node, GB, 1 to 100000 |
 * | `DORMICE_VOLUMES` | unset (none) | named volumes a create may mount, `name=/host/path[:ro]` or `name=docker-volume[:ro]`, comma-separated |
 * | `DORMICE_VOLUME_ROOT` | unset (`<DORMICE_DATA_DIR>/volumes`) | where managed volumes (E2B `Volume`) live; set it to a directory every node mounts (NFS or any shared filesystem) and every node serves every volume |
 * | `DORMICE_VOLUME_SIZE_GB` | `10` | the cap of a new managed volume, GB (1 to 100000): kept by the kernel (an ext4 image per volume) on a root node with loop devices, else checked on content-API writes and moves only |
 *
 * @module
 */
import { parseVolumes, type VolumeDecl } from "./config_capabilities.ts";

/** What the snapshot and template-build variables say (each a `NodeConfig` field). */
export interface StateSettings {
  /** Free bytes a snapshot must leave on the data disk. */
  snapshotMinDiskBytes: number;
  /** Template builds at once on this node. */
  templateBuilds: number;
  /** One template build's bound, ms. */
  templateBuildTimeoutMs: number;
  /** Cap of one uploaded template file context, bytes. */
  templateContextLimitBytes: number;
  /** `host:port` of the snapshots' OCI registry; none when absent. */
  snapshotRegistry?: string;
  /** One heal's time budget, ms. */
  snapshotHealTimeoutMs: number;
  /** How long a snapshot lives, ms; 0 keeps it until deleted. */
  snapshotTtlMs: number;
  /** The most bytes one heal reads. */
  snapshotHealMaxBytes: number;
  /** Whether this node heals from other nodes and serves its snapshots to their heals. */
  snapshotHeal: boolean;
}

/** The default life of a snapshot, hours (`DORMICE_SNAPSHOT_TTL_HOURS`): 30 days. */
export const DEFAULT_SNAPSHOT_TTL_HOURS = 720;

/**
 * Reads the snapshot and template-build variables through `get`, adding a refusal to
 * `refusals` for each bad one (its field then holds the default).
 */
export function readStateSettings(
  get: (name: string) => string | undefined,
  refusals: string[],
): StateSettings {
  // 1 GB: room for the ledger, staged uploads and the engine to keep working past a snapshot.
  const snapshotMinDiskBytes = 1e9 * integer(
    get("DORMICE_SNAPSHOT_MIN_DISK_GB"),
    1,
    0,
    100_000,
    "DORMICE_SNAPSHOT_MIN_DISK_GB",
    refusals,
  );

  const templateBuilds = integer(
    get("DORMICE_TEMPLATE_BUILDS"),
    2,
    0,
    64,
    "DORMICE_TEMPLATE_BUILDS",
    refusals,
  );
  const templateBuildTimeoutMs = 1000 * integer(
    get("DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS"),
    1800,
    1,
    86_400,
    "DORMICE_TEMPLATE_BUILD_TIMEOUT_SECONDS",
    refusals,
  );
  const templateContextLimitBytes = 1048576 * integer(
    get("DORMICE_TEMPLATE_CONTEXT_LIMIT_MB"),
    256,
    1,
    65_536,
    "DORMICE_TEMPLATE_CONTEXT_LIMIT_MB",
    refusals,
  );
  const registryText = get("DORMICE_SNAPSHOT_REGISTRY");
  let snapshotRegistry: string | undefined;
  if (registryText !== undefined && registryText !== "") {
    if (/^[A-Za-z0-9.-]+:\d{1,5}$/.test(registryText)) snapshotRegistry = registryText;
    else {
      refusals.push(
        `DORMICE_SNAPSHOT_REGISTRY must be host:port of an OCI registry, such as ` +
          `127.0.0.1:5000: received '${registryText.slice(0, 80)}'`,
      );
    }
  }
  const snapshotHealTimeoutMs = 1000 * integer(
    get("DORMICE_SNAPSHOT_HEAL_TIMEOUT_SECONDS"),
    600,
    1,
    86_400,
    "DORMICE_SNAPSHOT_HEAL_TIMEOUT_SECONDS",
    refusals,
  );
  const snapshotTtlMs = 3_600_000 * integer(
    get("DORMICE_SNAPSHOT_TTL_HOURS"),
    DEFAULT_SNAPSHOT_TTL_HOURS,
    0,
    87_600,
    "DORMICE_SNAPSHOT_TTL_HOURS",
    refusals,
  );
  const snapshotHealMaxBytes = 1e9 * integer(
    get("DORMICE_SNAPSHOT_HEAL_MAX_GB"),
    20,
    1,
    100_000,
    "DORMICE_SNAPSHOT_HEAL_MAX_GB",
    refusals,
  );
  const healText = get("DORMICE_SNAPSHOT_HEAL") ?? "";
  let snapshotHeal = true;
  if (healText === "off") snapshotHeal = false;
  else if (healText !== "" && healText !== "on") {
    refusals.push(
      `DORMICE_SNAPSHOT_HEAL must be 'on' or 'off': received '${healText.slice(0, 80)}'`,
    );
  }
  // A healed copy is only ever swept by the TTL (a delete may miss a node that is down): heals
  // between nodes with no TTL and no registry would leave copies no one ever removes.
  if (snapshotHeal && snapshotRegistry === undefined && snapshotTtlMs === 0) {
    refusals.push(
      "DORMICE_SNAPSHOT_TTL_HOURS=0 keeps snapshots forever, but with DORMICE_SNAPSHOT_HEAL=on " +
        "(the default) and no DORMICE_SNAPSHOT_REGISTRY a healed copy would never be swept: set " +
        `DORMICE_SNAPSHOT_TTL_HOURS to 1–87600 (the default is ${DEFAULT_SNAPSHOT_TTL_HOURS}, ` +
        "30 days) on every node, or write DORMICE_SNAPSHOT_HEAL=off",
    );
  }
  return {
    snapshotMinDiskBytes,
    templateBuilds,
    templateBuildTimeoutMs,
    templateContextLimitBytes,
    ...(snapshotRegistry === undefined ? {} : { snapshotRegistry }),
    snapshotHealTimeoutMs,
    snapshotHealMaxBytes,
    snapshotTtlMs,
    snapshotHeal,
  };
}

/** What the volume variables say (each a `NodeConfig` field). */
export interface VolumeSettings {
  /** Named volumes a create may mount (none when `DORMICE_VOLUMES` is refused). */
  volumes: VolumeDecl[];
  /** The shared volume root, or `null`: volumes under the data dir. */
  volumeRoot: string | null;
  /** The cap of a new managed volume, bytes. */
  volumeSizeBytes: number;
}

/**
 * Reads the volume variables through `get`, adding a refusal to `refusals` for each bad one.
 */
export function readVolumeSettings(
  get: (name: string) => string | undefined,
  refusals: string[],
): VolumeSettings {
  const volumes = parseVolumes(get("DORMICE_VOLUMES"));
  if (typeof volumes === "string") refusals.push(volumes);
  const volumeRoot = get("DORMICE_VOLUME_ROOT") ?? null;
  if (volumeRoot !== null && !volumeRoot.startsWith("/")) {
    refusals.push(
      `DORMICE_VOLUME_ROOT='${volumeRoot}' is not an absolute path: write the directory every ` +
        "node mounts, such as /mnt/dormice-volumes",
    );
  }
  const volumeSizeBytes = 1e9 * integer(
    get("DORMICE_VOLUME_SIZE_GB"),
    10,
    1,
    100_000,
    "DORMICE_VOLUME_SIZE_GB",
    refusals,
  );
  return {
    volumes: typeof volumes === "string" ? [] : volumes,
    volumeRoot,
    volumeSizeBytes,
  };
}

/**
 * A whole number from `min` to `max` read from `text`, `fallback` when it is absent; a refusal
 * naming `name` (and `fallback`) when it is not one.
 */
export function integer(
  text: string | undefined,
  fallback: number,
  min: number,
  max: number,
  name: string,
  refusals: string[],
): number {
  if (text === undefined) return fallback;
  const n = Number(text);
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(n) || n < min || n > max) {
    refusals.push(
      `${name}='${text}' is not a whole number from ${min} to ${max}: write one such as ${fallback}`,
    );
    return fallback;
  }
  return n;
}
