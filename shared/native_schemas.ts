/**
 * The native verbs' request bodies, one vocabulary for the node that answers them and the
 * gateway that must refuse a bad one (a 400 naming the field) before any lookup.
 *
 * @module
 */
import { z } from "zod";
import { isStandardBase64 } from "./base64.ts";
import {
  envSchema,
  metadataSchema,
  sandboxIdSchema,
  sandboxNameSchema,
  sandboxSpecSchema,
  sandboxStateSchema,
} from "./schemas.ts";

/**
 * The header a node's 404 carries when the sandbox the request named is not on that node (the
 * verb did nothing): a gateway whose cached entry was stale may then send the same request to
 * the node that holds the name now, where any other 404 (a file not found) is the answer.
 */
export const ABSENT_HEADER = "x-dormice-absent";

const NOT_BASE64 = "is not standard base64 (A–Z, a–z, 0–9, '+', '/', '=' padding)";
/** Checked in linear time: a regex of base64 quanta overflowed V8's stack on 8 MiB (a 500). */
const base64 = z.string().refine(isStandardBase64, NOT_BASE64);
/** Only its length checked: the node decodes it in slices, checking as it goes. */
const base64Shape = z.string().refine((s) => s.length % 4 === 0, NOT_BASE64);

/** `acquireSandbox`: create-or-wake by name. */
export const acquireRequestSchema: z.ZodType<{
  name: string;
  template?: string;
  metadata?: Record<string, string>;
  spec?: z.infer<typeof sandboxSpecSchema>;
}> = z.object({
  name: sandboxNameSchema,
  template: z.string().min(1).max(256).optional(),
  metadata: metadataSchema.optional(),
  spec: sandboxSpecSchema.optional(),
});

/** `listSandboxes`: an optional filter. */
export const listRequestSchema: z.ZodType<{
  metadata?: Record<string, string>;
  states?: z.infer<typeof sandboxStateSchema>[];
}> = z.object({
  metadata: metadataSchema.optional(),
  states: z.array(sandboxStateSchema).optional(),
});

/** `execCommand`: a shell string or an argv array. */
export const execRequestSchema: z.ZodType<{
  name: string;
  command: string | string[];
  timeoutSeconds?: number;
  cwd?: string;
  env?: Record<string, string>;
}> = z.object({
  name: sandboxNameSchema,
  command: z.union([
    z.string().min(1, "needs at least 1 character"),
    z.array(z.string()).min(1, "needs at least the program name"),
  ], { error: "must be a shell string or an array of strings (argv)" }),
  timeoutSeconds: z.number().positive().max(86_400).optional(),
  cwd: z.string().min(1).max(4096).optional(),
  env: envSchema.optional(),
});

/** A `writeFile` body as both schemas read it. */
export interface WriteFileRequest {
  /** The sandbox's name. */
  name: string;
  /** The file's path inside the sandbox. */
  path: string;
  /** The content, base64 (this or `content`). */
  contentBase64?: string;
  /** The content as UTF-8 text (this or `contentBase64`). */
  content?: string;
}

function writeFileSchemaWith(content64: z.ZodType<string>): z.ZodType<WriteFileRequest> {
  return z.object({
    name: sandboxNameSchema,
    path: z.string().min(1).max(4096),
    contentBase64: content64.optional(),
    content: z.string().optional(),
  }).refine((b) => (b.contentBase64 === undefined) !== (b.content === undefined), {
    message: "give exactly one of 'contentBase64' (bytes as base64) or 'content' (UTF-8 text)",
    path: ["contentBase64"],
  });
}

/** `writeFile`: bytes as base64 or UTF-8 text, exactly one. */
export const writeFileRequestSchema: z.ZodType<WriteFileRequest> = writeFileSchemaWith(base64);

/**
 * `writeFile` as the node reads it: `contentBase64`'s characters are checked while it is decoded
 * a slice at a time (`decodeBase64InSlices`), so a large file does not hold the event loop.
 */
export const writeFileShapeSchema: z.ZodType<WriteFileRequest> = writeFileSchemaWith(base64Shape);

/** `readFile`. */
export const readFileRequestSchema: z.ZodType<{ name: string; path: string }> = z.object({
  name: sandboxNameSchema,
  path: z.string().min(1).max(4096),
});

/** `updateMetadata`. */
export const updateMetadataRequestSchema: z.ZodType<{
  name: string;
  metadata: Record<string, string>;
  merge?: boolean;
}> = z.object({
  name: sandboxNameSchema,
  metadata: metadataSchema,
  merge: z.boolean().optional(),
});

/** A verb that names one sandbox and nothing else (`destroySandbox`, `getSandboxMetrics`). */
export const nameRequestSchema: z.ZodType<{ name: string }> = z.object({
  name: sandboxNameSchema,
});

/** `lookupSandbox`: `{name}` or `{id}`, exactly one, with a sentence when neither or both. */
export const lookupEitherSchema: z.ZodType<{ name: string } | { id: string }> = z.object({
  name: sandboxNameSchema.optional(),
  id: sandboxIdSchema.optional(),
}).refine((b) => (b.name === undefined) !== (b.id === undefined), {
  message: "give exactly one of 'name' or 'id'",
  path: ["name"],
}).transform((b) => b.name !== undefined ? { name: b.name } : { id: b.id! });

/**
 * Every native verb's body schema by verb name.
 *
 * @example
 * ```ts
 * import { nativeRequestSchemas } from "./native_schemas.ts";
 * nativeRequestSchemas.destroySandbox.safeParse({ name: "a".repeat(129) }).success; // false
 * ```
 */
export const nativeRequestSchemas: {
  acquireSandbox: typeof acquireRequestSchema;
  listSandboxes: typeof listRequestSchema;
  execCommand: typeof execRequestSchema;
  writeFile: typeof writeFileRequestSchema;
  readFile: typeof readFileRequestSchema;
  updateMetadata: typeof updateMetadataRequestSchema;
  destroySandbox: typeof nameRequestSchema;
  getSandboxMetrics: typeof nameRequestSchema;
  getHostMetrics: z.ZodType<Record<string, never>>;
  lookupSandbox: typeof lookupEitherSchema;
} = {
  acquireSandbox: acquireRequestSchema,
  listSandboxes: listRequestSchema,
  execCommand: execRequestSchema,
  writeFile: writeFileRequestSchema,
  readFile: readFileRequestSchema,
  updateMetadata: updateMetadataRequestSchema,
  destroySandbox: nameRequestSchema,
  getSandboxMetrics: nameRequestSchema,
  getHostMetrics: z.object({}) as unknown as z.ZodType<Record<string, never>>,
  lookupSandbox: lookupEitherSchema,
};

/**
 * The native sandbox verbs, in the order error sentences list them (the keys of
 * {@linkcode nativeRequestSchemas}, so a verb cannot be listed without a schema).
 *
 * @example
 * ```ts
 * import { nativeVerbs } from "./native_schemas.ts";
 * nativeVerbs.includes("execCommand"); // true
 * ```
 */
export const nativeVerbs: readonly string[] = Object.freeze(Object.keys(nativeRequestSchemas));
