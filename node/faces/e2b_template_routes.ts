/**
 * The node's E2B template build routes: file contexts (present? upload), a build's start and
 * its status with log lines. The gateway chose this node for the build and speaks these on the
 * SDK's behalf; the upload URL the SDK is given is the gateway's (see
 * `gateway/faces/e2b/templates.ts`).
 *
 * @module
 */
import type { Context, Hono } from "hono";
import { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { DEFAULT_TEAM } from "../../shared/teams.ts";
import { SNAPSHOT_ID_PATTERN } from "../executors/contract.ts";
import { buildInfo, type TemplateBuilds } from "../templates_build.ts";
import { SNAPSHOT_NAME_PATTERN } from "../snapshots.ts";
import { type E2bFace, parse } from "./e2b_face.ts";

const stepSchema = z.object({
  type: z.string().min(1).max(32),
  args: z.array(z.string().max(65536)).max(256).default([]),
  filesHash: z.string().max(128).optional(),
  force: z.boolean().optional(),
});

const nameSchema = z.string().regex(
  SNAPSHOT_NAME_PATTERN,
  "must be 1 to 64 letters, digits, '.', '_' or '-'",
);
const tagSchema = z.string().regex(
  /^[A-Za-z0-9._-]{1,64}$/,
  "must be 1 to 64 letters, digits, '.', '_' or '-'",
);
const targetSchema = z.object({
  buildID: z.string().min(1).max(128),
  createdAt: z.string().max(64),
});

/** A gateway placing a build here (`POST /v3/templates` reached it). */
const reserveSchema = z.object({
  name: nameSchema,
  tags: z.array(tagSchema).max(17).default([]),
  cpuCount: z.number().int().min(1).max(64).optional(),
  memoryMB: z.number().int().min(128).max(262144).optional(),
  /** The template's tags as the newest record elsewhere holds them (a rebuild moved here). */
  carry: z.record(tagSchema, targetSchema).optional(),
});

/** The build's header on an upload: which build's URL it came through. */
export const BUILD_HEADER = "x-dormice-template-build";

const buildSchema = z.object({
  /** The template's name; the build's reservation names it when absent. */
  name: nameSchema.optional(),
  fromTemplate: z.string().min(1).max(256).optional(),
  fromImage: z.string().min(1).max(512).optional(),
  fromImageRegistry: z.unknown().optional(),
  steps: z.array(stepSchema).max(512).default([]),
  startCmd: z.string().max(65536).optional(),
  readyCmd: z.string().max(65536).optional(),
  force: z.boolean().default(false),
  cpuCount: z.number().int().min(1).max(64).optional(),
  memoryMB: z.number().int().min(128).max(262144).optional(),
});

/** Adds the template build routes to `app`; each answers 501 without `builds`. */
export function templateBuildRoutes(
  app: Hono,
  face: E2bFace,
  builds: TemplateBuilds | undefined,
  templates: () => Promise<string[] | undefined>,
): void {
  const need = (): TemplateBuilds => {
    if (!builds) throw new HttpError(501, "This node builds no templates");
    return builds;
  };
  const checkId = (id: string) => {
    if (!SNAPSHOT_ID_PATTERN.test(id)) {
      throw new HttpError(404, `Template '${id}' not found: its id comes from POST /v3/templates`);
    }
  };

  app.get("/templates/:id/files/:hash", async (c) => {
    checkId(c.req.param("id"));
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    return c.json({ present: await need().hasContext(c.req.param("hash"), team) });
  });

  app.put("/templates/:id/files/:hash", async (c) => {
    checkId(c.req.param("id"));
    const buildId = c.req.header(BUILD_HEADER);
    const refused = buildId === undefined
      ? undefined
      : need().uploadRefusal(c.req.param("id"), buildId, face.teamOf(c) ?? DEFAULT_TEAM);
    if (refused !== undefined) {
      await c.req.raw.body?.cancel();
      throw new HttpError(
        403,
        `This upload URL is not valid (${refused}): ask for a new one with GET /templates/` +
          `${c.req.param("id")}/files/${c.req.param("hash")}`,
      );
    }
    await need().putContext(c.req.param("hash"), face.teamOf(c) ?? DEFAULT_TEAM, c.req.raw.body);
    return c.body(null, 201);
  });

  app.put("/templates/:id/builds/:buildID", async (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const body = parse(reserveSchema, await face.readBody(c, "refuse", '{"name":"t"}'));
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    const buildId = c.req.param("buildID");
    const builds = need();
    builds.reserve({
      templateId,
      buildId,
      team,
      name: body.name,
      ...(body.cpuCount !== undefined ? { cpus: body.cpuCount } : {}),
      ...(body.memoryMB !== undefined ? { memoryMB: body.memoryMB } : {}),
    });
    const createdAt = new Date(builds.now()).toISOString();
    const record = await builds.tags?.update(templateId, (held) => {
      if (held && held.team !== team) {
        throw new HttpError(409, `Template '${templateId}' is another team's`);
      }
      const tags = { ...(body.carry ?? held?.tags ?? {}) };
      for (const tag of body.tags) tags[tag] = { buildID: buildId, createdAt };
      return { team, latest: { buildID: buildId, createdAt }, tags };
    }).catch(tagError);
    return c.json({ templateID: templateId, buildID: buildId, tags: record ?? null }, 201);
  });

  // The build moved to another node (it follows its base there): its upload URL is spent here.
  app.delete("/templates/:id/builds/:buildID", (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    if (!need().spend(templateId, c.req.param("buildID"), face.teamOf(c) ?? DEFAULT_TEAM)) {
      throw new HttpError(404, `No build of template '${templateId}' was placed on this node`);
    }
    return c.body(null, 204);
  });

  app.get("/templates/:id/reservation", (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const found = need().pending(
      templateId,
      face.teamOf(c) ?? DEFAULT_TEAM,
      c.req.query("buildID") || undefined,
    );
    if (!found) {
      throw new HttpError(404, `No build of template '${templateId}' was placed on this node`);
    }
    return c.json({
      buildID: found.buildId,
      name: found.name,
      started: found.started,
      at: found.at,
      ...(found.cpus !== undefined ? { cpuCount: found.cpus } : {}),
      ...(found.memoryMB !== undefined ? { memoryMB: found.memoryMB } : {}),
    });
  });

  app.get("/templates/:id/tags", async (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const held = await need().tags?.get(templateId);
    if (!held || held.team !== (face.teamOf(c) ?? DEFAULT_TEAM)) {
      throw new HttpError(404, `Template '${templateId}' has no tags on this node`);
    }
    return c.json(held);
  });

  app.post("/templates/:id/tags", async (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const body = parse(
      z.object({ tags: z.array(tagSchema).min(1).max(16), target: targetSchema }),
      await face.readBody(c, "refuse", '{"tags":["v1"],"target":{"buildID":"…","createdAt":"…"}}'),
    );
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    const tagsOf = need().tags;
    if (!tagsOf) throw new HttpError(501, "This node keeps no template tags");
    const record = await tagsOf.update(templateId, (held) => {
      if (held && held.team !== team) {
        throw new HttpError(404, `Template '${templateId}' not found on this node`);
      }
      const tags = { ...(held?.tags ?? {}) };
      for (const tag of body.tags) tags[tag] = body.target;
      return { team, ...(held?.latest ? { latest: held.latest } : {}), tags };
    }).catch(tagError);
    return c.json(record, 201);
  });

  app.delete("/templates/:id/tags", async (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const body = parse(
      z.object({ tags: z.array(tagSchema).min(1).max(16) }),
      await face.readBody(c, "refuse", '{"tags":["v1"]}'),
    );
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    const tagsOf = need().tags;
    if (!tagsOf) throw new HttpError(501, "This node keeps no template tags");
    const record = await tagsOf.update(templateId, (held) => {
      if (!held || held.team !== team) {
        throw new HttpError(404, `Template '${templateId}' has no tags on this node`);
      }
      const missing = body.tags.find((t) => !(t in held.tags));
      if (missing !== undefined) {
        throw new HttpError(404, `Tag '${missing}' of template '${templateId}' not found`);
      }
      const tags = { ...held.tags };
      for (const t of body.tags) delete tags[t];
      return { ...held, tags };
    }).catch(tagError);
    return c.json(record);
  });

  app.post("/v2/templates/:id/builds/:buildID", async (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const body = parse(buildSchema, await face.readBody(c, "refuse", '{"name":"t","steps":[]}'));
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    const reserved = need().pending(templateId, team, c.req.param("buildID"));
    const name = body.name ?? reserved?.name;
    if (name === undefined) {
      throw new HttpError(
        404,
        `Build '${c.req.param("buildID")}' of template '${templateId}' was not placed on this ` +
          "node: request a build with POST /v3/templates first",
      );
    }
    const cpus = body.cpuCount ?? reserved?.cpus;
    const memoryMB = body.memoryMB ?? reserved?.memoryMB;
    let fromTemplate = body.fromTemplate;
    let fromSnapshot: string | undefined;
    if (fromTemplate !== undefined && !(await templates())?.includes(fromTemplate)) {
      const snap = await face.snapshots?.find(fromTemplate, team);
      if (!snap) {
        throw new HttpError(
          400,
          `fromTemplate('${fromTemplate}') names no template of this node nor one your team ` +
            `built: use one of ${
              (await templates())?.join(", ")
            }, or build '${fromTemplate}' first`,
        );
      }
      fromSnapshot = snap.snapshotId;
      fromTemplate = undefined;
    }
    const record = need().start({
      templateId,
      buildId: c.req.param("buildID"),
      team,
      name,
      ...(fromTemplate !== undefined ? { fromTemplate } : {}),
      ...(fromSnapshot !== undefined ? { fromSnapshot, fromSnapshotName: body.fromTemplate } : {}),
      ...(body.fromTemplate === undefined && body.fromImage !== undefined
        ? { fromImage: body.fromImage }
        : {}),
      steps: body.steps,
      ...(body.startCmd !== undefined ? { startCmd: body.startCmd } : {}),
      ...(body.readyCmd !== undefined ? { readyCmd: body.readyCmd } : {}),
      force: body.force,
      ...(cpus !== undefined ? { cpus } : {}),
      ...(memoryMB !== undefined ? { memoryMB } : {}),
    });
    return c.json({ templateID: templateId, buildID: record.spec.buildId }, 202);
  });

  const update = async (c: Context) => {
    const templateId = c.req.param("id")!;
    checkId(templateId);
    const body = parse(
      z.object({ public: z.boolean().optional() }),
      await face.readBody(c, "refuse", '{"public":true}'),
    );
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    if (body.public !== undefined && !(await need().setPublic(templateId, team, body.public))) {
      throw new HttpError(404, `Template '${templateId}' not found on this node`);
    }
    const held = (await face.snapshots?.list(team))?.find((s) => s.snapshotId === templateId);
    if (!held || held.team !== team) {
      throw new HttpError(404, `Template '${templateId}' not found on this node`);
    }
    return c.json({ names: held.name ? [held.name] : [] });
  };
  app.patch("/v2/templates/:id", update);
  app.patch("/templates/:id", update);

  app.get("/templates/:id/builds/:buildID/status", (c) => {
    const raw = c.req.query("logsOffset") ?? "0";
    const offset = Number(raw);
    if (!Number.isInteger(offset) || offset < 0) {
      throw new HttpError(400, `'logsOffset' must be a whole number of lines: received '${raw}'`);
    }
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
    const record = need().get(c.req.param("id"), c.req.param("buildID"), team);
    return c.json(buildInfo(record, offset));
  });
}

/** A tag store's refusal (too many tags) as a 400; an `HttpError` passes. */
function tagError(error: unknown): never {
  if (error instanceof RangeError) throw new HttpError(400, error.message);
  throw error;
}
