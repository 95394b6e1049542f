/**
 * The tags of the E2B templates a team built, as the gateway reads them: a build's request
 * (`name:tag`, `tags`; `default` without) points its tags at it; `POST /templates/tags` points
 * more at the build a `name:tag` names and `DELETE /templates/tags` removes them. The fleet keeps
 * a template's newest build only, so a create from `name:tag` starts it when the tag names it
 * and is a 409 naming the tag when it names an older build. Tags live on the nodes that build
 * (`node/template_tags.ts`), so they outlive a gateway's restart and every gateway reads them.
 *
 * @module
 */
import type { Context } from "hono";
import { HttpError } from "../../../shared/http_error.ts";
import { readJsonObject } from "../../../shared/json_body.ts";
import type { GatewayParts } from "../parts.ts";
import { type FoundTemplate, notFound, templateHolders } from "./template_listing.ts";

/** A template name: what a team calls it (a snapshot name). */
export const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
/** A tag (`name:tag`, `tags`). */
export const TAG = /^[A-Za-z0-9._-]{1,64}$/;
/** A template id here: a snapshot id. */
export const TEMPLATE_ID = /^snap-[a-z0-9]{20}$/;

/** Where a tag points, as the node keeps it. */
interface TagTarget {
  buildID: string;
  createdAt: string;
}

/** The tags of one template as a node keeps them (`node/template_tags.ts`). */
export interface TagRecord {
  team: string;
  updatedAt: number;
  latest?: TagTarget;
  tags: Record<string, TagTarget>;
}

/** The team's template by name (as the headers' team sees it), or undefined. */
export type FindTemplate = (
  name: string,
  headers: Record<string, string>,
  signal: AbortSignal,
) => Promise<FoundTemplate | undefined>;

/** Whether the headers' team owns a template found (its holder is asked). */
export type OwnsTemplate = (
  found: FoundTemplate,
  headers: Record<string, string>,
  signal: AbortSignal,
) => Promise<boolean>;

/**
 * The tags of the team's built templates, as the nodes keep them: each build's node records the
 * tags its request points at it, and the record written last (a template rebuilt on another node
 * leaves one on each) is the template's. Nothing is kept on the gateway, so every gateway of a
 * shared fleet, and this one after a restart, reads the same tags.
 */
export class TemplateTagBook {
  #parts: GatewayParts;
  #nodeApi: string;
  #find: FindTemplate;
  #owns: OwnsTemplate;

  constructor(
    parts: GatewayParts,
    nodeApi: string,
    find: FindTemplate,
    owns: OwnsTemplate,
  ) {
    this.#parts = parts;
    this.#nodeApi = nodeApi;
    this.#find = find;
    this.#owns = owns;
  }

  /**
   * The newest tag record of `templateId` for the headers' team, and the node keeping it: the
   * nodes that may hold the template are asked (`templateHolders`: the builder keeps the record
   * and holds the template; check-ins carry no tags), with `found`'s node. Undefined when none
   * keeps one, without a request when no node may hold it; a 503 when none answered with one
   * and some did not answer.
   */
  async record(
    templateId: string,
    headers: Record<string, string>,
    signal: AbortSignal,
    found?: string,
  ): Promise<{ node: string; record: TagRecord } | undefined> {
    const nodes = templateHolders(this.#parts, templateId);
    // Shared mode: a node that built it again since the check-ins this gateway read (etcd
    // records a finished build's pushed check-in at once).
    const extra = [found, ...await this.#builtAgainOn(templateId)];
    for (const id of extra) {
      const node = id === undefined ? undefined : this.#parts.fleet.get(id);
      if (node && !nodes.includes(node)) nodes.push(node);
    }
    if (nodes.length === 0) return undefined;
    const answers = await this.#parts.routing.fanOut(
      `${this.#nodeApi}/templates/${templateId}/tags`,
      null,
      signal,
      { method: "GET", headers, nodes },
    );
    let best: { node: string; record: TagRecord } | undefined;
    for (const a of answers) {
      if (!a.ok || a.status !== 200) continue;
      const record = a.json as TagRecord;
      if (typeof record?.updatedAt !== "number" || typeof record.tags !== "object") continue;
      if (!best || record.updatedAt > best.record.updatedAt) best = { node: a.node.id, record };
    }
    if (best) return best;
    const silent = answers.filter((a) => !a.ok && !/^HTTP (404|501):/.test(a.cause));
    if (silent.length > 0) {
      throw new HttpError(
        503,
        `The tags of template '${templateId}' could not be read: ${
          silent.map((a) => `'${a.node.id}'`).join(", ")
        } did not answer (it may keep them): retry shortly`,
        { headers: { "retry-after": "2" } },
      );
    }
    return undefined;
  }

  /**
   * Shared mode: the nodes etcd records as having built `templateId` again recently (a
   * finished build's pushed check-in); none with one gateway, or when etcd cannot be read (the
   * check-ins then say, within one fleet poll).
   */
  async #builtAgainOn(templateId: string): Promise<string[]> {
    if (this.#parts.snapshotRetakes === undefined) return [];
    try {
      return await this.#parts.snapshotRetakes.nodes(templateId);
    } catch (error) {
      this.#parts.log("warn", "cannot read etcd's record of templates built again", {
        template: templateId,
        error: error instanceof Error ? error.message : String(error),
      });
      return [];
    }
  }

  /** The tags of a template found, `default` (its newest build) among them. */
  async of(
    found: FoundTemplate,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<{ tag: string; buildID: string; createdAt: string }[]> {
    if (!TEMPLATE_ID.test(found.templateID)) {
      return [{ tag: "default", buildID: found.templateID, createdAt: found.createdAt }];
    }
    const held = (await this.record(found.templateID, headers, signal, found.node))?.record;
    return tagList(found, held);
  }

  /** The team's built template by name, for the tag routes; a 404 or 400 otherwise. */
  async #builtTemplate(
    name: string,
    field: string,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<FoundTemplate> {
    if (!NAME.test(name)) {
      throw new HttpError(
        400,
        `'${field}' '${name.slice(0, 80)}' must be a template name: 1 to 64 letters, digits, ` +
          "'.', '_' or '-', starting with a letter or digit",
      );
    }
    const found = await this.#find(name, headers, signal);
    if (!found) throw notFound(name);
    if (!TEMPLATE_ID.test(found.templateID)) {
      throw new HttpError(
        400,
        `'${name}' is a template of the fleet (DORMICE_TEMPLATES), which has no tags: tag a ` +
          "template your team built",
      );
    }
    // Another team's published template is found too; its holder says whose it is.
    if (!(await this.#owns(found, headers, signal))) throw notFound(name);
    return found;
  }

  /** `tags` of a tag request body: 1 to 16 valid tags; a 400 naming the field otherwise. */
  #tagList(value: unknown): string[] {
    if (!Array.isArray(value) || value.length === 0 || value.length > 16) {
      throw new HttpError(
        400,
        "'tags' must be an array of 1 to 16 tags, e.g. [\"production\"]",
      );
    }
    const bad = value.find((t) => typeof t !== "string" || !TAG.test(t));
    if (bad !== undefined) {
      throw new HttpError(
        400,
        `'tags' holds '${String(bad).slice(0, 80)}': a tag is 1 to 64 letters, digits, '.', ` +
          "'_' or '-'",
      );
    }
    return [...new Set(value as string[])];
  }

  /** `POST /templates/tags` (`{target: "name:tag", tags}`): the tags name the target's build. */
  async assign(c: Context, headers: Record<string, string>): Promise<Response> {
    const { value } = await readJsonObject(c.req.raw, {
      ...this.#parts.jsonBodyCap,
      empty: "refuse",
      example: '{"target":"my-template:v1","tags":["production"]}',
    });
    if (typeof value.target !== "string") {
      throw new HttpError(
        400,
        "'target' is required: the template and tag to point at, e.g. \"my-template:v1\"",
      );
    }
    const [name, from = "default", extra] = value.target.split(":", 3);
    if (extra !== undefined || !TAG.test(from)) {
      throw new HttpError(
        400,
        `'target' '${value.target.slice(0, 80)}' must be a name with at most one ':tag', ` +
          'e.g. "my-template:v1"',
      );
    }
    const tags = this.#tagList(value.tags);
    const signal = c.req.raw.signal;
    const found = await this.#builtTemplate(name, "target", headers, signal);
    const held = await this.record(found.templateID, headers, signal, found.node);
    const source = tagList(found, held?.record).find((t) => t.tag === from);
    if (!source) throw tagNotFound(name, from, found.templateID);
    const node = held?.node ?? found.node;
    const target = {
      buildID: source.buildID,
      createdAt: new Date(this.#parts.fleet.now()).toISOString(),
    };
    await this.#tell(node, found.templateID, "POST", { tags, target }, headers, signal);
    return Response.json({ tags, buildID: source.buildID }, { status: 201 });
  }

  /** `DELETE /templates/tags` (`{name, tags}`): each tag must be one of the template's. */
  async remove(c: Context, headers: Record<string, string>): Promise<Response> {
    const { value } = await readJsonObject(c.req.raw, {
      ...this.#parts.jsonBodyCap,
      empty: "refuse",
      example: '{"name":"my-template","tags":["production"]}',
    });
    if (typeof value.name !== "string") {
      throw new HttpError(400, "'name' is required: the template's name, e.g. \"my-template\"");
    }
    const tags = this.#tagList(value.tags);
    const signal = c.req.raw.signal;
    const found = await this.#builtTemplate(value.name, "name", headers, signal);
    const held = await this.record(found.templateID, headers, signal, found.node);
    const missing = tags.find((t) => !held || !(t in held.record.tags));
    if (missing !== undefined) throw tagNotFound(value.name, missing, found.templateID);
    await this.#tell(held!.node, found.templateID, "DELETE", { tags }, headers, signal);
    return new Response(null, { status: 204 });
  }

  /** Tells `node` a change of the template's tags (`POST` points them, `DELETE` removes). */
  async #tell(
    nodeId: string | undefined,
    templateId: string,
    method: "POST" | "DELETE",
    body: unknown,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<void> {
    const node = nodeId === undefined ? undefined : this.#parts.fleet.get(nodeId);
    if (!node || this.#parts.fleet.isDown(node)) {
      throw new HttpError(
        503,
        `Node '${nodeId}', which keeps the tags of template '${templateId}', is down: retry once ` +
          "it is back",
        { headers: { "retry-after": "5" } },
      );
    }
    let res: Response;
    try {
      res = await fetch(`${node.endpoint}${this.#nodeApi}/templates/${templateId}/tags`, {
        method,
        headers: { ...headers, "content-type": "application/json" },
        body: JSON.stringify(body),
        signal: AbortSignal.any([signal, AbortSignal.timeout(30_000)]),
      });
    } catch (error) {
      throw new HttpError(
        502,
        `Node '${node.id}', which keeps the tags of template '${templateId}', did not answer: ${
          error instanceof Error ? error.message : error
        }`,
      );
    }
    const text = await res.text();
    if (res.ok) return;
    let message = text;
    try {
      message = JSON.parse(text).message ?? text;
    } catch { /* not JSON */ }
    throw new HttpError(
      res.status === 400 || res.status === 404 ? res.status : 502,
      `Node '${node.id}' refused the tags of template '${templateId}' (${res.status}): ` +
        message.slice(0, 300),
    );
  }

  /**
   * A create's `templateID` without its `:tag`: the tag must name the template's newest build,
   * the only one the fleet keeps. `default` or no tag passes (a built template's id is returned
   * then, which its holders advertise); a 404 for a tag the template does not have, a 409 for
   * one naming an older build.
   */
  async untagged(
    templateID: string,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<string> {
    const [name, tag, extra] = templateID.split(":", 3);
    if (tag === undefined) return templateID;
    if (extra !== undefined || !TAG.test(tag)) {
      throw new HttpError(
        400,
        `'templateID' '${templateID.slice(0, 80)}' must be a template with at most one ':tag', ` +
          'e.g. "my-template:v1"',
      );
    }
    const found = await this.#find(name, headers, signal);
    if (!found || !TEMPLATE_ID.test(found.templateID)) return tag === "default" ? name : templateID;
    // Another team's published template: its tags are its team's, only `default` is seen.
    const held = (await this.record(found.templateID, headers, signal, found.node))?.record;
    const tags = tagList(found, held);
    const named = tags.find((t) => t.tag === tag);
    if (!named) throw tagNotFound(name, tag, found.templateID);
    const newest = held?.latest?.buildID ?? found.templateID;
    if (named.buildID !== newest) {
      throw new HttpError(
        409,
        `Tag '${tag}' of template '${name}' names build '${named.buildID}', not its newest ` +
          `build '${newest}': this fleet starts sandboxes from a template's newest build only; ` +
          `create from '${name}' or point the tag at it with POST /templates/tags`,
      );
    }
    // The template's id: the create then places it by the holders its id is advertised by,
    // without asking every node for the name again.
    return found.templateID;
  }
}

/**
 * Whether the headers' team owns `found`: its holder answers `PATCH /v2/templates/{id}` `{}`
 * (which changes nothing) with 200 for its team and 404 for any other (a published template is
 * found by every team).
 */
export async function ownsTemplate(
  parts: GatewayParts,
  nodeApi: string,
  found: FoundTemplate,
  headers: Record<string, string>,
  signal: AbortSignal,
): Promise<boolean> {
  const node = found.node === undefined ? undefined : parts.fleet.get(found.node);
  if (!node || parts.fleet.isDown(node)) {
    throw new HttpError(
      503,
      `Node '${found.node}', which holds template '${found.templateID}', is down: retry once ` +
        "it is back",
      { headers: { "retry-after": "5" } },
    );
  }
  let res: Response;
  try {
    res = await fetch(`${node.endpoint}${nodeApi}/v2/templates/${found.templateID}`, {
      method: "PATCH",
      headers: { ...headers, "content-type": "application/json" },
      body: "{}",
      signal: AbortSignal.any([signal, AbortSignal.timeout(30_000)]),
    });
  } catch (error) {
    throw new HttpError(
      502,
      `Node '${node.id}', which holds template '${found.templateID}', did not answer: ${
        error instanceof Error ? error.message : error
      }`,
    );
  }
  await res.body?.cancel();
  if (res.status === 200 || res.status === 404) return res.status === 200;
  throw new HttpError(
    502,
    `Node '${node.id}', which holds template '${found.templateID}', answered ${res.status}: ` +
      "retry shortly",
  );
}

/**
 * A template's tags from its record (none kept: `default` only), `default` naming its newest
 * build unless it was pointed elsewhere.
 */
function tagList(
  found: FoundTemplate,
  held: TagRecord | undefined,
): { tag: string; buildID: string; createdAt: string }[] {
  const kept = Object.entries(held?.tags ?? {}).map(([tag, t]) => ({
    tag,
    buildID: t.buildID,
    createdAt: t.createdAt,
  }));
  if (kept.some((t) => t.tag === "default")) return kept;
  return [{
    tag: "default",
    buildID: held?.latest?.buildID ?? found.templateID,
    createdAt: held?.latest?.createdAt ?? found.createdAt,
  }, ...kept];
}

/** A 404 naming the tag not found and where the template's tags are listed. */
function tagNotFound(name: string, tag: string, templateId: string): HttpError {
  return new HttpError(
    404,
    `Tag '${tag}' of template '${name}' not found: list its tags with GET /templates/` +
      `${templateId}/tags`,
  );
}
