/**
 * What the gateway's E2B control plane does with the answers of a fan-out to every node: keep
 * the ones it can use and name the silent nodes (`gather`), and the keyset paging of the merged
 * v2 list (`parsePaging`, `cursorOf`).
 *
 * @module
 */
import { decodeListCursor, type ListCursor } from "../../../shared/list_cursor.ts";
import { HttpError } from "../../../shared/http_error.ts";
import type { GatewayParts } from "../parts.ts";
import type { FanOutAnswer } from "../../routing/routing.ts";

/** The header that names the nodes a merged answer could not reach (the first 100 of them). */
export const UNREACHABLE_HEADER: string = "x-dormice-unreachable";
/** The header counting every node a merged answer could not reach. */
export const UNREACHABLE_COUNT_HEADER: string = "x-dormice-unreachable-count";
/**
 * Node ids named in `x-dormice-unreachable` at most. A list at 10,000 nodes on a busy gateway
 * left 8,904 nodes not heard (bench/RESULTS.md, Scale): all their ids made a header of about
 * 100 KB, past what HTTP clients accept (Node's is 16 KB), so the whole list would fail.
 */
export const UNREACHABLE_HEADER_IDS = 100;

/**
 * The headers naming the nodes not heard: the first `UNREACHABLE_HEADER_IDS` ids, and the count.
 *
 * @example
 * ```ts
 * import { unreachableHeaders } from "./merge.ts";
 * unreachableHeaders(["b", "c"]); // { "x-dormice-unreachable": "b,c", "x-dormice-unreachable-count": "2" }
 * ```
 */
export function unreachableHeaders(ids: readonly string[]): Record<string, string> {
  if (ids.length === 0) return {};
  return {
    [UNREACHABLE_HEADER]: ids.slice(0, UNREACHABLE_HEADER_IDS).join(","),
    [UNREACHABLE_COUNT_HEADER]: String(ids.length),
  };
}

/** `ids` for a sentence: the first ten, and how many more. */
function someOf(ids: readonly string[]): string {
  const more = ids.length > 10 ? ` and ${ids.length - 10} more` : "";
  return ids.slice(0, 10).join(", ") + more;
}
/** The header of a v2 list counting the running sandboxes its filters match, before paging. */
export const TOTAL_RUNNING_HEADER: string = "x-total-running";
/** Largest page a node serves, so the gateway asks for at most this many rows per node. */
const NODE_MAX_LIMIT = 1000;
/** A page size the SDK leaves unset. */
const DEFAULT_LIMIT = 100;

/** One row of a node's E2B list, as far as paging needs it. */
export interface ListedRow {
  /** The sandbox's id, the cursor's tie-break. */
  sandboxID: string;
  /** Its start time, the cursor's order. */
  startedAt: string;
}

/** A merged list's page, as the client asked it. */
export interface Paging {
  /** Rows the client gets. */
  limit: number;
  /** Rows asked of each node: one more than the page when allowed, to learn whether more exist. */
  ask: number;
  /** By start time, newest first unless asked. */
  order: "asc" | "desc";
  /** Where the page starts: after the last row of the previous page. */
  cursor?: ListCursor;
}

/**
 * Reads `limit`, `order` and `nextToken` of a v2 list.
 *
 * @throws {HttpError} 400 naming a bad limit, order or token.
 * @example
 * ```ts
 * import { parsePaging } from "./merge.ts";
 * parsePaging(new URLSearchParams("limit=10")).ask; // 11
 * ```
 */
export function parsePaging(query: URLSearchParams): Paging {
  const limitRaw = query.get("limit");
  const limit = limitRaw === null ? DEFAULT_LIMIT : Number(limitRaw);
  if (!Number.isInteger(limit) || limit < 1 || limit > NODE_MAX_LIMIT) {
    throw new HttpError(
      400,
      `'limit' must be a whole number from 1 to ${NODE_MAX_LIMIT}: received '${limitRaw}'`,
    );
  }
  const order = query.get("order") ?? "desc";
  if (order !== "asc" && order !== "desc") {
    throw new HttpError(400, `'order' must be asc or desc: received '${order.slice(0, 20)}'`);
  }
  const token = query.get("nextToken");
  return {
    limit,
    ask: Math.min(limit + 1, NODE_MAX_LIMIT),
    order,
    cursor: token ? decodeListCursor(token, "gateway") : undefined,
  };
}

/**
 * A listed row's position in the listing order.
 *
 * @example
 * ```ts
 * import { cursorOf } from "./merge.ts";
 * cursorOf({ sandboxID: "sbx_1", startedAt: "2026-01-01T00:00:00Z" }).id; // "sbx_1"
 * ```
 */
export function cursorOf(row: ListedRow): ListCursor {
  return { createdAt: String(row.startedAt), id: String(row.sandboxID) };
}

/**
 * The nodes' answers a fan-out can use, each read by `accept`, and the headers that name the
 * nodes that did not answer (`what` names the call in the log and the 503).
 *
 * @throws {HttpError} the nodes' own 4xx when every node refused the query alike, or a 503
 * with Retry-After when no node answered.
 * @example
 * ```ts ignore
 * const { answered, headers } = gather(answers, (j) => Array.isArray(j) ? j : undefined, "list", log);
 * ```
 */
export function gather<T>(
  answers: FanOutAnswer[],
  accept: (json: unknown) => T | undefined,
  what: string,
  log: GatewayParts["log"],
): {
  answered: { answer: FanOutAnswer & { ok: true }; value: T }[];
  headers: Record<string, string>;
} {
  const answered: { answer: FanOutAnswer & { ok: true }; value: T }[] = [];
  const unreachable: string[] = [];
  let refusal: { status: number; message: string } | undefined;
  for (const a of answers) {
    const value = a.ok ? accept(a.json) : undefined;
    if (a.ok && value !== undefined) answered.push({ answer: a, value });
    else {
      const cause = a.ok ? `its answer to the ${what} is malformed` : a.cause;
      refusal ??= clientFault(cause);
      unreachable.push(a.node.id);
      // One line per node while they are few; a fleet-wide silence is one line, not thousands.
      if (unreachable.length <= 10) {
        log("warn", `a node did not answer an E2B ${what}`, { nodeId: a.node.id, cause });
      }
    }
  }
  if (unreachable.length > 10) {
    log("warn", `${unreachable.length} nodes did not answer an E2B ${what}`, {
      nodeIds: unreachable.slice(0, 10),
    });
  }
  // The same bad query fails on every node: say so rather than answer nothing.
  if (refusal && answered.length === 0) throw new HttpError(refusal.status, refusal.message);
  if (answers.length > 0 && answered.length === 0) {
    throw new HttpError(
      503,
      `No node answered the ${what} (${someOf(unreachable)}): retry shortly; listNodes ` +
        "shows which nodes are down",
      { headers: { "retry-after": "2", ...unreachableHeaders(unreachable) } },
    );
  }
  const headers: Record<string, string> = unreachableHeaders(unreachable);
  return { answered, headers };
}

/** A node's 4xx in a fan-out is the query's fault, not the node's: its status and sentence. */
function clientFault(cause: string): { status: number; message: string } | undefined {
  const m = /^HTTP (4\d\d): ([\s\S]*)$/.exec(cause);
  if (!m) return undefined;
  let message = m[2];
  try {
    const parsed = JSON.parse(m[2]) as { message?: unknown };
    if (typeof parsed?.message === "string") message = parsed.message;
  } catch { /* the raw text, cut at 200 characters by fanOut */ }
  return { status: Number(m[1]), message };
}
