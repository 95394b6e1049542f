/**
 * The tags of the E2B templates a team built, as the gateway keeps them: a build's request
 * (`name:tag`, `tags`; `default` without) points its tags at it; `POST /templates/tags` points
 * more at the build a `name:tag` names and `DELETE /templates/tags` removes them. The fleet keeps
 * a template's newest build only, so a create from `name:tag` starts it when the tag names it
 * and is a 409 naming the tag when it names an older build. Tags live in the gateway's memory,
 * for at most {@linkcode KEPT_TAGGED} templates.
 *
 * @module
 */
import type { Context } from "hono";
import { HttpError } from "../../../shared/http_error.ts";
import { readJsonObject } from "../../../shared/json_body.ts";
import type { GatewayParts } from "../parts.ts";
import { type FoundTemplate, notFound } from "./template_listing.ts";

/** How many templates' tags the gateway keeps, the least recently tagged forgotten first. */
export const KEPT_TAGGED = 1000;
/** A template name: what a team calls it (a snapshot name). */
export const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
/** A tag (`name:tag`, `tags`). */
export const TAG = /^[A-Za-z0-9._-]{1,64}$/;
/** A template id here: a snapshot id. */
export const TEMPLATE_ID = /^snap-[a-z0-9]{20}$/;

/** The tags of one built template. */
interface TemplateTags {
  team: string;
  byTag: Map<string, { buildID: string; createdAt: string }>;
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

/** The tags of the team's built templates on one gateway. */
export class TemplateTagBook {
  #parts: GatewayParts;
  #find: FindTemplate;
  #latest: (templateId: string) => string | undefined;
  #owns: OwnsTemplate;
  /**
   * Template id → its team and its tags (tag → the build it names), the template least recently
   * tagged first: at most {@linkcode KEPT_TAGGED} templates, the oldest forgotten first.
   */
  #byTemplate = new Map<string, TemplateTags>();

  constructor(
    parts: GatewayParts,
    find: FindTemplate,
    latest: (templateId: string) => string | undefined,
    owns: OwnsTemplate,
  ) {
    this.#parts = parts;
    this.#find = find;
    this.#latest = latest;
    this.#owns = owns;
  }

  /** Forgets the tags of a deleted template. */
  forget(templateId: string): void {
    this.#byTemplate.delete(templateId);
  }

  /** Points `tags` of the team's `templateId` at `buildID`, the template tagged newest. */
  tag(team: string, templateId: string, buildID: string, tags: string[]): void {
    const held = this.#byTemplate.get(templateId) ?? { team, byTag: new Map() };
    const createdAt = new Date(this.#parts.fleet.now()).toISOString();
    for (const tag of tags) held.byTag.set(tag, { buildID, createdAt });
    this.#byTemplate.delete(templateId);
    this.#byTemplate.set(templateId, held);
    while (this.#byTemplate.size > KEPT_TAGGED) {
      this.#byTemplate.delete(this.#byTemplate.keys().next().value!);
    }
  }

  /** The tags of a template found for `team`, `default` (its newest build) among them. */
  of(
    found: FoundTemplate,
    team: string,
  ): { tag: string; buildID: string; createdAt: string }[] {
    const held = this.#byTemplate.get(found.templateID);
    const kept = held && held.team === team
      ? [...held.byTag].map(([tag, b]) => ({ tag, ...b }))
      : [];
    // `default` names the newest build unless it was pointed elsewhere.
    if (kept.some((t) => t.tag === "default")) return kept;
    return [{
      tag: "default",
      buildID: this.#latest(found.templateID) ?? found.templateID,
      createdAt: found.createdAt,
    }, ...kept];
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
  async assign(c: Context, team: string, headers: Record<string, string>): Promise<Response> {
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
    const found = await this.#builtTemplate(name, "target", headers, c.req.raw.signal);
    const source = this.of(found, team).find((t) => t.tag === from);
    if (!source) throw tagNotFound(name, from, found.templateID);
    this.tag(team, found.templateID, source.buildID, tags);
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
    const found = await this.#builtTemplate(value.name, "name", headers, c.req.raw.signal);
    const held = this.#byTemplate.get(found.templateID);
    const missing = tags.find((t) => !held?.byTag.has(t));
    if (missing !== undefined) throw tagNotFound(value.name, missing, found.templateID);
    for (const t of tags) held!.byTag.delete(t);
    return new Response(null, { status: 204 });
  }

  /**
   * A create's `templateID` without its `:tag`: the tag must name the template's newest build,
   * the only one the fleet keeps. `default` or no tag passes; a 404 for a tag the template does
   * not have, a 409 for one naming an older build.
   */
  async untagged(
    templateID: string,
    team: string,
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
    const tags = this.of(found, team);
    const named = tags.find((t) => t.tag === tag);
    if (!named) throw tagNotFound(name, tag, found.templateID);
    const newest = this.#latest(found.templateID) ?? found.templateID;
    if (named.buildID !== newest) {
      throw new HttpError(
        409,
        `Tag '${tag}' of template '${name}' names build '${named.buildID}', not its newest ` +
          `build '${newest}': this fleet starts sandboxes from a template's newest build only; ` +
          `create from '${name}' or point the tag at it with POST /templates/tags`,
      );
    }
    return name;
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

/** A 404 naming the tag not found and where the template's tags are listed. */
function tagNotFound(name: string, tag: string, templateId: string): HttpError {
  return new HttpError(
    404,
    `Tag '${tag}' of template '${name}' not found: list its tags with GET /templates/` +
      `${templateId}/tags`,
  );
}
