/**
 * What the sandbox service does to keep a row and its sandbox in step, beside the verbs
 * themselves (service.ts): wake and pause with their ledger writes undone when the disk refuses
 * them, a sandbox found gone marked lost, the boot reconcile, and executor errors turned into
 * answers.
 *
 * @module
 */
import type { Clock } from "../shared/clock.ts";
import type { Log } from "../shared/log.ts";
import type { NameQueue } from "../shared/name_queue.ts";
import { teamScopedName } from "../shared/teams.ts";
import { needsEgressProxy } from "../shared/egress_rules.ts";
import {
  type CreateRequest,
  type Executor,
  ExecutorError,
  executorErrorToHttp,
} from "./executors/contract.ts";
import type { Ledger } from "./ledger.ts";
import type { SandboxRecord } from "./service_contract.ts";
import { IDENTITY_DIR, writeIdentityFiles } from "./sandbox_identity.ts";

/** The parts of the service these steps work on. */
export interface ServiceCore {
  /** The node's ledger. */
  ledger: Ledger;
  /** The executor the sandboxes run on. */
  executor: Executor;
  /** Time of the idle clock. */
  clock: Clock;
  /** Where every step logs. */
  log: Log;
  /** The per-name slots. */
  queue: NameQueue;
  /**
   * Ids whose sandbox the boot reconcile of this process found missing, so each later call
   * says so; any other lost sandbox vanished while the node ran, and its call says what the
   * executor says now. Filled only by the reconcile (at most the rows of that moment), and an
   * id leaves when its row is destroyed.
   */
  lostAtBoot: Set<string>;
}

/** Runs an executor call; its errors become HttpErrors, except `gone`, which `#guard` reads. */
export async function callExecutor<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    if (error instanceof ExecutorError && error.code === "gone") throw error;
    throw executorErrorToHttp(error);
  }
}

/**
 * Marks a row whose sandbox the executor no longer has (call inside the slot): `stopped`,
 * never dropped, so the name stays taken (a gateway keeps finding it here, not building it
 * elsewhere), the E2B view shows it paused, a wake answers 410, and a destroy removes it. A
 * pause deadline is cleared, since nothing is left to pause.
 */
export function markLost(core: ServiceCore, row: SandboxRecord, why: string): void {
  const pauseDeadline = row.deadlineAction === "pause";
  if (row.state !== "stopped" || pauseDeadline) {
    try {
      core.ledger.update(row.id, {
        state: "stopped",
        ...(pauseDeadline ? { deadlineAt: null, deadlineAction: null } : {}),
      });
    } catch (error) {
      // A full disk: the next use finds it gone again and tries again.
      core.log("error", "could not mark a lost sandbox in the ledger", { id: row.id, error });
    }
  }
  core.log(
    "warn",
    `sandbox lost: ${why}; marked stopped (destroy it, then create it again)`,
    { name: row.name, id: row.id, was: row.state, executor: core.executor.kind },
  );
}

/**
 * Resumes a frozen sandbox and touches its idle clock (call inside the slot, under
 * `#guard`); with `probe`, an active one is asked too (a resume leaves a running sandbox as
 * it is), so a sandbox removed behind the node's back is noticed. The clock is
 * kept in memory and flushed in batches (`Ledger.flushTouches`): a command or a read on an
 * active sandbox writes nothing, so it works on a full data disk. A state change is written at
 * once; when the disk has no room for it the sandbox is frozen again, so the ledger never
 * says frozen about a running sandbox, and the caller gets the 507.
 */
export async function wake(
  core: ServiceCore,
  sandbox: SandboxRecord,
  { probe = false } = {},
): Promise<SandboxRecord> {
  if (sandbox.state === "active" && probe) {
    await callExecutor(() => core.executor.resume(sandbox.id));
  }
  if (sandbox.state === "archived") {
    // Paused to disk: built again from its files, under its id; its processes start afresh.
    await callExecutor(() => core.executor.restore(createRequestOf(sandbox)));
    try {
      core.ledger.update(sandbox.id, { state: "active" });
    } catch (error) {
      await core.executor.archive(sandbox.id).catch((again) =>
        core.log("error", "a sandbox restored without its ledger write could not be archived", {
          name: sandbox.name,
          id: sandbox.id,
          error: again,
        })
      );
      throw error;
    }
    core.log("info", "sandbox restored from its files", { name: sandbox.name, id: sandbox.id });
    // Its kept files hold its identity already, unless they were kept before it was written.
    await stampIdentity(core, sandbox);
  } else if (sandbox.state !== "active") {
    await callExecutor(() => core.executor.resume(sandbox.id));
    try {
      core.ledger.update(sandbox.id, { state: "active" });
    } catch (error) {
      if (sandbox.state === "frozen") {
        await core.executor.pause(sandbox.id).catch((again) =>
          core.log("error", "a sandbox woken without its ledger write could not be paused", {
            name: sandbox.name,
            id: sandbox.id,
            error: again,
          })
        );
      }
      throw error;
    }
    core.log("info", "sandbox woken", { name: sandbox.name, id: sandbox.id });
  }
  core.ledger.touch(sandbox.id, core.clock.now());
  return core.ledger.byId(sandbox.id)!;
}

/** What the executor builds a sandbox again from: the row's id, name, template, spec and env. */
export function createRequestOf(sandbox: SandboxRecord): CreateRequest {
  return {
    id: sandbox.id,
    name: sandbox.name,
    template: sandbox.template,
    spec: sandbox.spec,
    env: sandbox.env,
    team: sandbox.team,
  };
}

/**
 * Keeps only the file system of a sandbox (call inside the slot, under `#guard`) and records it
 * `archived`, clearing a pause deadline; when the ledger refuses the write (a full data disk) the
 * sandbox is restored again, so the row never says active about a removed container.
 */
export async function archive(core: ServiceCore, sandbox: SandboxRecord): Promise<SandboxRecord> {
  await callExecutor(() => core.executor.archive(sandbox.id));
  try {
    return core.ledger.update(sandbox.id, {
      state: "archived",
      ...(sandbox.deadlineAction === "pause" ? { deadlineAt: null, deadlineAction: null } : {}),
    })!;
  } catch (error) {
    await core.executor.restore(createRequestOf(sandbox)).catch((again) =>
      core.log("error", "a sandbox archived without its ledger write could not be restored", {
        name: sandbox.name,
        id: sandbox.id,
        error: again,
      })
    );
    throw error;
  }
}

/**
 * Writes the state of a sandbox just paused; when the ledger refuses (a full data disk) the
 * sandbox is resumed again, so the row never says active about a frozen sandbox.
 */
export async function recordPause<T>(
  core: ServiceCore,
  sandbox: SandboxRecord,
  write: () => T,
): Promise<T> {
  try {
    return write();
  } catch (error) {
    await core.executor.resume(sandbox.id).catch((again) =>
      core.log("error", "a sandbox paused without its ledger write could not be resumed", {
        name: sandbox.name,
        id: sandbox.id,
        error: again,
      })
    );
    throw error;
  }
}

/**
 * Brings the ledger in step with the executor at boot, before the node serves (a create in
 * flight holds a sandbox without its row for a moment, and would look like an orphan):
 *
 * - a sandbox the executor made for this node without a ledger row is removed: nothing can
 *   name it, so nothing could ever use or destroy it (the Docker executor lists only
 *   containers labelled with this ledger's instance id, so another node on the same engine is
 *   safe, even one with the same node id);
 * - a sandbox from before instance labels (`executor.legacy()`) is adopted when the ledger
 *   knows it and otherwise left alone, since another node with the same id may own it;
 * - a row whose sandbox is gone is marked lost (`stopped`, never dropped; see `#markLost`) and
 *   reported in the log, as a sandbox found gone on use is; `destroySandbox` (or its kill
 *   deadline) removes it.
 *
 * The fake executor's sandboxes vanish with the process by design, so after its restart every
 * row is marked the same way: one rule for both executors.
 */
export async function reconcileWithExecutor(
  core: ServiceCore,
): Promise<{ lost: string[]; removed: string[] }> {
  const held = new Set(await callExecutor(() => core.executor.list()));
  const older = core.executor.legacy ? await callExecutor(() => core.executor.legacy!()) : [];
  const strangers: string[] = [];
  const warmIds = new Set(core.ledger.warmRows().map((w) => w.id));
  for (const id of older) {
    if (core.ledger.byId(id) || warmIds.has(id)) held.add(id);
    else strangers.push(id);
  }
  if (strangers.length > 0) {
    core.log("info", "sandboxes labelled with this node id but not in its ledger left alone", {
      count: strangers.length,
      ids: strangers.slice(0, 10),
      why: "made before instance labels, by this node or another with the same id",
    });
  }
  // A warm row whose container is gone is simply forgotten: it belonged to no one.
  const warm = new Set<string>();
  for (const row of core.ledger.warmRows()) {
    if (held.has(row.id)) warm.add(row.id);
    else core.ledger.deleteWarm(row.id);
  }
  const lost: string[] = [];
  for (const row of core.ledger.all()) {
    if (held.has(row.id)) continue;
    await core.queue.run(teamScopedName(row.team, row.name), () => {
      const now = core.ledger.byId(row.id);
      if (!now) return;
      lost.push(now.id);
      core.lostAtBoot.add(now.id);
      markLost(core, now, "its ledger row has no sandbox in the executor");
    });
  }
  const destroyed: string[] = [];
  for (const id of held) {
    if (warm.has(id) || core.ledger.byId(id)) continue;
    try {
      await core.executor.destroy(id);
      destroyed.push(id);
    } catch (error) {
      core.log("error", "could not remove a sandbox without a ledger row", { id, error });
    }
  }
  // destroy() forgives a sandbox it cannot find (say, a container renamed by hand that still
  // wears this node's labels): look again rather than report a removal that did not happen.
  const left = destroyed.length > 0 ? new Set(await core.executor.list()) : new Set();
  const removed: string[] = [];
  for (const id of destroyed) {
    if (left.has(id)) {
      core.log("error", "a sandbox without a ledger row is still there after its removal", {
        id,
        executor: core.executor.kind,
        hint:
          "remove it by hand (e.g. docker rm -f on the container labelled dormice.sandbox=<id>)",
      });
    } else {
      removed.push(id);
      core.log("warn", "sandbox without a ledger row removed", {
        id,
        executor: core.executor.kind,
      });
    }
  }
  await reapplyProxiedRules(core, held);
  return { lost, removed };
}

/**
 * Writes again the egress rules of the sandboxes the executor still holds whose rules need the
 * egress proxy (domains, header transforms): the proxy lives in the node process, so a node
 * restarted over its running sandboxes must learn their rules (and steer them to its new port)
 * before it serves. A failure is logged (the sandbox's domain traffic is then refused, never
 * let through) and the next `updateNetwork` writes them again.
 */
async function reapplyProxiedRules(core: ServiceCore, held: Set<string>): Promise<void> {
  const set = core.executor.setEgressRules;
  if (set === undefined) return;
  for (const row of core.ledger.all()) {
    const rules = row.spec.egressRules;
    if (!held.has(row.id) || rules === undefined || !needsEgressProxy(rules)) continue;
    if (row.state !== "active" && row.state !== "frozen") continue;
    try {
      await set.call(core.executor, row.id, rules);
    } catch (error) {
      core.log("warn", "could not restore a sandbox's domain rules at boot", {
        id: row.id,
        error: error instanceof Error ? error.message : String(error),
      });
    }
  }
}

/**
 * Writes the sandbox's identity files (`/run/e2b/.E2B_SANDBOX_ID`, ...) with its own values. A
 * failed write is logged, not answered: the sandbox runs, and its commands get the variables.
 */
export async function stampIdentity(core: ServiceCore, sandbox: SandboxRecord): Promise<void> {
  await writeIdentityFiles(
    core.executor,
    sandbox,
    (why) =>
      core.log("warn", `could not write the sandbox's ${IDENTITY_DIR} files: ${why}`, {
        name: sandbox.name,
        id: sandbox.id,
      }),
  );
}
