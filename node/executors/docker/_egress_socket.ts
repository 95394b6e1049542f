/**
 * A `node:net`/`node:tls` socket as the `Deno.Conn` the project's HTTP/1.1 server reads and
 * writes (`shared/http1/server.ts`): the egress proxy's TLS terminators accept with `node:tls`,
 * whose sockets take `setNoDelay` (a `Deno.listenTls` connection has no such method), and serve
 * HTTP on them with that server.
 *
 * Reads take what the socket delivered, in order; at most {@linkcode MAX_QUEUED} bytes wait
 * unread before the socket is paused (the peer then waits on TCP's window). A write resolves at
 * once while the socket's buffer is below its high-water mark, else once it drained.
 *
 * @module
 */
import type { Socket } from "node:net";

/** Most bytes read from the socket and not yet taken before it is paused. */
export const MAX_QUEUED = 256 * 1024;

/** A socket's error as the `Deno.errors` class a `Deno.Conn` would reject with. */
function denoError(error: unknown): Error {
  const code = (error as { code?: string } | null)?.code;
  const message = error instanceof Error ? error.message : String(error);
  if (
    code === "EPIPE" || code === "ERR_STREAM_DESTROYED" || code === "ERR_STREAM_WRITE_AFTER_END"
  ) {
    return new Deno.errors.BrokenPipe(message);
  }
  if (code === "ECONNRESET") return new Deno.errors.ConnectionReset(message);
  return error instanceof Error ? error : new Error(message);
}

/** A node socket read and written as a `Deno.Conn` (the part of it a server uses). */
export class SocketConn {
  readonly remoteAddr: Deno.NetAddr;
  readonly localAddr: Deno.NetAddr;
  readonly #socket: Socket;
  #queue: Uint8Array[] = [];
  #queued = 0;
  #ended = false;
  #error: Error | undefined;
  #wake: (() => void) | undefined;

  constructor(socket: Socket) {
    this.#socket = socket;
    this.remoteAddr = {
      transport: "tcp",
      hostname: socket.remoteAddress ?? "",
      port: socket.remotePort ?? 0,
    };
    this.localAddr = {
      transport: "tcp",
      hostname: socket.localAddress ?? "",
      port: socket.localPort ?? 0,
    };
    socket.on("data", (chunk: Uint8Array) => {
      this.#queue.push(chunk);
      this.#queued += chunk.length;
      if (this.#queued >= MAX_QUEUED) socket.pause();
      this.#notify();
    });
    socket.on("end", () => {
      this.#ended = true;
      this.#notify();
    });
    socket.on("error", (error: unknown) => {
      this.#error = denoError(error);
      this.#notify();
    });
    socket.on("close", () => {
      this.#ended = true;
      this.#notify();
    });
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = undefined;
    wake?.();
  }

  /** Reads into `p`: how many bytes, or `null` at the end of the stream. One read at a time. */
  async read(p: Uint8Array): Promise<number | null> {
    while (this.#queue.length === 0) {
      if (this.#error !== undefined) throw this.#error;
      if (this.#ended) return null;
      await new Promise<void>((resolve) => this.#wake = resolve);
    }
    const first = this.#queue[0];
    const n = Math.min(first.length, p.length);
    p.set(n === first.length ? first : first.subarray(0, n));
    if (n === first.length) this.#queue.shift();
    else this.#queue[0] = first.subarray(n);
    this.#queued -= n;
    if (this.#queued < MAX_QUEUED && this.#socket.isPaused()) this.#socket.resume();
    return n;
  }

  /**
   * Writes all of `p` (a copy: the caller may reuse it at once). Resolves at once while the
   * socket's buffer is below its high-water mark, else once it drained, so writes pipeline but a
   * slow reader holds the writer back.
   */
  write(p: Uint8Array): Promise<number> {
    if (this.#socket.destroyed || this.#socket.writableEnded) {
      return Promise.reject(new Deno.errors.BrokenPipe("the connection is closed"));
    }
    if (this.#error !== undefined) return Promise.reject(this.#error);
    if (this.#socket.write(p.slice())) return Promise.resolve(p.length);
    return new Promise((resolve, reject) => {
      const done = () => {
        this.#socket.off("drain", done);
        this.#socket.off("close", done);
        if (this.#socket.destroyed && this.#socket.writableLength > 0) {
          reject(this.#error ?? new Deno.errors.BrokenPipe("the connection closed mid-write"));
        } else resolve(p.length);
      };
      this.#socket.on("drain", done);
      this.#socket.on("close", done);
    });
  }

  /** Ends the writing side once what was written has gone. */
  closeWrite(): Promise<void> {
    this.#socket.end();
    return Promise.resolve();
  }

  /** Closes the connection both ways at once. */
  close(): void {
    this.#ended = true;
    this.#socket.destroy();
    this.#notify();
  }

  ref(): void {}
  unref(): void {}
  [Symbol.dispose](): void {
    this.close();
  }

  get readable(): ReadableStream<Uint8Array<ArrayBuffer>> {
    throw new TypeError("SocketConn is read with read(), not as a stream");
  }

  get writable(): WritableStream<Uint8Array<ArrayBufferLike>> {
    throw new TypeError("SocketConn is written with write(), not as a stream");
  }
}

/** `socket` as a `Deno.Conn`. */
export function socketConn(socket: Socket): Deno.Conn {
  return new SocketConn(socket) as unknown as Deno.Conn;
}
