/**
 * envd's REST `/files` door, in both its forms: behind the `E2b-Sandbox-Id` header at
 * `/e2b/envd/files` (the access token checked by `guard`), and the SDK's root-level `/files`
 * that finds its sandbox from a signed URL alone.
 *
 * Uploads stream: a multipart body is read a part at a time (`multipart.ts`), each file is
 * staged (`staging.ts`: in memory up to 1 MiB, on the data disk past it) and then handed to the
 * executor as a stream, so an upload costs the node a bounded amount of memory whatever its size.
 * Every byte counts against `maxUploadBytes` (1 GiB by default, `DORMICE_UPLOAD_LIMIT_MB`), after
 * decompression too, and at most a few uploads stream at once (`upload_slots.ts`).
 *
 * @module
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { posix } from "node:path";
import { HttpError } from "../../../shared/http_error.ts";
import { formatBytes } from "../../../shared/json_body.ts";
import type { SandboxOps, SandboxRecord } from "../../service_contract.ts";
import {
  type AccessTokens,
  isExpired,
  parseSignedFileUrl,
  SignatureLocator,
  SIGNED_URL_EXPIRED,
} from "../../../shared/access_tokens.ts";
import { DEFAULT_USER, type EnvdCore, type EnvdOptions, makeCore } from "./core.ts";
import { restError, restErrorOf } from "./dialects.ts";
import { admitTraffic, guard } from "./guard.ts";
import { gunzipBounded } from "./gunzip.ts";
import { multipartBoundary, readMultipart } from "./multipart.ts";
import { resolvePath } from "./request.ts";

/**
 * Mounts `GET /files` and `POST /files` of the header-routed envd on `app`.
 *
 * @example
 * ```ts ignore
 * mountFiles(app, makeCore(ops, options));
 * ```
 */
export function mountFiles(app: Hono, core: EnvdCore): void {
  app.get("/files", (c) =>
    guard(core, c, "rest", async (sandbox) => {
      const url = new URL(c.req.url);
      return await readFileResponse(core, sandbox, url);
    }));
  app.post("/files", (c) =>
    guard(core, c, "rest", async (sandbox) => {
      const url = new URL(c.req.url);
      return await writeFilesResponse(core, sandbox, url, c.req.raw);
    }));
}

/**
 * The SDK's root-level `/files` door (`sandbox.downloadUrl()` / `uploadUrl()` land here with no
 * sandbox header). The sandbox is the one whose token validates the signature: a remembered
 * hint is re-verified first, otherwise every sandbox on this node is tried: one SHA-256 per
 * sandbox once its token is cached (measured 18 ms for a miss over 5,000 sandboxes on the dev
 * machine). Anyone who can reach the node can make it pay that per request, so keep this door
 * behind the same network rules as the node itself.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { AccessTokens } from "../../../shared/access_tokens.ts";
 * import { handleSignedFiles } from "./files.ts";
 * import { FakeExecutor } from "../../executors/fake.ts";
 * import { Ledger } from "../../ledger.ts";
 * import { SandboxService } from "../../service.ts";
 * const ops = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
 *   executor: new FakeExecutor(),
 * });
 * const app = new Hono();
 * app.route("/", handleSignedFiles(ops, { accessTokens: new AccessTokens("s".repeat(32)) }));
 * ```
 */
export function handleSignedFiles(
  ops: SandboxOps,
  options: EnvdOptions & { accessTokens: AccessTokens },
): Hono {
  const core = makeCore(ops, options);
  const locator = new SignatureLocator(options.accessTokens);
  const app = new Hono();
  const serve = async (c: Context, operation: "read" | "write") => {
    const url = new URL(c.req.url);
    const parsed = parseSignedFileUrl(url, operation);
    if (!parsed.ok) return restError(401, parsed.error);
    const ids = ops.ids();
    const id = locator.find(parsed.value, ids);
    const sandbox = id === undefined ? undefined : ops.get({ id });
    if (!sandbox) {
      return restError(
        401,
        "The signature matches no sandbox on this node: the URL was signed for another node, the sandbox is gone, or the URL was altered",
      );
    }
    // After the signature: an altered URL is told so, whatever its expiration says.
    if (isExpired(parsed.value, core.options.clock.now())) {
      return restError(401, SIGNED_URL_EXPIRED);
    }
    try {
      const awake = await admitTraffic(core, sandbox);
      return operation === "read"
        ? await readFileResponse(core, awake, url)
        : await writeFilesResponse(core, awake, url, c.req.raw);
    } catch (error) {
      return restErrorOf(core.options.log, error);
    }
  };
  app.get("/files", (c) => serve(c, "read"));
  app.post("/files", (c) => serve(c, "write"));
  return app;
}

/** `GET /files?path=…&username=…`: the file's bytes as an attachment. */
async function readFileResponse(
  core: EnvdCore,
  sandbox: SandboxRecord,
  url: URL,
): Promise<Response> {
  const user = url.searchParams.get("username") || DEFAULT_USER;
  const path = resolvePath(url.searchParams.get("path") ?? "", user, "path");
  const data = await core.ops.readFile({ id: sandbox.id }, path, { user });
  return new Response(data as Uint8Array<ArrayBuffer>, {
    status: 200,
    headers: {
      "content-type": "application/octet-stream",
      "content-length": String(data.length),
      "content-disposition": `attachment; filename="${encodeURIComponent(posix.basename(path))}"`,
    },
  });
}

/** The most metadata keys one write carries, and their keys' and values' bytes in all. */
const METADATA_MAX_KEYS = 32;
const METADATA_MAX_BYTES = 8 * 1024;
const METADATA_PREFIX = "x-metadata-";
/** What the SDK allows: keys of HTTP token characters, printable US-ASCII values. */
const METADATA_KEY = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$/;
const METADATA_VALUE = /^[\x20-\x7e]*$/;

/**
 * The file metadata of a write, from its `X-Metadata-<key>` headers, as the SDK sends it.
 * Header names reach the node lowercased (HTTP's names are case-insensitive), so keys are too.
 */
function metadataOf(headers: Headers): Record<string, string> | undefined {
  const out: Record<string, string> = {};
  let count = 0, bytes = 0;
  for (const [name, value] of headers) {
    if (!name.startsWith(METADATA_PREFIX)) continue;
    const key = name.slice(METADATA_PREFIX.length);
    if (!METADATA_KEY.test(key)) {
      throw new HttpError(
        400,
        `The metadata header '${name}' names no key: add one after 'X-Metadata-'`,
      );
    }
    if (!METADATA_VALUE.test(value)) {
      throw new HttpError(400, `The metadata value of '${key}' must be printable US-ASCII`);
    }
    count++;
    bytes += key.length + value.length;
    if (count > METADATA_MAX_KEYS || bytes > METADATA_MAX_BYTES) {
      throw new HttpError(
        400,
        `A file takes at most ${METADATA_MAX_KEYS} metadata keys and ${METADATA_MAX_BYTES} bytes ` +
          `of keys and values: send fewer`,
      );
    }
    out[key] = value;
  }
  return count ? out : undefined;
}

/**
 * `POST /files`: a multipart upload (one part per file, each part's filename its path, or
 * `?path=` for a single part) or one raw `application/octet-stream` body (gzip allowed) at
 * `?path=`. Every byte counts against `maxUploadBytes`, declared or not. The files of a
 * multipart body are written one by one as they arrive, so a body refused at its second part
 * has written its first.
 */
async function writeFilesResponse(
  core: EnvdCore,
  sandbox: SandboxRecord,
  url: URL,
  request: Request,
): Promise<Response> {
  const user = url.searchParams.get("username") || DEFAULT_USER;
  const pathParam = url.searchParams.get("path");
  const metadata = metadataOf(request.headers);
  const contentTypeHeader = request.headers.get("content-type") ?? "";
  const contentType = contentTypeHeader.split(";")[0].trim().toLowerCase();
  const limit = core.options.maxUploadBytes;
  const encoding = (request.headers.get("content-encoding") ?? "").toLowerCase();
  // Everything that needs no body byte is checked before the upload takes a slot.
  let boundary: string | undefined;
  if (contentType === "multipart/form-data") boundary = multipartBoundary(contentTypeHeader);
  else if (contentType === "application/octet-stream" || contentType === "") {
    if (!pathParam) {
      throw new HttpError(400, "'path' is required with an application/octet-stream body");
    }
    resolvePath(pathParam, user, "path");
  } else {
    throw new HttpError(
      400,
      `Content-Type '${contentType}' is not supported: use multipart/form-data or application/octet-stream`,
    );
  }
  if (encoding && encoding !== "identity" && !(encoding === "gzip" && boundary === undefined)) {
    throw new HttpError(
      400,
      `Content-Encoding '${encoding}' is not supported here: use gzip (octet-stream only) or none`,
    );
  }
  const declared = Number(request.headers.get("content-length") ?? "0");
  if (declared > limit) {
    await request.body?.cancel().catch(() => {});
    throw uploadTooLarge(limit, `it declares ${declared} bytes`);
  }
  const release = await core.options.uploads.acquire(request.signal);
  try {
    let raw: ReadableStream<Uint8Array> = request.body ?? new Blob([]).stream();
    const unreadable = (error: unknown) => {
      if (error instanceof HttpError) return error;
      if (request.signal.aborted) return new HttpError(499, "The client closed the request");
      return new HttpError(
        400,
        `The upload body could not be read${encoding === "gzip" ? " (bad gzip?)" : ""} ` +
          `(${(error as Error)?.message ?? error}): send it again`,
      );
    };
    if (encoding === "gzip") {
      const maxRatio = core.options.maxGzipRatio;
      raw = gunzipBounded(raw, {
        maxRatio,
        unreadable,
        tooExpanded: (compressed, inflated) => gzipTooExpanded(maxRatio, compressed, inflated),
      });
    }
    // Capped after decompression, so a small gzip bomb cannot fill the node's disk either.
    const body = metered(raw, limit, unreadable);
    const out: {
      path: string;
      name: string;
      type: "file";
      metadata?: Record<string, string>;
    }[] = [];
    const write = async (path: string, stream: ReadableStream<Uint8Array>) => {
      const staged = await core.options.staging.stage(stream);
      try {
        const entry = await core.ops.writeFile({ id: sandbox.id }, path, staged.data, {
          user,
          metadata,
        });
        out.push({
          path: entry.path,
          name: entry.name,
          type: "file",
          ...(entry.metadata ? { metadata: entry.metadata } : {}),
        });
      } finally {
        await staged.dispose();
      }
    };
    if (boundary === undefined) {
      await write(resolvePath(pathParam!, user, "path"), body);
      return Response.json(out, { status: 200 });
    }
    let files = 0;
    for await (const part of readMultipart(body, boundary)) {
      if (part.name !== "file") {
        await part.body.cancel();
        continue;
      }
      if (++files > 1 && pathParam) {
        throw new HttpError(
          400,
          `'path' names one file but the upload has more than one part named 'file' (the first ` +
            `was written to ${
              out[0]?.path
            }): drop 'path' and give each part its full path as filename`,
        );
      }
      const target = pathParam || part.filename;
      if (!target) {
        throw new HttpError(
          400,
          "'path' is required: give it as a query parameter or as the part's filename",
        );
      }
      await write(resolvePath(target, user, "path"), part.body);
    }
    if (files === 0) {
      throw new HttpError(
        400,
        "The multipart body has no part named 'file': name each part 'file'",
      );
    }
    return Response.json(out, { status: 200 });
  } finally {
    release();
    // Whatever was not read (a refusal midway) is let go of, so the connection can close.
    await request.body?.cancel().catch(() => {});
  }
}

/**
 * Passes `body` through as it is read, erroring with the 413 once more than `limit` bytes
 * flowed and with `unreadable(error)` when `body` itself fails (a client that left, bad gzip),
 * so every reader downstream (the multipart reader, the staging) stops with the right sentence.
 */
function metered(
  body: ReadableStream<Uint8Array>,
  limit: number,
  unreadable: (error: unknown) => HttpError,
): ReadableStream<Uint8Array> {
  const reader = body.getReader();
  let seen = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      let next: ReadableStreamReadResult<Uint8Array>;
      try {
        next = await reader.read();
      } catch (error) {
        controller.error(unreadable(error));
        return;
      }
      if (next.done) return controller.close();
      seen += next.value.byteLength;
      if (seen > limit) {
        controller.error(uploadTooLarge(limit, `more than ${limit} bytes arrived`));
        await reader.cancel().catch(() => {});
        return;
      }
      controller.enqueue(next.value);
    },
    cancel: (reason) => reader.cancel(reason),
  }, { highWaterMark: 0 });
}

/** The 413 of a gzip upload that inflates past the ratio cap, naming it and what to do. */
function gzipTooExpanded(maxRatio: number, compressed: number, inflated: number): HttpError {
  return new HttpError(
    413,
    `The gzip upload inflates more than ${maxRatio} times its size, this node's cap ` +
      `(${inflated} bytes from the first ${compressed}; ` +
      "DORMICE_UPLOAD_GZIP_MAX_RATIO sets it, 1 to 1032): send the file without " +
      "Content-Encoding: gzip, or compress it into an archive the sandbox unpacks",
  );
}

/** The 413 of an upload past the cap, naming it, its variable and what to do. */
function uploadTooLarge(limit: number, why: string): HttpError {
  return new HttpError(
    413,
    `The upload is over this node's cap of ${formatBytes(limit)} per request, counted after ` +
      `decompression (${why}; DORMICE_UPLOAD_LIMIT_MB sets it): send fewer or smaller files per ` +
      "request",
  );
}
