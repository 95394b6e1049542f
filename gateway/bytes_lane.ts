/**
 * The bytes lane: the routed verbs (`execCommand`, `readFile`, …) served from their bytes when the
 * gateway listens with the bytes engine (`shared/h1_server.ts`). No Request, Headers or Response
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
 * Once the node is asked it keeps the forwarding rules of `forward.ts`: the head's bound and a
 * node gone silent end the wait with a 504 (the routing's `HangUpWatch`), a client's hang-up
 * reaches the node's request, a node's 404 makes the Finder re-check the sandbox before the
 * answer goes out, the answer's head goes out before its first body byte, and every forward is
 * told to the routing's observer (metrics, lifecycle events).
 *
 * @module
 */
import type { BytesLane, LaneExchange } from "../shared/h1_server.ts";
import { HttpError } from "../shared/http_error.ts";
import { hopByHopHeaders } from "../shared/port_proxy.ts";
import { teamScopedName } from "../shared/teams.ts";
import { DEFAULT_JSON_BODY_LIMIT_BYTES } from "../shared/json_body.ts";
import { type Caller, scopeOf, teamOf } from "./auth.ts";
import { bearerToken } from "../shared/token.ts";
import { HOP_HEADER, nextHop } from "./door.ts";
import type { FindOne } from "./finder.ts";
import { answerHopByHop, unreachable } from "./forward.ts";
import { LruCache } from "./lru.ts";
import type { BytesAnswer, H1Client } from "./h1_client.ts";
import { sameName } from "../shared/_h1_head.ts";
import { writeBody } from "../shared/_h1_answer.ts";
import type { GatewayParts } from "./parts.ts";
import { statusOf } from "./routing_answers.ts";

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
const CRLF = encoder.encode("\r\n");
const LENGTH_NAME = encoder.encode("content-length: ");
/** Client headers the node's request does not carry: the hop's own and the hop marker. */
const notPassed = [...hopByHopHeaders, HOP_HEADER];
/** Node answer headers the client's answer does not carry: the hop's own; framing is redone. */
const notRelayed = [...answerHopByHop, "transfer-encoding", "content-length"];

/** The body as one JSON object, or undefined when the object path must say what is wrong. */
function jsonObject(body: Uint8Array): object | undefined {
  // An empty body, a byte-order mark or bytes that are not UTF-8 are decoded by the object path
  // into text it then forwards: only bytes that are that text already are passed on as they are.
  if (body.length === 0 || (body[0] === 0xef && body[1] === 0xbb && body[2] === 0xbf)) {
    return undefined;
  }
  try {
    const value = JSON.parse(utf8.decode(body));
    return value !== null && typeof value === "object" && !Array.isArray(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

/**
 * `content-length: <n>` and the blank line, as bytes. Written here, not by TextEncoder: its call
 * into the runtime was 0.75 µs a line, a twentieth of the lane's JavaScript per request.
 */
function lengthLine(n: number): Uint8Array {
  const digits = String(n);
  const out = new Uint8Array(LENGTH_NAME.length + digits.length + 4);
  out.set(LENGTH_NAME);
  let at = LENGTH_NAME.length;
  for (let i = 0; i < digits.length; i++) out[at++] = digits.charCodeAt(i);
  out[at++] = 13;
  out[at++] = 10;
  out[at++] = 13;
  out[at] = 10;
  return out;
}

/** `parts` laid end to end in one new buffer. */
function concat(parts: readonly Uint8Array[]): Uint8Array {
  let size = 0;
  for (let i = 0; i < parts.length; i++) size += parts[i].length;
  const out = new Uint8Array(size);
  let at = 0;
  for (let i = 0; i < parts.length; i++) {
    out.set(parts[i], at);
    at += parts[i].length;
  }
  return out;
}

/** Whether `name` (in `b[start, end)`) is one of `lowers`, ASCII case-insensitively. */
function nameIn(b: Uint8Array, start: number, end: number, lowers: readonly string[]): boolean {
  for (let i = 0; i < lowers.length; i++) if (sameName(b, start, end, lowers[i])) return true;
  return false;
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
  const { routing, finder, fleet, identify } = parts;
  // Read whole before it is parsed: a larger body streams through the object path's reader.
  const maxBodyBytes = Math.min(
    parts.jsonBodyCap.maxBytes ?? DEFAULT_JSON_BODY_LIMIT_BYTES,
    LANE_BODY_MAX,
  );

  // Encoded once: the request line and Host per verb and node, the node's own headers per team,
  // the hop marker (this gateway's request never carries one in: `claim` leaves those out).
  const prefixes = new LruCache<string, Uint8Array>({ max: 4096 });
  const owns = new LruCache<string, { bytes: Uint8Array; replaced: readonly string[] }>({
    max: 1024,
  });
  const hopLine = encoder.encode(`${HOP_HEADER}: ${nextHop(null, routing.hop)}\r\n`);

  /** The node's request: the client's end-to-end header lines as sent, the node's own, the hop. */
  const nodeRequest = (ex: LaneExchange, path: string, endpoint: string, caller: Caller) => {
    const { head, body } = ex;
    const at = `${path} ${endpoint}`;
    let prefix = prefixes.get(at);
    if (prefix === undefined) {
      const host = endpoint.slice(7).replace(/\/.*$/, "");
      prefix = encoder.encode(`POST ${path} HTTP/1.1\r\nhost: ${host}\r\n`);
      prefixes.set(at, prefix);
    }
    const team = scopeOf(caller);
    let own = owns.get(team ?? "");
    if (own === undefined) {
      const headers = routing.nodeHeadersFor(team);
      let text = "";
      for (const name in headers) text += `${name}: ${headers[name]}\r\n`;
      own = {
        bytes: encoder.encode(text),
        replaced: [...notPassed, ...Object.keys(headers).map((k) => k.toLowerCase())],
      };
      owns.set(team ?? "", own);
    }
    const parts: Uint8Array[] = [prefix];
    const raw = head.raw, spans = head.spans;
    for (let i = 0; i < spans.length; i += 4) {
      if (!nameIn(raw, spans[i], spans[i + 1], own.replaced)) parts.push(head.line(i / 4));
    }
    parts.push(own.bytes, hopLine, lengthLine(body.length), body);
    return concat(parts);
  };

  /** Relays the node's answer to the client, re-framed, its head before its first body byte. */
  const relay = async (ex: LaneExchange, answer: BytesAnswer): Promise<void> => {
    const { raw, spans, statusEnd, http11 } = answer.head;
    const sized = answer.length >= 0;
    const parts: Uint8Array[] = [raw.subarray(0, statusEnd)];
    for (let i = 0; i < spans.length; i += 3) {
      if (!nameIn(raw, spans[i], spans[i + 1], notRelayed)) {
        parts.push(raw.subarray(spans[i], spans[i + 2]));
      }
    }
    // A 204 or 304 has no body and no framing header (RFC 9110 §8.6, §15.4.5).
    const bodiless = answer.head.status === 204 || answer.head.status === 304;
    parts.push(
      bodiless ? CRLF : sized ? lengthLine(answer.length) : CHUNKED_HEAD_END,
    );
    // The head is copied out before the body is read (the read reuses the bytes it lies in).
    const whole = answer.whole();
    if (whole !== undefined) parts.push(whole);
    const head = concat(parts);
    // An HTTP/1.0 node's status line is passed on as HTTP/1.1: that is what this hop speaks.
    if (!http11) head[7] = 49;
    if (whole !== undefined) return await ex.write(head);
    try {
      const next = () => answer.next();
      await writeBody(ex.write, head, next(), next, answer.length, !sized);
    } catch (error) {
      answer.cancel();
      throw error;
    }
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
    claim: (head) =>
      head.method === "POST" && verbs.has(head.target) && head.get(HOP_HEADER) === undefined
        ? identify(bearerToken(head.get("authorization") ?? null))
        : undefined,
    async serve(ex, caller) {
      const path = ex.head.target;
      const verb = verbs.get(path)!;
      const value = jsonObject(ex.body);
      if (value === undefined) return handBack();
      const parsed = verb.schema.safeParse(value);
      if (!parsed.success) return handBack();
      const key = teamScopedName(teamOf(caller), parsed.data!.name);
      const found: FindOne | undefined = finder.cached("name", key);
      if (found === undefined || ex.hungUp) return handBack();
      const node = found.node;
      if (!node.endpoint.startsWith("http://") || fleet.isSilent(node, fleet.now())) {
        return handBack();
      }
      const target = { nodeId: node.id, endpoint: node.endpoint };
      served++;
      const bytes = nodeRequest(ex, path, node.endpoint, caller);
      const watched = routing.hangUps.watch(
        ex,
        target,
        verb.headBound?.(parsed.data!) ?? routing.headTimeoutMs,
      );
      routing.hangUps.bodySent(watched);
      const signal = watched.controller.signal;
      const started = performance.now();
      let answer: BytesAnswer;
      try {
        answer = await client.sendBytes(node.endpoint, bytes, signal);
      } catch (error) {
        routing.hangUps.done(watched);
        const reason = signal.aborted ? signal.reason : unreachable(target, error);
        routing.forwarded(path, statusOf(reason), (performance.now() - started) / 1000);
        // A client that hung up is no one to answer: the connection ends.
        if (!(reason instanceof HttpError)) throw reason;
        return answerError(reason);
      }
      // A streamed answer (a command's output) may run long: the hang-up is tied to it at once.
      routing.hangUps.done(watched, answer.length < 0);
      const status = answer.head.status;
      routing.forwarded(path, status, (performance.now() - started) / 1000, found);
      if (status === 404) {
        // The sandbox may have been destroyed behind the gateway's back; only the node can say.
        await finder.recheck("name", key).catch(() => {});
      }
      await relay(ex, answer);
      return true;
    },
  };
}
