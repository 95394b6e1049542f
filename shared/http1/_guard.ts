/**
 * The guard of {@linkcode serveGuarded} (serve.ts): its bounds, resolved once from the options,
 * and the accept loop that watches every connection whatever back end serves it. A connection
 * that has not completed a request head within `headerTimeoutMs` of its accept (or of its last
 * answer) is closed, a kept-alive one with nothing in flight after `idleTimeoutMs`, one whose
 * client stops sending a body or reading an answer after `bodyTimeoutMs` or `writeTimeoutMs`
 * (back ends that count their socket calls only); at most `maxConnections` are open, and running
 * out of descriptors sheds the idle ones and backs off instead of ending anything.
 *
 * @module
 */
import type { Clock } from "../clock.ts";
import { ChangeLog, type Log } from "../log.ts";
import { type Progress, StallWatch, unmetered } from "./_progress.ts";

/** Every bound of the guard, in one place (see `GuardedServeOptions` for each). */
export interface GuardBounds {
  headerTimeoutMs: number;
  idleTimeoutMs: number;
  bodyTimeoutMs: number;
  writeTimeoutMs: number;
  maxConnections: number;
  /** How often the timeouts are checked; `0` leaves it to `sweep`. */
  sweepIntervalMs: number;
}

/** The bounds `options` set, each absent one at its default. */
export function guardBounds(options: Partial<GuardBounds>): GuardBounds {
  const headerTimeoutMs = options.headerTimeoutMs ?? 10_000;
  const idleTimeoutMs = options.idleTimeoutMs ?? 60_000;
  const bodyTimeoutMs = options.bodyTimeoutMs ?? 60_000;
  const writeTimeoutMs = options.writeTimeoutMs ?? 60_000;
  const maxConnections = options.maxConnections ?? 8_192;
  // A quarter of the shorter timeout, between 250 ms and 5 s.
  const sweepIntervalMs = options.sweepIntervalMs ??
    Math.max(
      250,
      Math.min(
        5_000,
        Math.floor(Math.min(headerTimeoutMs, idleTimeoutMs, bodyTimeoutMs, writeTimeoutMs) / 4),
      ),
    );
  return {
    headerTimeoutMs,
    idleTimeoutMs,
    bodyTimeoutMs,
    writeTimeoutMs,
    maxConnections,
    sweepIntervalMs,
  };
}

/** How long a connection is left open after its last answer when it is closed for shutdown. */
const FLUSH_GRACE_MS = 100;

/** One accepted connection and what it is doing. */
export interface Watched {
  /** Aborting it makes the back end close the connection. */
  stop: AbortController;
  /** Requests whose answer is not fully sent yet. */
  inFlight: number;
  /** Since when it has been waiting for a request head (`inFlight === 0`), in ms. */
  waitingSince: number;
  /** True once a request has been answered: it is then a kept-alive connection. */
  served: boolean;
  /** Settles when the back end has closed it. */
  done: Promise<void>;
  /** Its reads and writes, counted by the bytes engine (Deno's servers count none). */
  progress: Progress;
  /** What the last sweeps saw of them. */
  stalls: StallWatch;
}

/**
 * A back end: serves one accepted connection until it closes, counting each request it begins
 * in `c.inFlight` and telling `answered` of each answer sent, and closing the connection once
 * `c.stop` is aborted.
 */
export type Backend = (
  conn: Deno.TcpConn | Deno.TlsConn,
  c: Watched,
  answered: (c: Watched) => void,
) => Promise<void>;

/** An accept error that means "out of descriptors": shed and retry, never stop. */
function outOfDescriptors(error: unknown): boolean {
  const message = (error as Error)?.message ?? "";
  return /os error (23|24)\b|Too many open files/i.test(message);
}

/** The accept loop over `listener`, every connection served by `serve` and watched. */
export class ConnectionGuard {
  /** The bound address (the real port when `port` was 0). */
  readonly addr: Deno.NetAddr;
  /** Resolves when the guard has stopped and every connection is closed. */
  readonly finished: Promise<void>;
  readonly #listener: Deno.Listener<Deno.TcpConn | Deno.TlsConn>;
  readonly #serve: Backend;
  readonly #bounds: GuardBounds;
  readonly #clock: Clock;
  readonly #changes: ChangeLog;
  /** Aborted at shutdown: the bytes engine's WebSocket splices end then, as nothing else does. */
  readonly #closing: AbortController;
  readonly #open = new Set<Watched>();
  readonly #accepting: Promise<void>;
  readonly #sweeper: ReturnType<typeof setInterval> | undefined;
  #stopping = false;
  #finishedResolve!: () => void;

  constructor(
    listener: Deno.Listener<Deno.TcpConn | Deno.TlsConn>,
    serve: Backend,
    setting: { bounds: GuardBounds; clock: Clock; log: Log; closing: AbortController },
  ) {
    this.#listener = listener;
    this.addr = listener.addr as Deno.NetAddr;
    this.#serve = serve;
    this.#bounds = setting.bounds;
    this.#clock = setting.clock;
    this.#changes = new ChangeLog(setting.log);
    this.#closing = setting.closing;
    this.#accepting = this.#accept();
    const every = this.#bounds.sweepIntervalMs;
    this.#sweeper = every > 0 ? setInterval(() => this.sweep(), every) : undefined;
    this.finished = new Promise<void>((r) => this.#finishedResolve = r);
  }

  /** Connections open now. */
  connections(): number {
    return this.#open.size;
  }

  /** Closes the connections past a timeout now; returns how many it closed. */
  sweep(): number {
    const now = this.#clock.now();
    const { writeTimeoutMs, bodyTimeoutMs, idleTimeoutMs, headerTimeoutMs } = this.#bounds;
    let n = 0;
    for (const c of this.#open) {
      if (c.stop.signal.aborted) continue;
      if (!idle(c)) {
        // A request in flight: only a client that stopped sending its body or reading its
        // answer is cut; the handler's own time is the handler's to bound.
        const { waiting, ms } = c.stalls.check(c.progress, now);
        if (waiting !== undefined && ms >= (waiting === "write" ? writeTimeoutMs : bodyTimeoutMs)) {
          this.#close(c);
          n++;
        }
        continue;
      }
      // A kept-alive connection gets the idle bound for its next head too: nobody can tell an
      // idle socket from one whose first head byte is late.
      const bound = c.served ? idleTimeoutMs : headerTimeoutMs;
      if (now - c.waitingSince >= bound) {
        this.#close(c);
        n++;
      }
    }
    return n;
  }

  /**
   * Stops accepting, closes idle connections, and resolves once every in-flight request has
   * finished.
   */
  async shutdown(): Promise<void> {
    if (!this.#stopping) {
      this.#stopping = true;
      this.#closing.abort();
      clearInterval(this.#sweeper);
      try {
        this.#listener.close();
      } catch {
        // Already closed.
      }
      await this.#accepting;
      for (const c of this.#open) if (idle(c)) this.#closeAfterFlush(c);
    }
    await Promise.all([...this.#open].map((c) => c.done));
    this.#finishedResolve();
  }

  #close(c: Watched): void {
    if (c.stop.signal.aborted || !this.#open.has(c)) return;
    try {
      c.stop.abort();
    } catch {
      // The connection ended between the check and the abort: nothing left to close.
    }
  }

  // Deno reports an answer complete once it holds the bytes, not once they are on the wire:
  // closing at that moment cuts the answer off (measured), so a close right after an answer waits.
  #closeAfterFlush(c: Watched): void {
    setTimeout(() => this.#close(c), FLUSH_GRACE_MS);
  }

  /** Closes idle connections, the longest-waiting first, `limit` of them at most. */
  #shed(limit: number): number {
    const candidates = [...this.#open].filter(idle).sort((a, b) => a.waitingSince - b.waitingSince);
    const victims = candidates.slice(0, limit);
    for (const c of victims) this.#close(c);
    return victims.length;
  }

  /** The end of one answer: the connection waits for its next head from now. */
  readonly #answered = (c: Watched): void => {
    c.inFlight--;
    c.served = true;
    c.waitingSince = this.#clock.now();
    if (this.#stopping && c.inFlight === 0) this.#closeAfterFlush(c);
  };

  #watch(conn: Deno.TcpConn | Deno.TlsConn): void {
    const c: Watched = {
      stop: new AbortController(),
      inFlight: 0,
      waitingSince: this.#clock.now(),
      served: false,
      done: Promise.resolve(),
      progress: unmetered(),
      stalls: new StallWatch(),
    };
    this.#open.add(c);
    c.done = this.#serve(conn, c, this.#answered).catch(() => {
      // A reset or a half-written request ends this connection only; nothing to report.
    }).finally(() => this.#open.delete(c));
  }

  async #accept(): Promise<void> {
    const open = this.#open;
    let backoffMs = 10;
    // Only a recovery is news: the first connection after boot is not "again".
    let acceptFailed = false;
    while (!this.#stopping) {
      let conn: Deno.TcpConn | Deno.TlsConn;
      try {
        conn = await this.#listener.accept();
      } catch (error) {
        if (this.#stopping || error instanceof Deno.errors.BadResource) break;
        const descriptors = outOfDescriptors(error);
        const shedCount = descriptors ? this.#shed(Math.max(1, Math.ceil(open.size / 4))) : 0;
        this.#changes.report(
          "accept",
          descriptors ? "descriptors" : String((error as Error)?.message),
          "warn",
          descriptors
            ? "out of file descriptors: closing idle connections and retrying; raise the limit " +
              "(LimitNOFILE in the systemd unit, ulimit -n) if this is real traffic"
            : "accepting a connection failed; retrying",
          { error: String((error as Error)?.message ?? error), open: open.size, shed: shedCount },
        );
        acceptFailed = true;
        await new Promise((r) => setTimeout(r, backoffMs));
        backoffMs = Math.min(backoffMs * 2, 500);
        continue;
      }
      backoffMs = 10;
      if (acceptFailed) {
        acceptFailed = false;
        this.#changes.report("accept", "ok", "info", "accepting connections again", {
          open: open.size,
        });
      }
      if (open.size >= this.#bounds.maxConnections && this.#shed(1) === 0) {
        // Every connection is busy: refusing this one costs less than starving the busy ones.
        conn.close();
        continue;
      }
      this.#watch(conn);
    }
  }
}

/** Whether `c` has nothing in flight. */
function idle(c: Watched): boolean {
  return c.inFlight === 0;
}
