/**
 * The bytes engine: an HTTP/1.1 server for one connection, written on `Deno.Conn` (TCP or TLS),
 * that `serveGuarded` runs in place of Deno's own per-connection server (`engine: "bytes"`).
 *
 * Why it exists: every proxy built of the runtime's HTTP objects (Request, Headers, Response)
 * stayed at ≤ 0.86× nginx's throughput before any gateway logic, while one that framed requests
 * on their bytes reached 1.02× (bench/RESULTS.md, docs/forwarding-engine.md). So this engine reads
 * heads as bytes and lets a {@linkcode BytesLane} answer the requests it claims straight from
 * them; everything else is served as Deno's server serves it, as a `Request` to the handler and a
 * `Response` back.
 *
 * What it keeps, each held by a test (server_test.ts, server_refusals_test.ts and the guard
 * suite in serve_test.ts):
 * - strict heads (`_head.ts`): the smuggling shapes answered 400 and the connection closed, a
 *   head past `maxHeadBytes` a 431;
 * - bodies sized or chunked, streamed as the handler reads them, `Expect: 100-continue` answered
 *   when the handler first reads, and a body the handler left unread drained (within a bound)
 *   before the next request, so an early answer (a 413) reaches the client;
 * - answers sized when their length is known, chunked when streamed, the head written before the
 *   first body byte, nothing after the head for HEAD, 204 and 304;
 * - HTTP/1.0 and `Connection: close`; pipelined requests answered in order, one at a time;
 * - a client's hang-up aborts its request's `signal` (a read stays pending on the socket while
 *   the answer is made), and a failed write cancels the answer's body, which stops its source.
 *
 * @module
 */
import { headEnd, HeadError, parseHead, RequestHead } from "./_head.ts";
import { BodyReader, Inbound } from "./_inbound.ts";
import { writeAll, type Writer, writeResponse } from "./_answer.ts";
import { markEngineRequest, runSplice, spliceOf } from "./_splice.ts";
import { MeteredWriter, type Progress, unmetered } from "./_progress.ts";

export { HeadError, RequestHead } from "./_head.ts";

const CONTINUE = new TextEncoder().encode("HTTP/1.1 100 Continue\r\n\r\n");

/** What a lane is given for a request it claimed. */
export interface LaneExchange {
  /** The parsed head (its `raw` view is valid until the lane's answer is written). */
  readonly head: RequestHead;
  /** The whole body (the lane claims sized bodies only). */
  readonly body: Uint8Array<ArrayBuffer>;
  /** Aborted when the client hangs up (made when first asked for). */
  readonly signal: AbortSignal;
  /** Whether the client has hung up: `signal.aborted` without making the signal. */
  readonly hungUp: boolean;
  /** Writes bytes to the client; rejects once it has gone. */
  write(bytes: Uint8Array): Promise<void>;
  /**
   * Writes what one write call takes of `bytes` (all of a small answer), resolving how many
   * bytes that was: an async caller then writes the rest itself, without the promise and the
   * closure `write` makes to do it.
   */
  writeOnce(bytes: Uint8Array): Promise<number>;
  /**
   * Starts hearing the client's hang-up (a read stays pending on its connection). The lane calls
   * it once the node's request is out: at one connection the work before that write is the
   * request's latency, and the work after it runs while the node answers. The server calls it
   * itself for a request the lane hands back.
   */
  watch(): void;
}

/**
 * A fast path for requests the app can answer from their head's bytes and a small body
 * (the gateway's routed verbs). `claim` looks at the head only, before a byte of the body is
 * read: it names what the lane learned (say, the caller its bearer stands for), or `undefined`
 * for a request it leaves to the handler (a stranger's included, which then costs no body read).
 * A claimed request's body is read whole (it must be sized and at most `maxBodyBytes`), then
 * `serve` either writes the whole answer itself and resolves `true`, or resolves a `Response`
 * for the engine to write, or `undefined` to have the request served by the handler after all
 * (with the body it read).
 */
export interface BytesLane<Claim = unknown> {
  /** The largest body a claimed request may carry; a longer one goes to the handler. */
  readonly maxBodyBytes: number;
  /**
   * What the lane knows of a request it serves, from its head alone (only HTTP/1.1 keep-alive
   * requests without Expect are offered), or `undefined` to leave it to the handler.
   */
  claim(head: RequestHead): Claim | undefined;
  /** Serves a claimed request. A rejection closes the connection. */
  serve(exchange: LaneExchange, claim: Claim): Promise<true | Response | undefined>;
}

/** Options of {@linkcode serveH1}. */
export interface H1ServeOptions {
  /** The app. */
  handler: (
    request: Request,
    info: Deno.ServeHandlerInfo<Deno.NetAddr>,
  ) => Response | Promise<Response>;
  /** Answers an exception the handler threw; hears of an answer body that failed. */
  onError: (error: unknown) => Response | Promise<Response>;
  /** `https` on a TLS connection: the scheme of the request URLs. */
  scheme: "http" | "https";
  /** Closes the connection when aborted (the guard's timeouts, shutdown). */
  stop: AbortSignal;
  /** Ends the connection's splices (its WebSockets) when aborted: the server is shutting down. */
  closing?: AbortSignal;
  /** Called when a request's head has arrived. */
  begun(): void;
  /** Called when its answer has been written (or has failed): the next head is waited for. */
  ended(): void;
  /** The longest request head: 64 KiB by default (431 past it). */
  maxHeadBytes?: number;
  /** Requests it answers from their bytes. */
  lane?: BytesLane;
  /** Where the connection's reads and writes are counted, for the guard's stall bounds. */
  progress?: Progress;
}

/** The reason a request's signal is aborted with when its client hangs up. */
function hangUpReason(): Error {
  return new Deno.errors.ConnectionReset("the client hung up");
}

const NO_BODY = new Uint8Array(0);

/**
 * One request's hang-up state, which is what a lane is given of it too. The signal is made only
 * when asked for: most lane requests never need it. (A class, where closures per request were
 * seven allocations.)
 */
class Exchange implements LaneExchange {
  readonly head: RequestHead;
  body: Uint8Array<ArrayBuffer> = NO_BODY;
  readonly write: (bytes: Uint8Array) => Promise<void>;
  hungUp = false;
  readonly #inbound: Inbound;
  #hangUp: AbortController | undefined;

  readonly #out: Writer;

  constructor(
    head: RequestHead,
    inbound: Inbound,
    out: Writer,
    write: (bytes: Uint8Array) => Promise<void>,
  ) {
    this.head = head;
    this.#inbound = inbound;
    this.#out = out;
    this.write = write;
  }

  writeOnce(bytes: Uint8Array): Promise<number> {
    return this.#out.write(bytes);
  }

  get signal(): AbortSignal {
    if (this.#hangUp === undefined) {
      this.#hangUp = new AbortController();
      if (this.hungUp) this.#hangUp.abort(hangUpReason());
    }
    return this.#hangUp.signal;
  }

  /** The client hung up: the pending read ended, or the body was cut short. */
  readonly onHangUp = (): void => {
    this.hungUp = true;
    this.#hangUp?.abort(hangUpReason());
  };

  /** Keeps a read pending on the connection, so a hang-up is heard while the answer is made. */
  readonly watch = (): void => this.#inbound.watch(this.onHangUp);
}

/** The URL as sent, for the requests whose `url` URL parsing changed. */
const sentUrls = new WeakMap<Request, string>();

/**
 * The URL of `request` as its client sent it. A `Request` normalizes its URL (dot segments
 * removed, backslashes made slashes), and a router that checks for those (the gateway's door)
 * must see them; Deno's own server hands the URL over as sent, so this is `request.url` there.
 *
 * @example
 * ```ts
 * import { sentUrl } from "./server.ts";
 * sentUrl(new Request("http://x/a/../b")); // "http://x/b": not served by the bytes engine
 * ```
 */
export function sentUrl(request: Request): string {
  return sentUrls.get(request) ?? request.url;
}

/** The request of a head, or a 400 when its target and Host make no URL. */
function requestOf(
  head: RequestHead,
  scheme: string,
  body: BodyInit | null,
  signal: AbortSignal,
): Request {
  const url = head.target[0] === "/"
    ? `${scheme}://${head.host || "localhost"}${head.target}`
    : head.target === "*"
    ? `${scheme}://${head.host || "localhost"}/`
    : head.target;
  try {
    const request = new Request(url, {
      method: head.method,
      body,
      signal,
      ...(body instanceof ReadableStream ? { duplex: "half" } : {}),
    } as RequestInit);
    // Appended to the request's own headers: a Headers given in the init is copied entry by
    // entry through its iterator, which was the costliest part of making the Request (measured
    // 2.6x with the copy in a Deno.bench of this head). A byte body gets no content-type
    // either way, so the headers are the same.
    const { names, values } = head;
    const headers = request.headers;
    for (let i = 0; i < names.length; i++) headers.append(names[i], values[i]);
    if (request.url !== url) sentUrls.set(request, url);
    // Only an engine request can be spliced (relayWebSocket asks).
    if (names.includes("upgrade")) markEngineRequest(request);
    return request;
  } catch (error) {
    throw new HeadError(
      400,
      `Bad request head: ${(error as Error).message.slice(0, 120)}. Send a Host and a target ` +
        "that make a URL",
    );
  }
}

/** What the handler is called with, the connection's own. */
interface Handling {
  handler: H1ServeOptions["handler"];
  onError: H1ServeOptions["onError"];
  scheme: string;
  remoteAddr: Deno.NetAddr;
}

/** A request's `completed` promise, with its two ends. */
class Completion {
  readonly promise: Promise<void>;
  sent!: () => void;
  failed!: (error: unknown) => void;
  constructor() {
    this.promise = new Promise<void>((resolve, reject) => {
      this.sent = resolve;
      this.failed = reject;
    });
    this.promise.catch(() => {});
  }
}

/** The handler's answer to the request of `ex` (the onError's when it throws). */
async function handle(
  h: Handling,
  ex: Exchange,
  body: BodyInit | null,
  done: Completion,
): Promise<Response> {
  const head = ex.head;
  // A GET or HEAD body is no body a Request can carry: dropped after the answer, as sent.
  const bodiless = head.method === "GET" || head.method === "HEAD";
  const request = requestOf(head, h.scheme, bodiless ? null : body, ex.signal);
  try {
    return await h.handler(request, { remoteAddr: h.remoteAddr, completed: done.promise });
  } catch (error) {
    return await h.onError(error);
  }
}

/** The body stream the handler reads; `100 Continue` goes out on its first read when asked for. */
function bodyStream(
  reader: BodyReader,
  onFirstRead: (() => Promise<void>) | undefined,
): ReadableStream<Uint8Array> {
  let first = onFirstRead;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (first !== undefined) {
        const f = first;
        first = undefined;
        await f();
      }
      const piece = await reader.next();
      if (piece === null) controller.close();
      else controller.enqueue(piece);
    },
  }, { highWaterMark: 0 });
}

/** The answer to a head the engine refuses. */
function refusal(error: HeadError): Response {
  return Response.json({ code: error.status, message: error.message }, { status: error.status });
}

/** Whether `error` says the client went away (no error of the app's). */
function clientLeft(error: unknown): boolean {
  return error instanceof Deno.errors.BrokenPipe || error instanceof Deno.errors.ConnectionReset ||
    error instanceof Deno.errors.BadResource || error instanceof Deno.errors.NotConnected ||
    error instanceof Deno.errors.Interrupted;
}

/**
 * Serves HTTP/1.1 on `conn` until the client or `stop` ends it. Resolves once the connection
 * is closed.
 *
 * @example
 * ```ts ignore
 * await serveH1(conn, { handler, onError, scheme: "http", stop, begun() {}, ended() {} });
 * ```
 */
export async function serveH1(conn: Deno.Conn, options: H1ServeOptions): Promise<void> {
  const { handler, onError, scheme, stop, lane } = options;
  const maxHead = options.maxHeadBytes ?? 64 * 1024;
  const progress = options.progress ?? unmetered();
  const inbound = new Inbound(conn, progress);
  /** Every write of an answer goes through it, so the guard sees one that waits. */
  const out: Writer = options.progress === undefined ? conn : new MeteredWriter(conn, progress);
  const remoteAddr = conn.remoteAddr as Deno.NetAddr;
  const closeConn = () => {
    inbound.closed = true;
    try {
      conn.close();
    } catch {
      // Closed already.
    }
  };
  const write = (bytes: Uint8Array) => writeAll(out, bytes);
  const handling: Handling = { handler, onError, scheme, remoteAddr };

  /** Serves the request whose head ends at `end` (-1: too long). Resolves whether to go on. */
  const exchange = async (end: number): Promise<boolean> => {
    let head: RequestHead;
    try {
      if (end < 0 || end - inbound.start > maxHead) {
        throw new HeadError(
          431,
          `The request head is longer than ${maxHead} bytes: send fewer or shorter headers`,
        );
      }
      head = parseHead(inbound.buf, inbound.start, end);
    } catch (error) {
      if (!(error instanceof HeadError)) throw error;
      await writeResponse(out, headOnly, refusal(error), true).catch(() => {});
      return false;
    }
    inbound.start = end;
    // The head (and a whole body) are views of the read buffer until the next head is read.
    inbound.hold();
    const reader = new BodyReader(inbound, head);
    const ex = new Exchange(head, inbound, out, write);
    // Once the body is read, a read stays pending: a hang-up is heard while the answer is made.
    reader.onEnd = ex.watch;
    reader.onCut = ex.onHangUp;
    let keep = head.keepAlive;
    let claim: unknown;
    let response: Response | undefined;
    // The handler's `completed`, made only when the handler is called (the lane's requests do
    // without): no closure here, so a lane request allocates no context for this frame's locals.
    let done: Completion | undefined;
    /** The body the handler is given, when the lane does not answer. */
    let given: BodyInit | null = null;
    try {
      if (reader.done) ex.watch();
      if (
        lane !== undefined && head.http11 && head.keepAlive && !head.expectContinue &&
        head.contentLength >= 0 && head.contentLength <= lane.maxBodyBytes &&
        (claim = lane.claim(head)) !== undefined
      ) {
        // The lane starts the hang-up read itself once the node's request is out.
        reader.onEnd = undefined;
        const body = reader.whole() ?? await readWhole(reader, head.contentLength);
        if (body === null) return false;
        ex.body = body;
        const answer = await lane.serve(ex, claim);
        if (answer === true) return keep;
        ex.watch();
        response = answer;
        given = body.length > 0 ? body : null;
      } else {
        // A sized body that came whole with its head (most small requests) is given as its bytes,
        // which the Request copies: a stream over them was a tenth of the object path's time.
        const whole = reader.done || head.expectContinue ? undefined : reader.whole();
        given = whole ?? (reader.done ? null : bodyStream(
          reader,
          head.expectContinue ? () => writeAll(out, CONTINUE) : undefined,
        ));
      }
      if (response === undefined) {
        done = new Completion();
        response = await handle(handling, ex, given, done);
        // The client's body broke its framing while the handler read it: the handler blamed
        // what it fed the body to (a forward answers 502, naming the node), but the bytes were
        // the client's, and so is the 400.
        if (reader.refusal !== undefined) {
          await response.body?.cancel().catch(() => {});
          response = refusal(reader.refusal);
          keep = false;
        }
      }
      const splice = spliceOf(response);
      if (splice !== undefined) {
        // An upgrade the next hop accepted: bytes both ways until either side ends.
        await runSplice(splice, { write, read: () => inbound.next() }, options.closing ?? stop);
        done?.sent();
        return false;
      }
      // The handler may answer before the body's end (a 413 at a cap). A client that waits for
      // 100 Continue was never told to send it: the connection ends after the answer.
      const unsent = !reader.done && head.expectContinue && reader.read === 0;
      if (unsent) keep = false;
      keep = await writeResponse(out, head, response, !keep || stop.aborted);
      // The rest of the body is read and dropped only now (until its answer is sent the handler
      // may still be reading, a relayed upload), so the client reads the answer, not a reset.
      if (!reader.done && !unsent && !(await reader.drain())) keep = false;
      done?.sent();
      return keep;
    } catch (error) {
      done?.failed(error);
      if (response === undefined && error instanceof HeadError) {
        await writeResponse(out, head, refusal(error), true).catch(() => {});
      } else if ((response !== undefined || claim !== undefined) && !clientLeft(error)) {
        // The answer's body failed, or the lane did (a bug, a node that broke off, a stream cut
        // on purpose): told, and the connection ended.
        await Promise.resolve(onError(error)).catch(() => {});
      }
      return false;
    } finally {
      inbound.unwatch();
    }
  };

  stop.addEventListener("abort", closeConn, { once: true });
  try {
    for (;;) {
      // The next head; empty lines before it are skipped (RFC 9112 §2.2).
      inbound.release();
      let end = -1;
      for (;;) {
        const b = inbound.buf;
        while (
          inbound.start < inbound.end && (b[inbound.start] === 13 || b[inbound.start] === 10)
        ) {
          inbound.start++;
        }
        end = headEnd(inbound.buf, inbound.start, inbound.end);
        if (end >= 0 || inbound.size > maxHead) break;
        if (!(await inbound.fill())) return;
      }
      options.begun();
      let keep = false;
      try {
        keep = await exchange(end);
      } finally {
        options.ended();
      }
      if (!keep || stop.aborted) return;
    }
  } finally {
    stop.removeEventListener("abort", closeConn);
    closeConn();
  }
}

/** A head for answering one the engine could not parse. */
const headOnly = new RequestHead({
  method: "GET",
  target: "/",
  http11: true,
  contentLength: 0,
  keepAlive: false,
  expectContinue: false,
  host: "",
  raw: new Uint8Array(0),
  spans: [],
});

/** Reads a sized body whole; null when the client ended it early. */
async function readWhole(
  reader: BodyReader,
  length: number,
): Promise<Uint8Array<ArrayBuffer> | null> {
  if (length === 0) return new Uint8Array(0);
  const out = new Uint8Array(length);
  let at = 0;
  try {
    for (let piece = await reader.next(); piece !== null; piece = await reader.next()) {
      out.set(piece, at);
      at += piece.length;
    }
  } catch {
    return null;
  }
  return out;
}
