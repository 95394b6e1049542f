/**
 * The native verbs that are the node's rather than a sandbox's: its warm pools (the operator's
 * only) and its snapshots.
 *
 * @module
 */
import { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { sandboxIdSchema, sandboxNameSchema } from "../../shared/schemas.ts";
import { setPoolsSchema } from "../../shared/pools.ts";
import type { WarmPools } from "../pools.ts";
import type { NodeSnapshots } from "../snapshots.ts";
import type { NativeVerbs } from "./native_verbs.ts";

/** The node's own verbs beside the sandbox verbs: they act on the node, not on one sandbox. */
export const nodeVerbs = [
  "setPools",
  "listPools",
  "snapshotSandbox",
  "listSnapshots",
  "deleteSnapshot",
];

/** Adds the pool and snapshot verbs to `verbs`; each answers 501 when the node has none. */
export function addNodeVerbs(
  verbs: NativeVerbs,
  options: { pools?: Pick<WarmPools, "set" | "list">; snapshots?: NodeSnapshots },
): void {
  const pools = () => {
    if (options.pools) return options.pools;
    throw new HttpError(501, "This node was built without warm pools");
  };
  // Pools are the node's, not a team's: only the operator (no X-Dormice-Team) sets or reads them.
  const operatorOnly = (team: string | undefined, verbName: string) => {
    if (team !== undefined) {
      throw new HttpError(403, `${verbName} is the operator's: call it with the fleet token alone`);
    }
  };
  verbs.add("setPools", setPoolsSchema, async (b, team) => {
    operatorOnly(team, "setPools");
    try {
      return { pools: await pools().set(b.pools) };
    } catch (error) {
      if (error instanceof RangeError) throw new HttpError(400, error.message);
      throw error;
    }
  });
  verbs.add("listPools", listPoolsSchema, (_b, team) => {
    operatorOnly(team, "listPools");
    return { pools: pools().list() };
  });

  const snapshots = () => {
    if (options.snapshots) return options.snapshots;
    throw new HttpError(501, "This node was built without snapshots");
  };
  verbs.add("snapshotSandbox", snapshotSandboxSchema, async (b, team) => ({
    snapshot: await snapshots().take({ name: b.name, team }, b.snapshotName),
  }));
  verbs.add("listSnapshots", listSnapshotsSchema, async (b, team) => ({
    snapshots: (await snapshots().list(team)).filter((s) =>
      (b.sandboxId === undefined || s.sandboxId === b.sandboxId) &&
      (b.name === undefined || s.name === b.name || s.snapshotId === b.name)
    ),
  }));
  verbs.add("deleteSnapshot", deleteSnapshotSchema, async (b, team) => ({
    deleted: await snapshots().delete(b.snapshotId, team),
  }));
}

const listPoolsSchema = z.object({}).strict();
const snapshotSandboxSchema = z.object({
  name: sandboxNameSchema,
  snapshotName: z.string().min(1).max(64).optional(),
});
const listSnapshotsSchema = z.object({
  sandboxId: sandboxIdSchema.optional(),
  name: z.string().min(1).max(64).optional(),
});
const deleteSnapshotSchema = z.object({
  snapshotId: z.string().regex(/^snap-[a-z0-9]{20}$/, "is not a snapshot id (snap-…)"),
});
