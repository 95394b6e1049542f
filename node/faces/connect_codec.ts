/**
 * The Connect protocol's JSON codec, as envd speaks it: envelopes for server streams, the
 * end-stream message, and Connect error codes with their HTTP statuses.
 *
 * @module
 */
import {
  type ConnectCode,
  connectCodeToStatus,
  statusToConnectCode,
} from "../../shared/connect_codes.ts";
import { HttpError } from "../../shared/http_error.ts";
import {
  type BodyCapOptions,
  readBodyBytes,
  readFlatJsonObject,
  readJsonObject,
} from "../../shared/json_body.ts";
import { StreamCut } from "../../shared/stream_cut.ts";
import { systemTimers, type Timers } from "../../shared/clock.ts";

export { StreamCut } from "../../shared/stream_cut.ts";

/** Envelope flag: the message is compressed (we never compress and refuse compressed input). */
export const FLAG_COMPRESSED = 0x01;
/** Envelope flag: this is the end-stream message that closes a server stream. */
export const FLAG_END_STREAM = 0x02;

/** Content type of a Connect server stream with the JSON codec. */
export const CONNECT_STREAM_JSON = "application/connect+json";

export {
  type ConnectCode,
  connectCodeToStatus,
  statusToConnectCode,
} from "../../shared/connect_codes.ts";

/**
 * An error to send in the Connect dialect: `{code:"not_found", message}`.
 *
 * @example
 * ```ts
 * import { ConnectError } from "./connect_codec.ts";
 * const error = new ConnectError("not_found", "No process with pid 7: list them with Process/List");
 * console.log(error.code); // "not_found"
 * ```
 */
export class ConnectError extends Error {
  /** The Connect code; the HTTP status of a unary answer follows from it. */
  readonly code: ConnectCode;
  /** Builds the error with a sentence saying what is wrong and what to do. */
  constructor(code: ConnectCode, message: string) {
    super(message);
    this.name = "ConnectError";
    this.code = code;
  }
}

/**
 * A unary Connect error answer: the code's HTTP status and a JSON `{code, message}` body.
 *
 * @example
 * ```ts
 * import { connectErrorResponse } from "./connect_codec.ts";
 * const res = connectErrorResponse("unauthenticated", "X-Access-Token is missing");
 * res.status; // 401
 * ```
 */
export function connectErrorResponse(code: ConnectCode, message: string): Response {
  return new Response(JSON.stringify({ code, message }), {
    status: connectCodeToStatus(code),
    headers: { "content-type": "application/json" },
  });
}

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/**
 * Encodes one envelope: `[flags:u8][length:u32 big-endian][json]`.
 *
 * @example
 * ```ts
 * import { encodeEnvelope } from "./connect_codec.ts";
 * encodeEnvelope(0, { event: { start: { pid: 1 } } });
 * ```
 */
export function encodeEnvelope(flags: number, message: unknown): Uint8Array<ArrayBuffer> {
  const body = encoder.encode(JSON.stringify(message));
  const out = new Uint8Array(5 + body.length);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, body.length, false);
  out.set(body, 5);
  return out;
}

/**
 * The end-stream envelope: flags `0x02` and `{}`, or `{"error":{code,message}}`.
 *
 * @example
 * ```ts
 * import { encodeEndStream } from "./connect_codec.ts";
 * encodeEndStream(); // closes a stream that went well
 * ```
 */
export function encodeEndStream(
  error?: { code: ConnectCode; message: string },
): Uint8Array<ArrayBuffer> {
  return encodeEnvelope(FLAG_END_STREAM, error ? { error } : {});
}

/** One decoded envelope. */
export interface Envelope {
  /** The flags byte. */
  flags: number;
  /** The parsed JSON message. */
  message: unknown;
}

/**
 * Decodes every envelope in `bytes`.
 *
 * @throws {ConnectError} `invalid_argument` when the bytes are truncated, compressed or not JSON.
 * @example
 * ```ts
 * import { decodeEnvelopes, encodeEnvelope } from "./connect_codec.ts";
 * decodeEnvelopes(encodeEnvelope(0, { path: "/" })); // [{ flags: 0, message: { path: "/" } }]
 * ```
 */
export function decodeEnvelopes(bytes: Uint8Array): Envelope[] {
  const out: Envelope[] = [];
  let at = 0;
  while (at < bytes.length) {
    if (bytes.length - at < 5) {
      throw new ConnectError(
        "invalid_argument",
        `The request ends inside an envelope header (${
          bytes.length - at
        } of 5 bytes): send whole envelopes`,
      );
    }
    const flags = bytes[at];
    const length = new DataView(bytes.buffer, bytes.byteOffset + at + 1, 4).getUint32(0, false);
    if (bytes.length - at - 5 < length) {
      throw new ConnectError(
        "invalid_argument",
        `The request's envelope announces ${length} bytes but only ${
          bytes.length - at - 5
        } arrived: send whole envelopes`,
      );
    }
    if (flags & FLAG_COMPRESSED) {
      throw new ConnectError(
        "unimplemented",
        "Compressed envelopes are not supported: send the request uncompressed (identity)",
      );
    }
    const body = bytes.subarray(at + 5, at + 5 + length);
    let message: unknown;
    try {
      message = length === 0 ? {} : JSON.parse(decoder.decode(body));
    } catch {
      throw new ConnectError(
        "invalid_argument",
        "The request envelope is not JSON: use the JSON codec",
      );
    }
    out.push({ flags, message });
    at += 5 + length;
  }
  return out;
}

/**
 * Reads the single request message of a server-streaming call, at most `cap.maxBytes` of it
 * (the shared JSON cap, 32 MiB by default): a stream's request is one small JSON message, and a
 * body read whole without a cap let a 1.2 GB upload sit in the node's memory.
 *
 * @throws {ConnectError} `invalid_argument` when the body is not exactly one JSON envelope or
 * is over the cap, `canceled` when the client hung up while it was read.
 * @example
 * ```ts
 * import { encodeEnvelope, readStreamRequest } from "./connect_codec.ts";
 * const body = encodeEnvelope(0, { path: "/home/user" });
 * await readStreamRequest(new Request("http://x/", { method: "POST", body })); // { path: "/home/user" }
 * ```
 */
export async function readStreamRequest(
  request: Request,
  cap: BodyCapOptions = {},
): Promise<unknown> {
  const bytes = await connectRefusals(() => readBodyBytes(request, cap));
  const envelopes = decodeEnvelopes(bytes).filter((e) => !(e.flags & FLAG_END_STREAM));
  if (envelopes.length !== 1) {
    throw new ConnectError(
      "invalid_argument",
      `A server-streaming call takes exactly one request message, got ${envelopes.length}`,
    );
  }
  return envelopes[0].message;
}

/**
 * Reads the JSON message of a unary call (an empty body is `{}`) with the shared JSON body
 * reader, so a unary body has the same byte cap as every other face's; its refusals become
 * Connect errors with the code of their status.
 *
 * @throws {ConnectError} `invalid_argument` when the body is not a JSON object or is over the
 * cap, `canceled` when the client hung up while it was read.
 * @example
 * ```ts
 * import { readUnaryRequest } from "./connect_codec.ts";
 * await readUnaryRequest(new Request("http://x/", { method: "POST", body: '{"path":"/"}' }));
 * ```
 */
export async function readUnaryRequest(
  request: Request,
  cap: BodyCapOptions & { flat?: boolean } = {},
): Promise<Record<string, unknown>> {
  const options = { ...cap, example: `{"path":"/home/user"}` };
  return await connectRefusals(async () =>
    (cap.flat ? await readFlatJsonObject(request, options) : await readJsonObject(request, options))
      .value
  );
}

/** Runs a body read, turning the shared reader's `HttpError`s into Connect errors. */
async function connectRefusals<T>(read: () => Promise<T>): Promise<T> {
  try {
    return await read();
  } catch (error) {
    if (error instanceof HttpError) {
      throw new ConnectError(statusToConnectCode(error.status), error.message);
    }
    throw error;
  }
}

/** What a streaming handler gets to send messages with. */
export interface StreamSink {
  /** Sends one message; resolves once it is queued. */
  send(message: unknown): void;
  /** Aborted when the client hung up or the stream ended. */
  readonly signal: AbortSignal;
}

/** Options of {@linkcode streamResponse}. */
export interface StreamResponseOptions {
  /** Also ends the stream (e.g. a request signal); the body being cancelled always does. */
  signal?: AbortSignal;
  /** Turns what `run` threw into the end-stream error (default: `ConnectError` or `internal`). */
  toError?: (error: unknown) => { code: ConnectCode; message: string };
  /**
   * Bytes that may wait for a slow client before the stream is ended with `resource_exhausted`
   * (default 16 MiB): a chatty command must not grow the node's memory without bound.
   */
  maxBufferedBytes?: number;
  /**
   * The call's deadline in ms from now (Connect's `Connect-Timeout-Ms`): once it passes the
   * stream ends with `deadline_exceeded` and `signal` aborts, whatever `run` is doing.
   */
  deadlineMs?: number;
  /** The timers the deadline runs on (default the real ones; a test passes a `FakeClock`). */
  timers?: Timers;
}

/**
 * Answers a server-streaming call: 200 `application/connect+json`, every message `run` sends as
 * an envelope as soon as it is sent, then the end-stream envelope (`{}` when `run` resolves,
 * `{"error":…}` when it throws, a dropped connection when it throws `StreamCut`). When
 * the client hangs up (Deno.serve cancels the body, measured even on an idle stream), or the
 * deadline passes, the sink's `signal` aborts so `run` can stop reading its sources.
 *
 * @example
 * ```ts
 * import { streamResponse } from "./connect_codec.ts";
 * const res = streamResponse(async (sink) => {
 *   sink.send({ event: { start: {} } });
 * });
 * await res.body?.cancel();
 * ```
 */
export function streamResponse(
  run: (sink: StreamSink) => Promise<void>,
  {
    signal: outer,
    toError = defaultToError,
    maxBufferedBytes = 16 * 1024 * 1024,
    deadlineMs,
    timers = systemTimers,
  }: StreamResponseOptions = {},
): Response {
  const highWaterMark = 64 * 1024;
  const done = new AbortController();
  const signal = outer ? AbortSignal.any([outer, done.signal]) : done.signal;
  let controller!: ReadableStreamDefaultController<Uint8Array>;
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    done.abort();
    try {
      controller.close();
    } catch { /* the consumer already cancelled */ }
  };
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      controller = c;
    },
    cancel() {
      closed = true;
      done.abort();
    },
  }, { highWaterMark, size: (chunk) => chunk.byteLength });
  const sink: StreamSink = {
    send(message) {
      if (closed) return;
      controller.enqueue(encodeEnvelope(0, message));
      // Bytes queued and not yet read by the client = highWaterMark - desiredSize.
      if (highWaterMark - (controller.desiredSize ?? 0) > maxBufferedBytes) {
        controller.enqueue(encodeEndStream({
          code: "resource_exhausted",
          message:
            `The client fell more than ${maxBufferedBytes} bytes behind the stream: read it faster or reconnect`,
        }));
        close();
      }
    },
    signal,
  };
  const deadline = deadlineMs === undefined ? undefined : timers.setTimer(() => {
    if (closed) return;
    controller.enqueue(encodeEndStream({
      code: "deadline_exceeded",
      message: `The call ran past the ${deadlineMs} ms its client allowed (Connect-Timeout-Ms)`,
    }));
    close();
  }, deadlineMs);
  (async () => {
    try {
      await run(sink);
      if (!closed) controller.enqueue(encodeEndStream());
    } catch (error) {
      if (error instanceof StreamCut && !closed) {
        closed = true;
        done.abort();
        controller.error(error);
      } else if (!closed) controller.enqueue(encodeEndStream(toError(error)));
    } finally {
      timers.clearTimer(deadline);
      close();
    }
  })();
  return new Response(body, { status: 200, headers: { "content-type": CONNECT_STREAM_JSON } });
}

function defaultToError(error: unknown): { code: ConnectCode; message: string } {
  if (error instanceof ConnectError) return { code: error.code, message: error.message };
  return { code: "internal", message: error instanceof Error ? error.message : String(error) };
}
