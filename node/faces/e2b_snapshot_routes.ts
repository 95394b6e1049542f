/**
 * The E2B routes of snapshots: take, list, delete, and fork (a snapshot and sandboxes from it).
 *
 * @module
 */
import type { Hono } from "hono";
import { TEMPLATE_DELETE_NOT_BUILT } from "../../shared/e2b_unbuilt.ts";
import {
  pageSnapshots,
  parseSnapshotQuery,
  SNAPSHOT_ID_HEADER,
  snapshotCursor,
  snapshotRow,
} from "../../shared/snapshots.ts";
import { HttpError } from "../../shared/http_error.ts";
import { encodeListCursor } from "../../shared/list_cursor.ts";
import { cameDirect } from "../../shared/slot_token.ts";
import { executorErrorToHttp, SNAPSHOT_ID_PATTERN } from "../executors/contract.ts";
import { type E2bFace, errorText, parse } from "./e2b_face.ts";

/** How many sandboxes of one fork are built at once (each is an engine create). */
const FORK_CONCURRENCY = 4;

/** Adds the snapshot routes to `app`. */
export function snapshotRoutes(
  app: Hono,
  face: E2bFace,
  tags?: { drop(templateId: string): Promise<void> },
): void {
  app.post("/sandboxes/:id/snapshots", async (c) => {
    const id = c.req.param("id");
    const body = parse(face.schemas.snapshot, await face.readBody(c, "object", `{"name":"ready"}`));
    face.mustGet(c, id);
    const reuse = c.req.header(SNAPSHOT_ID_HEADER);
    if (reuse !== undefined && !SNAPSHOT_ID_PATTERN.test(reuse)) {
      throw new HttpError(400, `${SNAPSHOT_ID_HEADER} '${reuse.slice(0, 40)}' is no snapshot id`);
    }
    // E2B: a name the team has is a new build of that snapshot (the gateway names its id
    // when another node holds it).
    const info = await face.needSnapshots().take(
      face.at(c, id),
      body.name,
      reuse === undefined ? {} : { snapshotId: reuse },
    );
    return c.json(snapshotRow(info), 201);
  });

  app.get("/snapshots", async (c) => {
    const query = parseSnapshotQuery(new URL(c.req.url).searchParams, "node");
    const rows = (await face.needSnapshots().list(face.teamOf(c))).map(snapshotRow);
    const { page, more } = pageSnapshots(rows, query);
    if (more && page.length > 0) {
      c.header("x-next-token", encodeListCursor(snapshotCursor(page[page.length - 1])));
    }
    return c.json(page);
  });

  app.delete("/templates/:id", async (c) => {
    const id = c.req.param("id");
    if (!SNAPSHOT_ID_PATTERN.test(id)) throw new HttpError(501, TEMPLATE_DELETE_NOT_BUILT);
    if (!(await face.needSnapshots().delete(id, face.teamOf(c)))) {
      throw new HttpError(404, `Snapshot '${id}' not found on this node`);
    }
    await tags?.drop(id);
    return c.body(null, 204);
  });

  // E2B's fork: one snapshot of the source's files, `count` new sandboxes from it, each
  // answered or failed on its own; the snapshot is dropped after (its sandboxes keep their
  // files). The source goes on running.
  app.post("/sandboxes/:id/fork", async (c) => {
    const id = c.req.param("id");
    const body = parse(face.schemas.fork, await face.readBody(c, "object", `{"count":1}`));
    const source = face.mustGet(c, id);
    const snapshots = face.needSnapshots();
    const snap = await snapshots.take(face.at(c, id));
    const { name: _name, ...metadata } = source.metadata;
    const timeoutSeconds = body.timeout ?? face.defaultTimeout;
    try {
      const results = await mapBounded(
        Array.from({ length: body.count ?? 1 }, (_, i) => i),
        FORK_CONCURRENCY,
        async () => {
          try {
            const { sandbox } = await face.ops.acquire({
              name: face.randomName(),
              team: source.team,
              template: source.template,
              snapshot: snap.snapshotId,
              metadata,
              env: source.env,
              spec: source.spec,
              deadline: { ms: timeoutSeconds * 1000, action: face.onTimeoutOf(source) },
              e2b: { ...source.e2b, timeoutSeconds },
              direct: cameDirect(c.req.raw.headers),
            });
            return { sandbox: face.created(c, sandbox) };
          } catch (thrown) {
            const error = executorErrorToHttp(thrown);
            if (error instanceof HttpError) {
              return { error: { code: error.status, message: error.message } };
            }
            face.log("error", "a fork failed", { source: id, error });
            return { error: { code: 500, message: `Internal error: ${errorText(error)}` } };
          }
        },
      );
      return c.json(results, 201);
    } finally {
      await snapshots.delete(snap.snapshotId).catch((error) =>
        face.log("warn", "could not drop a fork's snapshot", { snapshot: snap.snapshotId, error })
      );
    }
  });
}

/** `fn` over every item, at most `limit` at once, the answers in the items' order. */
async function mapBounded<T, R>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<R>,
): Promise<R[]> {
  const out: R[] = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i]);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return out;
}
