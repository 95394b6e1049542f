/**
 * E2B's fork through the gateway, held to the caller's team limits: the node builds the copies
 * itself, so each copy is admitted here as a create is (`TeamLimits.enter`: the team's
 * `maxSandboxes` and the key's `createsPerMinute`, across gateways in shared mode) before the
 * node is asked.
 *
 * A fork past the limits is admitted in part, as E2B answers a fork: one entry per copy, each
 * built or failed on its own. The node is asked for the admitted copies only, and each copy
 * that was not admitted is answered as `{error: {code: 429, message}}` (the SDK's
 * `RateLimitError` in that slot of the array) after them. A fork of which no copy is admitted
 * is one 429, as a refused create is.
 *
 * @module
 */
import type { Caller } from "../../keys/auth.ts";
import type { FindOne } from "../../finder/finder.ts";
import type { GatewayParts } from "../parts.ts";
import type { Admission } from "../../keys/team_limits.ts";
import type { CapturedAnswer } from "../../routing/create.ts";
import { ledgerSeqOf } from "../../routing/create.ts";
import { teamOf } from "../../keys/auth.ts";
import { HttpError } from "../../../shared/http_error.ts";
import { readJsonObject } from "../../../shared/json_body.ts";

/** The most copies one fork asks for (E2B's bound, which the node checks too). */
const MAX_FORK_COUNT = 100;

/** What {@linkcode forkWithinLimits} needs besides the parts. */
export interface ForkRequest {
  /** The client's request, its body not yet read. */
  request: Request;
  /** The caller, whose key's limits and team the copies count against. */
  caller: Caller;
  /** The source sandbox, found. */
  found: FindOne;
  /** The path and query on the node. */
  path: string;
  /** The headers for the node (the fleet token, the team). */
  headers: Readonly<Record<string, string>>;
}

/**
 * Admits the fork's copies one by one until the first refusal, asks the node for those, and
 * settles each admission by the node's entry for it.
 *
 * @throws {HttpError} the limits' 429 when no copy is admitted; what the routing throws.
 * @example
 * ```ts ignore
 * return await forkWithinLimits(parts, { request: c.req.raw, caller, found, path, headers });
 * ```
 */
export async function forkWithinLimits(
  parts: GatewayParts,
  fork: ForkRequest,
): Promise<Response> {
  const { request, caller, found, path } = fork;
  const headers = { "content-type": "application/json", ...fork.headers };
  const { text, value: body } = await readJsonObject(request, {
    ...parts.jsonBodyCap,
    empty: "object",
    example: '{"count":2}',
  });
  const count = body.count ?? 1;
  // A count the node refuses (its own 400 names why) builds nothing: nothing to admit.
  if (!Number.isInteger(count) || (count as number) < 1 || (count as number) > MAX_FORK_COUNT) {
    return relay(await parts.routing.send(found, path, { body: text || "{}", headers }));
  }
  const asked = count as number;
  const team = teamOf(caller);
  const key = caller.kind === "key" ? caller.key : undefined;
  const admitted: Admission[] = [];
  let refusal: HttpError | undefined;
  try {
    while (admitted.length < asked) {
      try {
        admitted.push(await parts.limits.enter(key, team));
      } catch (error) {
        if (!(error instanceof HttpError) || error.status !== 429) throw error;
        refusal = error;
        break;
      }
    }
  } catch (error) {
    for (const a of admitted) a.cancel();
    throw error;
  }
  if (refusal !== undefined && admitted.length === 0) throw refusal;
  let sending: Promise<CapturedAnswer>;
  // The copies are creates on the node: lookups keep asking it until its digest shows them
  // (docs/lookup-digest.md, rule 4).
  const ended = parts.finder.placing(found.node.id);
  try {
    // Throws at once, before anything is sent, when the node is silent.
    sending = parts.routing.send(found, path, {
      body: JSON.stringify({ ...body, count: admitted.length }),
      headers,
    });
  } catch (error) {
    ended(true);
    for (const a of admitted) a.cancel();
    throw error;
  }
  let answer: CapturedAnswer;
  try {
    answer = await sending;
  } catch (error) {
    // Sent, and no answer: the copies may exist, so they count until the node's next reading.
    ended(false);
    for (const a of admitted) a.placed(found.node.id);
    throw error;
  }
  ended(true);
  const entries = answer.status === 201 ? arrayOf(answer.text) : undefined;
  // Shared mode: the copies' ids are published for every gateway's lookups before the client
  // hears of them.
  await parts.routing.publishCreated(copyIds(entries), found.node);
  const seq = ledgerSeqOf(answer.headers);
  if (answer.status >= 400 && answer.status < 500) {
    for (const a of admitted) a.cancel();
  } else {
    // A copy the node answered with an error was not built; any other outcome may have been.
    admitted.forEach((a, i) => {
      const entry = entries?.[i] as { sandbox?: unknown } | undefined;
      if (entries !== undefined && entry?.sandbox === undefined) a.cancel();
      else a.placed(found.node.id, seq);
    });
  }
  if (entries === undefined || refusal === undefined) return relay(answer);
  const refused = { error: { code: 429, message: refusal.message } };
  return Response.json([...entries, ...Array(asked - admitted.length).fill(refused)], {
    status: answer.status,
  });
}

/** The ids of the copies a fork answer names (`[{sandbox: {sandboxID}}]`). */
function copyIds(entries: unknown[] | undefined): string[] {
  const ids: string[] = [];
  for (const entry of entries ?? []) {
    const id = (entry as { sandbox?: { sandboxID?: unknown } } | null)?.sandbox?.sandboxID;
    if (typeof id === "string") ids.push(id);
  }
  return ids;
}

/** The node's fork answer as an array, or undefined when it is not one. */
function arrayOf(text: string): unknown[] | undefined {
  try {
    const parsed = JSON.parse(text);
    return Array.isArray(parsed) ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/** A captured node answer, passed on as the node gave it (its errors are already E2B's). */
function relay(answer: CapturedAnswer): Response {
  const headers = new Headers();
  for (const name of ["content-type", "retry-after"]) {
    const v = answer.headers.get(name);
    if (v !== null) headers.set(name, v);
  }
  return new Response(answer.text === "" ? null : answer.text, { status: answer.status, headers });
}
