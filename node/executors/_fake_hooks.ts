/**
 * The test controls of `FakeExecutor` (private; re-exported by `fake.ts`): park, slow down, fail
 * and count any of its calls.
 *
 * @module
 */

/** The calls {@linkcode FakeExecutorHooks} can park, slow down, fail and count. */
export type FakeCall =
  | "create"
  | "destroy"
  | "exec"
  | "writeFile"
  | "readFile"
  | "listDir"
  | "stat"
  | "makeDir"
  | "move"
  | "remove"
  | "watch"
  | "pause"
  | "resume"
  | "stats"
  | "snapshot"
  | "listSnapshots"
  | "deleteSnapshot"
  | "archive"
  | "restore"
  | "list"
  | "portAddress"
  | "setEgressRules"
  | "exportImage"
  | "importImage";

interface Park {
  waiters: (() => void)[];
  arrived: number;
  onArrive: (() => void)[];
}

/**
 * Test controls of a {@linkcode FakeExecutor}. Each call runs, in order: count, park (if parked),
 * delay (if set), fail (if set). Concurrency: a park holds every call of that name made while it
 * is in place; the release function lets them all go and removes the park.
 *
 * @example Park a create, then let it go
 * ```ts
 * import { FakeExecutor } from "@dormice/cluster/node";
 * const executor = new FakeExecutor();
 * const release = executor.hooks.park("create");
 * const creating = executor.create({ id: "sbx_1", name: "a", template: "base", spec: {}, env: {} });
 * await executor.hooks.parked("create");
 * release();
 * await creating;
 * ```
 */
export class FakeExecutorHooks {
  /** How many times each call was made (counted before parking or failing). */
  readonly calls: Record<FakeCall, number> = {
    create: 0,
    destroy: 0,
    exec: 0,
    writeFile: 0,
    readFile: 0,
    listDir: 0,
    stat: 0,
    makeDir: 0,
    move: 0,
    remove: 0,
    watch: 0,
    pause: 0,
    resume: 0,
    stats: 0,
    snapshot: 0,
    listSnapshots: 0,
    deleteSnapshot: 0,
    archive: 0,
    restore: 0,
    list: 0,
    portAddress: 0,
    setEgressRules: 0,
    exportImage: 0,
    importImage: 0,
  };
  #parks = new Map<FakeCall, Park>();
  #delays = new Map<FakeCall, number>();
  #failures = new Map<FakeCall, { error: Error; times: number }>();

  /** Holds every `call` until the returned function is called. */
  park(call: FakeCall): () => void {
    const park: Park = { waiters: [], arrived: 0, onArrive: [] };
    this.#parks.set(call, park);
    return () => {
      if (this.#parks.get(call) === park) this.#parks.delete(call);
      for (const go of park.waiters.splice(0)) go();
    };
  }

  /** Resolves once `count` calls have reached the park of `call` (set the park first). */
  parked(call: FakeCall, count = 1): Promise<void> {
    const park = this.#parks.get(call);
    if (!park) return Promise.reject(new Error(`No park on '${call}': call hooks.park() first`));
    if (park.arrived >= count) return Promise.resolve();
    return new Promise((resolve) => {
      const check = () => {
        if (park.arrived >= count) resolve();
        else park.onArrive.push(check);
      };
      park.onArrive.push(check);
    });
  }

  /** Delays every `call` by `ms` (0 removes the delay). Uses real timers. */
  delay(call: FakeCall, ms: number): void {
    if (ms > 0) this.#delays.set(call, ms);
    else this.#delays.delete(call);
  }

  /** Makes the next `times` calls of `call` throw `error`. */
  fail(call: FakeCall, error: Error, times = 1): void {
    this.#failures.set(call, { error, times });
  }

  /** Removes every park (releasing what waits), delay and failure. */
  clear(): void {
    for (const park of this.#parks.values()) for (const go of park.waiters.splice(0)) go();
    this.#parks.clear();
    this.#delays.clear();
    this.#failures.clear();
  }

  /** Runs the controls for one call (the executor calls this first thing). */
  async enter(call: FakeCall): Promise<void> {
    this.calls[call]++;
    const park = this.#parks.get(call);
    if (park) {
      const wait = new Promise<void>((resolve) => park.waiters.push(resolve));
      park.arrived++;
      for (const f of park.onArrive.splice(0)) f();
      await wait;
    }
    const ms = this.#delays.get(call);
    if (ms) await new Promise((resolve) => setTimeout(resolve, ms));
    const failure = this.#failures.get(call);
    if (failure) {
      if (--failure.times <= 0) this.#failures.delete(call);
      throw failure.error;
    }
  }
}
