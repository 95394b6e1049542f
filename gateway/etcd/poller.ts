/**
 * A task run now and again `everyMs` after each run ends, until stopped: the loop shared mode's
 * replicas (the Fleet's and the key table's) read etcd with. A run never overlaps the next,
 * so a slow etcd slows the reads down instead of piling them up.
 *
 * @module
 */

/**
 * Runs `task` at once and then `everyMs` after each run ends, until `stop()`.
 *
 * @example
 * ```ts
 * import { Poller } from "./poller.ts";
 * const poller = new Poller(() => Promise.resolve(), 1000);
 * poller.start();
 * await poller.stop();
 * ```
 */
export class Poller {
  readonly #task: () => Promise<void>;
  readonly #everyMs: number;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #running = false;
  #run: Promise<void> | null = null;

  /** The task must not reject: a rejection would end the loop. */
  constructor(task: () => Promise<void>, everyMs: number) {
    this.#task = task;
    this.#everyMs = everyMs;
  }

  /** Starts the loop; a second call does nothing. */
  start(): void {
    if (this.#running) return;
    this.#running = true;
    const tick = async () => {
      this.#run = this.#task();
      await this.#run;
      if (this.#running) this.#timer = setTimeout(tick, this.#everyMs);
    };
    void tick();
  }

  /** Stops the loop and waits for a run in progress to end. */
  async stop(): Promise<void> {
    this.#running = false;
    clearTimeout(this.#timer);
    await this.#run;
  }
}
