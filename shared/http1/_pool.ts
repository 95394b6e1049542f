/**
 * The connections of {@linkcode createH1Client} (client.ts), one pool per origin: a connection is
 * acquired (an idle one, a new one, or a turn in the pool's queue), held by one request, and
 * released (kept idle on a clean end, closed otherwise, handed to the next in the queue first).
 * Idle connections are swept after their timeout, an origin with nothing pooled, busy or waiting
 * leaves the map, and a released connection's idle read (which hears a node that closes it) is
 * started late, once the next request is written.
 *
 * @module
 */
import { Conn } from "./_wire.ts";

/**
 * What ends a `sendBytes` exchange without an AbortSignal's cost (a forward's watch entry,
 * `WatchedForward`): its one `onAbort` hook is the exchange's, and `signal` is made only for the
 * waits that need one (a connect, a turn in a full pool).
 */
export interface Cancel {
  /** Whether the wait was cancelled. */
  readonly aborted: boolean;
  /** Why, once cancelled. */
  readonly reason: unknown;
  /** An AbortSignal that aborts with it, for the APIs that take one. */
  readonly signal: AbortSignal;
  /** Sets (or, with `undefined`, clears) the one hook called when it is cancelled. */
  onAbort(hook: (() => void) | undefined): void;
}

/** The signal of `s`, made now if it is a {@linkcode Cancel}. */
function signalOf(s: AbortSignal | Cancel | null): AbortSignal | null {
  return s === null || s instanceof AbortSignal ? s : s.signal;
}

/** Tells `hook` of an abort of `s` (or, with `on` false, stops telling it). */
function listen(s: AbortSignal | Cancel | null, hook: () => void, on: boolean): void {
  if (s === null) return;
  if (!(s instanceof AbortSignal)) s.onAbort(on ? hook : undefined);
  else if (on) s.addEventListener("abort", hook, { once: true });
  else s.removeEventListener("abort", hook);
}

/** A request waiting for one of its origin's connections. */
export interface Waiter {
  resolve(c: Conn): void;
  reject(e: unknown): void;
  signal: AbortSignal | null;
}

/** One origin's connections: the idle ones, how many are busy, and who waits for one. */
export interface Pool {
  origin: string;
  hostname: string;
  port: number;
  idle: Conn[];
  busy: number;
  waiting: Waiter[];
}

/** The bounds of {@linkcode OriginPools} (see `H1ClientOptions`). */
export interface PoolLimits {
  maxConnections: number;
  maxWaiting: number;
  idleTimeoutMs: number;
  idleReadAfterMs: number;
  /** Opens a new connection; `Deno.connect` (with no-delay) when not given. */
  connect?: (
    to: { hostname: string; port: number },
    signal: AbortSignal | null,
  ) => Promise<Deno.Conn>;
}

/** Every origin's pool, the connections open over them, and the timers that tend the idle ones. */
export class OriginPools {
  readonly #limits: PoolLimits;
  readonly #pools = new Map<string, Pool>();
  #open = 0;
  #sweeper: ReturnType<typeof setInterval> | undefined;
  /**
   * Connections released whose idle read has not started yet. It starts once the next request
   * (to any node) is written, while that node works, or at the latest `idleReadAfterMs` later:
   * a connection taken again before then (the next request at one connection) needs none, its
   * answer's read starting after its request is written. Started at release, the idle read was
   * an op call of about 2 µs between the node's answer and the client's, on a request's latency;
   * an immediate to start it cost more than the read (3 µs). One timer at a time, never set
   * again per request (a timeout set again before it fires cost a loaded proxy 5 µs a request).
   */
  #unwatched: Conn[] = [];
  #idleReader: ReturnType<typeof setTimeout> | undefined;

  constructor(limits: PoolLimits) {
    this.#limits = limits;
  }

  /** Connections open now (busy and idle) over every origin. */
  get open(): number {
    return this.#open;
  }

  /** The pool of `origin`, made when it has none (`url` parses it when given). */
  of(origin: string, url?: URL): Pool {
    let pool = this.#pools.get(origin);
    if (pool === undefined) {
      const parsed = url ?? new URL(origin);
      pool = {
        origin,
        hostname: parsed.hostname.replace(/^\[|\]$/g, ""),
        port: Number(parsed.port || (parsed.protocol === "https:" ? 443 : 80)),
        idle: [],
        busy: 0,
        waiting: [],
      };
      this.#pools.set(origin, pool);
    }
    return pool;
  }

  /** A connection to `pool`'s origin, pooled or new, waiting while the pool is full. */
  acquire(pool: Pool, stop: AbortSignal | Cancel | null): Promise<Conn> | Conn {
    while (pool.idle.length > 0) {
      const c = pool.idle.pop()!;
      if (!c.dead) {
        pool.busy++;
        c.idle = false;
        return c;
      }
    }
    const signal = signalOf(stop);
    if (pool.busy < this.#limits.maxConnections) {
      pool.busy++;
      return this.#connect(pool, signal);
    }
    if (pool.waiting.length >= this.#limits.maxWaiting) {
      throw new TypeError(
        `error sending request: ${pool.waiting.length} requests already wait for a connection ` +
          `to ${pool.origin} (maxWaiting)`,
      );
    }
    return new Promise<Conn>((resolve, reject) => {
      const waiter: Waiter = { resolve, reject, signal };
      pool.waiting.push(waiter);
      signal?.addEventListener("abort", () => {
        const at = pool.waiting.indexOf(waiter);
        if (at >= 0) pool.waiting.splice(at, 1);
        reject(signal.reason);
      }, { once: true });
    });
  }

  /**
   * One request's hold on `conn`: the returned `finish` frees the pool slot once, keeping the
   * connection for the next request only on a clean end; an abort of `signal` closes the
   * connection (which tells the node), runs `aborted`, and finishes.
   */
  hold(
    conn: Conn,
    pool: Pool,
    signal: AbortSignal | Cancel | null,
    aborted?: () => void,
  ): (reuse: boolean) => void {
    let finished = false;
    const finish = (reuse: boolean) => {
      if (finished) return;
      finished = true;
      listen(signal, onAbort, false);
      // Bytes past the answer's end break the framing of the next one.
      if (!reuse || conn.buffered.length > 0) {
        conn.destroy();
        this.#release(pool, undefined);
      } else this.#release(pool, conn);
    };
    const onAbort = () => {
      conn.destroy();
      aborted?.();
      finish(false);
    };
    listen(signal, onAbort, true);
    return finish;
  }

  /** Starts the idle reads still owed: called as a request is written, while its node works. */
  watchIdle(): void {
    if (this.#unwatched.length === 0) return;
    const those = this.#unwatched;
    this.#unwatched = [];
    for (let i = 0; i < those.length; i++) {
      const c = those[i];
      if (c.idle && !c.dead) c.watchIdle();
    }
  }

  /** Closes every idle connection and stops the timers; busy ones close as they end. */
  close(): void {
    for (const pool of this.#pools.values()) {
      for (const c of pool.idle) c.destroy();
      pool.idle = [];
    }
    if (this.#sweeper !== undefined) clearInterval(this.#sweeper);
    this.#sweeper = undefined;
    if (this.#idleReader !== undefined) clearTimeout(this.#idleReader);
    this.#idleReader = undefined;
    this.#unwatched = [];
  }

  async #connect(pool: Pool, signal: AbortSignal | null): Promise<Conn> {
    try {
      let tcp: Deno.Conn;
      if (this.#limits.connect !== undefined) {
        tcp = await this.#limits.connect({ hostname: pool.hostname, port: pool.port }, signal);
      } else {
        const plain = await Deno.connect({
          hostname: pool.hostname,
          port: pool.port,
          signal: signal ?? undefined,
        });
        plain.setNoDelay(true);
        tcp = plain;
      }
      this.#open++;
      return new Conn(tcp, this.#closed);
    } catch (error) {
      this.#release(pool, undefined);
      if (signal?.aborted) throw signal.reason;
      throw new TypeError(`error sending request: ${(error as Error).message}`, { cause: error });
    }
  }

  readonly #closed = (): void => {
    this.#open--;
  };

  /** Returns a finished connection (or a freed slot when `c` is undefined) to the pool. */
  #release(pool: Pool, c: Conn | undefined): void {
    pool.busy--;
    if (c !== undefined && c.dead) c = undefined;
    while (pool.waiting.length > 0) {
      const waiter = pool.waiting.shift()!;
      if (waiter.signal?.aborted) continue;
      pool.busy++;
      if (c !== undefined) waiter.resolve(c);
      else this.#connect(pool, waiter.signal).then(waiter.resolve, waiter.reject);
      return;
    }
    if (c === undefined) return;
    c.idleSince = performance.now();
    c.idle = true;
    // The next answer starts from nothing read: a failure before its first byte is a stale
    // connection (reset here, not when the idle read starts, which a connection taken again skips).
    c.answered = 0;
    pool.idle.push(c);
    this.#watchSoon(c);
    if (this.#sweeper === undefined) {
      const timer = setInterval(this.#sweep, Math.max(50, this.#limits.idleTimeoutMs / 2));
      Deno.unrefTimer(timer);
      this.#sweeper = timer;
    }
  }

  /** Owes `c` its idle read: started by the next request written, or by the timer. */
  #watchSoon(c: Conn): void {
    this.#unwatched.push(c);
    if (this.#idleReader === undefined) {
      this.#idleReader = setTimeout(this.#idleRead, this.#limits.idleReadAfterMs);
      Deno.unrefTimer(this.#idleReader);
    }
  }

  readonly #idleRead = (): void => {
    this.#idleReader = undefined;
    this.watchIdle();
  };

  /** Closes the connections idle past their timeout and drops the origins left with nothing. */
  readonly #sweep = (): void => {
    const now = performance.now();
    let idle = 0;
    for (const [origin, pool] of this.#pools) {
      pool.idle = pool.idle.filter((c) => {
        if (!c.dead && now - c.idleSince < this.#limits.idleTimeoutMs) return true;
        c.destroy();
        return false;
      });
      idle += pool.idle.length;
      if (pool.idle.length === 0 && pool.busy === 0 && pool.waiting.length === 0) {
        this.#pools.delete(origin);
      }
    }
    if (idle === 0 && this.#sweeper !== undefined) {
      clearInterval(this.#sweeper);
      this.#sweeper = undefined;
    }
  };
}
