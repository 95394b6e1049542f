/**
 * The sandbox service: keeps the ledger and the executor in step, one name at a time. This file
 * holds the verbs; service_create.ts the two ways a sandbox is made (a warm claim, a cold
 * create), service_state.ts the steps that keep a row and its sandbox in step (wake, pause,
 * lost, the boot reconcile), service_pause.ts the pause verbs (frozen, to disk, taken over from
 * another node), service_deadline.ts and service_egress.ts the deadline and egress-rule steps.
 *
 * @module
 */
import type { Clock } from "../shared/clock.ts";
import { systemClock } from "../shared/clock.ts";
import { HttpError } from "../shared/http_error.ts";
import type { Log } from "../shared/log.ts";
import { silentLog } from "../shared/log.ts";
import { NameQueue } from "../shared/name_queue.ts";
import { DEFAULT_TEAM, teamScopedName } from "../shared/teams.ts";
import type { LookupAnswer, LookupRequest } from "../shared/schemas.ts";
import { ABSENT_HEADER } from "../shared/native_schemas.ts";
import { RunningCommands, runToEnd } from "./_commands.ts";
import {
  type DirWatch,
  type ExecHandle,
  type ExecRequest,
  type Executor,
  ExecutorError,
  type FileEntry,
  type FileOptions,
  type FileStream,
  type FsChange,
  type SandboxLimits,
  type SandboxStats,
  type WatchRequest,
  type WriteOptions,
} from "./executors/contract.ts";
import type { EgressRules } from "../shared/egress_rules.ts";
import type { Ledger } from "./ledger.ts";
import type { WarmPools } from "./pools.ts";
import { MetricsHistory } from "./metrics_history.ts";
import {
  callExecutor,
  markLost,
  reconcileWithExecutor,
  type ServiceCore,
  wake,
} from "./service_state.ts";
import { buildNew } from "./service_create.ts";
import { expireAtDeadline, renewLifecycle } from "./service_deadline.ts";
import type { DirectCreate, SandboxServiceOptions } from "./service_options.ts";
import {
  boundedMetadata,
  execAnswer,
  matcher,
  refuseOtherTemplate,
  withEnv,
} from "./service_requests.ts";
import { changeEgressRules } from "./service_egress.ts";
import { archiveNow, pauseNow, takeOverArchived } from "./service_pause.ts";
import { SlotFence } from "./slot_fence.ts";

export type { SandboxServiceOptions } from "./service_options.ts";
import type {
  AcquireRequest,
  AcquireResult,
  DeadlineAction,
  ExecResult,
  ListFilter,
  SandboxOps,
  SandboxRecord,
  SandboxRef,
} from "./service_contract.ts";

/**
 * The node's sandbox service. Every verb that touches one sandbox runs inside that name's
 * NameQueue slot, so a create, a wake and a destroy of one name never interleave; a create
 * writes the executor first and the ledger row second, both inside the slot. A command's run is
 * outside the slot (only its wake and start are inside) so a long command never blocks a destroy
 * or another verb of the same sandbox.
 *
 * @example
 * ```ts
 * import { FakeExecutor, Ledger, SandboxService } from "@dormice/cluster/node";
 * const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
 * const service = new SandboxService({ ledger, executor: new FakeExecutor() });
 * const { created } = await service.acquire({ name: "agent-1" });
 * const r = await service.execCommand({ name: "agent-1" }, { cmd: ["echo", "hi"] });
 * console.log(created, r.stdout); // true "hi\n"
 * ```
 */
export class SandboxService implements SandboxOps {
  /** The per-name slots every verb runs in (the `queue` option, or one of its own). */
  readonly queue: NameQueue;
  /** Each sandbox's recent resource samples, dropped when the sandbox is destroyed. */
  readonly history: MetricsHistory;
  #ledger: Ledger;
  #executor: Executor;
  #clock: Clock;
  #log: Log;
  #defaultTemplate: string;
  #maxOutputBytes: number;
  #pools: WarmPools | undefined;
  #killGraceMs: number;
  #commands = new RunningCommands();
  #core: ServiceCore;
  #fence: SlotFence;
  #announceDirect?: (what: string, created: DirectCreate) => Promise<void>;
  #onArchived?: (sandbox: SandboxRecord) => Promise<void>;

  /** Builds the service over a ledger and an executor. */
  constructor(options: SandboxServiceOptions) {
    this.#ledger = options.ledger;
    this.#executor = options.executor;
    this.queue = options.queue ?? new NameQueue();
    this.#clock = options.clock ?? systemClock;
    this.#log = options.log ?? silentLog;
    this.#defaultTemplate = options.defaultTemplate ?? "base";
    this.#maxOutputBytes = options.maxOutputBytes ?? 1024 * 1024;
    this.history = options.history ?? new MetricsHistory();
    this.#killGraceMs = options.killGraceMs ?? 5_000;
    this.#pools = options.pools;
    this.#fence = options.fence ?? new SlotFence();
    this.#announceDirect = options.announceDirect;
    this.#onArchived = options.onArchived;
    this.#core = {
      ledger: this.#ledger,
      executor: this.#executor,
      clock: this.#clock,
      log: this.#log,
      queue: this.queue,
      lostAtBoot: new Set(),
    };
  }

  /** Create-or-wake by name. */
  acquire(request: AcquireRequest): Promise<AcquireResult> {
    const team = request.team ?? DEFAULT_TEAM;
    const slot = teamScopedName(team, request.name);
    return this.queue.run(slot, async () => {
      const existing = this.#ledger.byName(request.name, team);
      if (existing) {
        // A wake builds nothing: an older token may wake what a newer take built.
        this.#fence.saw(slot, request.slotToken);
        refuseOtherTemplate(existing, request.template);
        // A wake asks the executor even for an active row: "ready" must mean the sandbox is
        // there, not that the ledger remembers it.
        const sandbox = await this.#guard(
          existing,
          () => wake(this.#core, existing, { probe: true }),
        );
        return { created: false, sandbox: renewLifecycle(this.#core, sandbox, request) };
      }
      // A gateway that lost the name's slot must not build it beside the newer holder's.
      this.#fence.admit(slot, request.slotToken);
      const announce = request.direct ? this.#announceDirect : undefined;
      const what = `sandbox '${request.name}'`;
      // Behind the gateway's back: the gateway hears of the busy slot before anything is built.
      await announce?.(what, { team, name: request.name });
      const result = await buildNew(this.#core, this.#pools, this.#defaultTemplate, request, team);
      await announce?.(what, { team, name: request.name, id: result.sandbox.id }).catch((error) =>
        this.#log("warn", "a direct create's check-in failed", {
          name: request.name,
          cause: error instanceof Error ? error.message : String(error),
        })
      );
      return result;
    });
  }

  /**
   * The row, or undefined; never wakes. By id with a team, another team's row is undefined, as
   * if it did not exist.
   */
  get(ref: SandboxRef): SandboxRecord | undefined {
    if ("name" in ref) return this.#ledger.byName(ref.name, ref.team ?? DEFAULT_TEAM);
    const row = this.#ledger.byId(ref.id);
    return row && (ref.team === undefined || row.team === ref.team) ? row : undefined;
  }

  /** Every row matching the filter. Holds the event loop for every row: prefer `listInSlices`. */
  list(filter: ListFilter = {}): SandboxRecord[] {
    return this.#ledger.all().filter(matcher(filter));
  }

  /** Every row matching the filter, read a page at a time with the event loop let run between. */
  async listInSlices(filter: ListFilter = {}): Promise<SandboxRecord[]> {
    const matches = matcher(filter);
    const out: SandboxRecord[] = [];
    for await (const page of this.#ledger.pages()) {
      for (const row of page) if (matches(row)) out.push(row);
    }
    return out;
  }

  /** Every sandbox's id, without decoding its row. */
  ids(): string[] {
    return this.#ledger.keys().map((k) => k.id);
  }

  /**
   * The three-step truth: a row answers at once whatever its state; no row while the name's slot
   * is busy waits for the slot and looks again (a create in flight is found, never reported
   * absent); no row and a free slot is a plain no. By id there is no slot to wait on. Read-only.
   * `team` scopes it like `get`: a name within that team (the default team when absent), an id
   * of that team only (any team when absent). `slotToken`, a creator's (shared mode), is
   * remembered for the name: a build with an older one is refused from then on.
   */
  async lookup(request: LookupRequest, team?: string, slotToken?: number): Promise<LookupAnswer> {
    const found = (s: SandboxRecord): LookupAnswer => ({
      found: true,
      sandbox: { id: s.id, name: s.name, state: s.state, team: s.team },
    });
    if ("id" in request) {
      const row = this.get({ id: request.id, team });
      return row ? found(row) : { found: false };
    }
    const slot = teamScopedName(team, request.name);
    // A creator's lookup round reaches every node before it builds: from here on, a create of
    // this name with an older token (a gateway that lost the slot) is refused on this node.
    this.#fence.saw(slot, slotToken);
    for (;;) {
      const row = this.#ledger.byName(request.name, team ?? DEFAULT_TEAM);
      if (row) return found(row);
      if (!this.queue.isBusy(slot)) return { found: false };
      await this.queue.idle(slot);
    }
  }

  /**
   * Runs a command to the end, buffering each stream up to the cap. Past `timeoutMs` the
   * command is killed and the answer says `timedOut`; if its output is still open `killGraceMs`
   * later, the output read so far is answered with exit code -1.
   *
   * @throws {HttpError} 410 when the sandbox was destroyed while the command ran.
   */
  async execCommand(
    ref: SandboxRef,
    request: ExecRequest & { maxOutputBytes?: number },
  ): Promise<ExecResult> {
    const { maxOutputBytes = this.#maxOutputBytes, ...exec } = request;
    const { handle, sandbox } = await this.#inSlot(ref, async (sandbox) => {
      const awake = await wake(this.#core, sandbox);
      const started = await callExecutor(() => this.#executor.exec(awake.id, withEnv(awake, exec)));
      return { handle: this.#commands.track(awake.id, started, exec, false), sandbox: awake };
    });
    const { out, err, exit } = await runToEnd(handle, {
      maxOutputBytes,
      timeoutMs: exec.timeoutMs,
      killGraceMs: this.#killGraceMs,
    });
    return execAnswer(sandbox, out, err, exit);
  }

  /** Starts a streamed command; it is tracked in `commands()` until it exits. */
  startCommand(ref: SandboxRef, request: ExecRequest): Promise<ExecHandle> {
    return this.#inSlot(ref, async (sandbox) => {
      const awake = await wake(this.#core, sandbox);
      const started = await callExecutor(() =>
        this.#executor.exec(awake.id, withEnv(awake, request))
      );
      return this.#commands.track(awake.id, started, request, true);
    });
  }

  /** Running commands of a sandbox started with `startCommand`, by pid. */
  commands(ref: SandboxRef): Map<number, { handle: ExecHandle; request: ExecRequest }> {
    return this.#commands.listed(this.#require(ref).id);
  }

  /**
   * Destroys a sandbox's executor half and its row (call inside the slot). Its running commands
   * are told first, so their exits say the sandbox died rather than report the kill's code.
   */
  async #destroyNow(sandbox: SandboxRecord): Promise<void> {
    const settle = this.#commands.destroying(sandbox.id);
    try {
      await callExecutor(() => this.#executor.destroy(sandbox.id));
      this.#ledger.delete(sandbox.id);
      this.history.drop(sandbox.id);
      this.#core.lostAtBoot.delete(sandbox.id);
    } catch (error) {
      settle(false);
      throw error;
    }
    settle(true);
  }

  /** Writes a whole file (wakes first). */
  writeFile(
    ref: SandboxRef,
    path: string,
    data: Uint8Array | FileStream,
    options?: WriteOptions,
  ): Promise<FileEntry> {
    return this.#awake(ref, (id) => this.#executor.writeFile(id, path, data, options));
  }

  /** Reads a whole file (wakes first). */
  readFile(ref: SandboxRef, path: string, options?: FileOptions): Promise<Uint8Array> {
    return this.#awake(ref, (id) => this.#executor.readFile(id, path, options));
  }

  /** Lists a directory (wakes first). */
  listDir(
    ref: SandboxRef,
    path: string,
    depth?: number,
    options?: FileOptions,
  ): Promise<FileEntry[]> {
    return this.#awake(ref, (id) => this.#executor.listDir(id, path, depth, options));
  }

  /** Describes a path (wakes first). */
  stat(ref: SandboxRef, path: string, options?: FileOptions): Promise<FileEntry> {
    return this.#awake(ref, (id) => this.#executor.stat(id, path, options));
  }

  /** Creates a directory (wakes first). */
  makeDir(ref: SandboxRef, path: string, options?: FileOptions): Promise<boolean> {
    return this.#awake(ref, (id) => this.#executor.makeDir(id, path, options));
  }

  /** Renames a path (wakes first). */
  move(ref: SandboxRef, from: string, to: string, options?: FileOptions): Promise<FileEntry> {
    return this.#awake(ref, (id) => this.#executor.move(id, from, to, options));
  }

  /** Removes a path (wakes first). */
  remove(ref: SandboxRef, path: string, options?: FileOptions): Promise<void> {
    return this.#awake(ref, (id) => this.#executor.remove(id, path, options));
  }

  /** Starts a directory watch (wakes first). */
  watch(
    ref: SandboxRef,
    request: WatchRequest,
    onChange: (change: FsChange) => void,
  ): Promise<DirWatch> {
    return this.#awake(ref, (id) => this.#executor.watch(id, request, onChange));
  }

  /** Replaces (or merges) the metadata. */
  updateMetadata(
    ref: SandboxRef,
    metadata: Record<string, string>,
    merge = false,
  ): Promise<SandboxRecord> {
    return this.#inSlot(ref, (sandbox) => {
      const next = boundedMetadata(
        sandbox,
        merge ? { ...sandbox.metadata, ...metadata } : metadata,
      );
      return this.#ledger.update(sandbox.id, { metadata: next })!;
    });
  }

  /**
   * Replaces the egress address rules of a sandbox with egress (E2B's `updateNetwork`), in the
   * executor first and in the ledger's spec second, inside the sandbox's slot; never restarts it
   * or its processes. Empty lists leave it full egress. A sandbox without egress whose new rules
   * deny every address and allow none already has what was asked: nothing changes.
   *
   * @throws {HttpError} 404 for an unknown sandbox; 409 for one without egress, one archived, or
   * a node that cannot enforce rules.
   */
  updateEgressRules(ref: SandboxRef, rules: EgressRules): Promise<SandboxRecord> {
    return this.#inSlot(ref, (sandbox) => changeEgressRules(this.#core, sandbox, rules));
  }

  /**
   * Freezes a sandbox, or with `keepMemory: false` keeps its file system only (`archived`: its
   * processes end, no memory or CPU is held); a 409 when it is already paused either way.
   */
  pause(
    ref: SandboxRef,
    { keepMemory = true }: { keepMemory?: boolean } = {},
  ): Promise<SandboxRecord> {
    return this.#inSlot(
      ref,
      (sandbox) => pauseNow(this.#core, sandbox, keepMemory, (s) => this.#archiveNow(s)),
    );
  }

  /**
   * Archives a sandbox (call inside the slot): its running commands end with it, as on a
   * destroy, and their exits say the sandbox went.
   */
  #archiveNow(sandbox: SandboxRecord): Promise<SandboxRecord> {
    const parts = { commands: this.#commands, history: this.history, onArchived: this.#onArchived };
    return archiveNow(this.#core, parts, sandbox);
  }

  /**
   * Records a sandbox paused to disk on another node as this node's (its files already kept by
   * the executor as its archive): a row in state `archived`, under its own id, name and team,
   * which `resume` then restores. Its own row when it is here already.
   *
   * @throws {HttpError} 409 when its team has another sandbox by its name here.
   */
  adoptArchived(record: SandboxRecord): Promise<SandboxRecord> {
    return takeOverArchived(this.#core, record);
  }

  /**
   * Wakes a frozen sandbox, or restores an archived one from its files; `resumed: false` when
   * it was already running.
   */
  resume(ref: SandboxRef): Promise<{ resumed: boolean; sandbox: SandboxRecord }> {
    return this.#inSlot(ref, async (sandbox) => {
      const resumed = sandbox.state !== "active";
      return { resumed, sandbox: await wake(this.#core, sandbox, { probe: true }) };
    });
  }

  /** Sets or clears the E2B deadline. */
  setDeadline(ref: SandboxRef, deadlineAt: number | null, action?: DeadlineAction): SandboxRecord {
    const sandbox = this.#require(ref);
    return this.#ledger.update(sandbox.id, {
      deadlineAt,
      deadlineAction: deadlineAt === null ? null : action ?? sandbox.deadlineAction ?? "kill",
    })!;
  }

  /** Destroys; false when there was no such sandbox. */
  destroy(ref: SandboxRef): Promise<boolean> {
    const slot = "name" in ref ? teamScopedName(ref.team, ref.name) : this.#slotOfId(ref);
    if (slot === undefined) return Promise.resolve(false);
    return this.queue.run(slot, async () => {
      const sandbox = this.get(ref);
      if (!sandbox) return false;
      await this.#destroyNow(sandbox);
      this.#log("info", "sandbox destroyed", {
        name: sandbox.name,
        team: sandbox.team,
        id: sandbox.id,
      });
      return true;
    });
  }

  /** Resource use of one sandbox (never wakes; one paused to disk has none: a 409). */
  metrics(ref: SandboxRef): Promise<SandboxStats> {
    return this.#inSlot(ref, (sandbox) => {
      if (sandbox.state === "archived") {
        throw new HttpError(
          409,
          `Sandbox '${sandbox.name}' is paused to disk and uses no memory or CPU: resume it to ` +
            "read its resource use",
        );
      }
      return callExecutor(() => this.#executor.stats(sandbox.id));
    });
  }

  /**
   * The samples taken from `fromMs` to `toMs`, oldest first (never wakes). A running sandbox
   * with none yet (created since the last round) is sampled now, so a first read is not empty.
   */
  metricsHistory(ref: SandboxRef, fromMs?: number, toMs?: number): Promise<SandboxStats[]> {
    return this.#inSlot(ref, async (sandbox) => {
      const running = sandbox.state === "active" || sandbox.state === "restoring";
      if (running && !this.history.latest(sandbox.id)) {
        this.history.add(sandbox.id, await callExecutor(() => this.#executor.stats(sandbox.id)));
      }
      return this.history.range(sandbox.id, fromMs, toMs);
    });
  }

  /**
   * Wakes a paused sandbox for traffic when its lifecycle allows, renewing its E2B deadline by
   * the create's timeout (a deadline further out is kept); `null` when it stays paused.
   */
  wakeForTraffic(ref: SandboxRef): Promise<SandboxRecord | null> {
    return this.#inSlot(ref, async (sandbox) => {
      if (sandbox.state === "active" || sandbox.state === "restoring") return sandbox;
      const { onTimeout, autoResume, timeoutSeconds } = sandbox.e2b;
      // A native sandbox wakes on use; an E2B one only with autoResume, as on E2B.
      if (onTimeout !== undefined && !autoResume) return null;
      const awake = await wake(this.#core, sandbox);
      if (onTimeout === undefined || timeoutSeconds === undefined) return awake;
      const renewed = this.#clock.now() + timeoutSeconds * 1000;
      if (awake.deadlineAt !== null && awake.deadlineAt >= renewed) return awake;
      return this.#ledger.update(awake.id, { deadlineAt: renewed, deadlineAction: onTimeout })!;
    });
  }

  /** The cpu and memory the sandbox was given (no engine call). */
  limits(sandbox: SandboxRecord): SandboxLimits {
    return this.#executor.limits(sandbox.spec);
  }

  /**
   * Applies a passed deadline inside the slot, re-reading the row there (a wake may have pushed
   * the deadline out meanwhile): kill destroys, pause freezes and clears the deadline.
   */
  expireIfDue(id: string): Promise<"killed" | "paused" | "skipped"> {
    const slot = this.#slotOfId({ id });
    if (slot === undefined) return Promise.resolve("skipped");
    return this.queue.run(slot, () =>
      expireAtDeadline(this.#core, id, {
        archiveNow: (sandbox) => this.#archiveNow(sandbox),
        destroyNow: (sandbox) => this.#destroyNow(sandbox),
      }));
  }

  /**
   * Brings the ledger in step with the executor at boot, before the node serves (a create in
   * flight holds a sandbox without its row for a moment, and would look like an orphan):
   *
   * - a sandbox the executor holds for this node without a ledger row is removed: nothing can
   *   name it, so nothing could ever use or destroy it (the Docker executor lists only
   *   containers labelled with this node's id, so another node on the same engine is safe);
   * - a row whose sandbox is gone is marked lost (`stopped`, never dropped; see `#markLost`) and
   *   reported in the log, as a sandbox found gone on use is; `destroySandbox` (or its kill
   *   deadline) removes it.
   *
   * The fake executor's sandboxes vanish with the process by design, so after its restart every
   * row is marked the same way: one rule for both executors.
   */
  reconcile(): Promise<{ lost: string[]; removed: string[] }> {
    return reconcileWithExecutor(this.#core);
  }

  #require(ref: SandboxRef): SandboxRecord {
    const sandbox = this.get(ref);
    if (sandbox) return sandbox;
    throw new HttpError(
      404,
      "name" in ref
        ? `No sandbox named '${ref.name}' on this node: create it with acquireSandbox, or check the name with listSandboxes`
        : `No sandbox with id '${ref.id}' on this node: check the id with listSandboxes`,
      { headers: { [ABSENT_HEADER]: "1" } },
    );
  }

  /** The slot of the sandbox with this id (of `ref.team` when given), or undefined. */
  #slotOfId(ref: { id: string; team?: string }): string | undefined {
    const row = this.get(ref);
    return row === undefined ? undefined : teamScopedName(row.team, row.name);
  }

  /** Runs `task` in the sandbox's slot with its row as read inside the slot. */
  #inSlot<T>(ref: SandboxRef, task: (sandbox: SandboxRecord) => Promise<T> | T): Promise<T> {
    let slot: string;
    try {
      if ("name" in ref) slot = teamScopedName(ref.team, ref.name);
      else {
        const row = this.#require(ref);
        slot = teamScopedName(row.team, row.name);
      }
    } catch (error) {
      return Promise.reject(error);
    }
    return this.queue.run(slot, () => {
      const sandbox = this.#require(ref);
      return this.#guard(sandbox, () => task(sandbox));
    });
  }

  /**
   * Runs `task` on a sandbox inside its slot; when the executor says the sandbox is gone (its
   * container removed behind the node's back, say by `docker rm`), the row is marked lost and
   * the caller gets a 410 saying what happened rather than a 404 that contradicts the ledger.
   */
  async #guard<T>(sandbox: SandboxRecord, task: () => Promise<T> | T): Promise<T> {
    try {
      return await task();
    } catch (error) {
      if (!(error instanceof ExecutorError && error.code === "gone")) throw error;
      const row = this.#ledger.byId(sandbox.id);
      // A row already marked was reported when it was marked; a sandbox lost now is reported now.
      if (row && row.state !== "stopped") markLost(this.#core, row, error.message);
      // A stopped row is not enough to say "at boot": the first call of a sandbox removed while
      // the node ran marks it stopped too.
      const cause = this.#core.lostAtBoot.has(sandbox.id)
        ? "it was missing when the node started"
        : error.message;
      throw new HttpError(
        410,
        `Sandbox '${sandbox.name}' lost its ${this.#executor.kind} sandbox, with its files and ` +
          `processes (${cause}): destroy it (destroySandbox, or kill), then create it again`,
      );
    }
  }

  /** Runs a file verb in the slot on a woken sandbox. */
  #awake<T>(ref: SandboxRef, task: (id: string) => Promise<T>): Promise<T> {
    return this.#inSlot(ref, async (sandbox) => {
      const awake = await wake(this.#core, sandbox);
      return await callExecutor(() => task(awake.id));
    });
  }
}
