/**
 * What the bytes engine's black-box tests (`server_test.ts`, `server_refusals_test.ts`)
 * share: a raw client socket, a server per test, and readers of what came back. Every wait is
 * bounded (2–5 s of real time).
 *
 * @module
 */
import assert from "node:assert/strict";
import { FakeClock } from "../clock.ts";
import { type DaemonServeOptions, type GuardedServer, serveDaemon } from "./serve.ts";

const encoder = new TextEncoder();
export const enc = (text: string) => encoder.encode(text);
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Resolves as `promise` does, or rejects naming `what` after `ms` real milliseconds. */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

/** A promise settled from outside. */
export function deferred<T = void>() {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => resolve = r);
  return { promise, resolve };
}

export async function writeAll(conn: Deno.Conn, bytes: Uint8Array): Promise<void> {
  let at = 0;
  while (at < bytes.length) at += await conn.write(bytes.subarray(at));
}

/** A raw client socket: what it received (one char a byte), and whether the server closed it. */
export async function rawClient(port: number) {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  let received = "";
  let closedBy = false;
  let reset = false;
  const reading = (async () => {
    const buf = new Uint8Array(64 * 1024);
    try {
      for (;;) {
        const n = await conn.read(buf);
        if (n === null) break;
        for (let i = 0; i < n; i += 4096) {
          received += String.fromCharCode(
            ...buf.subarray(i, Math.min(n, i + 4096)),
          );
        }
      }
    } catch {
      reset = true; // a reset (or our own close): closed as well
    }
    closedBy = true;
  })();
  let closing: Promise<void> | undefined;
  return {
    /** Writes all of `data` (a string is sent one byte a char). */
    write: (data: string | Uint8Array) =>
      writeAll(
        conn,
        typeof data === "string" ? Uint8Array.from(data, (c) => c.charCodeAt(0)) : data,
      ),
    /** Ends the client's side (a FIN): the server reads the end of the stream. */
    endWrite: () => conn.closeWrite(),
    received: () => received,
    closed: () => closedBy,
    wasReset: () => reset,
    /** Resolves once the server closed the connection; rejects after `ms` real milliseconds. */
    closedWithin: (ms = 2000) => within(reading, ms, `EOF (got ${JSON.stringify(received)})`),
    /** Waits until what was received satisfies `test` (a string it must contain). */
    async until(test: string | ((text: string) => boolean), ms = 2000) {
      const ok = typeof test === "string" ? (t: string) => t.includes(test) : test;
      const end = Date.now() + ms;
      while (!ok(received)) {
        if (Date.now() > end) {
          throw new Error(`no ${test} within ${ms} ms: got ${JSON.stringify(received)}`);
        }
        if (closedBy) {
          throw new Error(`closed before ${test}: got ${JSON.stringify(received)}`);
        }
        await sleep(2);
      }
    },
    /** Closes the socket and waits for its reader to end. */
    close(): Promise<void> {
      if (closing === undefined) {
        try {
          conn.close();
        } catch {
          // closed already
        }
        closing = reading;
      }
      return closing;
    },
  };
}

export type Client = Awaited<ReturnType<typeof rawClient>>;

/**
 * Runs `body` against a bytes-engine server serving `handler` (timeouts on a FakeClock that
 * never moves, so no sweep closes anything), then closes its clients and shuts it down.
 */
export async function withServer(
  handler: DaemonServeOptions["handler"],
  body: (t: {
    server: GuardedServer;
    port: number;
    connect(): Promise<Client>;
  }) => Promise<void>,
  options: Partial<DaemonServeOptions> = {},
): Promise<void> {
  const server = serveDaemon({
    hostname: "127.0.0.1",
    port: 0,
    engine: "bytes",
    handler,
    clock: new FakeClock(),
    sweepIntervalMs: 0,
    ...options,
  });
  const clients: Client[] = [];
  const port = server.addr.port;
  try {
    await body({
      server,
      port,
      async connect() {
        const c = await rawClient(port);
        clients.push(c);
        return c;
      },
    });
  } finally {
    await Promise.all(clients.map((c) => c.close()));
    await within(server.shutdown(), 5000, "the server's shutdown");
  }
}

/** The head of the first answer in `text` (status line to blank line), lowercased names. */
export function firstHead(text: string): string {
  const end = text.indexOf("\r\n\r\n");
  assert.notEqual(end, -1, `no whole answer head in ${JSON.stringify(text)}`);
  return text.slice(0, end + 4);
}

/**
 * Whether `head` carries the header `line`: a name (any value) or a whole `name: value` line,
 * names matched case-insensitively.
 */
export function hasHeader(head: string, line: string): boolean {
  const escaped = line.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  return new RegExp(`\r\n${escaped}${line.includes(":") ? "\r\n" : ":"}`, "i").test(head);
}

/** How many answers (status lines) `text` holds. */
export function answers(text: string): number {
  return text.split(/HTTP\/1\.1 \d{3} /).length - 1;
}

export const GET = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
export const ok = () => new Response("ok");
