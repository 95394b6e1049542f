/**
 * The node's native face: `POST /<verb>` with a JSON body and the fleet bearer token; errors are
 * `{ "message": "…" }`.
 *
 * Verbs and their bodies (every `name` is 1–128 characters of `[A-Za-z0-9._-]`):
 *
 * | verb | body | answer |
 * |---|---|---|
 * | `acquireSandbox` | `{name, template?, metadata?, spec?}` | `{status:"ready", created, sandbox}` |
 * | `listSandboxes` | `{metadata?, states?}` | `{sandboxes}` |
 * | `execCommand` | `{name, command, timeoutSeconds?, cwd?, env?}` | `{exitCode, stdout, stderr, stdoutTruncated, stderrTruncated, timedOut?}` |
 * | `writeFile` | `{name, path, contentBase64}` or `{name, path, content}` (UTF-8 text) | `{path, size}` |
 * | `readFile` | `{name, path}` | `{path, size, contentBase64}` |
 * | `updateMetadata` | `{name, metadata, merge?}` | `{sandbox}` |
 * | `destroySandbox` | `{name}` | `{destroyed}` |
 * | `getSandboxMetrics` | `{name}` | `{name, metrics}` |
 * | `getHostMetrics` | `{}` | `{nodeId, endpoint, build, reading}` |
 * | `lookupSandbox` | `{name}` or `{id}` | `{found:true, sandbox:{id,name,state}}` or `{found:false}` |
 * | `setPools` | `{pools:[{template, spec?:{cpus?, memoryMB?}, warm}]}` (the whole set) | `{pools}` |
 * | `listPools` | `{}` | `{pools:[{template, spec, warm, target, refilling, claimed}]}` |
 * | `snapshotSandbox` | `{name, snapshotName?}` | `{snapshot:{snapshotId, team, name?, sandboxId, template, node, createdAt, sizeBytes}}` |
 * | `listSnapshots` | `{sandboxId?, name?}` (a name or an id) | `{snapshots:[…]}`, oldest first |
 * | `deleteSnapshot` | `{snapshotId}` | `{deleted}` |
 *
 * The snapshot verbs are this node's own (the gateway serves snapshots on its E2B face): a
 * snapshot belongs to its sandbox's team, and a team sees and deletes only its own.
 *
 * `command` is a shell string (run as `/bin/sh -c <command>`) or an argv array. `GET /healthz` is
 * open and answers `{ok:true, nodeId, build}`.
 *
 * `execCommand`'s output comes as JSON strings, so its bytes are decoded as UTF-8 and a
 * sequence that is not UTF-8 (say a lone byte 0xE2) becomes U+FFFD; binary output is read
 * whole through a file (`readFile` answers base64). Past `timeoutSeconds` the command is killed
 * and the answer says `timedOut: true` with the kill's exit code 137, or -1 when its output was
 * still open 5 s after the kill (held by a process that escaped it). A sandbox destroyed while
 * the command runs answers 410.
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { Hono } from "hono";
import type { Context } from "hono";
import { HttpError, messageResponse } from "../../shared/http_error.ts";
import { DEFAULT_JSON_MESSAGE_LIMIT_BYTES, MESSAGE_ALTERNATIVE } from "../../shared/json_body.ts";
import type { Log } from "../../shared/log.ts";
import { silentLog } from "../../shared/log.ts";
import {
  nativeRequestSchemas as schemas,
  nativeVerbs,
  writeFileShapeSchema,
} from "../../shared/native_schemas.ts";
import { decodeBase64InSlices } from "../../shared/base64.ts";
import { jsonArrayResponse } from "../../shared/json_stream.ts";
import type { HostReading, Sandbox } from "../../shared/schemas.ts";
import { cameDirect, slotTokenOf } from "../../shared/slot_token.ts";
import { executorErrorToHttp } from "../executors/contract.ts";
import type { WarmPools } from "../pools.ts";
import type { NodeSnapshots } from "../snapshots.ts";
import type { SandboxOps, SandboxRecord } from "../service_contract.ts";

import { addNodeVerbs, nodeVerbs } from "./native_node_verbs.ts";
import { methodNotAllowed, NativeVerbs } from "./native_verbs.ts";

export { nativeVerbs } from "../../shared/native_schemas.ts";

/** Options of {@linkcode createNativeFace}. */
export interface NativeFaceOptions {
  /** The sandbox service every verb calls. */
  service: SandboxOps;
  /** The fleet token every verb needs. */
  token: string;
  /** This node's id, answered by `/healthz` and `getHostMetrics`. */
  nodeId: string;
  /** This node's origin, answered by `getHostMetrics`. */
  endpoint: string;
  /** The software build, answered by `/healthz` and `getHostMetrics`. */
  build: string;
  /** A host reading for `getHostMetrics`. */
  hostReading: () => HostReading;
  /** More fields of `/healthz` (who keeps the volumes' caps). */
  health?: () => Record<string, unknown>;
  /** The warm pools `setPools` and `listPools` act on; both answer 501 when absent. */
  pools?: Pick<WarmPools, "set" | "list">;
  /** The node's snapshots, for the snapshot verbs; they answer 501 when absent. */
  snapshots?: NodeSnapshots;
  /** Where unexpected errors (500s) are logged; `silentLog` when absent. */
  log?: Log;
  /**
   * Cap of a verb's JSON body, bytes (`DORMICE_JSON_BODY_LIMIT_MB`); 32 MiB when absent. Past
   * it a 413 names the cap and `POST /files`, which streams a file of any size.
   */
  maxBodyBytes?: number;
  /**
   * Cap of every other verb's JSON body, bytes (`DORMICE_JSON_MESSAGE_LIMIT_KB`); 1 MiB when
   * absent. Only `writeFile` carries a file and takes up to `maxBodyBytes`.
   */
  maxMessageBytes?: number;
}

/**
 * The public sandbox object: the record without its E2B bookkeeping.
 *
 * @example
 * ```ts ignore
 * import { publicSandbox } from "@dormice/cluster/node";
 * publicSandbox(service.get({ name: "a" })!);
 * ```
 */
export function publicSandbox(record: SandboxRecord): Sandbox {
  const {
    id,
    name,
    team,
    state,
    nodeId,
    endpoint,
    template,
    metadata,
    spec,
    createdAt,
    lastActiveAt,
  } = record;
  return {
    id,
    name,
    team,
    state,
    nodeId,
    endpoint,
    template,
    metadata,
    spec: maskedSpec(spec),
    createdAt,
    lastActiveAt,
  };
}

/**
 * `spec` with the values of its header transforms masked (`***`): they are credentials, and a
 * sandbox's record is readable by every holder of the team's key and shown on the fleet's pages.
 */
function maskedSpec(spec: SandboxRecord["spec"]): SandboxRecord["spec"] {
  const transforms = spec.egressRules?.transforms;
  if (transforms === undefined) return spec;
  const masked = Object.fromEntries(
    Object.entries(transforms).map(([domain, list]) => [
      domain,
      list.map((t) =>
        t.headers
          ? { headers: Object.fromEntries(Object.keys(t.headers).map((h) => [h, "***"])) }
          : t
      ),
    ]),
  );
  return { ...spec, egressRules: { ...spec.egressRules!, transforms: masked } };
}

/**
 * Turns any error into the native dialect `{message}` with its status: `HttpError` and
 * `ExecutorError` keep theirs; anything else is a logged 500 (bad input never gets here).
 *
 * @example
 * ```ts
 * import { HttpError } from "../../shared/http_error.ts";
 * import { nativeErrorResponse } from "./native.ts";
 * nativeErrorResponse(new HttpError(404, "No sandbox named 'a'")).status; // 404
 * ```
 */
export function nativeErrorResponse(error: unknown, log: Log = silentLog): Response {
  return messageResponse(executorErrorToHttp(error), "node", log);
}

/**
 * The native 404: an unknown verb is named along with every verb the node answers.
 *
 * @example
 * ```ts ignore
 * app.notFound(nativeNotFound);
 * ```
 */
export function nativeNotFound(c: Context): Response {
  const path = new URL(c.req.url).pathname;
  const verbs = [...nativeVerbs, ...nodeVerbs].join(", ");
  if (/^\/[^/]+$/.test(path)) {
    return c.json({
      message: `Unknown verb '${path.slice(1)}': the node answers POST /<verb> for ${verbs}, ` +
        "and GET /healthz",
    }, 404);
  }
  return c.json({
    message: `No route ${c.req.method} ${path}: the node answers POST /<verb> for ${verbs}, ` +
      "and GET /healthz",
  }, 404);
}

/**
 * Builds the native face as a Hono app (mount it at the root). Bad input is a 400 naming the
 * field, a wrong or missing token a 401, an unknown verb a 404 naming the verbs, a wrong method
 * a 405; every error is `{message}` from one error handler.
 *
 * @example
 * ```ts ignore
 * import { createNativeFace } from "@dormice/cluster/node";
 * const face = createNativeFace({ service, token, nodeId: "node-1", endpoint, build: "dev",
 *   hostReading: () => reader.read() });
 * const res = await face.request("/healthz");
 * ```
 */
export function createNativeFace(options: NativeFaceOptions): Hono {
  const { token, nodeId, build } = options;
  const log = options.log ?? silentLog;
  const bodyCap = { maxBytes: options.maxBodyBytes, capVariable: "DORMICE_JSON_BODY_LIMIT_MB" };
  const messageCap = {
    maxBytes: options.maxMessageBytes ?? DEFAULT_JSON_MESSAGE_LIMIT_BYTES,
    capVariable: "DORMICE_JSON_MESSAGE_LIMIT_KB",
    tooLargeHint: MESSAGE_ALTERNATIVE,
  };
  const app = new Hono();
  app.onError((error) => nativeErrorResponse(error, log));
  app.notFound(nativeNotFound);

  app.get("/healthz", (c) => c.json({ ok: true, nodeId, build, ...options.health?.() }));
  app.all("/healthz", (c) => methodNotAllowed(c, "GET"));

  const verbs = new NativeVerbs(app, { token, bodyCap, messageCap });
  addSandboxVerbs(verbs, options);
  addNodeVerbs(verbs, options);
  return app;
}

/** The sandbox verbs (those the gateway routes by name), on `verbs`. */
function addSandboxVerbs(verbs: NativeVerbs, options: NativeFaceOptions): void {
  const { service, nodeId, endpoint, build, hostReading } = options;
  verbs.add("acquireSandbox", schemas.acquireSandbox, async (b, team, headers) => {
    const slotToken = slotTokenOf(headers);
    const { created, sandbox } = await service.acquire({
      ...b,
      team,
      slotToken,
      direct: cameDirect(headers),
    });
    return { status: "ready", created, sandbox: publicSandbox(sandbox) };
  });
  verbs.add(
    "listSandboxes",
    schemas.listSandboxes,
    async (b, team) =>
      jsonArrayResponse(
        (await service.listInSlices({ ...b, team })).map(publicSandbox),
        "sandboxes",
      ),
  );
  verbs.add(
    "execCommand",
    schemas.execCommand,
    (b, team) =>
      service.execCommand({ name: b.name, team }, {
        cmd: typeof b.command === "string" ? ["/bin/sh", "-c", b.command] : b.command,
        cwd: b.cwd,
        env: b.env,
        timeoutMs: b.timeoutSeconds === undefined ? undefined : b.timeoutSeconds * 1000,
      }),
  );
  verbs.add("writeFile", writeFileShapeSchema, async (b, team) => {
    const data = b.contentBase64 !== undefined
      ? await decodeContent(b.contentBase64)
      : new TextEncoder().encode(b.content);
    const entry = await service.writeFile({ name: b.name, team }, b.path, data);
    return { path: entry.path, size: entry.size };
  });
  verbs.add("readFile", schemas.readFile, async (b, team) => {
    const data = await service.readFile({ name: b.name, team }, b.path);
    return streamedReadAnswer(b.path, data);
  });
  verbs.add("updateMetadata", schemas.updateMetadata, async (b, team) => ({
    sandbox: publicSandbox(
      await service.updateMetadata({ name: b.name, team }, b.metadata, b.merge),
    ),
  }));
  verbs.add("destroySandbox", schemas.destroySandbox, async (b, team) => ({
    destroyed: await service.destroy({ name: b.name, team }),
  }));
  verbs.add("getSandboxMetrics", schemas.getSandboxMetrics, async (b, team) => ({
    name: b.name,
    metrics: await service.metrics({ name: b.name, team }),
  }));
  verbs.add("getHostMetrics", schemas.getHostMetrics, () => ({
    nodeId,
    endpoint,
    build,
    reading: hostReading(),
  }));
  verbs.add(
    "lookupSandbox",
    schemas.lookupSandbox,
    (b, team, headers) => service.lookup(b, team, slotTokenOf(headers)),
  );
}

/** Bytes of a file encoded at once in a `readFile` answer: 384 KiB, 512 KiB of base64. */
const READ_SLICE_BYTES = 384 * 1024;

/**
 * `readFile`'s answer `{path, size, contentBase64}`, streamed: the base64 is made a slice at a
 * time as the client takes it, so neither a whole base64 copy nor one long encode and
 * `JSON.stringify` hold the node (a 24 MiB file took 30 ms to encode and as long to stringify).
 */
function streamedReadAnswer(path: string, data: Uint8Array): Response {
  const encoder = new TextEncoder();
  let at = 0;
  let started = false;
  const body = new ReadableStream<Uint8Array>({
    pull(controller) {
      if (!started) {
        started = true;
        const head = `{"path":${JSON.stringify(path)},"size":${data.length},"contentBase64":"`;
        controller.enqueue(encoder.encode(head));
        return;
      }
      if (at >= data.length) {
        controller.enqueue(encoder.encode('"}'));
        controller.close();
        return;
      }
      const slice = data.subarray(at, at + READ_SLICE_BYTES);
      at += slice.length;
      controller.enqueue(encoder.encode(Buffer.from(slice).toString("base64")));
    },
  }, { highWaterMark: 0 });
  return new Response(body, { headers: { "content-type": "application/json" } });
}

/** `writeFile`'s `contentBase64`, decoded a slice at a time; a 400 naming it when it is not base64. */
async function decodeContent(text: string): Promise<Uint8Array> {
  try {
    return await decodeBase64InSlices(text);
  } catch (error) {
    if (!(error instanceof RangeError)) throw error;
    throw new HttpError(400, `Invalid body for writeFile: 'contentBase64': ${error.message}`);
  }
}
