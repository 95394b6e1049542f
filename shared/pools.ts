/**
 * The wire vocabulary of warm pools and node capabilities (DESIGN §8), shared by the nodes that
 * keep pools and the gateway that places by them: a pool's key, the `setPools` / `listPools`
 * bodies, what a check-in says of each pool, and the volume mounts a create may ask for.
 *
 * @module
 */
import { z } from "zod";

/** The size of a pooled sandbox; an absent field is the node's default for it. */
export interface PoolSpec {
  /** Cores (fractions allowed). */
  cpus?: number;
  /** Memory, MiB. */
  memoryMB?: number;
}

/** Zod schema of {@linkcode PoolSpec}: only the two fields a pool is keyed by. */
export const poolSpecSchema: z.ZodType<PoolSpec> = z.object({
  cpus: z.number().positive().max(256).optional(),
  memoryMB: z.number().int().positive().max(1_048_576).optional(),
}).strict();

/**
 * Most warm sandboxes one pool may hold. A pool is a standing cost (each warm sandbox is a
 * running container), so a typo such as `warm: 10000` is refused rather than built.
 */
export const MAX_POOL_WARM = 256;

/** Most pools one node keeps: one per template and size an operator really serves. */
export const MAX_POOLS = 32;

/** One pool target, as `setPools` takes it. */
export interface PoolTarget {
  /** The template its sandboxes are built from. */
  template: string;
  /** Their size; `{}` is the node's default size. */
  spec: PoolSpec;
  /** How many warm sandboxes the node keeps ready. */
  warm: number;
}

/** Zod schema of one {@linkcode PoolTarget}; `spec` defaults to `{}`. */
export const poolTargetSchema: z.ZodType<PoolTarget, unknown> = z.object({
  template: z.string().min(1).max(256),
  spec: poolSpecSchema.optional().transform((s) => s ?? {}),
  warm: z.number().int("must be a whole number").min(0).max(
    MAX_POOL_WARM,
    `must be at most ${MAX_POOL_WARM}`,
  ),
}).strict();

/** A whole set of pool targets (a pool left out is emptied), each key at most once. */
export const poolTargetsSchema: z.ZodType<PoolTarget[], unknown> = z.array(poolTargetSchema)
  .max(MAX_POOLS, `a node keeps at most ${MAX_POOLS} pools`)
  .superRefine((pools, ctx) => {
    const seen = new Set<string>();
    for (const [i, p] of pools.entries()) {
      const key = poolKey(p.template, p.spec);
      if (seen.has(key)) {
        ctx.addIssue({
          code: "custom",
          path: [i],
          message: `pool ${key} is listed twice: give each template and size once`,
        });
      }
      seen.add(key);
    }
  });

/** The `setPools` body of a node. */
export const setPoolsSchema: z.ZodType<{ pools: PoolTarget[] }, unknown> = z.object({
  pools: poolTargetsSchema,
}).strict();

/** What a check-in says of one pool. */
export interface PoolReport {
  /** The pool's template. */
  template: string;
  /** The pool's size. */
  spec: PoolSpec;
  /** Warm sandboxes ready to be claimed now. */
  warm: number;
  /** How many it keeps ready when full. */
  target: number;
}

/** Zod schema of a {@linkcode PoolReport}. */
export const poolReportSchema: z.ZodType<PoolReport> = z.object({
  template: z.string().min(1).max(256),
  spec: poolSpecSchema,
  warm: z.number().int().nonnegative(),
  target: z.number().int().nonnegative(),
});

/** What `listPools` answers for one pool: the report plus the refill's own counts. */
export interface PoolStatus extends PoolReport {
  /** Warm sandboxes being built (and probed) now. */
  refilling: number;
  /** Claims served from this pool since the node started. */
  claimed: number;
}

/**
 * The key a pool is found by: the template and the size, with absent fields written as `-` so
 * that `{}` and `{cpus: undefined}` are one key and `{cpus: 1}` another.
 *
 * @example
 * ```ts
 * import { poolKey } from "./pools.ts";
 * poolKey("base", {}); // "base/-/-"
 * poolKey("base", { cpus: 2, memoryMB: 1024 }); // "base/2/1024"
 * ```
 */
export function poolKey(template: string, spec: PoolSpec = {}): string {
  return `${template}/${spec.cpus ?? "-"}/${spec.memoryMB ?? "-"}`;
}

/** A volume a create asks for: a name the node declares and where to mount it. */
export interface VolumeMount {
  /** The name in the node's `DORMICE_VOLUMES`. */
  name: string;
  /** An absolute path inside the sandbox. */
  mountPath: string;
}

/** Zod schema of a {@linkcode VolumeMount}. */
export const volumeMountSchema: z.ZodType<VolumeMount> = z.object({
  name: z.string().regex(
    /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/,
    "a volume name is 1–64 letters, digits, '.', '_' or '-', starting with a letter or digit",
  ),
  mountPath: z.string().max(1024).regex(
    /^\/[^\0:,]*$/,
    "a mount path is absolute and has no ':' or ','",
  ).refine(
    (p) => !p.split("/").some((s) => s === "." || s === ".."),
    "a mount path has no '.' or '..' segment: name the directory itself, such as /data",
  ).refine(
    (p) => !RESERVED_MOUNT_PATH.test(p),
    "a mount path cannot be '/', /etc, or /proc, /sys or /dev or below them (the runtime sets " +
      "those up, and a volume there fails the create or takes the runtime's files): mount it " +
      "at a directory of its own, such as /data",
  ),
}).strict();

/** Mount paths a volume may not take: the root, /etc, and the kernel's filesystems. */
const RESERVED_MOUNT_PATH = /^\/+$|^\/+etc\/*$|^\/+(proc|sys|dev)(\/|$)/;
