/**
 * The bound on `POST /files` uploads one node streams at once. An upload streams, so it holds
 * little memory, but it holds an executor transfer and (on Docker) up to the upload cap of
 * staging disk; without a bound, many clients uploading at once could still exhaust either.
 * Uploads past the bound wait in a short queue (the SDK sends a multi-file write as parallel
 * uploads, which must not fail for arriving together); past the queue, or past the wait, the
 * client gets a 503 with Retry-After.
 *
 * @module
 */
import { HttpError } from "../../../shared/http_error.ts";

/** Options of {@linkcode UploadSlots}. */
export interface UploadSlotsOptions {
  /** Uploads that stream at once (default 8: at the default 1 GiB cap, 8 GiB of Docker staging). */
  concurrent?: number;
  /** Uploads that may wait for a slot (default 64); one more is refused at once. */
  queued?: number;
  /** How long an upload waits for a slot before it is refused, ms (default 30 s). */
  waitMs?: number;
}

/**
 * A counting semaphore with a bounded, timed queue, shared by every `/files` door of a node.
 *
 * @example
 * ```ts
 * import { UploadSlots } from "./upload_slots.ts";
 * const slots = new UploadSlots({ concurrent: 1 });
 * const release = await slots.acquire();
 * try {
 *   // stream the upload
 * } finally {
 *   release();
 * }
 * ```
 */
export class UploadSlots {
  readonly #concurrent: number;
  readonly #queued: number;
  readonly #waitMs: number;
  #active = 0;
  /** Waiters in arrival order; each is resolved with its release, or removed when it gives up. */
  #waiters: ((release: () => void) => void)[] = [];

  /**
   * Slots with the given bounds.
   *
   * @throws {RangeError} when a bound is not a positive whole number (`queued` may be 0).
   */
  constructor({ concurrent = 8, queued = 64, waitMs = 30_000 }: UploadSlotsOptions = {}) {
    if (!Number.isInteger(concurrent) || concurrent < 1) {
      throw new RangeError(
        `Cannot create UploadSlots as 'concurrent' must be a positive integer: received ${concurrent}`,
      );
    }
    if (!Number.isInteger(queued) || queued < 0) {
      throw new RangeError(
        `Cannot create UploadSlots as 'queued' must be 0 or more: received ${queued}`,
      );
    }
    this.#concurrent = concurrent;
    this.#queued = queued;
    this.#waitMs = waitMs;
  }

  /** Uploads streaming now. */
  get active(): number {
    return this.#active;
  }

  /** Uploads waiting for a slot. */
  get waiting(): number {
    return this.#waiters.length;
  }

  /**
   * Takes a slot, waiting for one when all are taken; resolves with the function that gives it
   * back (calling it twice gives back one slot).
   *
   * @throws {HttpError} 503 with Retry-After when the queue is full or the wait runs out, 499
   * when `signal` aborts while it waits.
   */
  acquire(signal?: AbortSignal): Promise<() => void> {
    if (this.#active < this.#concurrent) {
      this.#active++;
      return Promise.resolve(this.#release());
    }
    if (this.#waiters.length >= this.#queued) return Promise.reject(this.#busy());
    return new Promise((resolve, reject) => {
      const waiter = (release: () => void) => {
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        resolve(release);
      };
      const leave = (error: HttpError) => {
        const at = this.#waiters.indexOf(waiter);
        if (at !== -1) this.#waiters.splice(at, 1);
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        reject(error);
      };
      const onAbort = () => leave(new HttpError(499, "The client closed the request"));
      const timer = setTimeout(() => leave(this.#busy()), this.#waitMs);
      signal?.addEventListener("abort", onAbort, { once: true });
      this.#waiters.push(waiter);
    });
  }

  #release(): () => void {
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#waiters.shift();
      // The slot passes straight to the first waiter, so a new arrival cannot overtake it.
      if (next) next(this.#release());
      else this.#active--;
    };
  }

  #busy(): HttpError {
    return new HttpError(
      503,
      `This node is streaming ${this.#active} uploads at once (its bound) and ` +
        `${this.#waiters.length} more wait: retry in a few seconds, or send fewer files in ` +
        "parallel",
      { headers: { "retry-after": "2" } },
    );
  }
}
