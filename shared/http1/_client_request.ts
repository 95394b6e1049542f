/**
 * The request side of {@linkcode createH1Client} (client.ts): a `fetch` call's headers and body
 * made into a head of bytes and a body that is fixed or streamed ({@linkcode outgoing}), and that
 * request written on a connection ({@linkcode upload}): a small fixed one in one write before
 * the answer is read, a large or streamed one while it is.
 *
 * @module
 */
import { type Conn, encoder, StaleConnection, wrap, writeRequest } from "./_wire.ts";
import { joined, latin1 } from "./_answer.ts";

/** Headers the client frames itself; the caller's are dropped (RFC 9112 §6, §9.6). */
const framing = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
]);
const unsafe = /[\r\n\0]/;
/** A character no octet stands for: a header sent one byte a character cannot carry it. */
const notOctets = /[\u0100-\uffff]/;

/** A request ready for the wire: its head as bytes, and its body, fixed or streamed. */
export interface OutgoingRequest {
  readonly method: string;
  readonly head: Uint8Array;
  /** A fixed body (none for a GET or HEAD without one). */
  readonly bytes: Uint8Array | undefined;
  /** A body that goes out as it comes. */
  readonly stream: ReadableStream<Uint8Array> | undefined;
  /** The length the caller declared for `stream`, which then goes out unframed. */
  readonly length: number | undefined;
}

/**
 * A `fetch` call's `init` (over its `request`, when it was given one) made ready for the wire to
 * `url`. Throws a TypeError for a header that cannot be sent. `hostFromHeaders` sends a `host`
 * header given as the Host (see `H1ClientOptions.hostFromHeaders`).
 */
export function outgoing(
  url: URL,
  method: string,
  init: RequestInit,
  request: Request | undefined,
  hostFromHeaders: boolean,
): OutgoingRequest {
  const body: BodyInit | null = init.body ?? (request ? request.body : null) ?? null;
  const pairs: [string, string][] = [];
  const given = init.headers ?? request?.headers;
  let contentType = false;
  let declared: string | undefined;
  let host = url.host;
  const take = (k: string, v: string) => {
    const name = k.toLowerCase();
    if (name === "content-length") declared = v;
    if (framing.has(name) && !(name === "host" && hostFromHeaders)) return;
    if (unsafe.test(name) || unsafe.test(v)) {
      throw new TypeError(`Cannot send header '${name}': it holds a line break or NUL`);
    }
    if (notOctets.test(name) || notOctets.test(v)) {
      throw new TypeError(
        `Cannot send header '${name}': it holds a character past \\xff (a header is octets)`,
      );
    }
    if (name === "host") {
      host = v;
      return;
    }
    if (name === "content-type") contentType = true;
    pairs.push([name, v]);
  };
  // A Headers by forEach: the same entries as its iterator, without its result objects.
  if (given instanceof Headers) given.forEach((v, k) => take(k, v));
  else if (Array.isArray(given)) { for (const [k, v] of given as [string, string][]) take(k, v); }
  else if (given !== undefined) { for (const [k, v] of Object.entries(given)) take(k, v); }
  // Fixed bodies as bytes, everything else (a Blob, FormData) through Response's encoder.
  let bytes: Uint8Array | undefined;
  let stream: ReadableStream<Uint8Array> | undefined;
  if (body === null) {
    if (method !== "GET" && method !== "HEAD") bytes = new Uint8Array(0);
  } else if (typeof body === "string") bytes = encoder.encode(body);
  else if (body instanceof Uint8Array) bytes = body;
  else if (body instanceof ArrayBuffer) bytes = new Uint8Array(body);
  else if (ArrayBuffer.isView(body)) {
    bytes = new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  } else if (body instanceof ReadableStream) stream = body;
  else {
    const wrapped = new Response(body);
    const type = wrapped.headers.get("content-type");
    if (type !== null && !contentType) pairs.push(["content-type", type]);
    stream = wrapped.body ?? undefined;
  }
  // A stream whose length the caller declared goes out with that length, unframed: the node
  // then reads it without chunk framing, and a small one is sent in the head's write.
  let length: number | undefined;
  if (stream !== undefined && declared !== undefined && /^\d{1,15}$/.test(declared.trim())) {
    length = Number(declared);
  }
  // `Host` as Go's net/http (E2B's proxy) and browsers write it: a server that reads names as they
  // came (Python's http.server) sees what it would behind E2B.
  let head = `${method} ${url.pathname}${url.search} HTTP/1.1\r\nHost: ${host}\r\n`;
  for (let i = 0; i < pairs.length; i++) head += `${pairs[i][0]}: ${pairs[i][1]}\r\n`;
  head += length !== undefined
    ? `content-length: ${length}\r\n\r\n`
    : stream !== undefined
    ? "transfer-encoding: chunked\r\n\r\n"
    : bytes !== undefined
    ? `content-length: ${bytes.length}\r\n\r\n`
    : "\r\n";
  // One byte a character: a header value is octets (a ByteString), not text to make UTF-8 of.
  const headBytes = latin1(head);
  return { method, head: headBytes, bytes, stream, length };
}

/**
 * A request's body going out on its connection while the answer is read: `sent` settles true
 * once it is all written, false when a write failed (the connection is then closed); `stop`,
 * set while the body is still being written, ends it (the upload's reader is cancelled).
 */
export interface Upload {
  readonly sent: Promise<boolean>;
  stop: (() => void) | undefined;
}

/**
 * Writes `out` on `conn`. A small fixed request goes out whole before this resolves (a write
 * that fails is a {@linkcode StaleConnection}, after `finish(false)`); a large or streamed body
 * goes out while the answer is read, since a node may answer early. `writing` is called once the
 * first write has started: the time to start other work while the node reads.
 */
export async function upload(
  conn: Conn,
  out: OutgoingRequest,
  finish: (reuse: boolean) => void,
  signal: AbortSignal | null,
  writing: () => void,
): Promise<Upload> {
  const { head, bytes, stream } = out;
  if (stream === undefined && (bytes === undefined || bytes.length <= 16 * 1024)) {
    try {
      const written = conn.writeAll(
        bytes === undefined || bytes.length === 0 ? head : joined(head, bytes),
      );
      writing();
      await written;
    } catch (error) {
      finish(false);
      if (signal?.aborted) throw signal.reason;
      throw new StaleConnection("write failed", { cause: wrap(error) });
    }
    return { sent: Promise.resolve(true), stop: undefined };
  }
  // A write that fails closes the connection, so the answer's read fails with it.
  const going: { sent: Promise<boolean>; stop: (() => void) | undefined } = {
    sent: Promise.resolve(true),
    stop: undefined,
  };
  let uploading = true;
  going.sent = writeRequest(conn, head, bytes, stream, out.length, (stop) => {
    if (uploading) going.stop = stop;
  }).then(() => true, () => {
    conn.destroy();
    return false;
  }).finally(() => {
    uploading = false;
    going.stop = undefined;
  });
  return going;
}
