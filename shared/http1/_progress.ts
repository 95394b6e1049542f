/**
 * A connection's socket calls, counted as they start and end, so its guard can tell a client
 * that stopped sending its body or stopped reading its answer from a handler that is still at
 * work (a long command, a node streaming slowly), which no bound of the guard's may cut.
 *
 * Counting costs two increments a call, no clock read: the guard's sweep compares the counts
 * with what it saw at its last pass, and a call that has not ended since is a stall from then.
 *
 * @module
 */

/** The counts one connection's engine keeps and its guard reads. */
export interface Progress {
  /** Reads of the request (head or body) begun; the hang-up watch's read is not one. */
  reads: number;
  /** Of those, ended. */
  readsDone: number;
  /** Writes of the answer begun. */
  writes: number;
  /** Of those, ended. */
  writesDone: number;
}

/** Counts nobody reads: a connection served without a guard. */
export function unmetered(): Progress {
  return { reads: 0, readsDone: 0, writes: 0, writesDone: 0 };
}

/** Writes to a socket, counting each call in `progress`. */
export class MeteredWriter {
  readonly #conn: { write(p: Uint8Array): Promise<number> };
  readonly #progress: Progress;

  constructor(conn: { write(p: Uint8Array): Promise<number> }, progress: Progress) {
    this.#conn = conn;
    this.#progress = progress;
  }

  write(bytes: Uint8Array): Promise<number> {
    this.#progress.writes++;
    return this.#conn.write(bytes).then(this.#wrote);
  }

  /** Made once: a closure a write would be garbage on the lane's path. */
  readonly #wrote = (n: number): number => {
    this.#progress.writesDone++;
    return n;
  };
}

/** What the guard remembers of one connection's counts between two sweeps. */
export class StallWatch {
  /** The ended calls counted at the sweep that first saw a call waiting; -1 when none waits. */
  #seen = -1;
  /** When that sweep ran. */
  #since = 0;

  /**
   * How long, as far as the sweeps can tell, a read or a write of `progress` has waited without
   * any call ending (0 when none waits), and which kind waits; a write is named first, since a
   * client that reads no answer holds its send buffer.
   */
  check(progress: Progress, now: number): { waiting: "read" | "write" | undefined; ms: number } {
    const writing = progress.writes > progress.writesDone;
    const reading = progress.reads > progress.readsDone;
    if (!writing && !reading) {
      this.#seen = -1;
      return { waiting: undefined, ms: 0 };
    }
    const done = progress.readsDone + progress.writesDone;
    if (this.#seen !== done) {
      this.#seen = done;
      this.#since = now;
    }
    return { waiting: writing ? "write" : "read", ms: now - this.#since };
  }
}
