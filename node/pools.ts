/**
 * Warm pools: sandboxes built ahead of demand, per template and size, so a create whose
 * template and size match is a claim (a ledger write, no engine call) instead of a cold create.
 *
 * @module
 */
import type { Clock } from "../shared/clock.ts";
import { systemClock } from "../shared/clock.ts";
import { ChangeLog, type Log, silentLog } from "../shared/log.ts";
import {
  poolKey,
  type PoolReport,
  type PoolSpec,
  type PoolStatus,
  type PoolTarget,
  setPoolsSchema,
} from "../shared/pools.ts";
import { describeZodError, type SandboxSpec } from "../shared/schemas.ts";
import { formatPools } from "./config_capabilities.ts";
import type { Executor } from "./executors/contract.ts";
import { type Ledger, newSandboxId } from "./ledger.ts";

/** Options of {@linkcode WarmPools}. */
export interface WarmPoolsOptions {
  /** Where warm sandboxes are recorded (so the boot reconcile knows their containers). */
  ledger: Ledger;
  /** Builds, probes and removes the warm sandboxes. */
  executor: Executor;
  /**
   * `<DORMICE_DATA_DIR>/pools.json`: the targets `set()` applied, which seed the pools at the
   * next start (over `initial`). `null` keeps them in memory only.
   */
  file?: string | null;
  /** The targets when there is no `file` yet (`DORMICE_POOLS`). */
  initial?: PoolTarget[];
  /**
   * Warm sandboxes built at once, over every pool. Default 2: a build is a container create and
   * start (about 175 ms of engine work each on Docker), and a refill must not crowd out the
   * cold creates and commands of the sandboxes already serving.
   */
  concurrency?: number;
  /**
   * The health probe a new warm sandbox passes before it joins: by default a `true` command
   * must exit 0 within `probeTimeoutMs`, which proves the container runs and execs work.
   */
  probe?: (id: string) => Promise<void>;
  /** Bound of the default probe. Default 10,000 ms. */
  probeTimeoutMs?: number;
  /**
   * How long the refill after a claim waits, ms (claims meanwhile share it). Default 1,000: the
   * claimed sandbox's first commands come right after its claim, and a refill at once (a
   * container create and start, then the probe, on the same engine and cores) made them
   * 1.5–2× slower on Docker (measured 2026-12-04, bench/RESULTS.md "first command after a
   * claim"). A second's wait leaves a pool of one empty a second longer, as a refill takes
   * about that anyway.
   */
  claimRefillDelayMs?: number;
  /** First wait after a failed build; doubles per failure in a row. Default 1,000 ms. */
  backoffBaseMs?: number;
  /** Longest wait between attempts of a failing pool. Default 60,000 ms. */
  backoffMaxMs?: number;
  /** Time of backoffs and of warm rows; `systemClock` when absent. */
  clock?: Clock;
  /**
   * Starts the retry timer of a pool in backoff and the delayed refill after a claim;
   * `setTimeout` when absent (tests pass their own and run what it was given, or call `kick()`
   * after ticking the clock).
   */
  setTimer?: (fn: () => void, ms: number) => unknown;
  /** Where failures (on change) and adoptions are logged. */
  log?: Log;
}

/** One pool's live state. */
interface Pool {
  key: string;
  template: string;
  spec: PoolSpec;
  target: number;
  /** Ids ready to be claimed, oldest first (a claim takes the oldest: it was probed first). */
  warm: string[];
  building: number;
  claimed: number;
  /** Failed builds in a row; 0 once one succeeds. */
  failures: number;
  /** No build before this time (ms, `clock`). */
  retryAt: number;
}

/** What a create asks for, as far as a pool can match it. */
export interface ClaimAsk {
  /** The template to build from. */
  template: string;
  /** The create's spec: a claim needs its size to match and nothing a warm sandbox lacks. */
  spec: SandboxSpec;
}

/**
 * The node's warm pools. A pool's warm sandboxes are real sandboxes of the executor, recorded in
 * the ledger's `warm` table: the boot reconcile keeps them (and removes any container without a
 * row, such as one a crash left mid-build), and `start()` adopts them again.
 *
 * Refill rules: `kick()` is coalesced (many kicks before the next turn are one wave), a claim
 * kicks only after `claimRefillDelayMs` (its sandbox's first commands go first), a wave
 * builds at most `concurrency` sandboxes at once over all pools, a new sandbox joins only after
 * the probe passes, and a failing pool waits `backoffBaseMs · 2^(failures-1)` (at most
 * `backoffMaxMs`), its failure logged when the sentence changes, not per attempt.
 *
 * @example
 * ```ts
 * import { FakeExecutor } from "./executors/fake.ts";
 * import { Ledger } from "./ledger.ts";
 * import { WarmPools } from "./pools.ts";
 * const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
 * const pools = new WarmPools({ ledger, executor: new FakeExecutor() });
 * await pools.start();
 * pools.set([{ template: "base", spec: {}, warm: 2 }]);
 * await pools.settled();
 * console.log(pools.list()[0].warm); // 2
 * const id = pools.claim({ template: "base", spec: {} }); // "k3v9q0…": the caller records it
 * await pools.close();
 * ```
 */
export class WarmPools {
  #ledger: Ledger;
  #executor: Executor;
  #file: string | null;
  #initial: PoolTarget[];
  #concurrency: number;
  #claimRefillDelayMs: number;
  /** Whether a refill after a claim is waiting for its delay. */
  #claimRefillPending = false;
  #probe: (id: string) => Promise<void>;
  #backoffBaseMs: number;
  #backoffMaxMs: number;
  #clock: Clock;
  #setTimer: (fn: () => void, ms: number) => unknown;
  #log: Log;
  #changes: ChangeLog;
  #pools = new Map<string, Pool>();
  #building = 0;
  #scheduled = false;
  #closed = false;
  /** Builds and removals in flight, so `settled()` and `close()` can wait for them. */
  #work = new Set<Promise<void>>();
  #timers = new Set<string>();
  #waves = 0;

  /** Builds the pools; nothing runs until `start()`. */
  constructor(options: WarmPoolsOptions) {
    this.#ledger = options.ledger;
    this.#executor = options.executor;
    this.#file = options.file ?? null;
    this.#initial = options.initial ?? [];
    this.#concurrency = Math.max(1, options.concurrency ?? 2);
    this.#claimRefillDelayMs = Math.max(0, options.claimRefillDelayMs ?? 1_000);
    const probeTimeoutMs = options.probeTimeoutMs ?? 10_000;
    this.#probe = options.probe ?? ((id) => this.#defaultProbe(id, probeTimeoutMs));
    this.#backoffBaseMs = options.backoffBaseMs ?? 1_000;
    this.#backoffMaxMs = options.backoffMaxMs ?? 60_000;
    this.#clock = options.clock ?? systemClock;
    this.#setTimer = options.setTimer ??
      ((fn, ms) => Deno.unrefTimer(setTimeout(fn, ms) as unknown as number));
    this.#log = options.log ?? silentLog;
    this.#changes = new ChangeLog(this.#log);
  }

  /** Refill waves started so far (a coalesced burst of kicks counts once). */
  get waves(): number {
    return this.#waves;
  }

  /**
   * Loads the targets (`pools.json` when it exists, else `initial`), adopts the warm rows the
   * ledger kept (call after the boot reconcile, which dropped rows whose containers are gone),
   * removes warm sandboxes no target wants, and starts the refill.
   *
   * @throws {Error} a sentence naming `pools.json` when it cannot be read or is not valid.
   */
  async start(): Promise<void> {
    const targets = this.#file === null ? null : await readPoolsFile(this.#file);
    if (targets !== null) this.#reportSeed(this.#file!, targets);
    this.#apply(targets ?? this.#initial);
    for (const row of this.#ledger.warmRows()) {
      const pool = this.#pools.get(poolKey(row.template, row.spec));
      if (pool !== undefined && pool.warm.length < pool.target) {
        pool.warm.push(row.id);
      } else {
        this.#remove(row.id);
      }
    }
    const adopted = [...this.#pools.values()].reduce((n, p) => n + p.warm.length, 0);
    if (adopted > 0) this.#log("info", "warm sandboxes adopted at boot", { adopted });
    this.kick();
  }

  /**
   * Says that `file` seeded the pools, and warns when `DORMICE_POOLS` asks for other ones: an
   * operator who edits the variable of a node that once took `setPools` would otherwise see
   * the edit ignored in silence. An unset `DORMICE_POOLS` is the `setPools` way, not a
   * disagreement.
   */
  #reportSeed(file: string, targets: PoolTarget[]): void {
    const pools = formatPools(targets);
    this.#log(
      "info",
      "warm pools seeded from pools.json, which setPools wrote: it wins over DORMICE_POOLS " +
        "while it exists",
      { file, pools, fix: `delete ${file} and restart the node to go back to DORMICE_POOLS` },
    );
    if (this.#initial.length === 0) return;
    const keys = (list: PoolTarget[]) =>
      list.map((t) => `${poolKey(t.template, t.spec)}=${t.warm}`).sort().join(",");
    if (keys(targets) === keys(this.#initial)) return;
    this.#log(
      "warn",
      "pools.json disagrees with DORMICE_POOLS, which is ignored while the file exists",
      {
        file,
        pools,
        DORMICE_POOLS: formatPools(this.#initial),
        fix: `send setPools with the pools you want (it rewrites ${file}), or delete ${file} ` +
          "and restart the node to use DORMICE_POOLS",
      },
    );
  }

  /**
   * Sets the whole set of targets (a pool left out is emptied), writes them to `pools.json`
   * and kicks the refill; returns what `list()` then says.
   *
   * @throws {RangeError} a sentence naming the field when `targets` is not valid.
   */
  async set(targets: PoolTarget[]): Promise<PoolStatus[]> {
    const r = setPoolsSchema.safeParse({ pools: targets });
    if (!r.success) throw new RangeError(`Invalid pools: ${describeZodError(r.error, "pools")}`);
    if (this.#file !== null) await writePoolsFile(this.#file, r.data.pools);
    this.#apply(r.data.pools);
    this.kick();
    return this.list();
  }

  /** Every pool with its counts, in the order the targets were given. */
  list(): PoolStatus[] {
    return [...this.#pools.values()].map((p) => ({
      template: p.template,
      spec: { ...p.spec },
      warm: p.warm.length,
      target: p.target,
      refilling: p.building,
      claimed: p.claimed,
    }));
  }

  /** What a check-in says of each pool. */
  reports(): PoolReport[] {
    return [...this.#pools.values()].map((p) => ({
      template: p.template,
      spec: { ...p.spec },
      warm: p.warm.length,
      target: p.target,
    }));
  }

  /** Warm sandboxes ready now, over every pool (the reading's `warm`). */
  warmCount(): number {
    let n = 0;
    for (const p of this.#pools.values()) n += p.warm.length;
    return n;
  }

  /**
   * Takes a warm sandbox for a create, or `undefined` (no pool for that template and size, an
   * empty pool, or a spec a warm sandbox cannot honour: network, egress rules, pids, volumes).
   * Synchronous
   * and without an engine call; the caller records the sandbox under its new name (and calls
   * `giveBack` when it cannot). Starts the refill `claimRefillDelayMs` later.
   */
  claim(ask: ClaimAsk): string | undefined {
    const { spec } = ask;
    if (
      spec.network !== undefined || spec.egressRules !== undefined || spec.pids !== undefined ||
      spec.volumes?.length
    ) {
      return undefined;
    }
    const pool = this.#pools.get(poolKey(ask.template, spec));
    const id = pool?.warm.shift();
    if (pool === undefined || id === undefined) return undefined;
    pool.claimed++;
    this.#refillAfterClaim();
    return id;
  }

  /** Kicks the refill once the claim's delay has passed; claims meanwhile share the kick. */
  #refillAfterClaim(): void {
    if (this.#claimRefillDelayMs === 0) return this.kick();
    if (this.#claimRefillPending) return;
    this.#claimRefillPending = true;
    this.#setTimer(() => {
      this.#claimRefillPending = false;
      this.kick();
    }, this.#claimRefillDelayMs);
  }

  /** Returns a claimed sandbox whose ledger write failed: it is still warm and unowned. */
  giveBack(ask: ClaimAsk, id: string): void {
    const pool = this.#pools.get(poolKey(ask.template, ask.spec));
    if (pool !== undefined && pool.warm.length < pool.target) {
      pool.warm.unshift(id);
      pool.claimed--;
    } else this.#remove(id);
  }

  /** Asks for a refill wave; kicks before it starts are one wave. */
  kick(): void {
    if (this.#scheduled || this.#closed) return;
    this.#scheduled = true;
    queueMicrotask(() => {
      this.#scheduled = false;
      if (this.#closed) return;
      this.#waves++;
      this.#fill();
    });
  }

  /**
   * Resolves once no build or removal runs and nothing more would start now (a pool in
   * backoff counts as settled). For tests and orderly shutdown.
   */
  async settled(): Promise<void> {
    for (;;) {
      await Promise.resolve();
      if (this.#work.size === 0 && !this.#scheduled) return;
      await Promise.all([...this.#work]);
    }
  }

  /**
   * Stops refilling and waits for builds in flight (each ends in the ledger or removed). The
   * warm sandboxes stay: the next start adopts them.
   */
  async close(): Promise<void> {
    this.#closed = true;
    await Promise.all([...this.#work]);
  }

  /**
   * Replaces the targets; warm sandboxes beyond a lowered or dropped target are removed. A pool
   * whose key stays keeps its object (only the target changes): a build in flight holds that
   * object and counts itself off it, and its failure sets that object's backoff, so a copy
   * would keep counting the build for ever and never refill.
   */
  #apply(targets: PoolTarget[]): void {
    const next = new Map<string, Pool>();
    for (const t of targets) {
      const key = poolKey(t.template, t.spec);
      const pool = this.#pools.get(key) ?? {
        key,
        template: t.template,
        spec: {
          ...(t.spec.cpus === undefined ? {} : { cpus: t.spec.cpus }),
          ...(t.spec.memoryMB === undefined ? {} : { memoryMB: t.spec.memoryMB }),
        },
        target: t.warm,
        warm: [],
        building: 0,
        claimed: 0,
        failures: 0,
        retryAt: 0,
      };
      pool.target = t.warm;
      next.set(key, pool);
    }
    for (const [key, old] of this.#pools) {
      if (next.has(key)) continue;
      for (const id of old.warm) this.#remove(id);
      // A dropped pool's failure sentence goes with it, so the map holds only live pools.
      this.#changes.clear(`pool:${key}`);
    }
    for (const pool of next.values()) {
      while (pool.warm.length > pool.target) this.#remove(pool.warm.pop()!);
    }
    this.#pools = next;
  }

  /** Starts builds while a pool is short and the concurrency allows. */
  #fill(): void {
    if (this.#closed) return;
    const now = this.#clock.now();
    let started = true;
    // Round-robin over the pools, one build each per turn, so one large pool cannot starve a
    // small one of the shared concurrency.
    while (started && this.#building < this.#concurrency) {
      started = false;
      for (const pool of this.#pools.values()) {
        if (this.#building >= this.#concurrency) break;
        if (pool.warm.length + pool.building >= pool.target) continue;
        if (pool.retryAt > now) {
          this.#retryLater(pool, pool.retryAt - now);
          continue;
        }
        this.#track(this.#build(pool));
        started = true;
      }
    }
  }

  async #build(pool: Pool): Promise<void> {
    this.#building++;
    pool.building++;
    const id = newSandboxId();
    const { template, spec } = pool;
    let built = false;
    try {
      await this.#executor.create({ id, name: `warm-${id}`, template, spec, env: {} });
      built = true;
      await this.#probe(id);
      this.#ledger.insertWarm({ id, template, spec, createdAt: this.#clock.now() });
      pool.failures = 0;
      pool.retryAt = 0;
      this.#changes.clear(`pool:${pool.key}`);
      const current = this.#pools.get(pool.key);
      if (this.#closed || current === undefined) {
        // Set aside by close() or dropped by set() meanwhile: the row stays for the next boot
        // when closing; a dropped pool's sandbox goes.
        if (!this.#closed) this.#remove(id);
      } else if (current.warm.length < current.target) current.warm.push(id);
      else this.#remove(id);
    } catch (error) {
      if (built) await this.#executor.destroy(id).catch(() => {});
      pool.failures++;
      const wait = Math.min(
        this.#backoffMaxMs,
        this.#backoffBaseMs * 2 ** Math.min(30, pool.failures - 1),
      );
      pool.retryAt = this.#clock.now() + wait;
      const why = (error as Error)?.message ?? String(error);
      this.#changes.report(
        `pool:${pool.key}`,
        why,
        "warn",
        "warm pool refill failed; retrying with backoff",
        { pool: pool.key, error: why, failures: pool.failures, retryInMs: wait },
      );
    } finally {
      this.#building--;
      pool.building--;
    }
    this.#fill();
  }

  #retryLater(pool: Pool, ms: number): void {
    if (this.#timers.has(pool.key)) return;
    this.#timers.add(pool.key);
    this.#setTimer(() => {
      this.#timers.delete(pool.key);
      this.kick();
    }, ms);
  }

  /** Removes a warm sandbox (container, then row) in the background. */
  #remove(id: string): void {
    this.#track((async () => {
      try {
        await this.#executor.destroy(id);
        this.#ledger.deleteWarm(id);
      } catch (error) {
        // The row stays, so the next boot tries again; nothing is orphaned.
        this.#log("warn", "could not remove a warm sandbox", { id, error });
      }
    })());
  }

  #track(work: Promise<void>): void {
    this.#work.add(work);
    work.finally(() => this.#work.delete(work));
  }

  async #defaultProbe(id: string, timeoutMs: number): Promise<void> {
    const run = await this.#executor.exec(id, { cmd: ["true"], timeoutMs });
    // Drained, not cancelled: `true` writes nothing, and a cancelled stream can fail the exec.
    const [exit] = await Promise.all([
      run.exited,
      new Response(run.stdout).arrayBuffer(),
      new Response(run.stderr).arrayBuffer(),
    ]);
    if (exit.exitCode !== 0) {
      throw new Error(
        `the health probe 'true' exited ${exit.exitCode}${exit.timedOut ? " (timed out)" : ""}`,
      );
    }
  }
}

/** Reads `pools.json`; `null` when it does not exist. */
async function readPoolsFile(file: string): Promise<PoolTarget[] | null> {
  let text: string;
  try {
    text = await Deno.readTextFile(file);
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return null;
    throw new Error(
      `Cannot read ${file} (${(error as Error).message}): fix its permissions, or delete it to ` +
        "go back to DORMICE_POOLS",
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw new Error(
      `${file} is not JSON (${(error as Error).message}): delete it to go back to ` +
        "DORMICE_POOLS, or set the pools again with setPools",
    );
  }
  const r = setPoolsSchema.safeParse(value);
  if (!r.success) {
    throw new Error(
      `${file} is not a pools file (${describeZodError(r.error, "pools.json")}): delete it to ` +
        "go back to DORMICE_POOLS, or set the pools again with setPools",
    );
  }
  return r.data.pools;
}

/** Writes `pools.json` whole or not at all (a temporary file renamed over it). */
async function writePoolsFile(file: string, pools: PoolTarget[]): Promise<void> {
  const temporary = `${file}.${crypto.randomUUID()}.tmp`;
  await Deno.writeTextFile(temporary, JSON.stringify({ pools }, null, 2) + "\n");
  await Deno.rename(temporary, file);
}
