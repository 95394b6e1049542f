/**
 * The wire side of the Finder's lookups: asking one node whether it holds a sandbox
 * (`POST <endpoint>/lookupSandbox` with the fleet token), at most a few asks in flight per node,
 * and the node's answer read as found, absent or silent (with why). The Finder (`finder.ts`)
 * builds rounds, deadlines and outcomes on top.
 *
 * @module
 */
import type { FleetNode } from "../fleet/fleet.ts";
import { HOP_HEADER } from "../door.ts";
import { KeyedLimiter } from "./node_limit.ts";
import type { Log } from "../../shared/log.ts";
import { lookupAnswerSchema } from "../../shared/schemas.ts";
import { TEAM_HEADER } from "../../shared/teams.ts";
import { SLOT_TOKEN_HEADER } from "../../shared/slot_token.ts";

/** A sandbox as `lookupSandbox` reports it. */
export interface FoundSandbox {
  /** The sandbox id, which E2B clients route by. */
  readonly id: string;
  /** The sandbox name, which the native verbs route by. */
  readonly name: string;
  /** Its state when it was looked up (a cached entry does not follow later changes). */
  readonly state: string;
  /** The team it belongs to (the default team when absent): its name is unique within it. */
  readonly team?: string;
}

/**
 * One node's answer: it has the sandbox, it has not, or it said nothing useful (and why). An
 * `absent` with `refusal` is a node that answered 400 to the key: it cannot hold a sandbox under
 * a key its own rules reject (it checks the same rules when it creates one), so that is a no.
 */
export type LookupAnswer =
  | { kind: "found"; sandbox: FoundSandbox }
  | { kind: "absent"; refusal?: string }
  | { kind: "silent"; cause: string };

/** Options of {@linkcode LookupClient}. */
export interface LookupClientOptions {
  /** The fleet token, sent as `Authorization: Bearer <token>` to every node. */
  token: string;
  /** The HTTP client to the nodes. */
  fetch: typeof fetch;
  /** Where a node's failures go (once per change of cause) and its recovery. */
  log: Log;
  /** Asks in flight to one node at once; see `FinderOptions.maxLookupsPerNode` for the number. */
  maxLookupsPerNode: number;
  /** The gateway's hop marker (`x-dormice-hop`), so a lookup that loops back is refused. */
  hopMarker: string;
}

/**
 * The abort reason of a lookup round every caller left, so a node cut off by it is described as
 * "the client left" rather than as a failure of the node.
 *
 * @example
 * ```ts ignore
 * round.controller.abort(new EveryCallerLeft());
 * ```
 */
export class EveryCallerLeft extends Error {
  /** Takes no arguments: the reason is the same for every abandoned round. */
  constructor() {
    super("Every caller of this lookup round left");
    this.name = "EveryCallerLeft";
  }
}

/**
 * Asks nodes whether they hold a sandbox. Asks beyond `maxLookupsPerNode` to one node queue
 * first in, first out under the caller's signal, so the round's deadline bounds the wait too.
 * Every failure becomes a `silent` answer with a cause an operator can act on (a 401 says to
 * set the same `DORMICE_API_TOKEN`); a node's failures are logged when their cause changes and
 * once when it answers again, not on every round.
 *
 * @example
 * ```ts ignore
 * const client = new LookupClient({ token, fetch, log, maxLookupsPerNode: 16 });
 * const answer = await client.ask(node, JSON.stringify({ name: "agent-1" }), signal);
 * ```
 */
export class LookupClient {
  readonly #headers: Readonly<Record<string, string>>;
  readonly #fetch: typeof fetch;
  readonly #log: Log;
  readonly #perNode: KeyedLimiter;
  /**
   * node id → why its last lookup failed. An entry goes once the node answers again or leaves
   * the fleet (`forget`, or `retainOnly` from the Finder's rounds), so it never outgrows the fleet.
   */
  readonly #failing = new Map<string, string>();

  /**
   * Builds a client for one fleet token.
   *
   * @throws {RangeError} when `maxLookupsPerNode` is not a positive integer.
   */
  constructor(options: LookupClientOptions) {
    this.#headers = Object.freeze({
      "authorization": `Bearer ${options.token}`,
      "content-type": "application/json",
      [HOP_HEADER]: options.hopMarker,
    });
    this.#fetch = options.fetch;
    this.#log = options.log;
    this.#perNode = new KeyedLimiter(options.maxLookupsPerNode);
  }

  /**
   * Asks `node` with `body` (`{"name":…}` or `{"id":…}`) until `signal` aborts; never rejects.
   * `team` names the team a name is looked up in; without it (by id) the node answers for any
   * team and says which. `slotToken` (a creator's, shared mode) goes as `x-dormice-slot-token`.
   *
   * @example
   * ```ts ignore
   * const answer = await client.ask(node, JSON.stringify({ id }), AbortSignal.timeout(2000));
   * if (answer.kind === "silent") console.log(answer.cause);
   * ```
   */
  async ask(
    node: FleetNode,
    body: string,
    signal: AbortSignal,
    team?: string,
    slotToken?: string,
  ): Promise<LookupAnswer> {
    const answer = await this.#askQueued(node, body, signal, team, slotToken);
    if (answer.kind === "silent") {
      // A caller hanging up says nothing about the node; only its own failures are news.
      if (signal.aborted && !isTimeout(signal.reason)) return answer;
      if (this.#failing.get(node.id) !== answer.cause) {
        this.#failing.set(node.id, answer.cause);
        this.#log("warn", "node did not answer a lookup", {
          nodeId: node.id,
          endpoint: node.endpoint,
          cause: answer.cause,
        });
      }
    } else if (answer.kind === "absent" && answer.refusal !== undefined) {
      // Only a node whose key rules differ from this gateway's (another build) gets here: the
      // gateway checks keys with the same shared schemas before it asks.
      const cause = `refused the key: ${answer.refusal}`;
      if (this.#failing.get(node.id) !== cause) {
        this.#failing.set(node.id, cause);
        this.#log("warn", "node refused a lookup key, read as absent: its build may differ", {
          nodeId: node.id,
          endpoint: node.endpoint,
          cause,
        });
      }
    } else if (this.#failing.delete(node.id)) {
      this.#log("info", "node answers lookups again", { nodeId: node.id });
    }
    return answer;
  }

  /** How many nodes are remembered as failing (diagnostics and tests). */
  get failingNodes(): number {
    return this.#failing.size;
  }

  /**
   * Forgets a node that left the fleet: if its id comes back, its first failure is news again.
   *
   * @example
   * ```ts ignore
   * client.forget("node-c"); // after removeNode
   * ```
   */
  forget(nodeId: string): void {
    this.#failing.delete(nodeId);
  }

  /**
   * Forgets every failing node for which `known` is false, e.g. those the fleet no longer holds.
   *
   * @example
   * ```ts ignore
   * client.retainOnly((id) => fleet.get(id) !== undefined);
   * ```
   */
  retainOnly(known: (nodeId: string) => boolean): void {
    for (const id of [...this.#failing.keys()]) if (!known(id)) this.#failing.delete(id);
  }

  #askQueued(
    node: FleetNode,
    body: string,
    signal: AbortSignal,
    team: string | undefined,
    slotToken: string | undefined,
  ): Promise<LookupAnswer> {
    // Queued asks wait under the same signal, so the round's deadline bounds the wait too.
    const ask = () => this.#askNow(node, body, signal, team, slotToken);
    return this.#perNode.run(node.id, signal, ask)
      .catch((error) => ({ kind: "silent", cause: describeFailure(error, signal) }));
  }

  async #askNow(
    node: FleetNode,
    body: string,
    signal: AbortSignal,
    team: string | undefined,
    slotToken: string | undefined,
  ): Promise<LookupAnswer> {
    let response: Response;
    let headers = team === undefined ? this.#headers : { ...this.#headers, [TEAM_HEADER]: team };
    if (slotToken !== undefined) headers = { ...headers, [SLOT_TOKEN_HEADER]: slotToken };
    try {
      response = await this.#fetch(`${node.endpoint}/lookupSandbox`, {
        method: "POST",
        headers,
        body,
        signal,
        redirect: "manual",
      });
    } catch (error) {
      return { kind: "silent", cause: describeFailure(error, signal) };
    }
    try {
      if (response.status === 400) {
        // An answer, not silence: reading it as silence made every node's refusal of a bad key
        // a fleet-wide 503 "retry shortly" that no retry could ever fix.
        return { kind: "absent", refusal: sentenceOf(await response.text()) };
      }
      if (response.status !== 200) {
        const text = await response.text();
        const hint = response.status === 401
          ? ": the node refused the fleet token; set the same DORMICE_API_TOKEN on gateway and nodes"
          : response.status === 508
          ? ": its endpoint leads back to this gateway (a loop); correct that node's " +
            "DORMICE_NODE_ENDPOINT and remove it with removeNode once it is down"
          : `: ${text.slice(0, 200)}`;
        return { kind: "silent", cause: `HTTP ${response.status}${hint}` };
      }
      const parsed = lookupAnswerSchema.safeParse(await response.json());
      if (!parsed.success) {
        return { kind: "silent", cause: "its lookupSandbox answer is not the expected shape" };
      }
      return parsed.data.found
        ? { kind: "found", sandbox: parsed.data.sandbox }
        : { kind: "absent" };
    } catch (error) {
      await response.body?.cancel().catch(() => {});
      return { kind: "silent", cause: describeFailure(error, signal) };
    }
  }
}

/** A node's `{message}` error body, or its raw text, cut for a log line. */
function sentenceOf(text: string): string {
  try {
    const message = (JSON.parse(text) as { message?: unknown })?.message;
    if (typeof message === "string") return message.slice(0, 200);
  } catch { /* not JSON: the raw text */ }
  return text.slice(0, 200);
}

/** The reason a lookup deadline aborts with: the `TimeoutError` {@linkcode LookupClient} reads as silence. */
export function timeoutError(ms: number): DOMException {
  return new DOMException(`No answer within ${ms} ms`, "TimeoutError");
}

function isTimeout(reason: unknown): boolean {
  return reason instanceof DOMException && reason.name === "TimeoutError";
}

function describeFailure(error: unknown, signal: AbortSignal): string {
  if (signal.aborted) {
    const reason = signal.reason;
    if (reason instanceof EveryCallerLeft) return "the client left before it answered";
    if (reason instanceof Error) return reason.message;
    return String(reason);
  }
  const message = error instanceof Error ? error.message : String(error);
  return message.slice(0, 300);
}
