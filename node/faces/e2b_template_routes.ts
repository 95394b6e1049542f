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

const buildSchema = z.object({
  name: z.string().regex(SNAPSHOT_NAME_PATTERN, "must be 1 to 64 letters, digits, '.', '_' or '-'"),
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
    await need().putContext(c.req.param("hash"), face.teamOf(c) ?? DEFAULT_TEAM, c.req.raw.body);
    return c.body(null, 201);
  });

  app.post("/v2/templates/:id/builds/:buildID", async (c) => {
    const templateId = c.req.param("id");
    checkId(templateId);
    const body = parse(buildSchema, await face.readBody(c, "refuse", '{"name":"t","steps":[]}'));
    const team = face.teamOf(c) ?? DEFAULT_TEAM;
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
      name: body.name,
      ...(fromTemplate !== undefined ? { fromTemplate } : {}),
      ...(fromSnapshot !== undefined ? { fromSnapshot } : {}),
      ...(body.fromTemplate === undefined && body.fromImage !== undefined
        ? { fromImage: body.fromImage }
        : {}),
      steps: body.steps,
      ...(body.startCmd !== undefined ? { startCmd: body.startCmd } : {}),
      ...(body.readyCmd !== undefined ? { readyCmd: body.readyCmd } : {}),
      force: body.force,
      ...(body.cpuCount !== undefined ? { cpus: body.cpuCount } : {}),
      ...(body.memoryMB !== undefined ? { memoryMB: body.memoryMB } : {}),
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
