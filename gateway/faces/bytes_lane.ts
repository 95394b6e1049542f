/**
 * The bytes lane: the routed verbs (`execCommand`, `readFile`, …) served from their bytes when the
 * gateway listens with the bytes engine (`shared/http1/server.ts`). No Request, Headers or Response
 * is made: the client's head and body are checked as they came, the node's request is written as
 * bytes on one of the HTTP/1.1 client's pooled connections, and the node's answer goes back as it
 * arrives. Building those objects was most of what stood between the gateway and nginx's figures
 * (docs/forwarding-engine.md).
 *
 * It serves only what it can serve exactly as the object path would: a caller the bearer names,
 * a body that is one JSON object in valid UTF-8 passing the verb's schema, a sandbox the Finder
 * has cached on a node that checks in, reached over plain http. Anything else (a 401, a 400, a
 * cache miss with its lookup round, a silent node's 503) is handed back to the object path with
 * the body already read, before any byte reaches a node, so the answers and their dialect are
 * the object path's own.
 *
 * Once the node is asked it keeps the forwarding rules of `gateway/routing/forward.ts`: the head's
 * bound and a node gone silent end the wait with a 504 (the routing's `HangUpWatch`), a client's
 * hang-up reaches the node's request, a node's 404 makes the Finder re-check the sandbox before the
 * answer goes out, the answer's head goes out before its first body byte, and every forward is told
 * to the routing's observer (metrics, lifecycle events).
 *
 * @module
 */
import {
  type BytesAnswer,
  type BytesLane,
  Carver,
  type H1Client,
  type LaneExchange,
  octets,
  type RawHead,
  sameName,
  writeBody,
} from "../../shared/http1/mod.ts";
import { HttpError } from "../../shared/http_error.ts";
import { ABSENT_HEADER } from "../../shared/native_schemas.ts";
import { hopByHopHeaders } from "../../shared/port_proxy.ts";
import { teamScopedName } from "../../shared/teams.ts";
import { DEFAULT_JSON_BODY_LIMIT_BYTES } from "../../shared/json_body.ts";
import { type Caller, decodedBearerCheck, scopeOf, teamOf } from "../keys/auth.ts";
import { HOP_HEADER, nextHop } from "../door.ts";
import type { FindOne } from "../finder/finder.ts";
import { answerHopByHop, unreachable } from "../routing/forward.ts";
import { LruCache } from "../../shared/lru.ts";
import { BodyMemo } from "./body_memo.ts";
import type { GatewayParts } from "./parts.ts";
import { statusOf } from "../routing/answers.ts";

/** One verb the lane serves. */
export interface LaneVerb {
  /** The verb's body schema; its output names the sandbox. */
  schema: { safeParse(v: unknown): { success: boolean; data?: { name: string } } };
  /** The bound on the node's head a body asks for (`execCommand`'s timeout), if any. */
  headBound?(value: object): number | undefined;
}

/** Options of {@linkcode createBytesLane}. */
export interface BytesLaneOptions {
  /** The gateway's parts: the routing, the Finder, the Fleet, `identify`, the JSON cap. */
  parts: GatewayParts;
  /** The HTTP/1.1 client the routing reaches nodes with; its pools carry the lane's requests. */
  client: H1Client;
  /** The verbs, by exact path (`/execCommand`). */
  verbs: ReadonlyMap<string, LaneVerb>;
  /** The face's answer to an error once a node was asked (a 502, a 504), in its dialect. */
  answerError(error: unknown): Response;
}

/**
 * The largest body the lane reads whole: 1 MiB. The routed verbs' usual bodies are a few hundred
 * bytes; a file's content in `writeFile` is larger, and the object path reads it under its cap.
 */
const LANE_BODY_MAX = 1024 * 1024;
const encoder = new TextEncoder();
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const CHUNKED_HEAD_END = encoder.encode("transfer-encoding: chunked\r\n\r\n");
const LENGTH_NAME = encoder.encode("content-length: ");
/** Client headers the node's request does not carry: the hop's own and the hop marker. */
const notPassed = [...hopByHopHeaders, HOP_HEADER];

/** The body as one JSON object, or undefined when the object path must say what is wrong. */
function jsonObject(body: Uint8Array): object | undefined {
  // An empty body, a byte-order mark or bytes that are not UTF-8 are decoded by the object path
  // into text it then forwards: only bytes that are that text already are passed on as they are.
  if (body.length === 0 || (body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf)) {
    return undefined;
  }
  // ASCII, the usual body, is decoded without a call into the runtime.
  let ascii = body.length <= 4096;
  for (let i = 0; ascii && i < body.length; i++) if (body[i] > 127) ascii = false;
  try {
    const value = JSON.parse(ascii ? octets(body, 0, body.length) : utf8.decode(body));
    return value !== null && typeof value === "object" && !Array.isArray(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

/** Digits of `n` written at `out[at]`; the index after them. */
function putDigits(out: Uint8Array, at: number, n: number): number {
  const digits = String(n);
  for (let i = 0; i < digits.length; i++) out[at++] = digits.charCodeAt(i);
  return at;
}

/** How many bytes `content-length: <n>` and the blank line take. */
function lengthLineSize(n: number): number {
  return LENGTH_NAME.length + String(n).length + 4;
}

/**
 * Writes `content-length: <n>` and the blank line at `out[at]`, byte by byte: TextEncoder's
 * call into the runtime was 0.75 µs a line, a twentieth of the lane's JavaScript per request.
 */
function putLengthLine(out: Uint8Array, at: number, n: number): number {
  out.set(LENGTH_NAME, at);
  at = putDigits(out, at + LENGTH_NAME.length, n);
  out[at++] = 13;
  out[at++] = 10;
  out[at++] = 13;
  out[at++] = 10;
  return at;
}

/**
 * Lowercase header names, found by the length of the name asked about first: a header is then
 * compared with the one or two names of its length, where a walk through every name was a
 * twentieth of the lane's JavaScript (most of the comparisons failing on the length).
 */
class NameSet {
  readonly #byLength: (string[] | undefined)[] = [];

  constructor(lowers: readonly string[]) {
    for (const name of new Set(lowers)) (this.#byLength[name.length] ??= []).push(name);
  }

  /** Whether the name in `b[start, end)` is one of these, ASCII case-insensitively. */
  has(b: Uint8Array, start: number, end: number): boolean {
    const same = this.#byLength[end - start];
    if (same === undefined) return false;
    for (let i = 0; i < same.length; i++) if (sameName(b, start, end, same[i])) return true;
    return false;
  }
}

/** Node answer headers the client's answer does not carry: the hop's own; framing is redone. */
const notRelayed = new NameSet([...answerHopByHop, "transfer-encoding", "content-length"]);

/**
 * Whether the node's answer head goes to the client as it came: HTTP/1.1, framed by one
 * Content-Length of plain digits (what the relay would write again), with no other header the
 * relay drops. The node's usual answer (content type, length, date) is.
 */
function asItCame(head: RawHead): boolean {
  if (!head.http11 || head.length === undefined || head.status === 204 || head.status === 304) {
    return false;
  }
  const { raw, spans } = head;
  let lengths = 0;
  for (let i = 0; i < spans.length; i += 3) {
    const start = spans[i], colon = spans[i + 1];
    if (!notRelayed.has(raw, start, colon)) continue;
    if (colon - start !== 14 || !sameName(raw, start, colon, "content-length")) return false;
    lengths++;
  }
  return lengths === 1;
}

/** Whether the node's answer head has a line named `lower`. */
function hasLine(head: RawHead, lower: string): boolean {
  const { raw, spans } = head;
  for (let i = 0; i < spans.length; i += 3) {
    if (spans[i + 1] - spans[i] === lower.length && sameName(raw, spans[i], spans[i + 1], lower)) {
      return true;
    }
  }
  return false;
}

/**
 * The header lines of `raw` that are kept, as runs `[from, to)` of adjacent lines: `spans` has
 * `stride` offsets per line, the first its start, the second its colon; a line ends where the
 * next starts, the last at `end`. One run is one copy, where a copy per line was one more view.
 */
function keptRuns(
  raw: Uint8Array,
  spans: readonly number[],
  stride: number,
  end: number,
  dropped: NameSet,
  runs: number[],
): number {
  runs.length = 0;
  let size = 0;
  let from = -1;
  for (let i = 0; i < spans.length; i += stride) {
    const start = spans[i];
    if (dropped.has(raw, start, spans[i + 1])) {
      if (from >= 0) {
        runs.push(from, start);
        size += start - from;
        from = -1;
      }
    } else if (from < 0) from = start;
  }
  if (from >= 0) {
    runs.push(from, end);
    size += end - from;
  }
  return size;
}

/** Copies the runs of `raw` to `out[at]`; the index after them. */
function putRuns(out: Uint8Array, at: number, raw: Uint8Array, runs: readonly number[]): number {
  for (let i = 0; i < runs.length; i += 2) {
    out.set(raw.subarray(runs[i], runs[i + 1]), at);
    at += runs[i + 1] - runs[i];
  }
  return at;
}

/** The lane, with its counts (tests and the operator's view read them). */
export interface GatewayBytesLane extends BytesLane<Caller> {
  /** Requests the lane served itself, from their bytes. */
  readonly served: number;
  /** Requests it claimed and handed back to the object path (a 401, a bad body, a cache miss). */
  readonly handedBack: number;
}

/**
 * Builds the lane over the gateway's parts.
 *
 * @example
 * ```ts ignore
 * const lane = createBytesLane({ parts, client, verbs, answerError });
 * serveGuarded({ hostname, port, handler: gateway.fetch, engine: "bytes", lane });
 * ```
 */
export function createBytesLane(options: BytesLaneOptions): GatewayBytesLane {
  const { parts, client, verbs, answerError } = options;
  const { routing, finder, fleet } = parts;
  const identifyBearer = parts.identifyBearer ?? decodedBearerCheck(parts.identify);
  // Read whole before it is parsed: a larger body streams through the object path's reader.
  const maxBodyBytes = Math.min(
    parts.jsonBodyCap.maxBytes ?? DEFAULT_JSON_BODY_LIMIT_BYTES,
    LANE_BODY_MAX,
  );

  // Encoded once: the request line and Host per verb and node, the node's own headers per team,
  // the hop marker (this gateway's request never carries one in: `claim` leaves those out).
  // Looked up by the strings the request already holds (the verb's path, the node's endpoint),
  // whose hashes are kept: a key made of the two was a string to hash each request. An endpoint
  // holds one entry per verb; past 4096 endpoints the oldest are dropped.
  const prefixes = new LruCache<string, Map<string, Uint8Array>>({ max: 4096 });
  const owns = new LruCache<string, { bytes: Uint8Array; replaced: NameSet }>({
    max: 1024,
  });
  const hopLine = encoder.encode(`${HOP_HEADER}: ${nextHop(null, routing.hop)}\r\n`);
  // The runs of header lines kept, reused by each request (they are read before the next).
  const runs: number[] = [];
  const carver = new Carver();
  // What each verb's schema made of a small body lately, by its bytes: a polling client's body
  // is then neither parsed nor checked again.
  const bodies = new BodyMemo<{ name: string }>();

  /** The node's request: the client's end-to-end header lines as sent, the node's own, the hop. */
  const nodeRequest = (ex: LaneExchange, path: string, endpoint: string, caller: Caller) => {
    const { head, body } = ex;
    let byPath = prefixes.peek(endpoint);
    if (byPath === undefined) prefixes.set(endpoint, byPath = new Map());
    let prefix = byPath.get(path);
    if (prefix === undefined) {
      const host = endpoint.slice(7).replace(/\/.*$/, "");
      prefix = encoder.encode(`POST ${path} HTTP/1.1\r\nhost: ${host}\r\n`);
      byPath.set(path, prefix);
    }
    const team = scopeOf(caller);
    let own = owns.peek(team ?? "");
    if (own === undefined) {
      const headers = routing.nodeHeadersFor(team);
      let text = "";
      for (const name in headers) text += `${name}: ${headers[name]}\r\n`;
      own = {
        bytes: encoder.encode(text),
        replaced: new NameSet([...notPassed, ...Object.keys(headers).map((k) => k.toLowerCase())]),
      };
      owns.set(team ?? "", own);
    }
    // The client's header lines end where its blank line starts.
    const headerEnd = head.raw.length - 2;
    const kept = keptRuns(head.raw, head.spans, 4, headerEnd, own.replaced, runs);
    const out = carver.take(
      prefix.length + kept + own.bytes.length + hopLine.length + lengthLineSize(body.length) +
        body.length,
    );
    out.set(prefix);
    let at = putRuns(out, prefix.length, head.raw, runs);
    out.set(own.bytes, at);
    at += own.bytes.length;
    out.set(hopLine, at);
    at = putLengthLine(out, at + hopLine.length, body.length);
    out.set(body, at);
    return out;
  };

  /**
   * The answer's head for the client, re-framed, with room after it for a body of `whole` bytes
   * (-1: none, the body streams). Copied out before the body is taken: the next read reuses the
   * bytes the node's head lies in.
   */
  const answerHead = (answer: BytesAnswer, whole: number): Uint8Array => {
    const { raw, spans, statusEnd, http11 } = answer.head;
    const sized = answer.length >= 0;
    const kept = keptRuns(raw, spans, 3, raw.length - 2, notRelayed, runs);
    // A first header kept runs on from the status line: the two are one copy.
    if (runs.length > 0 && runs[0] === statusEnd) runs[0] = 0;
    // A 204 or 304 has no body and no framing header (RFC 9110 §8.6, §15.4.5).
    const bodiless = answer.head.status === 204 || answer.head.status === 304;
    const framing = bodiless ? 2 : sized ? lengthLineSize(answer.length) : CHUNKED_HEAD_END.length;
    const head = carver.take(statusEnd + kept + framing + Math.max(0, whole));
    let at = 0;
    if (runs[0] !== 0) {
      head.set(raw.subarray(0, statusEnd));
      at = statusEnd;
    }
    at = putRuns(head, at, raw, runs);
    if (bodiless) {
      head[at++] = 13;
      head[at++] = 10;
    } else if (sized) at = putLengthLine(head, at, answer.length);
    else head.set(CHUNKED_HEAD_END, at);
    if (!http11) head[7] = 49;
    return head;
  };

  /** Relays a streamed answer (head `out`): its head before its first body byte. */
  const relayStream = (ex: LaneExchange, answer: BytesAnswer, out: Uint8Array) => {
    const next = () => answer.next();
    return writeBody(ex.write, out, next(), next, answer.length, answer.length < 0);
  };

  let served = 0, handedBack = 0;
  /** What the object path serves instead. */
  const handBack = () => {
    handedBack++;
    return undefined;
  };
  return {
    get served() {
      return served;
    },
    get handedBack() {
      return handedBack;
    },
    maxBodyBytes,
    // The caller is named from the head, before the body is read: a stranger's request goes to
    // the object path, whose 401 reads nothing of it.
    claim: (head) => {
      if (head.method !== "POST" || !verbs.has(head.target) || head.find(HOP_HEADER) >= 0) {
        return undefined;
      }
      const at = head.find("authorization");
      if (at < 0) return undefined;
      try {
        return identifyBearer(head.raw, head.spans[at + 2], head.spans[at + 3]);
      } catch {
        // A key this gateway cannot confirm now (a 503): the object path answers it, in its
        // face's dialect.
        return undefined;
      }
    },
    async serve(ex, caller) {
      const path = ex.head.target;
      const verb = verbs.get(path)!;
      let data = bodies.get(verb, ex.body);
      if (data === undefined) {
        const value = jsonObject(ex.body);
        if (value === undefined) return handBack();
        const parsed = verb.schema.safeParse(value);
        if (!parsed.success) return handBack();
        data = parsed.data!;
        bodies.remember(verb, ex.body, data);
      }
      const key = teamScopedName(teamOf(caller), data.name);
      const found: FindOne | undefined = finder.cached("name", key);
      if (found === undefined || ex.hungUp) return handBack();
      const node = found.node;
      const now = fleet.now();
      // A node heard of only through an unreadable etcd is checked on the object path.
      if (
        !node.endpoint.startsWith("http://") || fleet.isSilent(node, now) ||
        fleet.isUnheard(node, now)
      ) return handBack();
      const target = { nodeId: node.id, endpoint: node.endpoint };
      served++;
      const bytes = nodeRequest(ex, path, node.endpoint, caller);
      const started = performance.now();
      const bound = verb.headBound?.(data) ?? routing.headTimeoutMs;
      const watched = routing.hangUps.watch(ex, target, bound, started);
      routing.hangUps.bodySent(watched, started);
      let answer: BytesAnswer;
      try {
        // The node's request is written before sendBytes first waits; the client's hang-up read
        // starts after it, while the node works (at one connection, off the request's latency).
        const asked = client.sendBytes(node.endpoint, bytes, watched);
        ex.watch();
        answer = await asked;
      } catch (error) {
        routing.hangUps.done(watched);
        const reason = watched.aborted ? watched.reason : unreachable(target, error);
        routing.forwarded(path, statusOf(reason), (performance.now() - started) / 1000);
        // A client that hung up is no one to answer: the connection ends.
        if (!(reason instanceof HttpError)) throw reason;
        return answerError(reason);
      }
      // The answer holds its connection until relayed: whatever fails first lets it go.
      try {
        // A streamed answer (a command's output) may run long: the hang-up is tied to it at once.
        routing.hangUps.done(watched, answer.length < 0);
        const status = answer.head.status;
        routing.forwarded(path, status, (performance.now() - started) / 1000, found);
        if (
          status === 404 &&
          await routing.recheckNotFound("name", key, found, hasLine(answer.head, ABSENT_HEADER))
        ) {
          // The node did nothing, and the name may live on another node now (made again through
          // another gateway): the object path finds it and sends the request there.
          answer.cancel();
          return handBack();
        }
        // A whole answer (the usual small one) is one write awaited here, in this frame: a helper
        // handing back its promise was one more promise and closure a request.
        const whole = answer.wholeLength();
        if (whole < 0) await relayStream(ex, answer, answerHead(answer, whole));
        else {
          let out: Uint8Array;
          // Nothing to change in it: the node's bytes go out from its connection's read buffer.
          if (asItCame(answer.head)) out = answer.asSent();
          else {
            out = answerHead(answer, whole);
            answer.copyWhole(out, out.length - whole);
          }
          const n = await ex.writeOnce(out);
          if (n < out.length) await ex.write(out.subarray(n));
        }
      } catch (error) {
        answer.cancel();
        throw error;
      }
      return true;
    },
  };
}
