/**
 * A sandbox paused: frozen in memory, or paused to disk (archived) with its running commands
 * told it went (`SandboxService.pause`, a pause deadline); and one paused to disk on another
 * node taken over as this node's (`SandboxService.adoptArchived`).
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import { teamScopedName } from "../shared/teams.ts";
import type { RunningCommands } from "./_commands.ts";
import type { MetricsHistory } from "./metrics_history.ts";
import type { SandboxRecord } from "./service_contract.ts";
import { archive, callExecutor, recordPause, type ServiceCore } from "./service_state.ts";

/** The parts of the service an archive tells besides the core. */
export interface ArchiveParts {
  /** The running commands, whose exits say the sandbox went. */
  commands: RunningCommands;
  /** The sandboxes' samples; an archived one's are dropped. */
  history: MetricsHistory;
  /** Told of every sandbox paused to disk (the app pushes it to the registry); a rejection is logged. */
  onArchived?: (sandbox: SandboxRecord) => Promise<void>;
}

/**
 * Freezes a sandbox (call inside the slot), or without `keepMemory` archives it through
 * `archiveNow`; a 409 when it is already paused either way. See `SandboxService.pause`.
 */
export async function pauseNow(
  core: ServiceCore,
  sandbox: SandboxRecord,
  keepMemory: boolean,
  archiveNow: (sandbox: SandboxRecord) => Promise<SandboxRecord>,
): Promise<SandboxRecord> {
  if (sandbox.state === "frozen" || sandbox.state === "archived") {
    throw new HttpError(
      409,
      `Sandbox '${sandbox.name}' is already paused: resume it, or run a command to wake it`,
    );
  }
  if (!keepMemory) return await archiveNow(sandbox);
  await callExecutor(() => core.executor.pause(sandbox.id));
  return await recordPause(
    core,
    sandbox,
    () => core.ledger.update(sandbox.id, { state: "frozen" })!,
  );
}

/**
 * Archives a sandbox (call inside the slot): its running commands end with it, as on a
 * destroy, and their exits say the sandbox went.
 */
export async function archiveNow(
  core: ServiceCore,
  parts: ArchiveParts,
  sandbox: SandboxRecord,
): Promise<SandboxRecord> {
  const settle = parts.commands.destroying(sandbox.id);
  try {
    const row = await archive(core, sandbox);
    settle(true);
    parts.history.drop(sandbox.id);
    core.log("info", "sandbox paused to disk", { name: sandbox.name, id: sandbox.id });
    await parts.onArchived?.(row).catch((error) =>
      core.log("warn", "could not hand a sandbox paused to disk on", { id: row.id, error })
    );
    return row;
  } catch (error) {
    settle(false);
    throw error;
  }
}

/**
 * Records a sandbox paused to disk on another node as this node's; see
 * `SandboxService.adoptArchived`.
 *
 * @throws {HttpError} 409 when its team has another sandbox by its name here.
 */
export function takeOverArchived(core: ServiceCore, record: SandboxRecord): Promise<SandboxRecord> {
  return core.queue.run(teamScopedName(record.team, record.name), () => {
    const here = core.ledger.byId(record.id);
    if (here) return Promise.resolve(here);
    if (core.ledger.byName(record.name, record.team)) {
      throw new HttpError(
        409,
        `Sandbox '${record.id}' cannot be resumed on this node: its team has another sandbox ` +
          `named '${record.name}' here`,
      );
    }
    core.ledger.insert({
      id: record.id,
      name: record.name,
      team: record.team,
      state: "archived",
      template: record.template,
      metadata: record.metadata,
      spec: record.spec,
      env: record.env,
      createdAt: Date.parse(record.createdAt),
      deadlineAt: record.deadlineAt,
      deadlineAction: record.deadlineAction,
      e2b: record.e2b,
    });
    core.log("info", "sandbox paused to disk on another node taken over", { id: record.id });
    return Promise.resolve(core.ledger.byId(record.id)!);
  });
}
