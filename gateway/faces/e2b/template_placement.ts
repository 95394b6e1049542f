/**
 * Where a template build request goes (`POST /v3/templates`, `templates.ts`): the name and tags
 * it asks for, read and checked; the node that builds (the fleet's placement); in shared mode
 * the id and node another gateway placed the name's newest build under; a new template id.
 *
 * @module
 */
import { HttpError } from "../../../shared/http_error.ts";
import type { FleetNode } from "../../fleet/node.ts";
import type { GatewayParts } from "../parts.ts";
import { NAME, TAG } from "./template_tags.ts";

const ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789";

/**
 * The name and tags a build request asks for (`name`, or `alias` as older SDKs send it, with
 * an optional `:tag`, and `tags`); a 400 naming what is wrong.
 */
export function buildName(body: Record<string, unknown>): { name: string; tags: string[] } {
  const given = typeof body.name === "string"
    ? body.name
    : typeof body.alias === "string"
    ? body.alias
    : undefined;
  if (given === undefined) {
    throw new HttpError(400, "'name' is required: the template's name, e.g. \"my-template\"");
  }
  const [name, tag, extra] = given.split(":", 3);
  if (!NAME.test(name) || extra !== undefined || (tag !== undefined && !TAG.test(tag))) {
    throw new HttpError(
      400,
      `'name' '${given.slice(0, 80)}' must be 1 to 64 letters, digits, '.', '_' or '-', ` +
        "starting with a letter or digit (a ':tag' may follow)",
    );
  }
  const tags = [
    ...new Set([
      ...(tag ? [tag] : []),
      ...(Array.isArray(body.tags) ? body.tags.filter((t) => typeof t === "string") : []),
    ]),
  ];
  const badTag = tags.find((t) => !TAG.test(t));
  if (badTag !== undefined || (Array.isArray(body.tags) && body.tags.length > 16)) {
    throw new HttpError(
      400,
      badTag !== undefined
        ? `Tag '${badTag.slice(0, 80)}' must be 1 to 64 letters, digits, '.', '_' or '-'`
        : "'tags' holds at most 16 tags",
    );
  }
  return { name, tags };
}

/**
 * Shared mode: the id and node another gateway placed the team's newest build of `scoped`
 * (`<team>/<name>`) under, as etcd records it; undefined when none is recorded or with one
 * gateway. A 503 when etcd cannot be read: a new id then could make the name two templates.
 */
export async function placedElsewhere(
  parts: GatewayParts,
  scoped: string,
): Promise<{ templateId: string; node: string } | undefined> {
  if (parts.templateNames === undefined) return undefined;
  try {
    return await parts.templateNames.get(scoped);
  } catch (error) {
    throw new HttpError(
      503,
      `Cannot read etcd's record of template builds for '${
        scoped.slice(scoped.indexOf("/") + 1)
      }' (${error instanceof Error ? error.message : error}): retry shortly`,
      { headers: { "retry-after": "2" } },
    );
  }
}

/**
 * The node that builds, by the fleet's placement (up, a reading, CPU and disk within the
 * limits): the holder of the team's template by this name when it passes (its cached steps
 * are there), else any node with `base`.
 */
export function placeBuild(
  parts: GatewayParts,
  templateId: string | undefined,
  holder: string | undefined,
): FleetNode {
  if (templateId !== undefined && holder !== undefined) {
    const held = parts.placer.pick({ snapshot: templateId, snapshotHolders: [holder] });
    if (held.ok) return held.node;
  }
  const pick = parts.placer.pick({ template: "base" });
  if (!pick.ok) {
    throw new HttpError(
      503,
      `No node can take a template build now: ${pick.message}`,
      { headers: { "retry-after": String(pick.retryAfterSeconds) } },
    );
  }
  return pick.node;
}

/** A new template id: a snapshot id. */
export function newTemplateId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(20));
  return `snap-${[...bytes].map((b) => ALPHABET[b % 36]).join("")}`;
}
