/**
 * WebSockets on the bytes engine (`server.ts`), as byte splices: the client's handshake is
 * passed on to the next hop as an HTTP/1.1 upgrade, and once that hop answers 101 the engine
 * copies bytes both ways until either side ends. Frames, pings and close codes pass through
 * untouched, and each direction is held back by TCP's own flow control, so no frame is decoded or
 * queued here. `relayWebSocket` (`port_proxy.ts`) takes this way for requests the bytes engine
 * served, and `Deno.upgradeWebSocket` for the others.
 *
 * @module
 */

import { blankLineAt, parseAnswerHead, type RawHead } from "./_head.ts";
import { joined, latin1, writeAll } from "./_answer.ts";

/** The requests the bytes engine made: only they can be spliced. */
const engineRequests = new WeakSet<Request>();
/** The answers that are splices, with their next hop's open socket. */
const splices = new WeakMap<Response, Splice>();

/** A next hop that answered an upgrade with 101, and what it sent with it. */
export interface Splice {
  /** The socket to the next hop, past its 101 head. */
  readonly upstream: Deno.Conn;
  /** The next hop's 101 head, passed on to the client as it came. */
  readonly head: Uint8Array;
  /** Bytes the next hop sent after its head (its first frames), passed on after it. */
  readonly rest: Uint8Array;
}

/** Marks `request` as one the bytes engine made (`server.ts` calls it). */
export function markEngineRequest(request: Request): void {
  engineRequests.add(request);
}

/** Whether `request` came from the bytes engine, which splices upgrades. */
export function fromBytesEngine(request: Request): boolean {
  return engineRequests.has(request);
}

/** The splice an answer stands for, or undefined for a plain answer. */
export function spliceOf(response: Response): Splice | undefined {
  return splices.get(response);
}

/**
 * Why `relayWebSocket` (`port_proxy.ts`) could not open the next hop, spliced or relayed: the
 * caller shapes its own answer from it.
 */
export class RelayOpenError extends Error {
  /** True when the next hop did not answer the handshake in time. */
  readonly timedOut: boolean;
  /** Builds the error. */
  constructor(message: string, timedOut: boolean) {
    super(message);
    this.name = "RelayOpenError";
    this.timedOut = timedOut;
  }
}

/** The client's handshake headers, which a splice passes on (each hop does not make its own). */
const handshake = [
  "sec-websocket-key",
  "sec-websocket-version",
  "sec-websocket-protocol",
  "sec-websocket-extensions",
];

/**
 * Opens the next hop at `url` (`ws:` or `wss:`) with the client's upgrade `request`, its
 * handshake headers and `headers`, and resolves the answer that stands for the splice once the
 * hop answers 101. `host`, when given, is the handshake's Host instead of the URL's authority.
 *
 * @throws {RelayOpenError} when the hop cannot be reached, answers anything but 101, or does not
 *   answer within `openTimeoutMs`.
 */
export async function openSplice(
  request: Request,
  url: string,
  headers: Headers,
  openTimeoutMs: number,
  host?: string,
): Promise<Response> {
  const target = new URL(url);
  let text = "";
  for (const name of handshake) {
    const value = request.headers.get(name);
    if (value !== null) text += `${name}: ${value}\r\n`;
  }
  for (const [name, value] of headers) {
    if (!handshake.includes(name)) text += `${name}: ${value}\r\n`;
  }
  const opened = await upgradeHop(target, host ?? target.host, text, openTimeoutMs, () => {});
  const response = new Response(null, { status: 200 });
  splices.set(response, { upstream: opened.conn, head: opened.head, rest: opened.rest });
  return response;
}

/** A next hop that answered an upgrade with 101: its socket, its head, what came after. */
export interface UpgradedHop {
  conn: Deno.Conn;
  /** The 101 head's bytes, status line to blank line. */
  head: Uint8Array;
  /** The head parsed. */
  parsed: RawHead;
  /** What the hop sent after its head. */
  rest: Uint8Array;
}

/**
 * Connects to `target` (`ws:` or `wss:`), sends a WebSocket upgrade with Host `host` and the
 * header lines `lines` (each ending in CRLF), and resolves once the hop answers 101 and `check`
 * (handed the head) throws nothing; all within `openTimeoutMs`. The socket is closed on every
 * failure.
 *
 * @throws {RelayOpenError} when the hop cannot be reached, answers anything but 101, fails
 *   `check`, or does not answer in time.
 */
export async function upgradeHop(
  target: URL,
  host: string,
  lines: string,
  openTimeoutMs: number,
  check: (hop: UpgradedHop) => void,
): Promise<UpgradedHop> {
  const secure = target.protocol === "wss:";
  const port = Number(target.port || (secure ? 443 : 80));
  const hostname = target.hostname.replace(/^\[|\]$/g, "");
  const deadline = Date.now() + openTimeoutMs;
  let upstream: Deno.Conn;
  try {
    upstream = await bounded(
      secure ? Deno.connectTls({ hostname, port }) : Deno.connect({ hostname, port }),
      openTimeoutMs,
    );
  } catch (error) {
    const late = error instanceof RelayOpenError;
    throw late ? error : new RelayOpenError((error as Error).message || String(error), false);
  }
  const text = `GET ${target.pathname}${target.search} HTTP/1.1\r\nhost: ${host}\r\n` +
    "connection: Upgrade\r\nupgrade: websocket\r\n" + lines;
  // The handshake's share of the bound: past it the socket is closed, which ends the read.
  let late = false;
  const timer = setTimeout(() => {
    late = true;
    try {
      upstream.close();
    } catch {
      // Closed already.
    }
  }, Math.max(0, deadline - Date.now()));
  try {
    await writeAll(upstream, latin1(text + "\r\n"));
    const { head, rest } = await readHead(upstream);
    let parsed: RawHead;
    try {
      parsed = parseAnswerHead(head);
    } catch (error) {
      throw new RelayOpenError(
        `the next hop sent no HTTP answer (${(error as Error).message})`,
        false,
      );
    }
    if (parsed.status !== 101) {
      throw new RelayOpenError(`the next hop answered ${parsed.status}, not 101`, false);
    }
    const hop = { conn: upstream, head, parsed, rest };
    check(hop);
    return hop;
  } catch (error) {
    try {
      upstream.close();
    } catch {
      // Closed already.
    }
    if (error instanceof RelayOpenError) throw error;
    throw new RelayOpenError(
      late
        ? `no WebSocket handshake within ${openTimeoutMs} ms`
        : (error as Error).message || String(error),
      late,
    );
  } finally {
    clearTimeout(timer);
  }
}

/** `connecting`, or a RelayOpenError after `ms` (a socket that opens later is closed). */
function bounded(connecting: Promise<Deno.Conn>, ms: number): Promise<Deno.Conn> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      connecting.then((c) => c.close(), () => {});
      reject(new RelayOpenError(`no connection within ${ms} ms`, true));
    }, ms);
  });
  return Promise.race([connecting, late]).finally(() => clearTimeout(timer));
}

/** Reads an answer head (at most 64 KiB) and what came after it. */
export async function readHead(conn: Deno.Conn): Promise<{ head: Uint8Array; rest: Uint8Array }> {
  let buf = new Uint8Array(16 * 1024);
  let end = 0;
  for (;;) {
    const at = blankLineAt(buf, 0, end);
    if (at >= 0) return { head: buf.slice(0, at + 4), rest: buf.slice(at + 4, end) };
    if (end === buf.length) {
      if (buf.length >= 64 * 1024) throw new Error("the next hop's head is longer than 64 KiB");
      const grown = new Uint8Array(buf.length * 2);
      grown.set(buf);
      buf = grown;
    }
    const n = await conn.read(buf.subarray(end));
    if (n === null) throw new Error("the next hop closed before its answer");
    end += n;
  }
}

/**
 * Runs `splice` between the client (`write` to it, `read` from it, the bytes it already sent
 * first) and the next hop, until either side ends or `stop` aborts; then closes the next hop.
 */
export async function runSplice(
  splice: Splice,
  client: {
    write(bytes: Uint8Array): Promise<void>;
    read(): Promise<Uint8Array | null>;
  },
  stop: AbortSignal,
): Promise<void> {
  const { upstream } = splice;
  const end = () => {
    try {
      upstream.close();
    } catch {
      // Closed already.
    }
  };
  stop.addEventListener("abort", end, { once: true });
  try {
    await client.write(joined(splice.head, splice.rest));
    const down = (async () => {
      const buf = new Uint8Array(64 * 1024);
      for (;;) {
        const n = await upstream.read(buf).catch(() => null);
        if (n === null) return;
        await client.write(buf.subarray(0, n));
      }
    })();
    const up = (async () => {
      for (;;) {
        const piece = await client.read();
        if (piece === null) return;
        await writeAll(upstream, piece);
      }
    })();
    // Either side's end ends both: a WebSocket has nothing to say after its close frame. The
    // other side's pending read or write then fails, which is no error.
    down.catch(() => {});
    up.catch(() => {});
    await Promise.race([down, up]).catch(() => {});
  } finally {
    stop.removeEventListener("abort", end);
    end();
  }
}
