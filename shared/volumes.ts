/**
 * The vocabulary gateway and node share about managed volumes (E2B's `Volume`): the shape of a
 * volume id, the node's verbs the gateway calls, and the header that tells the gateway a node
 * keeps its volumes on a shared root.
 *
 * @module
 */
import { z } from "zod";

/** A volume id as the gateway mints them: `vol-` and 20 lowercase letters or digits. */
export const VOLUME_ID: RegExp = /^vol-[a-z0-9]{20}$/;

/** Zod schema of a volume id. */
export const volumeIdSchema: z.ZodString = z.string().regex(
  VOLUME_ID,
  "is not a volume id (vol- and 20 lowercase letters or digits)",
);

/** A new volume id (`vol-` + 20 random lowercase hex digits). */
export function newVolumeId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(10));
  return "vol-" + [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** The largest cap a node makes a volume with (`createVolume`, or a move's `importVolume`). */
export const MAX_VOLUME_BYTES: number = 2 ** 50;

/** The body of a node's `createVolume` verb. */
export const createVolumeSchema: z.ZodObject<{
  id: z.ZodString;
  sizeBytes: z.ZodOptional<z.ZodNumber>;
}> = z.object({
  id: volumeIdSchema,
  /** The cap; the node's `DORMICE_VOLUME_SIZE_GB` when absent. */
  sizeBytes: z.number().int().positive().max(MAX_VOLUME_BYTES).optional(),
}).strict();

/** The body of a node's `destroyVolume` and `volumeUsers` verbs. */
export const volumeRefSchema: z.ZodObject<{ id: z.ZodString }> = z.object({
  id: volumeIdSchema,
}).strict();

/** What a node answers `createVolume` with. */
export interface CreatedVolume {
  /** The volume id. */
  id: string;
  /** The size cap in bytes. */
  sizeBytes: number;
  /** True when the node keeps volumes on a shared root (`DORMICE_VOLUME_ROOT`). */
  shared: boolean;
}
