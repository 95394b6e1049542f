/**
 * The node's envd face (E2B's in-sandbox daemon, served for every sandbox at once): `/health`,
 * `/files`, and the Connect RPC services `process.Process` and `filesystem.Filesystem` with the
 * JSON codec. The sandbox is picked by the `E2b-Sandbox-Id` header. Also the SDK's root-level
 * signed `/files` door, which finds its sandbox from the signature alone.
 *
 * @module
 */
import { Hono } from "hono";
import type { Context } from "hono";
import { Buffer } from "node:buffer";
import { posix } from "node:path";
import { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { type Clock, systemClock } from "../../shared/clock.ts";
import { type Log, silentLog } from "../../shared/log.ts";
import { describeZodError } from "../../shared/schemas.ts";
import {
  type ExecHandle,
  type ExecRequest,
  executorErrorToHttp,
  type FileEntry,
} from "../executors/contract.ts";
import type { SandboxOps, SandboxRecord } from "../service_contract.ts";
import {
  type AccessTokens,
  isExpired,
  parseSignedFileUrl,
  SignatureLocator,
  signatureMatches,
} from "./access_tokens.ts";
import {
  CONNECT_STREAM_JSON,
  type ConnectCode,
  ConnectError,
  connectErrorResponse,
  readStreamRequest,
  readUnaryRequest,
  statusToConnectCode,
  streamResponse,
  type StreamSink,
} from "./connect_codec.ts";

/** Options of {@linkcode createEnvd} and {@linkcode handleSignedFiles}. */
export interface EnvdOptions {
  /**
   * Per-sandbox access tokens. When set, every sandbox has a token and envd requires it as
   * `X-Access-Token` (or a valid `/files` signature); when absent, envd is open to whoever can
   * reach it (the fleet token guards only the control plane).
   */
  accessTokens?: AccessTokens;
  /** Where errors the client cannot fix are logged. */
  log?: Log;
  /** Used for signature expiry. */
  clock?: Clock;
  /** Largest upload accepted by `POST /files`, bytes (default 1 GiB: files are held in memory). */
  maxUploadBytes?: number;
}

/** The header the SDK names the sandbox with. */
const SANDBOX_HEADER = "E2b-Sandbox-Id";
/** The SDK's header asking for keepalive events every N seconds on a stream. */
const KEEPALIVE_HEADER = "Keepalive-Ping-Interval";
/** E2B's default user when the request names none. */
const DEFAULT_USER = "user";

type Dialect = "rest" | "connect";

/** One running command's output, fanned out to every stream attached to it. */
interface ProcessHub {
  pid: number;
  tag?: string;
  request: ExecRequest;
  subscribers: Set<(message: unknown) => void>;
  /** The end event once the command ended and its output was drained. */
  end?: unknown;
  done: Promise<void>;
}

/** One directory watch (streamed `WatchDir` or a polled `CreateWatcher`). */
interface Watcher {
  sandboxId: string;
  path: string;
  recursive: boolean;
  deliver: (event: FsEvent) => void;
}

interface FsEvent {
  name: string;
  type: "EVENT_TYPE_CREATE" | "EVENT_TYPE_WRITE" | "EVENT_TYPE_REMOVE" | "EVENT_TYPE_RENAME";
}

/** Internal state shared by the envd routes and the signed `/files` door. */
interface EnvdCore {
  ops: SandboxOps;
  options: Required<Omit<EnvdOptions, "accessTokens">> & { accessTokens?: AccessTokens };
  watchers: Set<Watcher>;
}

/**
 * Builds the envd face; `createNodeApp` mounts it at `/e2b/envd`.
 *
 * Process output is pumped from the executor into a hub for as long as the command runs, and
 * each `Start`/`Connect` stream is a subscriber: a client that hangs up stops its own stream at
 * once, while the command keeps running with its output drained (E2B's background commands
 * must survive their client, and an undrained pipe would stall or SIGPIPE the command).
 * `WatchDir` reports changes made through envd itself (uploads, MakeDir, Move, Remove), not
 * writes done by commands inside the sandbox.
 *
 * @example
 * ```ts
 * import { Hono } from "hono";
 * import { createEnvd } from "@dormice/cluster/node";
 * import { FakeExecutor, Ledger, SandboxService } from "@dormice/cluster/node";
 * const ops = new SandboxService({
 *   ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
 *   executor: new FakeExecutor(),
 * });
 * const app = new Hono();
 * app.route("/e2b/envd", createEnvd(ops));
 * ```
 */
export function createEnvd(ops: SandboxOps, options: EnvdOptions = {}): Hono {
  const core = makeCore(ops, options);
  const hubs = new Map<string, ProcessHub>();
  const polled = new Map<string, { sandboxId: string; events: FsEvent[]; watcher: Watcher }>();
  const app = new Hono();

  app.get("/health", (c) => {
    const id = c.req.header(SANDBOX_HEADER);
    if (!id) return restError(400, `The ${SANDBOX_HEADER} header is missing: name the sandbox`);
    const sandbox = ops.get({ id });
    if (!sandbox || sandbox.state !== "active") {
      return restError(502, `Sandbox '${id}' is not running on this node`);
    }
    return c.body(null, 204);
  });

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

  // --- process.Process -------------------------------------------------------------------

  const hubKey = (sandboxId: string, pid: number) => `${sandboxId}\u0000${pid}`;

  /** Starts pumping a handle's output into a new hub (subscribers added before this runs). */
  const openHub = (
    sandboxId: string,
    handle: ExecHandle,
    request: ExecRequest,
    tag?: string,
  ): ProcessHub => {
    const hub: ProcessHub = {
      pid: handle.pid,
      tag,
      request,
      subscribers: new Set(),
      done: Promise.resolve(),
    };
    const broadcast = (message: unknown) => {
      for (const s of hub.subscribers) s(message);
    };
    const pump = async (stream: ReadableStream<Uint8Array>, field: "stdout" | "stderr") => {
      const reader = stream.getReader();
      try {
        while (true) {
          const { done, value } = await reader.read();
          if (done) break;
          if (value.length) {
            broadcast({
              event: { data: { [field]: Buffer.from(value).toString("base64") } },
            });
          }
        }
      } catch (error) {
        core.options.log("warn", "command output stream failed", {
          sandboxId,
          pid: handle.pid,
          error,
        });
      } finally {
        reader.releaseLock();
      }
    };
    hubs.set(hubKey(sandboxId, handle.pid), hub);
    hub.done = (async () => {
      await Promise.all([pump(handle.stdout, "stdout"), pump(handle.stderr, "stderr")]);
      let end;
      try {
        end = endEvent(await handle.exited);
      } catch (error) {
        // Never let this promise reject: nobody may be awaiting it, and the node must not crash.
        core.options.log("warn", "command end could not be read", { sandboxId, error });
        end = { exitCode: -1, exited: false, status: "unknown", error: errorMessage(error) };
      }
      hub.end = { event: { end } };
      broadcast(hub.end);
      hubs.delete(hubKey(sandboxId, handle.pid));
    })();
    return hub;
  };

  const findHub = (sandbox: SandboxRecord, selector: Selector): ProcessHub => {
    const running = ops.commands({ id: sandbox.id });
    let pid: number | undefined;
    if ("pid" in selector) pid = selector.pid;
    else {
      for (const hub of hubs.values()) {
        if (hub.tag === selector.tag && running.has(hub.pid)) pid = hub.pid;
      }
    }
    const existing = pid === undefined ? undefined : hubs.get(hubKey(sandbox.id, pid));
    if (existing) return existing;
    const entry = pid === undefined ? undefined : running.get(pid);
    if (pid === undefined || !entry) {
      throw new ConnectError(
        "not_found",
        `No running process ${
          describeSelector(selector)
        } in sandbox '${sandbox.id}': list them with Process/List`,
      );
    }
    return openHub(sandbox.id, entry.handle, entry.request);
  };

  /** Streams a hub's events to one client until the command ends or the client leaves. */
  const follow = async (hub: ProcessHub, sink: StreamSink, keepaliveMs?: number) => {
    sink.send({ event: { start: { pid: hub.pid } } });
    if (hub.end) {
      sink.send(hub.end);
      return;
    }
    const subscriber = (message: unknown) => sink.send(message);
    hub.subscribers.add(subscriber);
    const timer = keepaliveMs
      ? setInterval(() => sink.send({ event: { keepalive: {} } }), keepaliveMs)
      : undefined;
    try {
      await Promise.race([hub.done, aborted(sink.signal)]);
    } finally {
      hub.subscribers.delete(subscriber);
      if (timer !== undefined) clearInterval(timer);
    }
  };

  const streams: Record<
    string,
    (sandbox: SandboxRecord, message: unknown, sink: StreamSink, c: Context) => Promise<void>
  > = {
    "process.Process/Start": async (sandbox, message, sink, c) => {
      const body = parse(startSchema, message);
      if (body.pty) {
        throw new ConnectError(
          "unimplemented",
          "PTY sessions are not supported by this node: run the command without a pty",
        );
      }
      const user = userOf(c);
      const request: ExecRequest = {
        cmd: [body.process.cmd, ...(body.process.args ?? [])],
        env: body.process.envs,
        cwd: body.process.cwd ? resolvePath(body.process.cwd, user, "process.cwd") : undefined,
        user,
        stdin: body.stdin ?? false,
      };
      const handle = await ops.startCommand({ id: sandbox.id }, request);
      // follow() sends the start event and subscribes before the pump's first read resolves,
      // so no output can slip ahead of the start event.
      await follow(openHub(sandbox.id, handle, request, body.tag), sink, keepaliveOf(c));
    },
    "process.Process/Connect": async (sandbox, message, sink, c) => {
      const body = parse(selectorRequestSchema, message);
      const hub = findHub(sandbox, body.process);
      await follow(hub, sink, keepaliveOf(c));
    },
    "filesystem.Filesystem/WatchDir": async (sandbox, message, sink, c) => {
      const body = parse(watchSchema, message);
      const path = resolvePath(body.path, userOf(c), "path");
      await requireDir(ops, sandbox, path);
      const watcher: Watcher = {
        sandboxId: sandbox.id,
        path,
        recursive: body.recursive ?? false,
        deliver: (event) => sink.send({ filesystem: event }),
      };
      sink.send({ start: {} });
      core.watchers.add(watcher);
      const keepaliveMs = keepaliveOf(c);
      const timer = keepaliveMs
        ? setInterval(() => sink.send({ keepalive: {} }), keepaliveMs)
        : undefined;
      try {
        await aborted(sink.signal);
      } finally {
        core.watchers.delete(watcher);
        if (timer !== undefined) clearInterval(timer);
      }
    },
  };

  const unaries: Record<
    string,
    (sandbox: SandboxRecord, message: Record<string, unknown>, c: Context) => Promise<unknown>
  > = {
    "process.Process/List": (sandbox) => {
      const processes = [...ops.commands({ id: sandbox.id })].map(([pid, { request }]) => {
        const tag = hubs.get(hubKey(sandbox.id, pid))?.tag;
        return {
          config: {
            cmd: request.cmd[0] ?? "",
            args: request.cmd.slice(1),
            envs: request.env ?? {},
            ...(request.cwd ? { cwd: request.cwd } : {}),
          },
          pid,
          ...(tag ? { tag } : {}),
        };
      });
      return Promise.resolve({ processes });
    },
    "process.Process/SendInput": async (sandbox, message) => {
      const body = parse(sendInputSchema, message);
      const handle = runningHandle(sandbox, body.process);
      if (body.input.stdin === undefined) {
        throw new ConnectError(
          "unimplemented",
          "Only 'input.stdin' is supported: this node has no pty sessions",
        );
      }
      await handle.writeStdin(new Uint8Array(Buffer.from(body.input.stdin, "base64")));
      return {};
    },
    "process.Process/SendSignal": async (sandbox, message) => {
      const body = parse(sendSignalSchema, message);
      const handle = runningHandle(sandbox, body.process);
      await handle.kill(signalOf(body.signal));
      return {};
    },
    "process.Process/CloseStdin": async (sandbox, message) => {
      const body = parse(selectorRequestSchema, message);
      await runningHandle(sandbox, body.process).closeStdin();
      return {};
    },
    "filesystem.Filesystem/Stat": async (sandbox, message, c) => {
      const body = parse(pathSchema, message);
      const entry = await ops.stat({ id: sandbox.id }, resolvePath(body.path, userOf(c), "path"));
      return { entry: entryJson(entry) };
    },
    "filesystem.Filesystem/ListDir": async (sandbox, message, c) => {
      const body = parse(listDirSchema, message);
      const path = resolvePath(body.path, userOf(c), "path");
      const entries = await ops.listDir({ id: sandbox.id }, path, body.depth || 1);
      return { entries: entries.map(entryJson) };
    },
    "filesystem.Filesystem/MakeDir": async (sandbox, message, c) => {
      const body = parse(pathSchema, message);
      const path = resolvePath(body.path, userOf(c), "path");
      const made = await ops.makeDir({ id: sandbox.id }, path);
      if (!made) {
        throw new ConnectError("already_exists", `Directory '${path}' already exists`);
      }
      publish(core, sandbox.id, path, "EVENT_TYPE_CREATE");
      return { entry: entryJson(await ops.stat({ id: sandbox.id }, path)) };
    },
    "filesystem.Filesystem/Move": async (sandbox, message, c) => {
      const body = parse(moveSchema, message);
      const user = userOf(c);
      const from = resolvePath(body.source, user, "source");
      const to = resolvePath(body.destination, user, "destination");
      const entry = await ops.move({ id: sandbox.id }, from, to);
      publish(core, sandbox.id, from, "EVENT_TYPE_RENAME");
      publish(core, sandbox.id, to, "EVENT_TYPE_CREATE");
      return { entry: entryJson(entry) };
    },
    "filesystem.Filesystem/Remove": async (sandbox, message, c) => {
      const body = parse(pathSchema, message);
      const path = resolvePath(body.path, userOf(c), "path");
      await ops.remove({ id: sandbox.id }, path);
      publish(core, sandbox.id, path, "EVENT_TYPE_REMOVE");
      return {};
    },
    "filesystem.Filesystem/CreateWatcher": async (sandbox, message, c) => {
      const body = parse(watchSchema, message);
      const path = resolvePath(body.path, userOf(c), "path");
      await requireDir(ops, sandbox, path);
      const watcherId = crypto.randomUUID();
      const events: FsEvent[] = [];
      const watcher: Watcher = {
        sandboxId: sandbox.id,
        path,
        recursive: body.recursive ?? false,
        // Bounded so a watcher nobody polls cannot grow without limit.
        deliver: (event) => {
          if (events.length < 10_000) events.push(event);
        },
      };
      core.watchers.add(watcher);
      polled.set(watcherId, { sandboxId: sandbox.id, events, watcher });
      return { watcherId };
    },
    "filesystem.Filesystem/GetWatcherEvents": (sandbox, message) => {
      const body = parse(watcherIdSchema, message);
      const entry = polled.get(body.watcherId);
      if (!entry || entry.sandboxId !== sandbox.id) {
        throw new ConnectError("not_found", `No watcher '${body.watcherId}': create one first`);
      }
      return Promise.resolve({ events: entry.events.splice(0) });
    },
    "filesystem.Filesystem/RemoveWatcher": (sandbox, message) => {
      const body = parse(watcherIdSchema, message);
      const entry = polled.get(body.watcherId);
      if (!entry || entry.sandboxId !== sandbox.id) {
        throw new ConnectError("not_found", `No watcher '${body.watcherId}': create one first`);
      }
      core.watchers.delete(entry.watcher);
      polled.delete(body.watcherId);
      return Promise.resolve({});
    },
  };

  const runningHandle = (sandbox: SandboxRecord, selector: Selector): ExecHandle => {
    const running = ops.commands({ id: sandbox.id });
    let pid: number | undefined;
    if ("pid" in selector) pid = selector.pid;
    else {
      for (const hub of hubs.values()) if (hub.tag === selector.tag) pid = hub.pid;
    }
    const entry = pid === undefined ? undefined : running.get(pid);
    if (!entry) {
      throw new ConnectError(
        "not_found",
        `No running process ${
          describeSelector(selector)
        } in sandbox '${sandbox.id}': list them with Process/List`,
      );
    }
    return entry.handle;
  };

  app.post("/:service/:method", async (c) => {
    const route = `${c.req.param("service")}/${c.req.param("method")}`;
    const contentType = (c.req.header("content-type") ?? "").split(";")[0].trim().toLowerCase();
    const stream = Object.hasOwn(streams, route) ? streams[route] : undefined;
    const unary = Object.hasOwn(unaries, route) ? unaries[route] : undefined;
    if (!stream && !unary) {
      return connectErrorResponse(
        "unimplemented",
        `This node does not implement ${route}: see E2B-WIRE.md for the supported RPCs`,
      );
    }
    if (stream && contentType !== CONNECT_STREAM_JSON) {
      return unsupportedMedia(route, CONNECT_STREAM_JSON);
    }
    if (unary && contentType !== "application/json") {
      return unsupportedMedia(route, "application/json");
    }
    return await guard(core, c, "connect", async (sandbox) => {
      if (stream) {
        const message = await readStreamRequest(c.req.raw);
        // Not the request's signal: Deno.serve aborts it on success too (legacy behaviour)
        // and warns; a client that hangs up cancels the body, which ends the sink.
        return streamResponse((sink) => stream(sandbox, message, sink, c), {
          toError: (error) => toConnect(core, error),
        });
      }
      const message = await readUnaryRequest(c.req.raw);
      return c.json(await unary!(sandbox, message, c));
    });
  });

  // A catch-all route rather than notFound(): a mounted sub-app's notFound is not used.
  app.all(
    "*",
    (c) => restError(404, `No envd route ${c.req.method} ${new URL(c.req.url).pathname}`),
  );
  app.onError((error) => restError(500, errorMessage(error)));
  return app;
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
      return operation === "read"
        ? await readFileResponse(core, sandbox, url)
        : await writeFilesResponse(core, sandbox, url, c.req.raw);
    } catch (error) {
      return restErrorOf(core, error);
    }
  };
  app.get("/files", (c) => serve(c, "read"));
  app.post("/files", (c) => serve(c, "write"));
  return app;
}

// --- shared pieces ---------------------------------------------------------------------------

function makeCore(ops: SandboxOps, options: EnvdOptions): EnvdCore {
  return {
    ops,
    options: {
      accessTokens: options.accessTokens,
      log: options.log ?? silentLog,
      clock: options.clock ?? systemClock,
      maxUploadBytes: options.maxUploadBytes ?? 1024 ** 3,
    },
    watchers: new Set(),
  };
}

/** Picks the sandbox, checks its token, runs `fn`, and answers errors in `dialect`. */
async function guard(
  core: EnvdCore,
  c: Context,
  dialect: Dialect,
  fn: (sandbox: SandboxRecord) => Promise<Response>,
): Promise<Response> {
  try {
    const id = c.req.header(SANDBOX_HEADER);
    if (!id) {
      throw new ConnectError(
        "invalid_argument",
        `The ${SANDBOX_HEADER} header is missing: name the sandbox the request is for`,
      );
    }
    const sandbox = core.ops.get({ id });
    if (!sandbox) {
      throw new ConnectError(
        "unavailable",
        `No sandbox '${id}' on this node: it may have been killed`,
      );
    }
    const tokens = core.options.accessTokens;
    if (tokens && !tokens.verify(sandbox.id, c.req.header("X-Access-Token"))) {
      // A signed URL reaching envd through the gateway (with the sandbox header) also counts.
      const url = new URL(c.req.url);
      const signed = dialect === "rest" && url.searchParams.has("signature")
        ? parseSignedFileUrl(url, c.req.method === "GET" ? "read" : "write")
        : undefined;
      const ok = signed?.ok && !isExpired(signed.value, core.options.clock.now()) &&
        signatureMatches(signed.value, tokens.forSandbox(sandbox.id));
      if (!ok) {
        throw new ConnectError(
          "unauthenticated",
          c.req.header("X-Access-Token")
            ? `The X-Access-Token does not belong to sandbox '${sandbox.id}': use the envdAccessToken that create or connect returned`
            : `Sandbox '${sandbox.id}' needs the X-Access-Token header: send the envdAccessToken that create or connect returned`,
        );
      }
    }
    return await fn(sandbox);
  } catch (error) {
    if (dialect === "connect") {
      const { code, message } = toConnect(core, error);
      return connectErrorResponse(code, message);
    }
    return restErrorOf(core, error);
  }
}

async function readFileResponse(
  core: EnvdCore,
  sandbox: SandboxRecord,
  url: URL,
): Promise<Response> {
  const user = url.searchParams.get("username") || DEFAULT_USER;
  const path = resolvePath(url.searchParams.get("path") ?? "", user, "path");
  const data = await core.ops.readFile({ id: sandbox.id }, path);
  return new Response(data as Uint8Array<ArrayBuffer>, {
    status: 200,
    headers: {
      "content-type": "application/octet-stream",
      "content-length": String(data.length),
      "content-disposition": `attachment; filename="${encodeURIComponent(posix.basename(path))}"`,
    },
  });
}

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
    const entry = await core.ops.writeFile({ id: sandbox.id }, file.path, file.data);
    publish(core, sandbox.id, entry.path, "EVENT_TYPE_WRITE");
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

function tooLarge(limit: number): HttpError {
  return new HttpError(
    413,
    `The upload is over this node's limit of ${limit} bytes: send smaller files`,
  );
}

function publish(core: EnvdCore, sandboxId: string, path: string, type: FsEvent["type"]): void {
  for (const w of core.watchers) {
    if (w.sandboxId !== sandboxId) continue;
    const parent = posix.dirname(path);
    const inside = parent === w.path ||
      (w.recursive && path.startsWith(w.path === "/" ? "/" : w.path + "/"));
    if (inside) w.deliver({ name: posix.relative(w.path, path), type });
  }
}

async function requireDir(ops: SandboxOps, sandbox: SandboxRecord, path: string): Promise<void> {
  const entry = await ops.stat({ id: sandbox.id }, path);
  if (entry.type !== "dir") {
    throw new ConnectError("invalid_argument", `'${path}' is not a directory: watch a directory`);
  }
}

/** The run-as user: `Authorization: Basic base64("<user>:")`, or E2B's default user. */
function userOf(c: Context): string {
  const header = c.req.header("authorization");
  if (!header) return DEFAULT_USER;
  const m = /^Basic\s+(\S+)$/i.exec(header.trim());
  if (!m) return DEFAULT_USER;
  let decoded: string;
  try {
    decoded = atob(m[1]);
  } catch {
    throw new ConnectError("unauthenticated", "The Authorization header is not valid base64");
  }
  const user = decoded.split(":")[0];
  if (!user) return DEFAULT_USER;
  if (!/^[A-Za-z_][A-Za-z0-9_.-]{0,31}$/.test(user)) {
    throw new ConnectError("unauthenticated", `'${user.slice(0, 40)}' is not a valid user name`);
  }
  return user;
}

function keepaliveOf(c: Context): number | undefined {
  const raw = Number(c.req.header(KEEPALIVE_HEADER));
  // A floor of one second keeps a silly header from flooding the stream.
  return Number.isFinite(raw) && raw > 0 ? Math.max(raw, 1) * 1000 : undefined;
}

/**
 * Resolves a path as envd does: `~` and relative paths start at the user's home.
 *
 * @throws {ConnectError} `invalid_argument` naming `field` when the path is empty.
 * @example
 * ```ts
 * import { resolvePath } from "./envd.ts";
 * resolvePath("notes.txt", "user", "path"); // "/home/user/notes.txt"
 * ```
 */
export function resolvePath(path: string, user: string, field: string): string {
  if (!path) throw new ConnectError("invalid_argument", `'${field}' is required`);
  if (path.includes("\0")) throw new ConnectError("invalid_argument", `'${field}' contains NUL`);
  const home = user === "root" ? "/root" : `/home/${user}`;
  let abs = path;
  if (path === "~") abs = home;
  else if (path.startsWith("~/")) abs = home + path.slice(1);
  else if (!path.startsWith("/")) abs = `${home}/${path}`;
  const normal = posix.normalize(abs);
  return normal.length > 1 && normal.endsWith("/") ? normal.slice(0, -1) : normal;
}

function endEvent(exit: { exitCode: number; signal?: string }) {
  if (exit.signal) {
    // envd reports what Go's ProcessState says for a signalled process: code -1.
    const names: Record<string, string> = {
      SIGKILL: "killed",
      SIGTERM: "terminated",
      SIGINT: "interrupt",
      SIGHUP: "hangup",
    };
    return {
      exitCode: -1,
      exited: false,
      status: `signal: ${names[exit.signal] ?? exit.signal.toLowerCase()}`,
    };
  }
  return { exitCode: exit.exitCode, exited: true, status: `exit status ${exit.exitCode}` };
}

function entryJson(e: FileEntry) {
  const type = e.type === "dir"
    ? "FILE_TYPE_DIRECTORY"
    : e.type === "symlink"
    ? "FILE_TYPE_SYMLINK"
    : "FILE_TYPE_FILE";
  return {
    name: e.name,
    type,
    path: e.path,
    size: String(e.size),
    mode: e.mode & 0o7777,
    permissions: permissionString(e),
    owner: e.owner,
    group: e.group,
    modifiedTime: new Date(e.modifiedAt).toISOString(),
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: e.symlinkTarget } : {}),
  };
}

function permissionString(e: FileEntry): string {
  const kind = e.type === "dir" ? "d" : e.type === "symlink" ? "L" : "-";
  const bits = "rwxrwxrwx";
  let out = kind;
  for (let i = 0; i < 9; i++) out += e.mode & (1 << (8 - i)) ? bits[i] : "-";
  return out;
}

type Selector = { pid: number } | { tag: string };

function describeSelector(selector: Selector): string {
  return "pid" in selector ? `with pid ${selector.pid}` : `tagged '${selector.tag}'`;
}

function signalOf(signal: string | number): "SIGKILL" | "SIGTERM" {
  if (signal === "SIGNAL_SIGKILL" || signal === 9) return "SIGKILL";
  if (signal === "SIGNAL_SIGTERM" || signal === 15) return "SIGTERM";
  throw new ConnectError(
    "invalid_argument",
    `'signal' must be SIGNAL_SIGKILL or SIGNAL_SIGTERM: received ${JSON.stringify(signal)}`,
  );
}

function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  );
}

function unsupportedMedia(route: string, wanted: string): Response {
  return new Response(
    JSON.stringify({
      code: "invalid_argument" satisfies ConnectCode,
      message: `${route} takes Content-Type ${wanted} (the Connect JSON codec)`,
    }),
    {
      status: 415,
      headers: { "content-type": "application/json", "accept-post": wanted },
    },
  );
}

// --- request schemas -------------------------------------------------------------------------

const selectorSchema = z.union([
  z.object({ pid: z.number().int().nonnegative() }),
  z.object({ tag: z.string().min(1) }),
], { error: "needs 'pid' or 'tag'" });

const startSchema = z.object({
  process: z.object({
    cmd: z.string().min(1),
    args: z.array(z.string()).optional(),
    envs: z.record(z.string(), z.string()).optional(),
    cwd: z.string().optional(),
  }),
  pty: z.unknown().optional(),
  tag: z.string().optional(),
  stdin: z.boolean().optional(),
});

const selectorRequestSchema = z.object({ process: selectorSchema });

const sendInputSchema = z.object({
  process: selectorSchema,
  input: z.object({ stdin: z.string().optional(), pty: z.string().optional() }),
});

const sendSignalSchema = z.object({
  process: selectorSchema,
  signal: z.union([z.string(), z.number()]),
});

const pathSchema = z.object({ path: z.string() });
const listDirSchema = z.object({ path: z.string(), depth: z.number().int().min(0).optional() });
const moveSchema = z.object({ source: z.string(), destination: z.string() });
const watchSchema = z.object({
  path: z.string(),
  recursive: z.boolean().optional(),
  includeEntry: z.boolean().optional(),
  allowNetworkMounts: z.boolean().optional(),
});
const watcherIdSchema = z.object({ watcherId: z.string().min(1) });

function parse<T>(schema: z.ZodType<T>, message: unknown): T {
  const r = schema.safeParse(message);
  if (!r.success) throw new ConnectError("invalid_argument", describeZodError(r.error, "request"));
  return r.data;
}

// --- error dialects --------------------------------------------------------------------------

const restStatusOfCode: Partial<Record<ConnectCode, number>> = {
  invalid_argument: 400,
  unauthenticated: 401,
  not_found: 404,
  already_exists: 409,
  unavailable: 502,
  unimplemented: 501,
  deadline_exceeded: 504,
};

function toConnect(core: EnvdCore, thrown: unknown): { code: ConnectCode; message: string } {
  const error = executorErrorToHttp(thrown);
  if (error instanceof ConnectError) return { code: error.code, message: error.message };
  if (error instanceof HttpError) {
    return { code: statusToConnectCode(error.status), message: error.message };
  }
  core.options.log("error", "envd request failed", { error });
  return { code: "internal", message: `Internal error: ${errorMessage(error)}` };
}

function restErrorOf(core: EnvdCore, thrown: unknown): Response {
  const error = executorErrorToHttp(thrown);
  if (error instanceof ConnectError) {
    return restError(restStatusOfCode[error.code] ?? 500, error.message);
  }
  if (error instanceof HttpError) return restError(error.status, error.message, error.headers);
  core.options.log("error", "envd request failed", { error });
  return restError(500, `Internal error: ${errorMessage(error)}`);
}

function restError(status: number, message: string, headers: Record<string, string> = {}) {
  return Response.json({ code: status, message }, { status, headers });
}

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
