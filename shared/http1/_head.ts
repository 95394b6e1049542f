/**
 * HTTP/1.1 heads, both kinds: a request's for the bytes engine (`server.ts`) and an answer's for
 * the client to the nodes (`client.ts`) and the WebSocket splice. Found and parsed from the
 * bytes as they came, strictly, since a proxy that reads a head differently from the server
 * behind it is how requests get smuggled and answers desynchronised. A request's refusal is a
 * {@linkcode HeadError} with the status to answer and a sentence naming what was wrong (the
 * connection is closed after it); an answer's is a TypeError "error reading response: …".
 *
 * @module
 */

/** A head the engine will not serve: answered with `status`, then the connection is closed. */
export class HeadError extends Error {
  /** 400, 431 (head too long), 501 (a transfer coding other than chunked) or 505. */
  readonly status: number;
  /** A head refused with `status` and the sentence `message`. */
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

/**
 * One parsed request head. Only what framing and routing need is decoded as it is parsed; the
 * header names and values are decoded when first asked for (the object path asks for all of
 * them, the bytes lane for a few, copying the rest as the bytes that came).
 */
export class RequestHead {
  /** The method, as sent (methods are case-sensitive). */
  readonly method: string;
  /** The request target: an origin-form path and query, an absolute URL, or `*`. */
  readonly target: string;
  /** HTTP/1.1 (true) or HTTP/1.0. */
  readonly http11: boolean;
  /** The body's length; `-1` for a chunked body; `0` when the request has none. */
  readonly contentLength: number;
  /** Whether the connection may carry another request after this one's answer. */
  readonly keepAlive: boolean;
  /** Whether the client waits for `100 Continue` before sending its body. */
  readonly expectContinue: boolean;
  /** The Host header ('' when absent, as HTTP/1.0 allows). */
  readonly host: string;
  /**
   * The head's bytes, request line to blank line: a view of the connection's buffer, valid until
   * the engine next reads a head (copy what must outlive the request's answer).
   */
  readonly raw: Uint8Array;
  /** Per header, four offsets into `raw`: its line's start, its colon, its value's start, end. */
  readonly spans: readonly number[];
  #names: string[] | undefined;
  #values: string[] | undefined;

  /** A head from the parser's fields and the connection buffer's bytes. */
  constructor(fields: {
    method: string;
    target: string;
    http11: boolean;
    contentLength: number;
    keepAlive: boolean;
    expectContinue: boolean;
    host: string;
    raw: Uint8Array;
    spans: number[];
  }) {
    this.method = fields.method;
    this.target = fields.target;
    this.http11 = fields.http11;
    this.contentLength = fields.contentLength;
    this.keepAlive = fields.keepAlive;
    this.expectContinue = fields.expectContinue;
    this.host = fields.host;
    this.raw = fields.raw;
    this.spans = fields.spans;
  }

  /** How many header lines the head has. */
  get count(): number {
    return this.spans.length / 4;
  }

  /** Header names, lowercased, in the order sent; `values[i]` is the value of `names[i]`. */
  get names(): string[] {
    if (this.#names === undefined) {
      const names: string[] = [];
      for (let i = 0; i < this.spans.length; i += 4) {
        names.push(octets(this.raw, this.spans[i], this.spans[i + 1]).toLowerCase());
      }
      this.#names = names;
    }
    return this.#names;
  }

  /** Header values, trimmed of surrounding whitespace. */
  get values(): string[] {
    if (this.#values === undefined) {
      const values: string[] = [];
      for (let i = 0; i < this.spans.length; i += 4) {
        values.push(octets(this.raw, this.spans[i + 2], this.spans[i + 3]));
      }
      this.#values = values;
    }
    return this.#values;
  }

  /** The value of the first header named `lower` (a lowercase name), or undefined. */
  get(lower: string): string | undefined {
    const i = this.find(lower);
    return i < 0 ? undefined : octets(this.raw, this.spans[i + 2], this.spans[i + 3]);
  }

  /**
   * Where the first header named `lower` is in `spans` (its value is `raw[spans[i + 2],
   * spans[i + 3])`), or -1: a value read from its bytes needs no string.
   */
  find(lower: string): number {
    const spans = this.spans, n = lower.length;
    for (let i = 0; i < spans.length; i += 4) {
      if (spans[i + 1] - spans[i] === n && sameName(this.raw, spans[i], spans[i + 1], lower)) {
        return i;
      }
    }
    return -1;
  }

  /** Header `i`'s whole line, CRLF included, as the bytes that came (a view of `raw`). */
  line(i: number): Uint8Array {
    const start = this.spans[4 * i];
    return this.raw.subarray(start, byteIndex(this.raw, 10, this.spans[4 * i + 3]) + 1);
  }
}

/**
 * Where byte `c` first is in `b[from, to)`, or -1. A loop, not `Uint8Array.prototype.indexOf`,
 * which leaves JavaScript for the runtime's C++ at each call: on the wire, the time the strict
 * head parse spent in the runtime's binary fell from 1.9 to 0.8 µs a request with this loop
 * (`perf` samples by the JS function that called in, docs/forwarding-engine.md).
 */
export function byteIndex(b: Uint8Array, c: number, from: number, to: number = b.length): number {
  for (let i = from; i < to; i++) if (b[i] === c) return i;
  return -1;
}

/** Whether `b[start, end)` is the name `lower`, ASCII case-insensitively. */
export function sameName(b: Uint8Array, start: number, end: number, lower: string): boolean {
  if (end - start !== lower.length) return false;
  for (let k = 0; k < lower.length; k++) {
    const c = b[start + k];
    if ((c >= 65 && c <= 90 ? c + 32 : c) !== lower.charCodeAt(k)) return false;
  }
  return true;
}

/** A Host value: `host[:port]`, the host a name, an IPv4 address or a bracketed IPv6 one. */
const HOST = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9\-._~!$&'()*+,;=%]*)(?::\d{0,5})?$/;

const TOKEN = (() => {
  const t = new Uint8Array(128);
  for (const c of "!#$%&'*+-.^_`|~") t[c.charCodeAt(0)] = 1;
  for (let c = 48; c <= 57; c++) t[c] = 1;
  for (let c = 65; c <= 90; c++) t[c] = 1;
  for (let c = 97; c <= 122; c++) t[c] = 1;
  return t;
})();

const TOKEN_TEXT = "[!#$%&'*+\\-.^_`|~0-9A-Za-z]+";
/** A quoted-string (RFC 9110 §5.6.4), its text one character a byte. */
const QUOTED_TEXT =
  '"(?:[\\t \\x21\\x23-\\x5b\\x5d-\\x7e\\x80-\\xff]|\\\\[\\t \\x21-\\x7e\\x80-\\xff])*"';
/**
 * A chunk-size line without its CRLF (RFC 9112 §7.1.1): the size in hex, then extensions, each
 * `;` and a token, with `=` and a token or a quoted string, whitespace allowed only around `;`
 * and `=`. A size followed by whitespace alone, a `;` with no name or an unclosed quote is no
 * chunk line: parsers that read those differently disagree on where the body ends.
 */
const CHUNK_LINE = new RegExp(
  `^([0-9a-fA-F]{1,13})(?:[ \\t]*;[ \\t]*${TOKEN_TEXT}` +
    `(?:[ \\t]*=[ \\t]*(?:${TOKEN_TEXT}|${QUOTED_TEXT}))?)*$`,
);

/** The chunk size a chunk-size line (one character a byte, no CRLF) gives, or -1 for none. */
export function chunkSize(line: string): number {
  const m = CHUNK_LINE.exec(line);
  return m === null ? -1 : parseInt(m[1], 16);
}

/**
 * Where the head in `b[from, to)` ends (the index after its blank line), or -1 while it is not all
 * there. Empty lines before a request line are skipped by the caller (RFC 9112 §2.2).
 */
export function headEnd(b: Uint8Array, from: number, to: number): number {
  // Byte by byte: a view and an indexOf call per line took three times as long on a usual head.
  for (let i = from + 1; i < to; i++) {
    if (b[i] !== 10) continue;
    // A blank line after a line's end: CRLF CRLF, or one with a bare LF in it (LF CRLF, CRLF LF,
    // LF LF), which is found here so that parse refuses it rather than waiting for more.
    if (b[i - 1] === 10 || (i - from >= 2 && b[i - 1] === 13 && b[i - 2] === 10)) return i + 1;
  }
  return -1;
}

/**
 * Where the first CRLF CRLF in `b[from, to)` starts, or -1: the end of a head read strictly (an
 * answer's from a next hop; a request's is `headEnd`, which also finds the bare-LF shapes it
 * refuses).
 */
export function blankLineAt(b: Uint8Array, from: number, to: number = b.length): number {
  for (let i = from; i + 3 < to; i++) {
    if (b[i] === 13 && b[i + 1] === 10 && b[i + 2] === 13 && b[i + 3] === 10) return i;
  }
  return -1;
}

/** Latin-1 text of `b[from, to)`: header bytes are octets, and Headers takes them as such. */
export function octets(b: Uint8Array, from: number, to: number): string {
  if (to - from < 4096) {
    // All of `b` (a lane's body) is read as it is: a view of the whole is one more object.
    const v = from === 0 && to === b.length ? b : b.subarray(from, to);
    return String.fromCharCode.apply(null, v as unknown as number[]);
  }
  let s = "";
  for (let i = from; i < to; i += 4096) {
    s += String.fromCharCode.apply(
      null,
      b.subarray(i, Math.min(to, i + 4096)) as unknown as number[],
    );
  }
  return s;
}

/** Recently decoded short fields (methods, targets, hosts), by a hash of their bytes. */
const recent: (string | undefined)[] = new Array(256);

/**
 * `octets(b, from, to)`, as the same string as last time when these bytes were decoded lately: a
 * keep-alive client sends the same method, Host and a few targets again and again, and comparing
 * bytes costs less than making a string (with its view) each time.
 */
export function recentOctets(b: Uint8Array, from: number, to: number): string {
  const n = to - from;
  if (n === 0 || n > 96) return octets(b, from, to);
  const slot = (n * 31 + b[from] * 7 + b[to - 1] * 3 + b[from + (n >> 1)]) & 255;
  const seen = recent[slot];
  if (seen !== undefined && seen.length === n) {
    let k = 0;
    while (k < n && seen.charCodeAt(k) === b[from + k]) k++;
    if (k === n) return seen;
  }
  const made = octets(b, from, to);
  recent[slot] = made;
  return made;
}

/** Whether `b[from, to)` is `HTTP/1.<minor>`. */
function isVersion(b: Uint8Array, from: number, to: number, minor: number): boolean {
  return to - from === 8 && b[from] === 72 && b[from + 1] === 84 && b[from + 2] === 84 &&
    b[from + 3] === 80 && b[from + 4] === 47 && b[from + 5] === 49 && b[from + 6] === 46 &&
    b[from + 7] === minor;
}

/** The number `b[from, to)` spells in at most 15 digits, or -1 when it is not one. */
export function digitsAt(b: Uint8Array, from: number, to: number): number {
  if (to <= from || to - from > 15) return -1;
  let n = 0;
  for (let i = from; i < to; i++) {
    const c = b[i];
    if (c < 48 || c > 57) return -1;
    n = n * 10 + c - 48;
  }
  return n;
}

/** The last Host that passed the check, which a keep-alive client sends again unchanged. */
let hostPassed = "";

const bad = (what: string) =>
  new HeadError(400, `Bad request head: ${what}. Send an HTTP/1.1 request (RFC 9112)`);

/**
 * Parses the head in `b[from, end)` (`end` from {@linkcode headEnd}).
 *
 * @throws {HeadError} for anything RFC 9112 refuses, or a proxy must: a bare LF, obs-fold,
 *   whitespace before a colon, a control character in a field, both Content-Length and
 *   Transfer-Encoding, differing Content-Lengths, a transfer coding other than `chunked`.
 */
export function parseHead(b: Uint8Array, from: number, end: number): RequestHead {
  if (b[end - 2] !== 13 || b[end - 3] !== 10 || b[end - 4] !== 13) {
    throw bad("a line ends with a bare LF");
  }
  // The request line.
  let i = from;
  const lineEnd = byteIndex(b, 10, from, end);
  if (lineEnd < from + 1 || b[lineEnd - 1] !== 13) throw bad("a line ends with a bare LF");
  while (i < lineEnd && b[i] < 128 && TOKEN[b[i]] === 1) i++;
  if (i === from || b[i] !== 32) throw bad("the request line has no method");
  const method = recentOctets(b, from, i);
  const targetStart = ++i;
  let query = false;
  while (i < lineEnd - 1 && b[i] > 32 && b[i] < 127) {
    if (b[i] === 63) query = true;
    i++;
  }
  if (i === targetStart || b[i] !== 32) throw bad("the request line has no target");
  // A query may carry a signature: it is not kept for later requests.
  const target = query ? octets(b, targetStart, i) : recentOctets(b, targetStart, i);
  let http11: boolean;
  const version = isVersion(b, i + 1, lineEnd - 1, 49)
    ? "HTTP/1.1"
    : isVersion(b, i + 1, lineEnd - 1, 48)
    ? "HTTP/1.0"
    : octets(b, i + 1, lineEnd - 1);
  if (version === "HTTP/1.1") http11 = true;
  else if (version === "HTTP/1.0") http11 = false;
  else if (/^HTTP\/\d(\.\d)?$/.test(version)) {
    throw new HeadError(505, `HTTP version '${version}' is not served here: use HTTP/1.1`);
  } else throw bad(`the request line ends with '${version.slice(0, 20)}', not a version`);
  if (target[0] !== "/" && target !== "*" && !/^https?:\/\//i.test(target)) {
    throw bad(`the target '${target.slice(0, 40)}' is not a path or an absolute URL`);
  }

  const spans: number[] = [];
  let contentLength = -2;
  let transferEncoding: string | undefined;
  let connection = "";
  let expect = "";
  let host: string | undefined;
  let at = lineEnd + 1;
  const stop = end - 2; // the blank line's CRLF
  while (at < stop) {
    const nl = byteIndex(b, 10, at, end);
    if (nl < 0 || b[nl - 1] !== 13) throw bad("a line ends with a bare LF");
    const first = b[at];
    if (first === 32 || first === 9) throw bad("a header line is folded (obs-fold)");
    let j = at;
    while (j < nl && b[j] < 128 && TOKEN[b[j]] === 1) j++;
    if (j === at || b[j] !== 58) {
      throw bad(
        b[j] === 32 || b[j] === 9
          ? "a header name is followed by whitespace before its colon"
          : "a header line has no name and colon",
      );
    }
    let v = j + 1, w = nl - 1;
    while (v < w && (b[v] === 32 || b[v] === 9)) v++;
    while (w > v && (b[w - 1] === 32 || b[w - 1] === 9)) w--;
    for (let k = v; k < w; k++) {
      const c = b[k];
      if ((c < 32 && c !== 9) || c === 127) {
        throw bad(`header '${octets(b, at, j).toLowerCase()}' holds a control character`);
      }
    }
    spans.push(at - from, j - from, v - from, w - from);
    // Only the names that frame or route the request are decoded here.
    const n = j - at;
    if (n === 14 && sameName(b, at, j, "content-length")) {
      // One plain number, the usual value, is read from the bytes.
      const plain = digitsAt(b, v, w);
      if (plain >= 0 && (contentLength === -2 || contentLength === plain)) {
        contentLength = plain;
        at = nl + 1;
        continue;
      }
      const value = octets(b, v, w);
      // A list of equal values is one value (RFC 9110 §8.6); anything else is refused.
      for (const part of value.split(",")) {
        const digits = part.trim();
        if (!/^\d{1,16}$/.test(digits) || !Number.isSafeInteger(Number(digits))) {
          throw bad(`Content-Length '${value.slice(0, 20)}' is not a length`);
        }
        const length = Number(digits);
        if (contentLength !== -2 && contentLength !== length) {
          throw bad("two Content-Length values differ");
        }
        contentLength = length;
      }
    } else if (n === 17 && sameName(b, at, j, "transfer-encoding")) {
      const value = octets(b, v, w);
      transferEncoding = transferEncoding === undefined ? value : `${transferEncoding},${value}`;
    } else if (n === 10 && sameName(b, at, j, "connection")) {
      connection += `,${octets(b, v, w).toLowerCase()}`;
    } else if (n === 6 && sameName(b, at, j, "expect")) {
      expect = octets(b, v, w).toLowerCase();
    } else if (n === 4 && sameName(b, at, j, "host")) {
      if (host !== undefined) throw bad("the request has two Host headers");
      host = recentOctets(b, v, w);
    }
    at = nl + 1;
  }
  if (transferEncoding !== undefined) {
    if (contentLength !== -2) {
      throw bad("the request has both Content-Length and Transfer-Encoding");
    }
    if (!http11) throw bad("Transfer-Encoding is not allowed in HTTP/1.0");
    if (transferEncoding.trim().toLowerCase() !== "chunked") {
      throw new HeadError(
        501,
        `Transfer-Encoding '${transferEncoding.slice(0, 40)}' is not served: send the body ` +
          "with Content-Length or Transfer-Encoding: chunked alone",
      );
    }
    contentLength = -1;
  }
  if (http11 && host === undefined) throw bad("an HTTP/1.1 request must carry a Host header");
  if (host !== undefined && host !== hostPassed) {
    if (!HOST.test(host)) throw bad(`the Host '${host.slice(0, 40)}' is not a host[:port]`);
    hostPassed = host;
  }
  // No Connection header, the usual HTTP/1.1 request, asks for no pattern.
  const closes = connection !== "" && /(^|,)\s*close\s*(,|$)/.test(connection);
  const keepAlive = http11
    ? !closes
    : connection !== "" && /(^|,)\s*keep-alive\s*(,|$)/.test(connection) && !closes;
  if (expect !== "" && expect !== "100-continue") {
    throw new HeadError(417, `Expect '${expect.slice(0, 40)}' is not served: only 100-continue is`);
  }
  return new RequestHead({
    method,
    target,
    http11,
    contentLength: contentLength === -2 ? 0 : contentLength,
    keepAlive,
    expectContinue: http11 && expect === "100-continue",
    host: host ?? "",
    raw: b.subarray(from, end),
    spans,
  });
}

/**
 * An answer head as bytes, read by the client to the nodes: the status and the framing headers
 * decoded, every other line left as bytes for the bytes lane to relay without a Headers object.
 */
export interface RawHead {
  /** The answer's status code. */
  status: number;
  /** Whether the answer is HTTP/1.1 (not 1.0). */
  http11: boolean;
  /**
   * The head's bytes, status line to blank line: a view of the connection's buffer, valid only
   * until the body is first read (copy it out before).
   */
  raw: Uint8Array;
  /** Where the status line ends (after its CRLF), in `raw`. */
  statusEnd: number;
  /** Per header line, three offsets in `raw`: its start, its colon, its end after the CRLF. */
  spans: number[];
  /** The Content-Length when it was a plain number (read from its digits), else undefined. */
  length: number | undefined;
  /** Any other Content-Length value, as text (the client refuses what is no length). */
  contentLength: string | undefined;
  /** The Transfer-Encoding lines' values, joined by ", " as `Headers.get` joins them. */
  transferEncoding: string | undefined;
  /** The Connection lines' values, each after a comma. */
  connection: string;
}

/** `HTTP/1.` as bytes: an answer's version is case-sensitive. */
const HTTP1 = [72, 84, 84, 80, 47, 49, 46];

function isDigit(c: number): boolean {
  return c >= 48 && c <= 57;
}

/** The error of an answer head HTTP/1.1 does not allow. */
function badAnswer(what: string): TypeError {
  return new TypeError(`error reading response: ${what}`);
}

/**
 * Parses an answer head, `raw` being its bytes from the status line through the blank line.
 * Held to the request side's rules where they guard the framing: every line ends with CRLF, a
 * header line is a token name, a colon and a value without CR, LF or NUL, no line is folded,
 * and two Content-Lengths must agree. (A Transfer-Encoding beside a Content-Length is allowed
 * in an answer, where the coding wins, RFC 9112 §6.3.)
 *
 * @throws {TypeError} "error reading response: …" for a head that breaks them.
 */
export function parseAnswerHead(raw: Uint8Array): RawHead {
  const statusEnd = byteIndex(raw, 10, 0) + 1;
  // "HTTP/1.x NNN" and a CRLF: the rest of the status line is the reason, passed on as it came.
  // Read from the bytes: a TextDecoder call per answer was two calls into the runtime.
  let ok = statusEnd >= 14 && raw[statusEnd - 2] === 13 && (raw[7] === 48 || raw[7] === 49) &&
    raw[8] === 32 && (raw[12] === 32 || raw[12] === 13) && isDigit(raw[9]) &&
    isDigit(raw[10]) && isDigit(raw[11]);
  for (let i = 0; ok && i < HTTP1.length; i++) ok = raw[i] === HTTP1[i];
  const status = ok ? (raw[9] - 48) * 100 + (raw[10] - 48) * 10 + raw[11] - 48 : NaN;
  if (!(status >= 100)) {
    const line = octets(raw, 0, Math.min(raw.length, 80)).split(/[\r\n]/)[0];
    throw badAnswer(`bad status line '${line}'`);
  }
  const spans: number[] = [];
  let contentLength: string | undefined, transferEncoding: string | undefined, connection = "";
  let length: number | undefined;
  const stop = raw.length - 2;
  for (let at = statusEnd; at < stop;) {
    const nl = byteIndex(raw, 10, at);
    let colon = at;
    while (colon < nl && raw[colon] < 128 && TOKEN[raw[colon]] === 1) colon++;
    if (nl <= at || raw[nl - 1] !== 13 || colon === at || raw[colon] !== 58) {
      throw badAnswer("bad header line");
    }
    for (let k = colon; k < nl - 1; k++) {
      if (raw[k] === 13 || raw[k] === 0) throw badAnswer("bad header line");
    }
    spans.push(at, colon, nl + 1);
    const n = colon - at;
    // The framing headers' values only (a closure per line to decode one was a heap object).
    if (n === 14 && sameName(raw, at, colon, "content-length")) {
      // The usual value, digits between optional blanks, is read from the bytes: no string.
      const plain = digitsBetweenBlanks(raw, colon + 1, nl - 1);
      const text = plain === undefined ? octets(raw, colon + 1, nl - 1).trim() : undefined;
      if (
        (length !== undefined || contentLength !== undefined) &&
        (plain !== length || text !== contentLength)
      ) {
        throw badAnswer("two Content-Length values differ");
      }
      length = plain;
      contentLength = text;
    } else if (n === 17 && sameName(raw, at, colon, "transfer-encoding")) {
      const value = octets(raw, colon + 1, nl - 1).trim();
      transferEncoding = transferEncoding === undefined ? value : `${transferEncoding}, ${value}`;
    } else if (n === 10 && sameName(raw, at, colon, "connection")) {
      connection += `,${octets(raw, colon + 1, nl - 1).trim()}`;
    }
    at = nl + 1;
  }
  return {
    status,
    http11: raw[7] === 49,
    raw,
    statusEnd,
    spans,
    length,
    contentLength,
    transferEncoding,
    connection,
  };
}

/** The number `b[from, to)` spells: at most 15 digits between spaces or tabs; else undefined. */
function digitsBetweenBlanks(b: Uint8Array, from: number, to: number): number | undefined {
  while (from < to && (b[from] === 32 || b[from] === 9)) from++;
  while (to > from && (b[to - 1] === 32 || b[to - 1] === 9)) to--;
  const n = digitsAt(b, from, to);
  return n < 0 ? undefined : n;
}
