/**
 * The gateway's E2B template build routes, as the SDK's `Template.build` speaks them:
 *
 * - `POST /v3/templates` (and `/v2/templates`) picks the node that builds by the fleet's
 *   placement: the node already holding the team's template by that name (its cached steps are
 *   there) when it passes, else a node with the `base` template. The template's id is a
 *   snapshot id: the result is a snapshot of the team named after the template (see
 *   `node/executors/template_build.ts`), so a create from it is placed on its holders as any
 *   snapshot's is (`resolveCreateSource` in `snapshots.ts`). Moving snapshot images between
 *   nodes (heal, a registry) hooks in there and serves built templates unchanged.
 * - `GET /templates/{id}/files/{hash}` asks that node whether it has the file context, and
 *   hands out an upload URL on this gateway; `PUT` there (no key: the URL carries a signed
 *   token naming the build's node and the file hash, `template_upload.ts`) is streamed to the
 *   node, through any gateway of the fleet.
 * - `POST /v2/templates/{id}/builds/{buildID}` and `GET …/status` go to the building node.
 * - `GET /templates`, `GET /templates/aliases/{alias}` and `GET /templates/{id}/tags` read the
 *   fleet's templates (public) and the team's built ones (its named snapshots), found and
 *   listed by `template_listing.ts`.
 * - `POST`/`DELETE /templates/tags` and a build's tags are kept by `template_tags.ts`, which
 *   also reads the `:tag` of a create's `name:tag`.
 *
 * The node a build is placed on keeps it (its reservation, `PUT /templates/{id}/builds/{buildID}`
 * on the node), so any gateway finds it there. The gateway remembers where it placed or found
 * each build, a cache of at most {@linkcode KEPT_BUILDS}, the oldest forgotten first; a build
 * it does not know is asked of the nodes that may hold it, then of the rest, for the caller's
 * team only.
 *
 * @module
 */
import type { Context } from "hono";
import { HttpError } from "../../../shared/http_error.ts";
import { readJsonObject } from "../../../shared/json_body.ts";
import { TEAM_HEADER } from "../../../shared/teams.ts";
import { type Caller, teamOf } from "../../keys/auth.ts";
import type { SlotHold } from "../../routing/slots.ts";
import type { GatewayParts } from "../parts.ts";
import { findTemplate, type FoundTemplate, listTemplates, notFound } from "./template_listing.ts";
import { ownsTemplate, TEMPLATE_ID, TemplateTagBook } from "./template_tags.ts";
import { signUpload, verifyUpload } from "./template_upload.ts";
import {
  askBuild,
  buildNode,
  type BuildRoute,
  buildUnfinished,
  decoded,
  relay,
  reservedBuild,
  statusAnywhere,
} from "./template_builds.ts";
import { buildName, newTemplateId, placeBuild, placedElsewhere } from "./template_placement.ts";
import { updateTemplate } from "./template_update.ts";

/** How many builds the gateway remembers the node of. */
export const KEPT_BUILDS = 1000;

/** The header naming the build an upload came through (`node/faces/e2b_template_routes.ts`). */
const BUILD_HEADER = "x-dormice-template-build";

/** The template routes of one gateway. */
export class GatewayTemplates {
  #parts: GatewayParts;
  #nodeApi: string;
  /** `<template id>/<build id>` → the build, oldest first. */
  #builds = new Map<string, BuildRoute>();
  /** The tags of the team's built templates. */
  #tags: TemplateTagBook;
  /** Team and name → the lookup of its template id, while one runs (a request's life). */
  #naming = new Map<string, Promise<{ templateID: string; node?: string }>>();

  constructor(parts: GatewayParts, nodeApi: string) {
    this.#parts = parts;
    this.#nodeApi = nodeApi;
    this.#tags = new TemplateTagBook(
      parts,
      nodeApi,
      (name, headers, signal) => this.#find(name, headers, signal),
      (found, headers, signal) => ownsTemplate(parts, nodeApi, found, headers, signal),
    );
  }

  /**
   * The upload of a file context (`PUT …/files/{hash}/upload/{token}`), which carries no key:
   * the token stands for it. It is signed under a secret derived from the fleet token and names
   * the build's node, team and file hash, so any gateway of the fleet, restarted or not, checks
   * it without asking anyone, and a request with a bad token reaches no node. The node refuses
   * it once the build's steps arrived. Undefined for any other request.
   */
  async upload(c: Context, rest: string): Promise<Response | undefined> {
    const m = /^\/templates\/([^/]+)\/files\/([^/]+)\/upload\/([^/]+)$/.exec(rest);
    if (!m || c.req.method !== "PUT") return undefined;
    const [, templateId, hash, token] = m;
    const grant = verifyUpload(
      this.#parts.accessTokens,
      templateId,
      token,
      this.#parts.fleet.now(),
    );
    if (grant === "expired") {
      throw new HttpError(
        403,
        "This upload URL expired (an upload URL is good for an hour after it was issued): ask " +
          `for a new one with GET /templates/${templateId.slice(0, 40)}/files/{hash}`,
      );
    }
    if (!grant) {
      throw new HttpError(
        403,
        "This upload URL is not valid (its token was not issued for this template by this " +
          `fleet): ask for a new one with GET /templates/${templateId.slice(0, 40)}/files/{hash}`,
      );
    }
    if (grant.hash !== hash) {
      throw new HttpError(
        400,
        `This upload URL was issued for files hash '${grant.hash}', not '${hash.slice(0, 80)}': ` +
          `ask for the URL of '${hash.slice(0, 80)}' with GET /templates/${templateId}/files/` +
          hash.slice(0, 80),
      );
    }
    const node = buildNode(this.#parts, grant.node);
    let res: Response;
    try {
      res = await fetch(
        `${node.endpoint}${this.#nodeApi}/templates/${templateId}/files/${hash}`,
        {
          method: "PUT",
          body: c.req.raw.body,
          headers: {
            ...this.#parts.routing.nodeHeadersFor(grant.team),
            [TEAM_HEADER]: grant.team,
            [BUILD_HEADER]: grant.build,
          },
          signal: c.req.raw.signal,
          // @ts-ignore: Deno's fetch streams a request body with duplex "half".
          duplex: "half",
        },
      );
    } catch (error) {
      throw new HttpError(
        502,
        `Node '${node.id}', which builds this template, did not take the upload: ${
          error instanceof Error ? error.message : error
        }`,
      );
    }
    return relay(res);
  }

  /** The template routes; undefined for a request that is none of them. */
  async handle(
    c: Context,
    rest: string,
    caller: Caller,
    nodeHeaders: Record<string, string>,
  ): Promise<Response | undefined> {
    const method = c.req.method;
    const team = teamOf(caller);
    const headers = { ...nodeHeaders, [TEAM_HEADER]: team };
    const signal = c.req.raw.signal;
    if ((rest === "/v3/templates" || rest === "/v2/templates") && method === "POST") {
      return await this.#request(c, team, headers);
    }
    if (rest === "/templates" && method === "GET") {
      return await listTemplates(
        this.#parts,
        this.#nodeApi,
        (id) => this.#latest(id)?.buildId,
        headers,
        signal,
      );
    }
    let m = /^\/templates\/aliases\/([^/]+)$/.exec(rest);
    if (m && method === "GET") return await this.#alias(decoded(m[1]), headers, signal);
    m = /^\/templates\/([^/]+)\/files\/([^/]+)$/.exec(rest);
    if (m && method === "GET") {
      const build = await this.#own(m[1], team, undefined, headers, signal);
      const answer = await askBuild(
        this.#parts,
        this.#nodeApi,
        build,
        `/templates/${build.templateId}/files/${m[2]}`,
        {
          method: "GET",
          headers,
          signal,
        },
      );
      if (answer.status !== 200) return relay(answer);
      const { present } = await answer.json() as { present: boolean };
      const url = new URL(c.req.url);
      // Behind a proxy that ends TLS, the SDK must upload over https as it called.
      const proto = c.req.header("x-forwarded-proto")?.split(",")[0].trim();
      if (proto === "https" || proto === "http") url.protocol = `${proto}:`;
      const prefix = url.pathname.slice(0, url.pathname.length - rest.length);
      const token = signUpload(this.#parts.accessTokens, build.templateId, {
        node: build.node,
        build: build.buildId,
        team,
        hash: decoded(m[2]),
      }, this.#parts.fleet.now());
      return Response.json({
        present,
        url: `${url.origin}${prefix}/templates/${build.templateId}/files/${m[2]}/upload/${token}`,
      });
    }
    m = /^\/v2\/templates\/([^/]+)\/builds\/([^/]+)$/.exec(rest);
    if (m && method === "POST") {
      const build = await this.#own(m[1], team, m[2], headers, signal);
      const { value } = await readJsonObject(c.req.raw, {
        ...this.#parts.jsonBodyCap,
        empty: "refuse",
        example: '{"fromTemplate":"base","steps":[]}',
      });
      if (typeof value.fromTemplate === "string") {
        await this.#followBase(build, value.fromTemplate, value.steps, headers, signal);
      }
      build.started = true;
      return relay(
        await askBuild(
          this.#parts,
          this.#nodeApi,
          build,
          `/v2/templates/${build.templateId}/builds/${build.buildId}`,
          {
            method: "POST",
            headers: { ...headers, "content-type": "application/json" },
            body: JSON.stringify({ ...value, ...build.limits, name: build.name }),
            signal,
          },
        ),
      );
    }
    m = /^\/templates\/([^/]+)\/builds\/([^/]+)\/status$/.exec(rest);
    if (m && method === "GET") {
      const known = this.#builds.get(`${decoded(m[1])}/${decoded(m[2])}`);
      if (!known && TEMPLATE_ID.test(decoded(m[1]))) {
        // Accepted by another gateway, or by this one before it restarted: the node that
        // builds it answers (each checks the team).
        return await statusAnywhere(
          this.#parts,
          this.#nodeApi,
          c,
          decoded(m[1]),
          decoded(m[2]),
          headers,
          signal,
        );
      }
      const build = await this.#own(m[1], team, m[2], headers, signal);
      const search = new URL(c.req.url).search;
      return relay(
        await askBuild(
          this.#parts,
          this.#nodeApi,
          build,
          `/templates/${build.templateId}/builds/${build.buildId}/status${search}`,
          { method: "GET", headers, signal },
        ),
      );
    }
    m = /^\/templates\/([^/]+)\/tags$/.exec(rest);
    if (m && method === "GET") {
      const found = await this.#find(decoded(m[1]), headers, signal);
      if (!found) throw notFound(decoded(m[1]));
      return Response.json(await this.#tags.of(found, headers, signal));
    }
    m = /^(?:\/v2)?\/templates\/([^/]+)$/.exec(rest);
    if (m && method === "PATCH") {
      return await updateTemplate(this.#parts, this.#nodeApi, c, decoded(m[1]), team, headers);
    }
    if (rest === "/templates/tags" && method === "POST") {
      return await this.#tags.assign(c, headers);
    }
    if (rest === "/templates/tags" && method === "DELETE") {
      return await this.#tags.remove(c, headers);
    }
    return undefined;
  }

  /**
   * A build from another template of the team must run where that one is held. Until images
   * move between nodes, the build follows it there when it uploaded no files (they sit on the
   * node first chosen); with files, it is a 409 saying so.
   */
  async #followBase(
    build: BuildRoute,
    base: string,
    steps: unknown,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<void> {
    const found = await this.#find(base, headers, signal);
    if (!found?.node || found.node === build.node) return;
    const copies = Array.isArray(steps) &&
      steps.some((s) => (s as { type?: unknown } | null)?.type === "COPY");
    if (copies) {
      throw new HttpError(
        409,
        `Template '${base}' is held by node '${found.node}', and this build's files were ` +
          `uploaded to node '${build.node}': build again (the build then starts on '${found.node}')`,
      );
    }
    const pick = this.#parts.placer.pick({
      snapshot: found.templateID,
      snapshotHolders: [found.node],
    });
    if (!pick.ok) {
      throw new HttpError(503, `Template '${base}' cannot be built on now: ${pick.message}`, {
        headers: { "retry-after": String(pick.retryAfterSeconds) },
      });
    }
    // The node first chosen keeps the build's reservation: told it moved, it spends the upload
    // URL it was issued for (a failure to tell leaves the URL open there, files nobody uses).
    const first = build.node;
    build.node = pick.node.id;
    await askBuild(
      this.#parts,
      this.#nodeApi,
      { ...build, node: first },
      `/templates/${build.templateId}/builds/${build.buildId}`,
      {
        method: "DELETE",
        headers,
        signal,
      },
    ).then((res) => res.body?.cancel()).catch((error) =>
      this.#parts.log("warn", "a moved build's first node was not told", {
        template: build.templateId,
        nodeId: first,
        error,
      })
    );
  }

  /**
   * The template id `DELETE /templates/{nameOrId}` deletes: an id as it is, a name the team's
   * built template by it (E2B takes either); a name of none as it is (the delete says why).
   */
  async idOf(
    nameOrId: string,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<string> {
    if (TEMPLATE_ID.test(nameOrId)) return nameOrId;
    const found = await this.#find(nameOrId, headers, signal);
    return found?.node === undefined ? nameOrId : found.templateID;
  }

  /** Forgets the builds of a deleted template (its nodes drop its tags). */
  forget(templateId: string): void {
    for (const [key, b] of this.#builds) if (b.templateId === templateId) this.#builds.delete(key);
  }

  /** A create's `templateID` without its `:tag` (see {@linkcode TemplateTagBook.untagged}). */
  untagged(
    templateID: string,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<string> {
    return this.#tags.untagged(templateID, headers, signal);
  }

  /** The newest build of `templateId` this gateway routed, if any. */
  #latest(templateId: string): BuildRoute | undefined {
    return [...this.#builds.values()].findLast((b) => b.templateId === templateId);
  }

  async #request(c: Context, team: string, headers: Record<string, string>): Promise<Response> {
    const { value: body } = await readJsonObject(c.req.raw, {
      ...this.#parts.jsonBodyCap,
      empty: "refuse",
      example: '{"name":"my-template"}',
    });
    const { name, tags } = buildName(body);
    // One name is one template: requests for a name run one at a time in its template slot
    // (etcd in shared mode, memory with one gateway), so a build of it still running (not yet
    // listed by the nodes) and a request for it arriving meanwhile, through any gateway, keep
    // one id: the first placed records it (this gateway's builds, and etcd's `t/<team>/<name>`).
    const scoped = `${team}/${name}`;
    return await this.#parts.routing.slots.run(
      `@template/${scoped}`,
      (hold) => this.#reserve(c, team, name, tags, body, headers, hold),
      c.req.raw.signal,
    );
  }

  /** A build's request, in its name's template slot: its id, its node and its reservation. */
  async #reserve(
    c: Context,
    team: string,
    name: string,
    tags: string[],
    body: Record<string, unknown>,
    headers: Record<string, string>,
    hold: SlotHold | undefined,
  ): Promise<Response> {
    const signal = c.req.raw.signal;
    if (signal.aborted) throw new HttpError(499, "The client closed the request");
    const scoped = `${team}/${name}`;
    const naming = `${team}\n${name}`;
    let lookup = this.#naming.get(naming);
    if (!lookup) {
      lookup = this.#find(name, headers, signal).then(async (found) => {
        const pending = [...this.#builds.values()].findLast((b) =>
          b.team === team && b.name === name
        );
        if (found) return found;
        if (
          pending &&
          (!pending.started ||
            await buildUnfinished(this.#parts, this.#nodeApi, pending, headers, signal))
        ) {
          return { templateID: pending.templateId, node: pending.node };
        }
        const placed = await placedElsewhere(this.#parts, scoped);
        return placed
          ? { templateID: placed.templateId, node: placed.node }
          : { templateID: newTemplateId() };
      });
      this.#naming.set(naming, lookup);
      lookup.finally(() => this.#naming.delete(naming)).catch(() => {});
    }
    const existing: { templateID: string; node?: string } = await lookup;
    if (!TEMPLATE_ID.test(existing.templateID)) {
      throw new HttpError(
        409,
        `'${name}' is a template of the fleet (DORMICE_TEMPLATES): choose another name`,
      );
    }
    const node = placeBuild(this.#parts, existing.templateID, existing.node);
    const route: BuildRoute = {
      templateId: existing.templateID,
      buildId: crypto.randomUUID(),
      node: node.id,
      team,
      name,
      started: false,
      limits: {
        ...(typeof body.cpuCount === "number" ? { cpuCount: body.cpuCount } : {}),
        ...(typeof body.memoryMB === "number" ? { memoryMB: body.memoryMB } : {}),
      },
      createdAt: this.#parts.fleet.now(),
    };
    const routeTags = tags.length > 0 ? tags : ["default"];
    // A rebuild placed on another node than the one keeping the template's tags carries them.
    const held = existing.node === undefined
      ? undefined
      : await this.#tags.record(route.templateId, headers, signal, existing.node);
    if (this.#parts.templateNames !== undefined) {
      // Still this request's slot (a 503 when its lease lapsed): then every gateway's next
      // request for the name finds this id before the build is advertised.
      await hold?.check();
      await this.#parts.templateNames.record(scoped, route.templateId, route.node).catch(
        (error) => {
          throw new HttpError(
            503,
            `Cannot record the build of template '${name}' in etcd (${
              error instanceof Error ? error.message : error
            }): nothing was built; retry shortly`,
            { headers: { "retry-after": "2" } },
          );
        },
      );
    }
    const reserved = await askBuild(
      this.#parts,
      this.#nodeApi,
      route,
      `/templates/${route.templateId}/builds/${route.buildId}`,
      {
        method: "PUT",
        headers: { ...headers, "content-type": "application/json" },
        body: JSON.stringify({
          name,
          tags: routeTags,
          ...route.limits,
          ...(held && held.node !== route.node ? { carry: held.record.tags } : {}),
        }),
        signal,
      },
    );
    if (!reserved.ok) return relay(reserved);
    await reserved.body?.cancel();
    this.#remember(route);
    this.#parts.log("info", "template build placed", {
      template: route.templateId,
      name,
      team,
      nodeId: node.id,
    });
    return Response.json({
      templateID: route.templateId,
      buildID: route.buildId,
      public: false,
      names: [name],
      aliases: [name],
      tags: routeTags,
    }, { status: 202 });
  }

  /** The team's template (built, or a fleet template) by name or id, or undefined. */
  #find(
    nameOrId: string,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<FoundTemplate | undefined> {
    return findTemplate(this.#parts, this.#nodeApi, nameOrId, headers, signal);
  }

  async #alias(
    alias: string,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<Response> {
    const found = await this.#find(alias, headers, signal);
    if (!found) throw notFound(alias);
    return Response.json({ templateID: found.templateID, public: found.public });
  }

  /** Remembers where a build was placed, at most {@linkcode KEPT_BUILDS}, oldest first. */
  #remember(route: BuildRoute): void {
    const key = `${route.templateId}/${route.buildId}`;
    this.#builds.delete(key);
    this.#builds.set(key, route);
    while (this.#builds.size > KEPT_BUILDS) {
      this.#builds.delete(this.#builds.keys().next().value!);
    }
  }

  /**
   * The build of `templateId` for `team` (and of `buildId`, when given): as this gateway placed
   * it, else as the node it was placed on keeps it (another gateway accepted it, or this one
   * before a restart; the nodes that may hold it are asked, then the rest, for the caller's
   * team only: {@linkcode holdersFirst}); a 404 otherwise.
   */
  async #own(
    templateId: string,
    team: string,
    buildId: string | undefined,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<BuildRoute> {
    const id = decoded(templateId);
    const known = buildId === undefined
      ? [...this.#builds.values()].findLast((b) =>
        b.templateId === id && b.team === team && !b.started
      )
      : this.#builds.get(`${id}/${decoded(buildId)}`);
    if (known && known.team === team) return known;
    const notHere = new HttpError(
      404,
      `Template build '${templateId}${buildId ? `/${buildId}` : ""}' not found: request a ` +
        "build with POST /v3/templates first",
    );
    if (!TEMPLATE_ID.test(id)) throw notHere;
    const build = buildId === undefined ? undefined : decoded(buildId);
    const route = await reservedBuild(this.#parts, this.#nodeApi, id, team, build, {
      headers,
      signal,
    });
    if (!route) throw notHere;
    this.#remember(route);
    return route;
  }
}
