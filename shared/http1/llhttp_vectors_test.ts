/**
 * nodejs/llhttp's test vectors (testdata/llhttp/, MIT) replayed against this folder's two
 * parsers: the bytes engine's request heads and bodies, and the client's answers (both its
 * fetch-shaped reader and the bytes lane's). A vector's log says what llhttp parsed; each replay
 * must parse the same method, target, version, headers and body, or refuse where llhttp refuses.
 * Where this engine deliberately refuses what llhttp accepts, the vector is in
 * {@linkcode STRICTER} with the reason; anything else that differs fails the test.
 *
 * Lenient vectors (a `request-lenient-*` or `response-lenient-*` type, or `mode: "loose"`) show
 * what llhttp accepts only with a leniency flag set: this engine has none, so it must refuse
 * them, unless llhttp refuses them too.
 */
import assert from "node:assert/strict";
import { seeded } from "../_seeded_fixtures_test.ts";
import {
  type Logged,
  type LoggedMessage,
  misplacedSpan,
  readLog,
  readVectors,
  type Vector,
} from "./_llhttp_fixtures_test.ts";
import { createH1Client } from "./client.ts";

// --- The adapter: the only place this file reaches into the engine's private files. It runs
// the bytes engine's request loop (server.ts's `serveH1`) over bytes handed out in pieces: skip
// empty lines, find the head's end, parse it, read its body, and go on while the connection is
// kept alive.
import { headEnd, HeadError, parseHead } from "./_head.ts";
import { BodyReader, Inbound } from "./_inbound.ts";

/** The engine's default longest head (server.ts). */
const MAX_HEAD = 64 * 1024;

/** One request as the engine parsed it; header names as sent, values as the engine trims them. */
interface ParsedRequest {
  method: string;
  target: string;
  version: "1.0" | "1.1";
  headers: [string, string][];
  body: Uint8Array;
}

/** What the engine made of a connection's bytes. */
interface RequestReplay {
  served: ParsedRequest[];
  /** How the connection ended: refused (with the status), not kept alive, upgraded, cut, EOF. */
  end: "refused" | "close" | "upgrade" | "cut" | "eof";
  status?: number;
  message?: string;
}

/** A connection whose reads hand out `pieces` in turn, then the end of the stream. */
function piecesConn(pieces: Uint8Array[]): Deno.Conn {
  let i = 0, at = 0;
  const conn = {
    remoteAddr: { transport: "tcp", hostname: "127.0.0.1", port: 1 },
    read(p: Uint8Array): Promise<number | null> {
      while (i < pieces.length && at >= pieces[i].length) (i++, at = 0);
      if (i >= pieces.length) return Promise.resolve(null);
      const n = Math.min(p.length, pieces[i].length - at);
      p.set(pieces[i].subarray(at, at + n));
      at += n;
      return Promise.resolve(n);
    },
    write: (p: Uint8Array) => Promise.resolve(p.length),
    close() {},
  };
  return conn as unknown as Deno.Conn;
}

const latin1 = (b: Uint8Array) => String.fromCharCode(...b);

/** Runs the bytes engine's request loop over `pieces`. */
async function parseRequests(pieces: Uint8Array[]): Promise<RequestReplay> {
  const inbound = new Inbound(piecesConn(pieces));
  const served: ParsedRequest[] = [];
  for (;;) {
    inbound.release();
    let end = -1;
    for (;;) {
      const b = inbound.buf;
      while (inbound.start < inbound.end && (b[inbound.start] === 13 || b[inbound.start] === 10)) {
        inbound.start++;
      }
      end = headEnd(inbound.buf, inbound.start, inbound.end);
      if (end >= 0 || inbound.size > MAX_HEAD) break;
      if (!(await inbound.fill())) return { served, end: "eof" };
    }
    if (end < 0 || end - inbound.start > MAX_HEAD) return { served, end: "refused", status: 431 };
    let head;
    try {
      head = parseHead(inbound.buf, inbound.start, end);
    } catch (error) {
      if (!(error instanceof HeadError)) throw error;
      return { served, end: "refused", status: error.status, message: error.message };
    }
    inbound.start = end;
    inbound.hold();
    const reader = new BodyReader(inbound, head);
    const pieces: Uint8Array[] = [];
    try {
      for (let p = await reader.next(); p !== null; p = await reader.next()) pieces.push(p.slice());
    } catch (error) {
      if (error instanceof HeadError) {
        return { served, end: "refused", status: error.status, message: error.message };
      }
      return { served, end: "cut" };
    }
    const headers: [string, string][] = [];
    for (let i = 0; i < head.spans.length; i += 4) {
      const s = head.spans;
      headers.push([
        latin1(head.raw.subarray(s[i], s[i + 1])),
        latin1(head.raw.subarray(s[i + 2], s[i + 3])),
      ]);
    }
    served.push({
      method: head.method,
      target: head.target,
      version: head.http11 ? "1.1" : "1.0",
      headers,
      body: joinAll(pieces),
    });
    const connection = (head.get("connection") ?? "").toLowerCase();
    // An upgrade hands the connection over (server.ts's splice): no request follows.
    if (head.get("upgrade") !== undefined && /(^|,)\s*upgrade\s*(,|$)/.test(connection)) {
      return { served, end: "upgrade" };
    }
    if (!head.keepAlive) return { served, end: "close" };
  }
}
// --- End of the adapter.

function joinAll(pieces: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(pieces.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of pieces) (out.set(p, at), at += p.length);
  return out;
}

const encoder = new TextEncoder();

/** A logged value as the octets it was sent as (the log prints UTF-8 text). */
const octetsOf = (text: string) => latin1(encoder.encode(text));

/** RFC 9110 §5.5: a field value has no surrounding whitespace (llhttp keeps the trailing). */
const trimmed = (value: string) => value.replace(/^[ \t]+|[ \t]+$/g, "");

/** Whether a vector shows what llhttp accepts only with a leniency flag. */
function lenient(v: Vector): boolean {
  return v.meta.type.includes("lenient") || v.meta.mode === "loose";
}

/** How one replay compares with llhttp's log. */
type Verdict =
  /** The same messages, and the same refusal (or none). */
  | { kind: "same" }
  /** This side refused (or did not complete) a message llhttp parsed. */
  | { kind: "stricter"; detail: string }
  /** This side parsed a message llhttp refused or had not completed. */
  | { kind: "looser"; detail: string }
  /** Both parsed a message, and it differs. */
  | { kind: "differs"; detail: string };

/** Why a message this side parsed is not the one llhttp logged, or undefined when it is. */
function requestDiff(ours: ParsedRequest, theirs: LoggedMessage): string | undefined {
  const want = {
    method: theirs.method,
    target: octetsOf(theirs.url),
    version: theirs.version,
    headers: theirs.headers.map(([n, v]) => [octetsOf(n), trimmed(octetsOf(v))]),
    body: latin1(theirs.body),
  };
  const got = { ...ours, body: latin1(ours.body) };
  try {
    assert.deepEqual(got, want);
    return undefined;
  } catch (error) {
    return (error as Error).message;
  }
}

/** Compares a request replay with the log: the messages in order, then where each side stopped. */
function judgeRequests(replay: RequestReplay, log: Logged): Verdict {
  const done = log.messages.filter((m) => m.complete);
  for (let i = 0; i < Math.min(done.length, replay.served.length); i++) {
    const why = requestDiff(replay.served[i], done[i]);
    if (why !== undefined) return { kind: "differs", detail: `message ${i}: ${why}` };
  }
  const ours = replay.served.length;
  const end = `${replay.end}${replay.status ? ` ${replay.status}` : ""}${
    replay.message ? ` (${replay.message})` : ""
  }`;
  if (ours > done.length) {
    return { kind: "looser", detail: `served ${ours} messages, llhttp completed ${done.length}` };
  }
  if (ours < done.length) {
    return { kind: "stricter", detail: `served ${ours} of llhttp's ${done.length}, then ${end}` };
  }
  // The same messages. A refusal of the next one llhttp was still reading without an error (its
  // input ended first) is stricter; one llhttp refused too, or an end it stopped at, is the same.
  const next = log.messages[done.length];
  if (
    replay.end === "refused" && log.error === undefined && !log.upgraded && next !== undefined
  ) {
    return { kind: "stricter", detail: `refused message ${ours} llhttp was still reading: ${end}` };
  }
  return { kind: "same" };
}

// --- The answer side: the client over loopback, against a stub that answers with the bytes. ---

/** One answer as the client read it, or why it refused it. */
type Answer =
  | { ok: true; status: number; headers: [string, string][]; body: string }
  | { ok: false; error: string };

/** A loopback server that answers each connection's first request with queued bytes. */
function answering() {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const queue: { pieces: Uint8Array[]; pause: boolean }[] = [];
  const conns = new Set<Deno.Conn>();
  const serving = (async () => {
    for await (const conn of listener) {
      conns.add(conn);
      (async () => {
        try {
          const buf = new Uint8Array(4096);
          let text = "";
          while (!text.includes("\r\n\r\n")) {
            const n = await conn.read(buf);
            if (n === null) return;
            text += latin1(buf.subarray(0, n));
          }
          const next = queue.shift();
          if (next === undefined) return;
          for (const piece of next.pieces) {
            let at = 0;
            while (at < piece.length) at += await conn.write(piece.subarray(at));
            if (next.pause) await new Promise((r) => setTimeout(r, 1));
          }
        } catch {
          // The client hung up first: its refusal is what is judged.
        } finally {
          conns.delete(conn);
          try {
            conn.close();
          } catch { /* closed */ }
        }
      })();
    }
  })();
  const port = (listener.addr as Deno.NetAddr).port;
  return {
    origin: `http://127.0.0.1:${port}`,
    answer(pieces: Uint8Array[], pause: boolean) {
      queue.push({ pieces, pause });
    },
    async close() {
      listener.close();
      for (const c of conns) {
        try {
          c.close();
        } catch { /* closed */ }
      }
      await serving.catch(() => {});
    },
  };
}

const GET = encoder.encode("GET / HTTP/1.1\r\nhost: vector\r\n\r\n");

/** The answer read by the client's fetch (`readHead` and its body framing). */
async function fetchAnswer(origin: string): Promise<Answer> {
  const client = createH1Client();
  try {
    const res = await client.fetch(`${origin}/`, { signal: AbortSignal.timeout(2000) });
    const body = latin1(new Uint8Array(await res.arrayBuffer()));
    const headers: [string, string][] = [];
    res.headers.forEach((v, k) => headers.push([k, v]));
    return { ok: true, status: res.status, headers, body };
  } catch (error) {
    return { ok: false, error: String((error as Error).message ?? error) };
  } finally {
    client.close();
  }
}

/** The answer read by the bytes lane's `sendBytes` (`bufferedRawHead` and its framing). */
async function bytesAnswer(origin: string): Promise<Answer> {
  const client = createH1Client();
  try {
    const signal = AbortSignal.timeout(2000);
    const answer = await client.sendBytes(origin, GET, signal);
    const { raw, spans } = answer.head;
    const headers: [string, string][] = [];
    for (let i = 0; i < spans.length; i += 3) {
      headers.push([
        latin1(raw.subarray(spans[i], spans[i + 1])),
        trimmed(latin1(raw.subarray(spans[i + 1] + 1, spans[i + 2] - 2))),
      ]);
    }
    const status = answer.head.status;
    let body = "";
    for (let p = await answer.next(); p !== null; p = await answer.next()) body += latin1(p);
    return { ok: true, status, headers, body };
  } catch (error) {
    return { ok: false, error: String((error as Error).message ?? error) };
  } finally {
    client.close();
  }
}

/** llhttp's F_CHUNKED and F_CONTENT_LENGTH flags. */
const F_CHUNKED = 0x8, F_CONTENT_LENGTH = 0x20;

/**
 * The answer llhttp parsed first (1xx interim answers skipped, as the client skips them), and
 * whether it was whole: complete, or a body that ends with the connection, which the stub closes
 * after its bytes. Undefined when llhttp refused or had not finished it.
 */
function firstAnswer(log: Logged): LoggedMessage | undefined {
  for (let i = 0; i < log.messages.length; i++) {
    const m = log.messages[i];
    const interim = m.status >= 100 && m.status < 200 && m.status !== 101;
    if (m.headed && interim && m.complete) continue;
    if (log.error !== undefined && log.error.after <= i) return undefined;
    const bodiless = m.status === 204 || m.status === 304 || (m.status >= 100 && m.status < 200);
    const untilClose = m.headed && !bodiless && (m.flags & (F_CHUNKED | F_CONTENT_LENGTH)) === 0;
    return m.complete || (untilClose && !log.upgraded) ? m : undefined;
  }
  return undefined;
}

/** Compares an answer with llhttp's first: the status, the headers, the body. */
function judgeAnswer(answer: Answer, log: Logged, lowerNames: boolean): Verdict {
  const theirs = firstAnswer(log);
  if (!answer.ok) {
    return theirs === undefined
      ? { kind: "same" }
      : { kind: "stricter", detail: `refused: ${answer.error}` };
  }
  if (theirs === undefined) {
    return { kind: "looser", detail: `read ${answer.status} where llhttp has no whole answer` };
  }
  const name = (n: string) => lowerNames ? n.toLowerCase() : n;
  const headers = theirs.headers.map(([n, v]) => [name(octetsOf(n)), trimmed(octetsOf(v))]);
  // A Headers joins repeated names with ", " and iterates sorted: the fetch side is compared so.
  const want = lowerNames ? joinedSorted(headers as [string, string][]) : headers;
  try {
    assert.deepEqual(
      { status: answer.status, headers: answer.headers, body: answer.body },
      { status: theirs.status, headers: want, body: latin1(theirs.body) },
    );
    return { kind: "same" };
  } catch (error) {
    return { kind: "differs", detail: (error as Error).message };
  }
}

function joinedSorted(pairs: [string, string][]): [string, string][] {
  const h = new Headers();
  for (const [n, v] of pairs) h.append(n, v);
  const out: [string, string][] = [];
  h.forEach((v, k) => out.push([k, v]));
  return out;
}

/** The Host line the request replay adds to a vector's HTTP/1.1 message that has none. */
const ADDED_HOST = "Host: llhttp-vector\r\n";

/**
 * `vector`'s input with a Host line after the request line of each HTTP/1.1 message the log
 * began that names no Host: the engine refuses those (RFC 9112 §3.2), so the rest of the vector
 * is compared on this copy. The offsets come from the log's `message begin` lines.
 */
function withHost(vector: Vector, log: Logged): Uint8Array {
  const text = latin1(vector.input);
  let out = text;
  for (const m of [...log.messages].reverse()) {
    const eol = text.indexOf("\r\n", m.begin);
    if (eol < 0 || !text.slice(m.begin, eol).endsWith(" HTTP/1.1")) continue;
    if (m.headers.some(([n]) => n.toLowerCase() === "host")) continue;
    out = out.slice(0, eol + 2) + ADDED_HOST + out.slice(eol + 2);
  }
  return Uint8Array.from(out, (c) => c.charCodeAt(0));
}

/** A replay of {@linkcode withHost}'s copy, less the Host lines it added. */
function lessAddedHost(replay: RequestReplay): RequestReplay {
  const served = replay.served.map((r) => ({
    ...r,
    headers: r.headers.filter(([n, v]) => !(n === "Host" && v === "llhttp-vector")),
  }));
  return { ...replay, served };
}

/** Whether the engine refused a message for its missing Host alone. */
const hostless = (r: RequestReplay) =>
  r.end === "refused" && /must carry a Host/.test(r.message ?? "");

// --- The corpus and the table of deliberate differences.

const root = new URL("./testdata/llhttp/", import.meta.url);

function corpus(kind: "request" | "response"): Vector[] {
  const out: Vector[] = [];
  for (
    const entry of [...Deno.readDirSync(new URL(`${kind}/`, root))].sort((a, b) =>
      a.name < b.name ? -1 : 1
    )
  ) {
    const file = `${kind}/${entry.name}`;
    out.push(...readVectors(file, Deno.readTextFileSync(new URL(file, root))));
  }
  return out;
}

type Side = "request" | "fetch" | "bytes";

const OBS_FOLD = "obs-fold: RFC 9112 §5.2 lets a server refuse it, and a proxy that unfolds " +
  "differently from the server behind it is a smuggling path; the engine refuses it outright";
const CONNECT = "CONNECT's authority-form target: the gateway opens no tunnels, so a target " +
  "that is not a path or an absolute URL is a 400";
const OTHER_PROTOCOL = "an ICE or RTSP request line: only HTTP/1.0 and HTTP/1.1 are served";
const HTTP09 = "HTTP/0.9 (a request line without a version, an answer that names 0.9): not " +
  "served; a 0.9 answer from a node is a broken node";
const CODINGS = "a transfer coding other than chunked alone (here deflate, then chunked): 501, " +
  "as the engine decodes no codings; a request it would have to forward re-framed is refused " +
  "rather than half-understood";
const NO_101_RESPONSE = "a 101 read by the fetch-shaped client: a Response cannot carry 101 " +
  "(the Fetch standard), so the upgrade goes through the splice path (_splice.ts), not fetch";
const BARE_LF_ANSWER = "an answer whose lines end in a bare LF: the client reads CRLF lines " +
  "only, as the engine does for requests, so no answer's end is read two ways";
const CRLF_BEFORE_ANSWER = "an empty line before the status line: RFC 9112 §2.2 allows skipping " +
  "one before a request only; before an answer it means the previous answer's framing was wrong";
const FOLDED_ANSWER = "obs-fold in an answer: refused from a node as from a client";

/**
 * Vectors llhttp accepts (by default, without leniency) that this side refuses on purpose, by
 * vector id, with the sides that refuse (`request`: the engine; `fetch`, `bytes`: the client's
 * two readers) and the reason. A tabled vector read as llhttp reads it fails too: the table
 * stays true.
 */
const STRICTER: Record<string, { sides: Side[]; why: string }> = {
  "request/connection.md:377 Multiple tokens with folding": { sides: ["request"], why: OBS_FOLD },
  "request/connection.md:468 Multiple tokens with folding, LWS, and CRLF": {
    sides: ["request"],
    why: OBS_FOLD,
  },
  "request/method.md:23 CONNECT request": { sides: ["request"], why: CONNECT },
  "request/method.md:52 CONNECT request with CAPS": { sides: ["request"], why: CONNECT },
  "request/method.md:80 CONNECT with body": { sides: ["request"], why: CONNECT },
  "request/uri.md:168 Underscore in hostname": { sides: ["request"], why: CONNECT },
  "request/method.md:308 SOURCE request with ICE": { sides: ["request"], why: OTHER_PROTOCOL },
  "request/method.md:332 OPTIONS request with RTSP": { sides: ["request"], why: OTHER_PROTOCOL },
  "request/method.md:354 ANNOUNCE request with RTSP": { sides: ["request"], why: OTHER_PROTOCOL },
  "request/sample.md:298 No HTTP version": { sides: ["request"], why: HTTP09 },
  "request/sample.md:543 X-SSL-Nonsense": { sides: ["request"], why: OBS_FOLD },
  "request/transfer-encoding.md:715 POST with `chunked` as last transfer-encoding": {
    sides: ["request"],
    why: CODINGS,
  },
  "request/transfer-encoding.md:755 POST with `chunked` as last transfer-encoding (multiple headers)":
    { sides: ["request"], why: CODINGS },
  "response/connection.md:276 HTTP 101 response with Upgrade and Content-Length header": {
    sides: ["fetch"],
    why: NO_101_RESPONSE,
  },
  "response/connection.md:311 HTTP 101 response with Upgrade and Transfer-Encoding header": {
    sides: ["fetch"],
    why: NO_101_RESPONSE,
  },
  "response/sample.md:261 No carriage ret": { sides: ["fetch", "bytes"], why: BARE_LF_ANSWER },
  "response/sample.md:586 HTTP version 0.9": { sides: ["fetch", "bytes"], why: HTTP09 },
  "response/sample.md:628 Response starting with CRLF": {
    sides: ["fetch", "bytes"],
    why: CRLF_BEFORE_ANSWER,
  },
  "response/transfer-encoding.md:373 Invalid OBS fold after chunked value": {
    sides: ["fetch", "bytes"],
    why: FOLDED_ANSWER,
  },
};

/**
 * Vectors llhttp refuses that the engine parses, each with why that is no defect. Anything
 * else parsed where llhttp refuses fails the test.
 */
const LOOSER: Record<string, string> = {
  "request/invalid.md:68 HTTP protocol and ANNOUNCE method": "a method is any token (RFC 9110 " +
    "§9.1): llhttp knows a fixed list (ANNOUNCE is RTSP's); the gateway answers an unknown " +
    "method with its 404, it never forwards one as another",
  "request/invalid.md:358 Invalid method": "a method is any token (RFC 9110 §9.1): `MKCOLA` is " +
    "one, and the gateway's routes answer it 404",
  "request/method.md:376 PRI request HTTP2": "the HTTP/2 preface as sent carries no Host and is " +
    "refused (HOSTLESS); only the copy with a Host added parses, PRI then a token method",
};

/**
 * HTTP/1.1 vectors without a Host header. RFC 9112 §3.2: a server MUST answer 400 to an HTTP/1.1
 * request without exactly one Host; llhttp leaves that check to its user. These are refused as
 * written, then replayed with a Host line added, and that copy is compared.
 */
const HOSTLESS = new Set<string>([
  "request/connection.md:8 Setting flag",
  "request/connection.md:34 Restarting when keep-alive is explicitly",
  "request/connection.md:220 Setting flag on `close`",
  "request/connection.md:351 Sample",
  "request/connection.md:436 Multiple tokens with folding and LWS",
  "request/connection.md:565 Setting a flag and pausing",
  "request/connection.md:597 Emitting part of body and pausing",
  "request/content-length.md:6 `Content-Length` with zeroes",
  "request/content-length.md:37 `Content-Length` with follow-up headers",
  "request/content-length.md:182 Spaces in `Content-Length` (surrounding)",
  "request/finish.md:8 It should be safe to finish after GET request",
  "request/invalid.md:358 Invalid method",
  "request/lenient-headers.md:30 Second request header value with lenient",
  "request/method.md:6 REPORT request",
  "request/method.md:376 PRI request HTTP2",
  "request/pipelining.md:6 Should parse multiple events",
  "request/sample.md:8 Simple request",
  "request/sample.md:44 Request with method starting with `H`",
  "request/sample.md:162 DUMBPACK",
  "request/sample.md:188 No headers and no body",
  "request/sample.md:209 One header and no body",
  "request/sample.md:277 Prefix newline",
  "request/sample.md:454 Request starting with CRLF",
  "request/sample.md:482 Extended Characters",
  "request/sample.md:510 255 ASCII in header value",
  "request/transfer-encoding.md:8 Parsing and setting flag",
  "request/transfer-encoding.md:33 Parse chunks with lowercase size",
  "request/transfer-encoding.md:68 Parse chunks with uppercase size",
  "request/transfer-encoding.md:103 POST with `Transfer-Encoding: chunked`",
  "request/transfer-encoding.md:138 Two chunks and triple zero prefixed end chunk",
  "request/transfer-encoding.md:178 Trailing headers",
  "request/transfer-encoding.md:228 Chunk extensions",
  "request/transfer-encoding.md:350 Chunk extensions quoting",
  "request/transfer-encoding.md:406 Unbalanced chunk extensions quoting",
  "request/transfer-encoding.md:835 Missing last-chunk",
  "request/transfer-encoding.md:867 Validate chunk parameters",
  "request/transfer-encoding.md:1128 Space after chunk header",
  "request/transfer-encoding.md:1157 Space after chunk header (lenient)",
  "request/uri.md:6 Quotes in URI",
  "request/uri.md:25 Query URL with question mark",
  "request/uri.md:42 Host terminated by a query string",
  "request/uri.md:59 `host:port` terminated by a query string",
  "request/uri.md:80 Query URL with vertical bar character",
  "request/uri.md:97 `host:port` terminated by a space",
  "request/uri.md:151 Fragment in URI",
  "request/uri.md:196 `host:port` and basic auth",
]);

/**
 * Lenient vectors this side reads as llhttp does: the leniency was about bytes it never reads.
 * The client reads one answer a connection and drops the connection after `Connection: close`,
 * so llhttp's leniency about what follows such an answer changes nothing it reads.
 */
const AFTER_CLOSE = "the leniency is about what follows a `Connection: close` answer, which " +
  "the client never reads: the first answer is the same in llhttp's strict mode";
const VALID_WITHOUT_LENIENCY: Record<string, string> = {
  "response/connection.md:161 HTTP/1.1 with keep-alive disabled, content-length, and in loose mode":
    AFTER_CLOSE,
  "response/connection.md:222 HTTP/1.1 with keep-alive disabled, content-length, and in lenient mode":
    AFTER_CLOSE,
  "response/connection.md:252 HTTP/1.1 with keep-alive disabled and 204 status in lenient mode":
    AFTER_CLOSE,
};

/** The bytes of `input` in `n` pieces cut at seeded random offsets. */
function cuts(input: Uint8Array, n: number, random: () => number): Uint8Array[] {
  const at = new Set<number>();
  while (at.size < Math.min(n - 1, input.length - 1)) {
    at.add(1 + Math.floor(random() * (input.length - 1)));
  }
  const points = [0, ...[...at].sort((a, b) => a - b), input.length];
  return points.slice(1).map((p, i) => input.subarray(points[i], p));
}

/** Every byte a piece of its own. */
const bytewise = (input: Uint8Array) => [...input].map((b) => Uint8Array.of(b));

Deno.test("the llhttp corpus is intact: every span of every log lies where its input has it", () => {
  const all = [...corpus("request"), ...corpus("response")];
  assert.ok(all.length > 150, `only ${all.length} vectors read`);
  for (const v of all) assert.equal(misplacedSpan(v), undefined, v.id);
});

const REPORT = Deno.env.get("LLHTTP_REPORT") === "1";

Deno.test("llhttp's request vectors: the engine parses what llhttp parses, or refuses on purpose", async () => {
  const random = seeded(7);
  const vectors = corpus("request");
  const problems: string[] = [];
  let stricter = 0, noHost = 0, looser = 0;
  for (const v of vectors) {
    const log = readLog(v);
    if (log.unread !== undefined) continue;
    let whole = await parseRequests([v.input]);
    // How the bytes arrive must not matter: byte by byte, and in a few random cuts.
    const splits = v.meta.noScan ? [] : [bytewise(v.input), cuts(v.input, 3, random)];
    for (const pieces of splits) {
      const again = await parseRequests(pieces);
      if (JSON.stringify(again) !== JSON.stringify(whole)) {
        problems.push(`${v.id}: cut in ${pieces.length} pieces it parsed otherwise`);
      }
    }
    if (hostless(whole)) {
      if (!HOSTLESS.has(v.id)) problems.push(`${v.id}: refused for its Host, not in HOSTLESS`);
      noHost++;
      whole = lessAddedHost(await parseRequests([withHost(v, log)]));
    } else if (HOSTLESS.has(v.id)) problems.push(`${v.id}: in HOSTLESS, not refused for its Host`);
    const verdict = judgeRequests(whole, log);
    const tabled = STRICTER[v.id]?.sides.includes("request");
    if (REPORT && verdict.kind !== "same") {
      console.log(
        "REQ",
        v.id,
        lenient(v) ? "LENIENT" : "",
        verdict.kind,
        (verdict as { detail?: string }).detail?.slice(0, 160),
      );
    }
    if (lenient(v)) {
      // Never lenient: a vector whose every message llhttp began (with its flag set) is parsed
      // here too was accepted without the flag.
      const servedAll = log.error === undefined && whole.served.length >= log.messages.length;
      if ((servedAll || verdict.kind === "looser") && !(v.id in VALID_WITHOUT_LENIENCY)) {
        problems.push(`${v.id}: lenient vector accepted: ${JSON.stringify(verdict)}`);
      }
      continue;
    }
    if (verdict.kind === "stricter") {
      stricter++;
      if (!tabled) problems.push(`${v.id}: refused, not in STRICTER: ${verdict.detail}`);
    } else if (verdict.kind === "looser" && v.id in LOOSER) looser++;
    else if (verdict.kind !== "same") problems.push(`${v.id}: ${verdict.kind}: ${verdict.detail}`);
    else if (tabled) problems.push(`${v.id}: in STRICTER but parsed as llhttp parses it`);
  }
  console.log(
    `request vectors: ${vectors.length}; refused for a missing Host: ${noHost}; otherwise ` +
      `deliberately stricter: ${stricter}; parsed where llhttp refuses, by design: ${looser}`,
  );
  for (const id of Object.keys(LOOSER)) {
    if (!vectors.some((v) => v.id === id)) problems.push(`LOOSER names no vector: ${id}`);
  }
  for (const id of [...HOSTLESS, ...Object.keys(STRICTER)]) {
    if (!vectors.some((v) => v.id === id) && id.startsWith("request/")) {
      problems.push(`a table names no vector: ${id}`);
    }
  }
  assert.deepEqual(problems, []);
});

Deno.test("llhttp's response vectors: the client reads what llhttp reads, or refuses on purpose", async () => {
  const random = seeded(11);
  const vectors = corpus("response");
  const stub = answering();
  const problems: string[] = [];
  let stricter = 0;
  try {
    for (const v of vectors) {
      const log = readLog(v);
      if (log.unread !== undefined) continue;
      for (const side of ["fetch", "bytes"] as const) {
        const read = side === "fetch" ? fetchAnswer : bytesAnswer;
        stub.answer([v.input], false);
        const whole = await read(stub.origin);
        if (!v.meta.noScan) {
          stub.answer(cuts(v.input, 3, random), true);
          const again = await read(stub.origin);
          if (JSON.stringify(again.ok) !== JSON.stringify(whole.ok)) {
            problems.push(`${v.id} (${side}): cut in pieces it read otherwise`);
          }
        }
        const verdict = judgeAnswer(whole, log, side === "fetch");
        if (REPORT && verdict.kind !== "same") {
          console.log(
            "RES",
            v.id,
            side,
            lenient(v) ? "LENIENT" : "",
            verdict.kind,
            (verdict as { detail?: string }).detail?.slice(0, 200),
          );
        }
        const tabled = STRICTER[v.id]?.sides.includes(side);
        if (lenient(v)) {
          if (
            verdict.kind === "same" && whole.ok && !(v.id in VALID_WITHOUT_LENIENCY) ||
            verdict.kind === "looser"
          ) problems.push(`${v.id} (${side}): lenient vector accepted`);
          continue;
        }
        if (verdict.kind === "stricter") {
          stricter++;
          if (!tabled) {
            problems.push(`${v.id} (${side}): refused, not in STRICTER: ${verdict.detail}`);
          }
        } else if (verdict.kind !== "same") {
          problems.push(`${v.id} (${side}): ${verdict.kind}: ${verdict.detail}`);
        } else if (tabled) {
          problems.push(`${v.id} (${side}): in STRICTER but read as llhttp reads it`);
        }
      }
    }
  } finally {
    await stub.close();
  }
  console.log(
    `response vectors: ${vectors.length}, deliberately stricter (per reader): ${stricter}`,
  );
  for (const id of Object.keys(STRICTER)) {
    if (id.startsWith("response/") && !vectors.some((v) => v.id === id)) {
      problems.push(`STRICTER names no vector: ${id}`);
    }
  }
  assert.deepEqual(problems, []);
});
