/**
 * The back end of `serveGuarded`'s `deno` engine with `upgrades`: `Deno.serveHttp`, the one
 * per-connection server of Deno's that keeps an upgraded socket open ({@linkcode serveHttpBackend}),
 * and what it needs beyond Deno's per-connection server (the `deno` engine without upgrades): its
 * types (gone from Deno's own), the request body that is read to its end before an early answer,
 * the switch that keeps it from compressing answers, and the hang-up it never tells an answer of.
 *
 * @module
 */
import { StreamCut } from "../stream_cut.ts";
import type { Backend } from "./_guard.ts";
import type { Handler, OnError } from "./_backends.ts";

/** One request as `Deno.serveHttp` yields it. */
export interface RequestEvent {
  readonly request: Request;
  respondWith(response: Response | Promise<Response>): Promise<void>;
}

/** What `Deno.serveHttp` returns for a connection: its requests, one after another. */
export interface HttpConn extends AsyncIterable<RequestEvent> {
  close(): void;
}

/**
 * `Deno.serveHttp`: gone from Deno's types but still in the pinned runtime, and the one
 * per-connection server that keeps an upgraded socket open.
 */
export function serveHttpLegacy(): ((conn: Deno.Conn) => HttpConn) | undefined {
  // deno-lint-ignore no-explicit-any
  const fn = (Deno as any).serveHttp;
  return typeof fn === "function" ? fn : undefined;
}

/**
 * Longest time spent reading and dropping a body before an early answer: 10 s, which covers any
 * body a client sends at loopback or LAN speed (a 128 MiB refused body is read in well under a
 * second). Past it the connection is given up. Bytes are not bounded: one buffer is reused.
 */
const DRAIN_MAX_MS = 10_000;
/** The size of one read of a request body (what Deno's own reads hand over at most). */
const CHUNK_BYTES = 64 * 1024;

/**
 * A request body the handler reads through `stream`. Deno.serveHttp stops reading a request's
 * body the moment its answer is handed over and then closes a connection with bytes still
 * unread, which resets it: the client sees a failed fetch (broken pipe) instead of, say, a 413
 * for a cap. So when the handler answers before the body's end, the rest is read and dropped
 * first, within a bound; the handler's cancel is not passed on, for the same reason.
 */
export class DrainableBody {
  readonly stream: ReadableStream<Uint8Array>;
  readonly #reader: ReadableStreamBYOBReader;
  #done = false;
  #reading: Promise<unknown> = Promise.resolve();

  constructor(source: ReadableStream<Uint8Array>) {
    // BYOB, so the drain can read into one buffer instead of leaving megabytes to the GC.
    this.#reader = source.getReader({ mode: "byob" });
    this.stream = new ReadableStream<Uint8Array>({
      pull: async (controller) => {
        const read = this.#reader.read(new Uint8Array(CHUNK_BYTES));
        this.#reading = read;
        const { value, done } = await read;
        if (done || value === undefined) {
          this.#done = true;
          controller.close();
        } else controller.enqueue(value);
      },
      cancel: () => {},
    }, { highWaterMark: 0 });
  }

  /** Whether some of the body is still unread. */
  get unfinished(): boolean {
    return !this.#done;
  }

  /** Reads what is left, for at most DRAIN_MAX_MS. */
  async drain(): Promise<void> {
    const deadline = Date.now() + DRAIN_MAX_MS;
    let buffer = new Uint8Array(CHUNK_BYTES);
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<"late">((r) => timer = setTimeout(() => r("late"), DRAIN_MAX_MS));
    try {
      await Promise.race([this.#reading.catch(() => {}), late]);
      while (Date.now() < deadline && !this.#done) {
        const next = await Promise.race([this.#reader.read(buffer), late]);
        if (next === "late") break;
        if (next.done || next.value === undefined) this.#done = true;
        else buffer = new Uint8Array(next.value.buffer);
      }
    } catch {
      // The client left: nothing left to read.
    } finally {
      clearTimeout(timer);
    }
  }
}

/** Whether Deno.serveHttp would compress an answer to `request` (it offers gzip or br). */
export function acceptsCompression(request: Request): boolean {
  return /\b(gzip|br)\b/i.test(request.headers.get("accept-encoding") ?? "");
}

/**
 * `response`, marked so that Deno.serveHttp sends it as it is. That server compresses a
 * compressible answer unasked; a proxy must not (a node's answer would reach the gateway's
 * fetch compressed, be unpacked there and leave with the `content-encoding` of the packed
 * bytes), and Deno's per-connection server never does. `Cache-Control: no-transform` is the one switch it
 * honours that does not change the body, and it tells other proxies the same.
 */
export function uncompressed(response: Response): Response {
  if (response.status === 101 || response.headers.has("content-encoding")) return response;
  if (!response.headers.has("content-type")) return response;
  const cacheControl = response.headers.get("cache-control");
  if (cacheControl !== null && /\bno-transform\b/i.test(cacheControl)) return response;
  const value = cacheControl === null ? "no-transform" : `${cacheControl}, no-transform`;
  try {
    response.headers.set("cache-control", value);
    return response;
  } catch {
    // A fetched answer's headers are immutable: the same body under a copy of them.
    const headers = new Headers(response.headers);
    headers.set("cache-control", value);
    return new Response(response.body, {
      status: response.status,
      statusText: response.statusText,
      headers,
    });
  }
}

/**
 * `Deno.serveHttp` as a back end (`serveLegacy`). Once a request upgrades, its loop ends and the
 * socket belongs to the handler's WebSocket, outside the guard's count.
 */
export function serveHttpBackend(
  serveLegacy: (conn: Deno.Conn) => HttpConn,
  handler: Handler,
  onError: OnError,
): Backend {
  return async (conn, c, answered) => {
    const http = serveLegacy(conn);
    c.stop.signal.addEventListener("abort", () => {
      try {
        http.close();
      } catch {
        // Closed already (the client left, or the connection upgraded).
      }
    }, { once: true });
    const remoteAddr = conn.remoteAddr as Deno.NetAddr;
    /** The requests of this connection whose answer is not sent: their hang-up signals. */
    const unanswered = new Set<AbortController>();
    try {
      for await (const event of http) {
        c.inFlight++;
        const hangUp = new AbortController();
        unanswered.add(hangUp);
        void answer(handler, onError, event, remoteAddr, hangUp, () => unanswered.delete(hangUp))
          .finally(() => {
            unanswered.delete(hangUp);
            answered(c);
          });
      }
    } finally {
      // This server ends a connection's request loop as soon as the client hangs up, even with
      // an answer still being made (measured), but never tells that answer's request.signal: a
      // proxy would wait for its upstream's head for nothing. So the loop's end is the signal.
      for (const hangUp of unanswered) {
        hangUp.abort(new Deno.errors.ConnectionReset("the client hung up"));
      }
    }
  };
}

/**
 * Answers one request `event` of a `Deno.serveHttp` connection: its request gets the hang-up
 * signal too, and its body is drained before an early answer; `upgraded` is told of a 101.
 */
async function answer(
  handler: Handler,
  onError: OnError,
  event: RequestEvent,
  remoteAddr: Deno.NetAddr,
  hangUp: AbortController,
  upgraded: () => void,
): Promise<void> {
  let sent!: () => void;
  let failed!: (error: unknown) => void;
  const completed = new Promise<void>((resolve, reject) => {
    sent = resolve;
    failed = reject;
  });
  completed.catch(() => {});
  const compressible = acceptsCompression(event.request);
  const body = event.request.body === null ? null : new DrainableBody(event.request.body);
  // The server's own signal (it aborts once the answer is done) or the hang-up, first of both.
  const signal = AbortSignal.any([event.request.signal, hangUp.signal]);
  const request = new Request(
    event.request,
    (body === null ? { signal } : { body: body.stream, duplex: "half", signal }) as RequestInit,
  );
  let response: Response;
  try {
    response = await handler(request, { remoteAddr, completed });
  } catch (error) {
    response = await onError(error);
  }
  // An upgraded connection's loop ends with the handshake: that is no hang-up.
  if (response.status === 101) upgraded();
  if (compressible) response = uncompressed(response);
  if (body?.unfinished) await body.drain();
  try {
    await event.respondWith(response);
    sent();
  } catch (error) {
    failed(error);
    // A client that left is no error of ours; a body that failed on purpose or by a bug is.
    if (!(error instanceof Deno.errors.Http || error instanceof Deno.errors.BadResource)) {
      await onError(error);
    } else if ((error as Error).cause instanceof StreamCut) await onError((error as Error).cause);
  }
}
