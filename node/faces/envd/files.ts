/**
 * envd's REST `/files` door, in both its forms: behind the `E2b-Sandbox-Id` header at
 * `/e2b/envd/files` (the access token checked by `guard`), and the SDK's root-level `/files`
 * that finds its sandbox from a signed URL alone. Uploads are held in memory, so every byte of
 * one counts against `maxUploadBytes` (1 GiB by default), after decompression too.
 *
 * @module
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { posix } from "node:path";
import { HttpError } from "../../../shared/http_error.ts";
import type { SandboxOps, SandboxRecord } from "../../service_contract.ts";
import {
  type AccessTokens,
  isExpired,
  parseSignedFileUrl,
  SignatureLocator,
} from "../../../shared/access_tokens.ts";
import { DEFAULT_USER, type EnvdCore, type EnvdOptions, makeCore } from "./core.ts";
import { restError, restErrorOf } from "./dialects.ts";
import { admitTraffic, guard } from "./guard.ts";
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
 * import { AccessTokens, handleSignedFiles } from "@dormice/cluster/node";
 * import { FakeExecutor, Ledger, SandboxService } from "@dormice/cluster/node";
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
    if (isExpired(parsed.value, core.options.clock.now())) {
      return restError(401, "The signed URL has expired: ask the SDK for a fresh one");
    }
    const ids = ops.list().map((s) => s.id);
    const id = locator.find(parsed.value, ids);
    const sandbox = id === undefined ? undefined : ops.get({ id });
    if (!sandbox) {
      return restError(
        401,
        "The signature matches no sandbox on this node: the URL was signed for another node, the sandbox is gone, or the URL was altered",
      );
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

/**
 * `POST /files`: a multipart upload (one part per file, each part's filename its path, or
 * `?path=` for a single part) or one raw `application/octet-stream` body (gzip allowed) at
 * `?path=`. Every byte counts against `maxUploadBytes`, declared or not.
 */
async function writeFilesResponse(
  core: EnvdCore,
  sandbox: SandboxRecord,
  url: URL,
  request: Request,
): Promise<Response> {
  const user = url.searchParams.get("username") || DEFAULT_USER;
  const pathParam = url.searchParams.get("path");
  const contentType = (request.headers.get("content-type") ?? "").split(";")[0].trim()
    .toLowerCase();
  const limit = core.options.maxUploadBytes;
  const declared = Number(request.headers.get("content-length") ?? "0");
  if (declared > limit) {
    throw new HttpError(
      413,
      `The upload is ${declared} bytes, over this node's limit of ${limit}: send smaller files`,
    );
  }
  const files: { path: string; data: Uint8Array }[] = [];
  if (contentType === "multipart/form-data") {
    let form: FormData;
    try {
      // Re-wrapped so the byte cap applies to chunked uploads too (the SDK sends no length).
      form = await new Request(request.url, {
        method: "POST",
        headers: request.headers,
        body: capped(request.body, limit),
        duplex: "half",
      } as RequestInit).formData();
    } catch (error) {
      if (error instanceof UploadTooLarge) throw tooLarge(limit);
      throw new HttpError(400, "The multipart body could not be parsed: send parts named 'file'");
    }
    const parts = form.getAll("file");
    if (parts.length === 0) {
      throw new HttpError(
        400,
        "The multipart body has no part named 'file': name each part 'file'",
      );
    }
    if (pathParam && parts.length > 1) {
      throw new HttpError(
        400,
        `'path' names one file but the upload has ${parts.length} parts: drop 'path' and give each part its full path as filename`,
      );
    }
    for (const part of parts) {
      const name = typeof part === "string" ? "" : part.name;
      const data = typeof part === "string"
        ? new TextEncoder().encode(part)
        : new Uint8Array(await part.arrayBuffer());
      const target = pathParam || name;
      if (!target) {
        throw new HttpError(
          400,
          "'path' is required: give it as a query parameter or as the part's filename",
        );
      }
      files.push({ path: resolvePath(target, user, "path"), data });
    }
  } else if (contentType === "application/octet-stream" || contentType === "") {
    if (!pathParam) {
      throw new HttpError(400, "'path' is required with an application/octet-stream body");
    }
    let body: ReadableStream<Uint8Array> | null = request.body;
    const encoding = (request.headers.get("content-encoding") ?? "").toLowerCase();
    if (body && encoding === "gzip") {
      body = body.pipeThrough(
        new DecompressionStream("gzip") as unknown as ReadableWritablePair<Uint8Array, Uint8Array>,
      );
    } else if (encoding && encoding !== "identity") {
      throw new HttpError(400, `Content-Encoding '${encoding}' is not supported: use gzip or none`);
    }
    let data: Uint8Array;
    try {
      // Capped after decompression, so a small gzip bomb cannot fill the node's memory either.
      data = new Uint8Array(await new Response(capped(body, limit)).arrayBuffer());
    } catch (error) {
      if (error instanceof UploadTooLarge) throw tooLarge(limit);
      throw new HttpError(400, "The upload body could not be read (bad gzip?): send it again");
    }
    files.push({ path: resolvePath(pathParam, user, "path"), data });
  } else {
    throw new HttpError(
      400,
      `Content-Type '${contentType}' is not supported: use multipart/form-data or application/octet-stream`,
    );
  }
  const out = [];
  for (const file of files) {
    const entry = await core.ops.writeFile({ id: sandbox.id }, file.path, file.data, { user });
    out.push({ path: entry.path, name: entry.name, type: "file" });
  }
  return Response.json(out, { status: 200 });
}

/** Raised inside a capped stream once more than its limit has flowed. */
class UploadTooLarge extends Error {}

/** Passes `body` through, erroring with UploadTooLarge once more than `limit` bytes flowed. */
function capped(
  body: ReadableStream<Uint8Array> | null,
  limit: number,
): ReadableStream<Uint8Array> | null {
  if (body === null) return null;
  let seen = 0;
  return body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        seen += chunk.byteLength;
        if (seen > limit) controller.error(new UploadTooLarge());
        else controller.enqueue(chunk);
      },
    }),
  );
}

/** The 413 of an upload that ran past the cap while it was read. */
function tooLarge(limit: number): HttpError {
  return new HttpError(
    413,
    `The upload is over this node's limit of ${limit} bytes: send smaller files`,
  );
}
