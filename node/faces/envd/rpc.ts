/**
 * The Connect router of envd: `POST /<service>/<method>` finds the RPC by its service and
 * method, checks the content type (the JSON codec: `application/json` for a unary call,
 * `application/connect+json` for a server stream), reads the message, and answers in the
 * Connect dialect. The services (`process.Process`, `filesystem.Filesystem`) are plain tables
 * of RPCs, so a reader finds an RPC by its name.
 *
 * @module
 */
import type { Hono } from "hono";
import type { SandboxRecord } from "../../service_contract.ts";
import {
  CONNECT_STREAM_JSON,
  connectErrorResponse,
  readStreamRequest,
  readUnaryRequest,
  streamResponse,
  type StreamSink,
} from "../connect_codec.ts";
import { type EnvdCore, jsonBodyCap } from "./core.ts";
import { toConnect, unsupportedMedia } from "./dialects.ts";
import { guard } from "./guard.ts";
import { deadlineOf, keepaliveOf, userOf } from "./request.ts";

/** One RPC call, once its sandbox was found and its access token checked. */
export interface RpcCall {
  /** The sandbox named by the `E2b-Sandbox-Id` header. */
  readonly sandbox: SandboxRecord;
  /** The request message, not yet checked against the RPC's schema. */
  readonly message: unknown;
  /**
   * The run-as user from `Authorization: Basic`. Read on demand: a bad header is an error only
   * for the RPCs that run as a user, and only after their message was checked.
   */
  user(): string;
  /** The keepalive interval the stream asked for, ms, or `undefined`. */
  keepaliveMs(): number | undefined;
  /**
   * The stream's deadline from `Connect-Timeout-Ms`, ms from its arrival, or `undefined` for
   * none. The router ends the stream with `deadline_exceeded` when it passes; `Start` also
   * kills its command then, as envd does. Always `undefined` on a unary call.
   */
  readonly deadlineMs: number | undefined;
}

/** A unary RPC: the answer is sent as the JSON body. */
export type UnaryRpc = (call: RpcCall) => Promise<unknown>;

/** A server-streaming RPC: it sends its messages to `sink` and resolves when the stream ends. */
export type StreamRpc = (call: RpcCall, sink: StreamSink) => Promise<void>;

/** One Connect service: its full name and its RPCs by method name. */
export interface EnvdService {
  /** The service's full name, e.g. `process.Process`. */
  readonly name: string;
  /** Its unary RPCs by method name, e.g. `List`. */
  readonly unary: Readonly<Record<string, UnaryRpc>>;
  /** Its server-streaming RPCs by method name, e.g. `Start`. */
  readonly stream: Readonly<Record<string, StreamRpc>>;
}

/**
 * Mounts `POST /:service/:method` for `services` on `app`. An unknown RPC is `unimplemented`,
 * a wrong content type a 415 naming the one to send.
 *
 * @example
 * ```ts ignore
 * mountRpcs(app, core, [processService(core), filesystemService(core)]);
 * ```
 */
export function mountRpcs(app: Hono, core: EnvdCore, services: readonly EnvdService[]): void {
  const byName = new Map(services.map((s) => [s.name, s]));
  app.post("/:service/:method", async (c) => {
    const service = byName.get(c.req.param("service"));
    const method = c.req.param("method");
    const route = `${c.req.param("service")}/${method}`;
    const contentType = (c.req.header("content-type") ?? "").split(";")[0].trim().toLowerCase();
    const stream = service && Object.hasOwn(service.stream, method)
      ? service.stream[method]
      : undefined;
    const unary = service && Object.hasOwn(service.unary, method)
      ? service.unary[method]
      : undefined;
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
      const call = (message: unknown, deadlineMs?: number): RpcCall => ({
        sandbox,
        message,
        user: () => userOf(c),
        keepaliveMs: () => keepaliveOf(c),
        deadlineMs,
      });
      if (stream) {
        // Read before the body, so the deadline counts from the request's arrival.
        const deadlineMs = deadlineOf(c);
        const arrived = performance.now();
        const message = await readStreamRequest(c.req.raw, jsonBodyCap(core, route));
        const left = deadlineMs === undefined
          ? undefined
          : Math.max(0, Math.round(deadlineMs - (performance.now() - arrived)));
        // Not the request's signal: Deno.serve aborts it on success too (legacy behaviour)
        // and warns; a client that hangs up cancels the body, which ends the sink.
        return streamResponse((sink) => stream(call(message, left), sink), {
          toError: (error) => toConnect(core.options.log, error),
          deadlineMs: left,
        });
      }
      const message = await readUnaryRequest(c.req.raw, jsonBodyCap(core, route));
      return c.json(await unary!(call(message)));
    });
  });
}

/**
 * Resolves once the stream's client left (or the stream ended).
 *
 * @example
 * ```ts
 * import { untilAborted } from "./rpc.ts";
 * const client = new AbortController();
 * client.abort();
 * await untilAborted(client.signal);
 * ```
 */
export function untilAborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  );
}

/**
 * Sends `message` on `sink` every `intervalMs` (none when it is `undefined`); call the returned
 * function when the stream ends.
 *
 * @example
 * ```ts ignore
 * const stop = startKeepalive(sink, call.keepaliveMs(), { keepalive: {} });
 * try { await untilAborted(sink.signal); } finally { stop(); }
 * ```
 */
export function startKeepalive(
  sink: StreamSink,
  intervalMs: number | undefined,
  message: unknown,
): () => void {
  if (!intervalMs) return () => {};
  const timer = setInterval(() => sink.send(message), intervalMs);
  return () => clearInterval(timer);
}
