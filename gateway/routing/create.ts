/**
 * A create that builds a new sandbox, once `GatewayRouting.create` has found the name absent
 * (or the create is unnamed): admit it against the team's limits, let the Placer choose the
 * node, hold the Finder's placing window open while the node answers, then count the placement
 * back (a 4xx), keep it (a 2xx or no answer) and cache the sandbox the node named. Separate from
 * `routing.ts` because this bookkeeping (admission, placer, finder, observer, unnamed re-keying)
 * is the one rule that touches every part of the gateway; the slot and the wake stay with the
 * routing class.
 *
 * @module
 */
import type { Fleet, FleetNode } from "../fleet/fleet.ts";
import type { Finder, FoundSandbox } from "../finder/finder.ts";
import type { PickResult, PlacementAsk, Placer } from "../placer/placer.ts";
import type { Admission } from "../keys/team_limits.ts";
import { placementRefusal } from "./answers.ts";
import type { Log } from "../../shared/log.ts";
import { teamScopedName } from "../../shared/teams.ts";
import { LEDGER_SEQ_HEADER } from "../../shared/schemas.ts";
import { SLOT_TOKEN_HEADER } from "../../shared/slot_token.ts";
import { HEAL_FROM_HEADER } from "../../shared/snapshots.ts";
import type { SlotHold } from "./slots.ts";

/** A node's whole answer, read by the gateway (create and destroy). */
export interface CapturedAnswer {
  /** The node's status: 4xx and 2xx decide what is counted and cached. */
  status: number;
  /** The node's headers; a face relays only those its clients need. */
  headers: Headers;
  /** The node's whole body, read so the sandbox in it can be cached. */
  text: string;
  /** The node that answered. */
  node: FleetNode;
}

/** Options of {@linkcode GatewayRouting.create}. */
export interface CreateOptions {
  /** The sandbox name, or `undefined` for an unnamed create (no slot, no lookup: always new). */
  name?: string;
  /** The path on the node, e.g. `/acquireSandbox`. */
  path: string;
  /** The body to send (already validated by the face). */
  body: string;
  /** The client's signal: a client that left is not served (checked in the slot). */
  signal: AbortSignal;
  /** Headers for the node; the fleet token and JSON content type by default. */
  headers?: Readonly<Record<string, string>>;
  /** Reads the sandbox out of a 2xx answer so the Finder can cache it; `undefined` skips. */
  identify: (text: string) => FoundSandbox | undefined;
  /**
   * Called just before a new sandbox is placed (never for a wake): throws to refuse it (a
   * team's limit), or returns what to tell once the node answered.
   */
  admit?: () => Admission | Promise<Admission>;
  /** What the create asks of its node (template, volumes, pool): the placer's filters read it. */
  ask?: PlacementAsk;
  /**
   * The nodes holding `ask.snapshot`, the one to prefer first. When none of them can take the
   * create (full, above a limit) and one is up, another node that passes every other filter is
   * chosen and told to heal: to get the snapshot from them first ({@linkcode HEAL_FROM_HEADER}).
   * With every holder down, a node with a registry (it pulls the snapshot from there) is.
   */
  healFrom?: readonly string[];
}

/** What a create works with: the routing's own parts, passed by `GatewayRouting`. */
export interface CreateParts {
  /** Only a node still registered gets the created sandbox cached. */
  fleet: Fleet;
  /** Caches the created sandbox and holds the placing window. */
  finder: Finder;
  /** Chooses the node and counts the placement. */
  placer: Placer;
  /** Where placements and refusals go. */
  log: Log;
  /** The node headers a create without its own `headers` is sent with. */
  defaultHeaders: Readonly<Record<string, string>>;
  /** Hears of the placement decided (placed, or nothing fits). */
  placed(key: string, pick: PickResult): void;
  /** Hears of a 2xx create that named its sandbox. */
  created(node: FleetNode, sandbox: FoundSandbox, path: string): void;
  /** Sends the create to its node and reads the whole answer (the routing's capture). */
  capture(
    node: FleetNode,
    path: string,
    init: { body: string; headers?: Readonly<Record<string, string>> },
  ): Promise<CapturedAnswer>;
  /**
   * Shared mode: publishes a created sandbox's id with its node for every gateway's lookups
   * (`RecentCreates.publishId`) before the client hears of it; none with one gateway.
   */
  publishId?: (id: string, nodeId: string) => Promise<void>;
}

/**
 * The node's ledger change number an answer names (`x-dormice-ledger-seq`), or undefined when it
 * names none or no number.
 *
 * @example
 * ```ts
 * ledgerSeqOf(new Headers({ "x-dormice-ledger-seq": "42" })); // 42
 * ```
 */
export function ledgerSeqOf(headers: Headers): number | undefined {
  const text = headers.get(LEDGER_SEQ_HEADER);
  if (text === null || !/^\d{1,16}$/.test(text)) return undefined;
  return Number(text);
}

/**
 * Places a new sandbox and creates it on the chosen node; `name` is `undefined` for an unnamed
 * create, which is counted under a private key until the node names the sandbox.
 *
 * @throws {HttpError} 400 when no node has the template, 503 when no node fits, what `admit`
 *   throws, and the capture's 502 (the placement stays counted: the sandbox may exist).
 * @example
 * ```ts ignore
 * const answer = await placeNew(parts, "acme/agent-1", options);
 * ```
 */
export async function placeNew(
  parts: CreateParts,
  name: string | undefined,
  options: CreateOptions,
  hold?: SlotHold,
): Promise<CapturedAnswer> {
  const { finder, placer } = parts;
  // An unnamed create is counted under a private key until the node names the sandbox.
  const key = name ?? `unnamed:${crypto.randomUUID()}`;
  const admission = await options.admit?.();
  let pick = placer.place(key, options.ask);
  let healHeaders: Record<string, string> | undefined;
  if (!pick.ok && options.ask?.snapshot !== undefined && options.healFrom !== undefined) {
    const heal = placeHeal(parts, key, options.ask, options.healFrom);
    if (heal !== undefined) {
      pick = heal.pick;
      healHeaders = { [HEAL_FROM_HEADER]: heal.from };
      parts.log("info", "a create from a snapshot goes to a node that heals it", {
        name: key,
        nodeId: heal.pick.node.id,
        snapshot: options.ask.snapshot,
        from: heal.from,
      });
    }
  }
  parts.placed(key, pick);
  if (!pick.ok) {
    admission?.cancel();
    if (!pick.templateNowhere) {
      parts.log("warn", "no node can take a new sandbox", { name: key, explain: pick.explain });
    }
    throw placementRefusal(pick);
  }
  parts.log("info", "sandbox placed", {
    name: key,
    nodeId: pick.node.id,
    score: pick.score,
    explain: pick.explain,
  });
  if (hold !== undefined) {
    // Last look before the node builds: a gateway paused or cut off past its lease has lost
    // the slot, and another may be creating the name now. Nothing was sent: counted back. In
    // shared mode the same transaction publishes the chosen node for every gateway's lookups.
    try {
      await hold.check(pick.node.id);
    } catch (error) {
      placer.refused(key);
      admission?.cancel();
      throw error;
    }
  }
  // Sent with the create: a node that saw a newer take's token for the name refuses it (a
  // gateway paused between the check above and the node).
  let headers = hold === undefined ? options.headers : {
    ...(options.headers ?? parts.defaultHeaders),
    [SLOT_TOKEN_HEADER]: hold.token,
  };
  if (healHeaders !== undefined) {
    headers = { ...(headers ?? parts.defaultHeaders), ...healHeaders };
  }
  // A 502 (no answer) leaves the placement counted: the sandbox may exist.
  let answer: CapturedAnswer;
  // Until the node's digest shows this create, lookups must ask that node (lookup digests).
  const ended = finder.placing(pick.node.id);
  try {
    answer = await parts.capture(pick.node, options.path, { body: options.body, headers });
    ended(true);
  } catch (error) {
    ended(false);
    admission?.placed(pick.node.id);
    throw error;
  }
  if (answer.status >= 400 && answer.status < 500) {
    placer.refused(key);
    admission?.cancel();
  } else {
    admission?.placed(pick.node.id, ledgerSeqOf(answer.headers));
  }
  if (answer.status >= 200 && answer.status < 300) {
    const sandbox = rememberCreated(parts, pick.node, answer, options);
    if (sandbox !== undefined) {
      await publishIdOf(parts, sandbox.id, pick.node);
      parts.created(pick.node, sandbox, options.path);
    }
    if (name === undefined && sandbox !== undefined && placer.release(key)) {
      placer.record(
        teamScopedName(sandbox.team, sandbox.name),
        pick.node.id,
        pick.explain.warm ? options.ask?.poolKey : undefined,
      );
    }
  }
  return answer;
}

/**
 * A node for a create from a snapshot none of whose holders can take it: one that passes every
 * filter but the snapshot's, when it can get the snapshot — some holder is up (it heals from
 * them, those up first), or it pulls from a registry. Undefined when there is none (the
 * holders' own refusal then stands). A pick made here is counted as any placement.
 */
function placeHeal(
  parts: CreateParts,
  key: string,
  ask: PlacementAsk,
  holderIds: readonly string[],
): { pick: Extract<PickResult, { ok: true }>; from: string } | undefined {
  const now = parts.fleet.now();
  const holders = holderIds.map((id) => parts.fleet.get(id))
    .filter((n): n is FleetNode => n !== undefined && !parts.fleet.isDown(n, now));
  const anyRegistry = [...parts.fleet.nodes()].some((n) =>
    n.snapshotRegistry !== undefined && !parts.fleet.isDown(n, now)
  );
  if (holders.length === 0 && !anyRegistry) return undefined;
  const pick = parts.placer.pick({
    ...ask,
    snapshot: undefined,
    snapshotHolders: undefined,
    heal: true,
  });
  if (!pick.ok) return undefined;
  if (holders.length === 0 && pick.node.snapshotRegistry === undefined) return undefined;
  parts.placer.record(key, pick.node.id);
  return { pick, from: holders.map((n) => `${n.id}=${n.endpoint}`).join(",") };
}

/**
 * Publishes a created sandbox's id (shared mode) before the client hears of it. A failure is
 * logged, not thrown: the sandbox exists, and another gateway finds its id from the node's next
 * digest (a lookup by id there may answer 404 until then).
 *
 * @example
 * ```ts ignore
 * await publishIdOf(parts, "sbx_1", node);
 * ```
 */
export async function publishIdOf(
  parts: Pick<CreateParts, "publishId" | "log">,
  id: string,
  node: FleetNode,
): Promise<void> {
  if (parts.publishId === undefined) return;
  try {
    await parts.publishId(id, node.id);
  } catch (error) {
    parts.log("warn", "could not publish a new sandbox's id in etcd", {
      sandboxId: id,
      nodeId: node.id,
      cause: error instanceof Error ? error.message : String(error),
    });
  }
}

/**
 * Reads the sandbox out of a 2xx create or wake and caches it, unless its node left the fleet
 * meanwhile; an answer `identify` cannot read caches nothing.
 *
 * @example
 * ```ts ignore
 * const sandbox = rememberCreated(parts, node, answer, options);
 * ```
 */
export function rememberCreated(
  parts: Pick<CreateParts, "fleet" | "finder">,
  node: FleetNode,
  answer: CapturedAnswer,
  options: CreateOptions,
): FoundSandbox | undefined {
  let sandbox: FoundSandbox | undefined;
  try {
    sandbox = options.identify(answer.text);
  } catch {
    sandbox = undefined;
  }
  if (sandbox !== undefined && parts.fleet.get(node.id) === node) {
    parts.finder.remember(node, sandbox);
  }
  return sandbox;
}
