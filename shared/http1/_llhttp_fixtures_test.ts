/**
 * Reads nodejs/llhttp's test vectors (`testdata/llhttp/`, MIT, see SOURCE.md there): each `.md`
 * file holds tests, a heading, a `<!-- meta={...} -->` comment naming the type, an `http` block
 * with the input and a `log` block with the events llhttp emits for it. This module turns them
 * into bytes and into the messages the log says were parsed; llhttp_vectors_test.ts replays
 * them. Holds no tests itself.
 *
 * @module
 */

/** One vector as its file states it. */
export interface Vector {
  /** `request/invalid.md:412 Headers separated by CR`: where to find it. */
  id: string;
  file: string;
  line: number;
  name: string;
  meta: { type: string; noScan?: boolean; mode?: string };
  /** The input, decoded to the bytes llhttp is fed. */
  input: Uint8Array;
  /** The log block's lines. */
  log: string[];
}

/** One message the log says llhttp parsed (or began to). */
export interface LoggedMessage {
  method: string;
  url: string;
  status: number;
  version: string;
  /** Header fields and values, each the concatenation of its spans (a folded value's pieces). */
  headers: [string, string][];
  body: Uint8Array;
  /** `headers complete` was logged. */
  headed: boolean;
  /** `message complete` was logged. */
  complete: boolean;
  /** Where the message began in the input. */
  begin: number;
  /** The `flags=` of `headers complete` (llhttp's F_* bits). */
  flags: number;
}

/** What a log says of its input. */
export interface Logged {
  messages: LoggedMessage[];
  /** The parse error, if any, and how many messages had completed before it. */
  error?: { code: number; reason: string; after: number };
  /** llhttp stopped at an upgrade or CONNECT (its "Pause on CONNECT/Upgrade", code 22). */
  upgraded: boolean;
  /** A line this reader does not understand (a regular expression): the vector is skipped. */
  unread?: string;
}

const encoder = new TextEncoder();

/**
 * The bytes of an `http` block, by the rules the vector files are written to (llhttp's README of
 * its tests): the block's last newline dropped; a backslash before a newline joins the lines;
 * every newline is CRLF; then `\r`, `\n`, `\t`, `\f`, `\xHH…` and octal `\ooo` stand for their
 * characters, each rule applied to the text the previous one left; `${…}` is a JavaScript
 * expression (only `"x".repeat(n)` forms occur); the text is then sent as UTF-8.
 */
export function decodeInput(block: string): Uint8Array {
  let text = block.replace(/\n$/, "");
  text = text.replace(/\\(\r\n|\r|\n)/g, "");
  text = text.replace(/\r\n|\r|\n/g, "\r\n");
  text = text.replace(/\\r/g, "\r");
  text = text.replace(/\\n/g, "\n");
  text = text.replace(/\\t/g, "\t");
  text = text.replace(/\\f/g, "\f");
  text = text.replace(/\\x([0-9a-fA-F]+)/g, (_, hex) => String.fromCharCode(parseInt(hex, 16)));
  text = text.replace(/\\([0-7]{1,3})/g, (_, oct) => String.fromCharCode(parseInt(oct, 8)));
  text = text.replace(/\$\{(.+?)\}/g, (_, code: string) => evaluate(code));
  return encoder.encode(text);
}

/** The expressions the files use inside `${…}`: a quoted string repeated n times. */
function evaluate(code: string): string {
  const m = /^\s*(['"])(.*?)\1\.repeat\((\d+)\)\s*$/.exec(code);
  if (m === null) throw new Error(`Cannot evaluate the vector expression '${code}'`);
  return m[2].repeat(Number(m[3]));
}

/** Every vector in the text of one `.md` file (`file` names it in ids). */
export function readVectors(file: string, text: string): Vector[] {
  const lines = text.split("\n");
  const out: Vector[] = [];
  let heading = "";
  let meta: Vector["meta"] | undefined;
  let metaLine = 0;
  let http: string | undefined;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const h = /^#{1,6}\s+(.*)$/.exec(line);
    if (h !== null) {
      heading = h[1].trim();
      continue;
    }
    // A heading underlined with `===`: the file's title, no test's name.
    const m = /^<!--\s*meta=(\{.*\})\s*-->/.exec(line);
    if (m !== null) {
      meta = JSON.parse(m[1]);
      metaLine = i + 1;
      http = undefined;
      continue;
    }
    const fence = /^```(\w+)\s*$/.exec(line);
    if (fence === null) continue;
    const body: string[] = [];
    let j = i + 1;
    while (j < lines.length && lines[j] !== "```") body.push(lines[j++]);
    i = j;
    const content = body.join("\n") + "\n";
    if (fence[1] === "http") http = content;
    else if (fence[1] === "log" && meta !== undefined && http !== undefined) {
      out.push({
        id: `${file}:${metaLine} ${heading}`,
        file,
        line: metaLine,
        name: heading,
        meta,
        input: decodeInput(http),
        log: body,
      });
      meta = undefined;
      http = undefined;
    }
  }
  return out;
}

/**
 * A span's value as the log prints it: the bytes as they were, but for a tab and a form feed,
 * printed `\\t` and `\\f` (a quote or a backslash inside is printed as it is).
 */
export function spanValue(printed: string): string {
  return printed.replace(/\\t/g, "\t").replace(/\\f/g, "\f");
}

/** A span line; a lone CR or LF byte is printed bare, as `cr` or `lf`. */
const SPAN = /^off=(\d+) len=(\d+) span\[(\w+)\]=(?:"(.*)"|(cr|lf))$/;

/** The value of a matched span line. */
function spanOf(m: RegExpExecArray): string {
  return m[5] === "cr" ? "\r" : m[5] === "lf" ? "\n" : spanValue(m[4]);
}

/**
 * Whether the log's spans are where its input has them: `len` bytes at `off` spell the span's
 * value. A check of the copy (a byte lost in transcription shows here), not of any parser.
 * Returns the first span that does not match, or undefined.
 */
export function misplacedSpan(vector: Vector): string | undefined {
  for (const line of vector.log) {
    const m = SPAN.exec(line);
    if (m === null) continue;
    const off = Number(m[1]), len = Number(m[2]);
    const want = encoder.encode(spanOf(m));
    const got = vector.input.subarray(off, off + len);
    // A value printed with characters past Latin-1 was printed from UTF-8 bytes as they were.
    const same = got.length === len && want.length === len && got.every((b, k) => b === want[k]);
    if (!same) return line;
  }
  return undefined;
}

/**
 * The messages, error and upgrade the log of `vector` records. A log without method spans (an
 * older file's) names the method by number: it is then read from the input, where the message
 * began.
 */
export function readLog(vector: Pick<Vector, "log" | "input">): Logged {
  const { log, input } = vector;
  const messages: LoggedMessage[] = [];
  let current: LoggedMessage | undefined;
  let field: string | undefined;
  let upgraded = false;
  let error: Logged["error"];
  const decoder = new TextDecoder();
  const fresh = (): LoggedMessage => ({
    method: "",
    url: "",
    status: 0,
    version: "",
    headers: [],
    body: new Uint8Array(0),
    headed: false,
    complete: false,
    flags: 0,
    begin: 0,
  });
  for (const line of log) {
    if (line.startsWith("/")) return { messages, upgraded, error, unread: line };
    const rest = line.replace(/^off=\d+ /, "");
    if (rest === "message begin") {
      const at = Number(/^off=(\d+)/.exec(line)![1]);
      current = fresh();
      current.begin = at;
      messages.push(current);
      field = undefined;
      continue;
    }
    current ??= (messages.push(fresh()), messages[messages.length - 1]);
    const span = SPAN.exec(line);
    if (span !== null) {
      const value = spanOf(span);
      const kind = span[3];
      if (kind === "method") current.method += value;
      else if (kind === "url") current.url += value;
      else if (kind === "version") current.version += value;
      else if (kind === "status") { /* the reason phrase */ }
      else if (kind === "header_field" && !current.headed) {
        if (field === undefined) {
          current.headers.push([value, ""]);
          field = "";
        } else current.headers[current.headers.length - 1][0] += value;
      } else if (kind === "header_value" && !current.headed) {
        current.headers[current.headers.length - 1][1] += value;
      } else if (kind === "body") {
        const piece = encoder.encode(value);
        const joined = new Uint8Array(current.body.length + piece.length);
        joined.set(current.body);
        joined.set(piece, current.body.length);
        current.body = joined;
      }
      continue;
    }
    if (rest === "header_field complete" || rest === "header_value complete") {
      if (rest === "header_value complete") field = undefined;
      continue;
    }
    const headers = /^headers complete (?:method=\d+|status=(\d+)) v=(\d+)\/(\d+) flags=([0-9a-f]+)/
      .exec(rest);
    if (headers !== null) {
      current.headed = true;
      if (current.method === "" && headers[1] === undefined) {
        let end = current.begin;
        while (end < input.length && input[end] !== 32) end++;
        current.method = decoder.decode(input.subarray(current.begin, end));
      }
      if (headers[1] !== undefined) current.status = Number(headers[1]);
      if (current.version === "") current.version = `${headers[2]}.${headers[3]}`;
      current.flags = parseInt(headers[4], 16);
      continue;
    }
    if (rest === "message complete") {
      current.complete = true;
      continue;
    }
    const e = /^error code=(\d+) reason="(.*)"$/.exec(rest);
    if (e !== null) {
      const code = Number(e[1]);
      if (code === 22) upgraded = true;
      else error = { code, reason: e[2], after: messages.filter((m) => m.complete).length };
      break;
    }
  }
  return { messages, upgraded, error };
}
