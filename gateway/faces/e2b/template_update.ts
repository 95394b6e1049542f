/**
 * `PATCH /v2/templates/{id}` at the gateway (`templates.ts` routes it): told to the nodes that
 * may hold the template, as a delete is; the holder answers.
 *
 * @module
 */
import type { Context } from "hono";
import { HttpError } from "../../../shared/http_error.ts";
import { readJsonObject } from "../../../shared/json_body.ts";
import type { GatewayParts } from "../parts.ts";
import { holdersOf, notFound } from "./template_listing.ts";

/**
 * `PATCH /v2/templates/{id}` (`{public}`): told to the nodes that may hold it
 * ({@linkcode holdersOf}), as a delete is; the holder answers. A 404 when none holds a
 * template of the team by that id (none advertised: no node asked).
 */
export async function updateTemplate(
  parts: GatewayParts,
  nodeApi: string,
  c: Context,
  id: string,
  team: string,
  headers: Record<string, string>,
): Promise<Response> {
  const { text } = await readJsonObject(c.req.raw, {
    ...parts.jsonBodyCap,
    empty: "refuse",
    example: '{"public":true}',
  });
  const nodes = await holdersOf(parts, id, team);
  if (nodes.length === 0) throw notFound(id);
  const answers = await parts.routing.fanOut(
    `${nodeApi}/v2/templates/${encodeURIComponent(id)}`,
    text,
    c.req.raw.signal,
    { method: "PATCH", headers: { ...headers, "content-type": "application/json" }, nodes },
  );
  const done = answers.find((a) => a.ok);
  if (done && done.ok) return Response.json(done.json);
  const bad = answers.find((a) => !a.ok && /^HTTP 400:/.test(a.cause));
  if (bad && !bad.ok) throw new HttpError(400, bad.cause.replace(/^HTTP 400: /, ""));
  const silent = answers.filter((a) => !a.ok && !/^HTTP 404:/.test(a.cause));
  if (silent.length > 0) {
    throw new HttpError(
      503,
      `No node updated template '${id}', and ${
        silent.map((a) => `'${a.node.id}'`).join(", ")
      } did not answer (it may hold it): retry shortly`,
      { headers: { "retry-after": "2" } },
    );
  }
  throw notFound(id);
}
