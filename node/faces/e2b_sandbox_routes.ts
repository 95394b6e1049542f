/**
 * The E2B routes of one sandbox's life: create, connect, resume, timeout, refresh, network,
 * kill and pause.
 *
 * @module
 */
import type { Context, Hono } from "hono";
import { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { cameDirect, slotTokenOf } from "../../shared/slot_token.ts";
import { describeZodError, sandboxNameSchema } from "../../shared/schemas.ts";
import { parseCreateOptions, parseNetworkUpdate } from "./e2b_create_options.ts";
import { type E2bFace, e2bState, parse, volumeSpec } from "./e2b_face.ts";

/** Adds the routes of a sandbox's life to `app`. */
export function sandboxRoutes(app: Hono, face: E2bFace): void {
  const create = async (c: Context) => {
    const raw = await face.readBody(c, "refuse", `{"templateID":"base"}`);
    const body = parse(face.schemas.create, raw);
    const timeoutSeconds = body.timeout ?? face.defaultTimeout;
    const options = parseCreateOptions(raw, timeoutSeconds, {
      defaultEgress: face.defaultEgress,
    });
    let name: string;
    if (body.metadata?.name !== undefined) {
      const r = sandboxNameSchema.safeParse(body.metadata.name);
      if (!r.success) throw new HttpError(400, describeZodError(r.error, "'metadata.name'"));
      name = r.data;
    } else {
      // A gateway names an unnamed create itself (the key of its slot, placement and cache).
      const named = c.req.header("x-dormice-sandbox-name");
      const r = named === undefined ? undefined : sandboxNameSchema.safeParse(named);
      if (r && !r.success) {
        throw new HttpError(400, describeZodError(r.error, "'X-Dormice-Sandbox-Name'"));
      }
      name = r?.data ?? face.randomName();
    }
    const from = await face.snapshotOf(c, body.templateID);
    const result = await face.ops.acquire({
      name,
      team: face.teamOf(c),
      template: body.templateID,
      ...(from ? { template: from.snapshotId, snapshot: from.snapshotId } : {}),
      metadata: body.metadata,
      env: body.envVars,
      spec: body.volumeMounts?.length
        ? {
          ...options.spec,
          ...volumeSpec(body.volumeMounts.map((v) => ({ name: v.name, mountPath: v.path }))),
        }
        : options.spec,
      deadline: { ms: timeoutSeconds * 1000, action: options.onTimeout },
      e2b: options.e2b,
      slotToken: slotTokenOf(c.req.raw.headers),
      direct: cameDirect(c.req.raw.headers),
    });
    return c.json(face.created(c, result.sandbox), 201);
  };
  app.post("/v2/sandboxes", create);
  app.post("/sandboxes", create);

  const connect = async (c: Context) => {
    const id = c.req.param("id")!;
    const body = parse(face.schemas.connect, await face.readBody(c, "object", `{"timeout":300}`));
    face.mustGet(c, id);
    const { resumed, sandbox } = await face.ops.resume(face.at(c, id));
    const now = face.clock.now();
    let current = sandbox;
    // Connect only ever extends the lifetime; a sandbox without a deadline keeps none unless
    // the caller asked for one.
    if (body.timeout !== undefined || sandbox.deadlineAt !== null) {
      const wanted = now + (body.timeout ?? face.defaultTimeout) * 1000;
      if (sandbox.deadlineAt === null || wanted > sandbox.deadlineAt) {
        current = face.ops.setDeadline(face.at(c, id), wanted, face.onTimeoutOf(sandbox));
      }
    }
    return c.json(face.created(c, current), resumed ? 201 : 200);
  };
  app.post("/v2/sandboxes/:id/connect", connect);
  app.post("/sandboxes/:id/connect", connect);

  app.post("/sandboxes/:id/resume", async (c) => {
    const id = c.req.param("id");
    const body = parse(
      z.object({ timeout: face.schemas.timeout.optional(), autoPause: z.boolean().optional() }),
      await face.readBody(c, "object", `{"timeout":300}`),
    );
    const before = face.mustGet(c, id);
    if (e2bState(before.state) === "running") {
      throw new HttpError(409, `Sandbox '${id}' is already running: connect to it instead`);
    }
    const { sandbox } = await face.ops.resume(face.at(c, id));
    const action = body.autoPause === undefined
      ? face.onTimeoutOf(sandbox)
      : body.autoPause
      ? "pause"
      : "kill";
    const after = face.ops.setDeadline(
      face.at(c, id),
      face.clock.now() + (body.timeout ?? face.defaultTimeout) * 1000,
      action,
    );
    return c.json(face.created(c, after), 201);
  });

  app.post("/sandboxes/:id/timeout", async (c) => {
    const id = c.req.param("id");
    const body = parse(
      face.schemas.setTimeout,
      await face.readBody(c, "refuse", `{"timeout":300}`),
    );
    const s = face.mustGet(c, id);
    face.ops.setDeadline(
      face.at(c, id),
      face.clock.now() + body.timeout * 1000,
      face.onTimeoutOf(s),
    );
    return c.body(null, 204);
  });

  // Only ever extends, unlike /timeout (E2B's keep-alive); a sandbox with no deadline keeps none.
  app.post("/sandboxes/:id/refreshes", async (c) => {
    const id = c.req.param("id");
    const body = parse(face.schemas.refresh, await face.readBody(c, "object", `{"duration":60}`));
    const s = face.mustGet(c, id);
    if (e2bState(s.state) === "paused") {
      throw new HttpError(409, `Sandbox '${id}' is paused: connect to it to resume it first`);
    }
    const wanted = face.clock.now() + Math.max(body.duration ?? 15, 15) * 1000;
    if (s.deadlineAt !== null && wanted > s.deadlineAt) {
      face.ops.setDeadline(face.at(c, id), wanted, face.onTimeoutOf(s));
    }
    return c.body(null, 204);
  });

  // E2B's updateNetwork: the address rules replaced whole (an omitted list is cleared).
  app.put("/sandboxes/:id/network", async (c) => {
    const id = c.req.param("id");
    const rules = parseNetworkUpdate(await face.readBody(c, "refuse", `{"allowOut":[]}`));
    face.mustGet(c, id);
    await face.ops.updateEgressRules(face.at(c, id), rules);
    return c.body(null, 204);
  });

  app.delete("/sandboxes/:id", async (c) => {
    const id = c.req.param("id");
    if (!(await face.ops.destroy(face.at(c, id)))) {
      throw new HttpError(404, `Sandbox '${id}' not found on this node`);
    }
    return c.body(null, 204);
  });

  app.post("/sandboxes/:id/pause", async (c) => {
    const id = c.req.param("id");
    const body = parse(face.schemas.pause, await face.readBody(c, "object", `{}`));
    const s = face.mustGet(c, id);
    if (e2bState(s.state) === "paused") {
      throw new HttpError(409, `Sandbox '${id}' is already paused: connect to resume it`);
    }
    // `memory: false` keeps the file system only and frees the rest (E2B's filesystem pause),
    // within the data-disk floor snapshots keep.
    const keepMemory = body.memory !== false;
    if (!keepMemory) await face.snapshots?.checkDisk(s.id, "A pause to disk");
    await face.ops.pause(face.at(c, id), { keepMemory });
    return c.body(null, 204);
  });
}
