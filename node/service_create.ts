/**
 * The two ways the sandbox service makes a new sandbox inside a name's slot: a claim hands a
 * warm one over with no engine call, a cold create builds one and records it, taking the
 * sandbox back when its ledger row cannot be written.
 *
 * @module
 */
import { HttpError } from "../shared/http_error.ts";
import { teamScopedName } from "../shared/teams.ts";
import type { SandboxSpec } from "../shared/schemas.ts";
import { newSandboxId, type NewSandboxRow } from "./ledger.ts";
import { LedgerFullError } from "./ledger_space.ts";
import type { WarmPools } from "./pools.ts";
import type { AcquireRequest, AcquireResult, SandboxRecord } from "./service_contract.ts";
import { callExecutor, type ServiceCore, stampIdentity } from "./service_state.ts";

/** What a new sandbox is made of, decided by `acquire` before either path runs. */
export interface NewSandbox {
  /** Its id (a cold create's; a claim takes the warm sandbox's own). */
  id: string;
  /** Its team. */
  team: string;
  /** Its template. */
  template: string;
  /** Its resource limits. */
  spec: SandboxSpec;
  /** Its default environment. */
  env: Record<string, string>;
}

/**
 * Hands a warm sandbox over (call inside the name's slot): the pool gives an id, the ledger
 * turns its warm row into this sandbox's row in one transaction (named, metadata and team
 * set, the env recorded for every later command, the deadline started), and no engine call
 * is made. `undefined` when no pool matches or the matching pool is empty: the caller builds
 * cold.
 */
export function claimWarm(
  core: ServiceCore,
  pools: WarmPools,
  request: AcquireRequest,
  { team, template, spec, env }: Omit<NewSandbox, "id">,
): SandboxRecord | undefined {
  const ask = { template, spec };
  const id = pools.claim(ask);
  if (id === undefined) return undefined;
  try {
    const sandbox = core.ledger.claimWarm(
      newRow(core, request, { id, team, template, spec, env }),
    );
    core.log("info", "sandbox claimed from a warm pool", {
      name: request.name,
      team,
      id,
      template,
    });
    return sandbox;
  } catch (error) {
    pools.giveBack(ask, id);
    throw error;
  }
}

/**
 * Builds a sandbox cold and writes its row (call inside the name's slot). A row that cannot be
 * written takes the sandbox back: without its row it would be an orphan nobody can name.
 */
export async function buildCold(
  core: ServiceCore,
  request: AcquireRequest,
  { id, team, template, spec, env }: NewSandbox,
): Promise<SandboxRecord> {
  await callExecutor(() =>
    core.executor.create({
      id,
      name: request.name,
      template,
      spec,
      env,
      team,
      ...(request.snapshot === undefined ? {} : { snapshot: request.snapshot }),
    })
  );
  try {
    const sandbox = core.ledger.insert(newRow(core, request, { id, team, template, spec, env }));
    core.log("info", "sandbox created", { name: request.name, team, id, template });
    return sandbox;
  } catch (error) {
    // Without its row the container would be an orphan nobody can name: take it back.
    await core.executor.destroy(id).catch((e) =>
      core.log("error", "could not remove a sandbox whose ledger row failed", {
        id,
        error: e,
      })
    );
    if (error instanceof LedgerFullError) {
      core.log("warn", "sandbox not created: the data disk is full", {
        name: request.name,
        dataDir: error.dataDir,
      });
      throw error;
    }
    core.log("error", "ledger write failed after create", { name: request.name, error });
    throw new HttpError(
      500,
      `The node built sandbox '${request.name}' but could not record it in its ledger ` +
        `(${(error as Error)?.message}); it was removed again: check the node's data dir`,
    );
  }
}

/**
 * The row a new sandbox gets, the same whichever way it was made: a claimed sandbox is this
 * request's sandbox in every field a cold one would have (its E2B lifecycle included).
 */
function newRow(
  core: ServiceCore,
  request: AcquireRequest,
  { id, team, template, spec, env }: NewSandbox,
): NewSandboxRow {
  const now = core.clock.now();
  return {
    id,
    name: request.name,
    team,
    state: "active",
    template,
    metadata: request.metadata ?? {},
    spec,
    env,
    createdAt: now,
    deadlineAt: request.deadline ? now + request.deadline.ms : null,
    deadlineAction: request.deadline?.action ?? null,
    e2b: request.e2b,
  };
}

/**
 * Builds a name no row holds, its slot held by the caller: warm when a pool has one of its
 * template (never for a snapshot, whose files no warm sandbox holds), cold otherwise.
 */
export async function buildNew(
  core: ServiceCore,
  pools: WarmPools | undefined,
  defaultTemplate: string,
  request: AcquireRequest,
  team: string,
): Promise<AcquireResult> {
  const id = newSandboxId();
  const template = request.template ?? defaultTemplate;
  const spec = request.spec ?? {};
  const env = { ...spec.env, ...request.env };
  core.ledger.refuseNewWhileFull(`sandbox '${request.name}'`);
  const warm = pools && request.snapshot === undefined
    ? claimWarm(core, pools, request, { team, template, spec, env })
    : undefined;
  if (warm !== undefined) {
    // A claim makes no engine call: the identity files (the team is learnt only now) are
    // written next in the name's slot, so every later verb on the sandbox finds them.
    void core.queue.run(teamScopedName(team, request.name), () => stampIdentity(core, warm));
    return { created: true, sandbox: warm };
  }
  const sandbox = await buildCold(core, request, { id, team, template, spec, env });
  // A sandbox from a snapshot holds its origin's files until this write.
  await stampIdentity(core, sandbox);
  return { created: true, sandbox };
}
