/**
 * A WebSocket client of our own over `Deno.connect`, for the one thing Deno's `WebSocket` cannot
 * do: show the server another Host than the URL's authority (E2B's `network.maskRequestHost`,
 * which dev servers that check their Host need on their hot-reload socket too). Measured on Deno
 * 2.9.6: `new WebSocket(url, { headers: { host } })` sends the URL's host and drops the one
 * given. Plain `ws:` only: a node reaches sandbox ports inside its own network.
 *
 * It holds RFC 6455's client side as far as a relay needs it: the handshake (the server's
 * `Sec-WebSocket-Accept` checked), one masked frame per message sent, text and binary messages
 * joined from their fragments up to a cap, pings answered, the close handshake, and a bound on
 * what waits to be written.
 *
 * @module
 */
import { createHash } from "node:crypto";
import { octets, sameName } from "./_head.ts";
import { writeAll } from "./_answer.ts";
import { RelayOpenError, upgradeHop } from "./_splice.ts";

/** RFC 6455's key suffix for `Sec-WebSocket-Accept`. */
const GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/** Headers the handshake makes itself; a caller's of these names are dropped. */
const ownHeaders = new Set([
  "host",
  "connection",
  "upgrade",
  "sec-websocket-key",
  "sec-websocket-version",
  "sec-websocket-protocol",
  "sec-websocket-extensions",
  "sec-websocket-accept",
]);

/** Options of {@linkcode connectWebSocket}. */
export interface WireWebSocketOptions {
  /** The handshake's Host header. */
  host: string;
  /** Further handshake headers (end-to-end ones); the handshake's own are made here. */
  headers?: Headers;
  /** Subprotocols offered. */
  protocols?: string[];
  /** Bound of the connection and the handshake together: 10 s. */
  openTimeoutMs?: number;
  /**
   * The largest message taken (fragments joined) and the most bytes waiting to be written:
   * 16 MiB each. Past either the socket is closed with 1009 (message too big).
   */
  maxBytes?: number;
  /** How long a close waits for the server's own close frame before the socket is cut: 5 s. */
  closeTimeoutMs?: number;
}

/** What a {@linkcode WireWebSocket} tells its listener. */
export interface WireListener {
  /** A whole message: text as a string, binary as an ArrayBuffer. */
  message(data: string | ArrayBuffer): void;
  /** The socket ended: the close frame's code and reason, 1006 when it ended without one. */
  close(code: number, reason: string): void;
}

const encoder = new TextEncoder();
/** The most fragments one message may come in. */
const MAX_FRAGMENTS = 4096;

/** Whether an endpoint may send `code` in a close frame (RFC 6455 §7.4). */
function sendable(code: number): boolean {
  return code >= 1000 && code <= 4999 && code !== 1004 && code !== 1005 && code !== 1006 &&
    code !== 1015;
}

/**
 * A WebSocket opened by {@linkcode connectWebSocket}. Nothing is read until
 * {@linkcode WireWebSocket.listen}, so no message arrives before a listener does.
 */
export class WireWebSocket {
  /** The subprotocol the server chose, `""` for none. */
  readonly protocol: string;
  #conn: Deno.Conn;
  #reader: ByteReader;
  #maxBytes: number;
  #closeTimeoutMs: number;
  #listener: WireListener | undefined;
  #state: "open" | "closing" | "closed" = "open";
  #writing: Promise<void> = Promise.resolve();
  #queued = 0;
  #closeTimer: ReturnType<typeof setTimeout> | undefined;

  /** Wraps a connection past its 101 head; `rest` is what came after the head. */
  constructor(conn: Deno.Conn, protocol: string, rest: Uint8Array, options: {
    maxBytes: number;
    closeTimeoutMs: number;
  }) {
    this.#conn = conn;
    this.protocol = protocol;
    this.#reader = new ByteReader(conn, rest);
    this.#maxBytes = options.maxBytes;
    this.#closeTimeoutMs = options.closeTimeoutMs;
  }

  /** Whether messages may still be sent (no close sent or received). */
  get open(): boolean {
    return this.#state === "open";
  }

  /** Starts reading; every message and the end go to `listener`. Call once. */
  listen(listener: WireListener): void {
    this.#listener = listener;
    this.#read().catch(() => this.#end(1006, ""));
  }

  /** Sends one message: a string as text, bytes as binary. Ignored once closing. */
  send(data: string | ArrayBuffer | ArrayBufferView): void {
    if (this.#state !== "open") return;
    const payload = typeof data === "string"
      ? encoder.encode(data)
      : data instanceof ArrayBuffer
      ? new Uint8Array(data)
      : new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    if (this.#queued + payload.length > this.#maxBytes) {
      this.close(1009, "too much data waiting to be written");
      return;
    }
    this.#write(frame(typeof data === "string" ? 1 : 2, payload));
  }

  /**
   * Starts the close handshake (the server's close ends it, or the timeout cuts it). A code no
   * endpoint may send (1005, 1006, 1015, or outside 1000–4999) goes as 1000.
   */
  close(code = 1000, reason = ""): void {
    if (this.#state !== "open") return;
    this.#state = "closing";
    const ok = sendable(code);
    this.#sendClose(ok ? code : 1000, ok ? reason : "");
    this.#closeTimer = setTimeout(() => this.#end(1006, ""), this.#closeTimeoutMs);
  }

  #sendClose(code: number, reason: string): void {
    const text = encoder.encode(reason).subarray(0, 123);
    const payload = new Uint8Array(2 + text.length);
    payload[0] = code >> 8;
    payload[1] = code & 255;
    payload.set(text, 2);
    this.#write(frame(8, payload));
  }

  #write(bytes: Uint8Array): void {
    this.#queued += bytes.length;
    this.#writing = this.#writing.then(() => writeAll(this.#conn, bytes)).then(
      () => {
        this.#queued -= bytes.length;
      },
      () => this.#end(1006, ""),
    );
  }

  async #read(): Promise<void> {
    const r = this.#reader;
    let parts: Uint8Array[] = [];
    let partsBytes = 0;
    let messageType = 0;
    for (;;) {
      if (!(await r.need(2))) return this.#end(1006, "");
      const first = r.byte(0);
      const second = r.byte(1);
      const fin = (first & 0x80) !== 0;
      const opcode = first & 0x0f;
      const masked = (second & 0x80) !== 0;
      let length = second & 0x7f;
      let at = 2;
      if (length === 126) {
        if (!(await r.need(4))) return this.#end(1006, "");
        length = (r.byte(2) << 8) | r.byte(3);
        at = 4;
      } else if (length === 127) {
        if (!(await r.need(10))) return this.#end(1006, "");
        length = 0;
        for (let i = 2; i < 10; i++) length = length * 256 + r.byte(i);
        at = 10;
      }
      // No extension was offered, so the reserved bits must be clear.
      if ((first & 0x70) !== 0) return this.#fail(1002, "reserved bits set");
      const control = opcode >= 8;
      if (control && (!fin || length > 125)) return this.#fail(1002, "bad control frame");
      if (partsBytes + length > this.#maxBytes) return this.#fail(1009, "message too big");
      const header = at + (masked ? 4 : 0);
      if (!(await r.need(header + length))) return this.#end(1006, "");
      const key = masked ? [r.byte(at), r.byte(at + 1), r.byte(at + 2), r.byte(at + 3)] : null;
      r.skip(header);
      const payload = r.take(length);
      if (key) { for (let i = 0; i < payload.length; i++) payload[i] ^= key[i & 3]; }
      if (opcode === 8) {
        const code = payload.length >= 2 ? (payload[0] << 8) | payload[1] : 1005;
        const reason = new TextDecoder().decode(payload.subarray(2));
        // Answered with the same code, as RFC 6455 §5.5.1 asks, unless we closed first.
        if (this.#state === "open") this.#sendClose(sendable(code) ? code : 1000, "");
        this.#state = "closing";
        await this.#writing;
        return this.#end(code, reason);
      }
      if (opcode === 9) {
        // A server that pings without reading our pongs would queue them without end.
        if (this.#queued > this.#maxBytes) return this.#fail(1009, "pongs not read");
        this.#write(frame(10, payload));
        continue;
      }
      if (opcode === 10) continue;
      if (opcode === 0 ? messageType === 0 : messageType !== 0 || (opcode !== 1 && opcode !== 2)) {
        return this.#fail(1002, "unexpected frame");
      }
      if (opcode !== 0) messageType = opcode;
      // Empty fragments add no bytes: their number is bounded on its own.
      if (parts.length >= MAX_FRAGMENTS) return this.#fail(1009, "too many fragments");
      parts.push(payload);
      partsBytes += payload.length;
      if (!fin) continue;
      const whole = parts.length === 1 ? parts[0] : concat(parts, partsBytes);
      const type = messageType;
      parts = [];
      partsBytes = 0;
      messageType = 0;
      if (this.#state !== "open") continue;
      if (type === 2) {
        // `take` and `concat` copy, so `whole` owns its buffer, sized to the message.
        this.#listener?.message(whole.buffer as ArrayBuffer);
        continue;
      }
      let text: string;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(whole);
      } catch {
        return this.#fail(1007, "text that is not UTF-8");
      }
      this.#listener?.message(text);
    }
  }

  /** The server broke the protocol: say why in a close frame, then end with that code. */
  async #fail(code: number, reason: string): Promise<void> {
    if (this.#state === "open") this.#sendClose(code, reason);
    this.#state = "closing";
    await this.#writing;
    this.#end(code, reason);
  }

  #end(code: number, reason: string): void {
    if (this.#state === "closed") return;
    this.#state = "closed";
    clearTimeout(this.#closeTimer);
    try {
      this.#conn.close();
    } catch {
      // Closed already.
    }
    this.#listener?.close(code, reason);
  }
}

/**
 * Opens a WebSocket to `url` (`ws:`) with the handshake's Host set to `options.host`, and
 * resolves it once the server answers 101 with the right accept key.
 *
 * @throws {RelayOpenError} when the server cannot be reached, answers anything but a valid 101,
 *   or does not answer within `openTimeoutMs`.
 * @example
 * ```ts ignore
 * const ws = await connectWebSocket("ws://10.0.0.7:5173/", { host: "localhost:5173" });
 * ws.listen({ message: (m) => console.log(m), close: (code) => console.log(code) });
 * ws.send("hello");
 * ```
 */
export async function connectWebSocket(
  url: string,
  options: WireWebSocketOptions,
): Promise<WireWebSocket> {
  const target = new URL(url);
  if (target.protocol !== "ws:") {
    throw new TypeError(`Cannot open ${target.origin}: this WebSocket client speaks ws: only`);
  }
  const key = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(16))));
  const protocols = options.protocols ?? [];
  let lines = `sec-websocket-version: 13\r\nsec-websocket-key: ${key}\r\n`;
  if (protocols.length > 0) lines += `sec-websocket-protocol: ${protocols.join(", ")}\r\n`;
  for (const [name, value] of options.headers ?? []) {
    if (!ownHeaders.has(name)) lines += `${name}: ${value}\r\n`;
  }
  let protocol = "";
  const hop = await upgradeHop(
    target,
    options.host,
    lines,
    options.openTimeoutMs ?? 10_000,
    ({ head, parsed }) => {
      const value = (name: string): string | undefined => {
        const s = parsed.spans;
        for (let i = 0; i < s.length; i += 3) {
          if (sameName(head, s[i], s[i + 1], name)) {
            return octets(head, s[i + 1] + 1, s[i + 2] - 2).trim();
          }
        }
        return undefined;
      };
      const accept = createHash("sha1").update(key + GUID).digest("base64");
      if (
        value("upgrade")?.toLowerCase() !== "websocket" || value("sec-websocket-accept") !== accept
      ) {
        throw new RelayOpenError("the next hop's 101 is not a WebSocket handshake", false);
      }
      protocol = value("sec-websocket-protocol") ?? "";
      if (protocol !== "" && !protocols.includes(protocol)) {
        throw new RelayOpenError(
          `the next hop chose subprotocol '${protocol}', never offered`,
          false,
        );
      }
    },
  );
  return new WireWebSocket(hop.conn, protocol, hop.rest, {
    maxBytes: options.maxBytes ?? 16 * 1024 * 1024,
    closeTimeoutMs: options.closeTimeoutMs ?? 5_000,
  });
}

/** One client frame: FIN set, the payload masked with a fresh key (RFC 6455 §5.3). */
function frame(opcode: number, payload: Uint8Array): Uint8Array {
  const n = payload.length;
  const size = n < 126 ? 2 : n < 65536 ? 4 : 10;
  const out = new Uint8Array(size + 4 + n);
  out[0] = 0x80 | opcode;
  if (n < 126) out[1] = 0x80 | n;
  else if (n < 65536) {
    out[1] = 0x80 | 126;
    out[2] = n >> 8;
    out[3] = n & 255;
  } else {
    out[1] = 0x80 | 127;
    new DataView(out.buffer).setBigUint64(2, BigInt(n));
  }
  const key = crypto.getRandomValues(new Uint8Array(4));
  out.set(key, size);
  for (let i = 0; i < n; i++) out[size + 4 + i] = payload[i] ^ key[i & 3];
  return out;
}

function concat(parts: Uint8Array[], total: number): Uint8Array {
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** The bytes read from a connection and not yet taken, in one buffer that grows as needed. */
class ByteReader {
  #conn: Deno.Conn;
  #buf: Uint8Array;
  #start = 0;
  #end = 0;

  constructor(conn: Deno.Conn, initial: Uint8Array) {
    this.#conn = conn;
    this.#buf = new Uint8Array(Math.max(64 * 1024, initial.length));
    this.#buf.set(initial);
    this.#end = initial.length;
  }

  /** Reads until `n` bytes are at hand; false when the connection ends first. */
  async need(n: number): Promise<boolean> {
    while (this.#end - this.#start < n) {
      if (this.#buf.length - this.#start < n) {
        // Move what is left to the front, in a larger buffer when it cannot hold `n`.
        if (this.#buf.length >= n) this.#buf.copyWithin(0, this.#start, this.#end);
        else {
          const grown = new Uint8Array(n);
          grown.set(this.#buf.subarray(this.#start, this.#end));
          this.#buf = grown;
        }
        this.#end -= this.#start;
        this.#start = 0;
      }
      const read = await this.#conn.read(this.#buf.subarray(this.#end));
      if (read === null) return false;
      this.#end += read;
    }
    return true;
  }

  /** The byte `i` places past the read position (it must be at hand). */
  byte(i: number): number {
    return this.#buf[this.#start + i];
  }

  skip(n: number): void {
    this.#start += n;
  }

  /** The next `n` bytes, copied out. */
  take(n: number): Uint8Array {
    const out = this.#buf.slice(this.#start, this.#start + n);
    this.#start += n;
    return out;
  }
}
