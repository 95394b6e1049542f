/**
 * The E2B routes that read sandboxes: one, the lists (v1 and v2's pages), the newest metrics of
 * many and one's metrics over a range.
 *
 * @module
 */
import type { Hono } from "hono";
import {
  compareListCursors,
  decodeListCursor,
  encodeListCursor,
} from "../../shared/list_cursor.ts";
import { HttpError } from "../../shared/http_error.ts";
import { jsonArrayResponse } from "../../shared/json_stream.ts";
import { parseSandboxIds } from "../../shared/e2b_metrics_ids.ts";
import { type E2bMetric, e2bMetric, parseMetricsRange } from "./e2b_metrics.ts";
import { type E2bFace, e2bState } from "./e2b_face.ts";

/** The header of a v2 list counting the running sandboxes its filters match, before paging. */
const TOTAL_RUNNING_HEADER = "x-total-running";

/** Adds the routes that read sandboxes to `app`. */
export function listRoutes(app: Hono, face: E2bFace): void {
  // Before /sandboxes/:id, which would take "metrics" for an id. The newest sample of each id
  // this node holds for the caller; others are left out (a gateway merges every node's).
  app.get("/sandboxes/metrics", async (c) => {
    const sandboxes: Record<string, E2bMetric> = {};
    for (const id of parseSandboxIds(c.req.queries("sandbox_ids"))) {
      if (!face.ops.get(face.at(c, id))) continue;
      const samples = await face.ops.metricsHistory(face.at(c, id)).catch((error) => {
        // Destroyed since the line above: as absent as one never here.
        if (error instanceof HttpError && error.status === 404) return [];
        throw error;
      });
      const latest = samples.at(-1);
      if (latest) sandboxes[id] = e2bMetric(latest);
    }
    return c.json({ sandboxes });
  });

  app.get("/sandboxes/:id", (c) => c.json(face.detail(face.mustGet(c, c.req.param("id")))));

  app.get("/sandboxes", async (c) => {
    const metadata = parseMetadataQuery(c.req.query("metadata"));
    const rows = await face.ops.listInSlices({
      metadata,
      team: face.teamOf(c),
      states: ["active", "restoring"],
    });
    return jsonArrayResponse(rows.map((s) => face.listed(s)));
  });

  app.get("/v2/sandboxes", async (c) => {
    const metadata = parseMetadataQuery(c.req.query("metadata"));
    const states = parseStates(c.req.queries("state"));
    const order = c.req.query("order") ?? "desc";
    if (order !== "asc" && order !== "desc") {
      throw new HttpError(400, `'order' must be asc or desc: received '${order.slice(0, 20)}'`);
    }
    const limitRaw = c.req.query("limit");
    const limit = limitRaw === undefined ? 100 : Number(limitRaw);
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) {
      throw new HttpError(
        400,
        `'limit' must be a whole number from 1 to 1000: received '${limitRaw}'`,
      );
    }
    const startedAfterRaw = c.req.query("startedAfter");
    const startedAfter = startedAfterRaw === undefined ? undefined : Date.parse(startedAfterRaw);
    if (startedAfter !== undefined && Number.isNaN(startedAfter)) {
      throw new HttpError(400, `'startedAfter' must be an RFC 3339 date-time`);
    }
    const template = c.req.query("template");
    const sign = order === "asc" ? 1 : -1;
    let rows = (await face.ops.listInSlices({ metadata, team: face.teamOf(c) }))
      .filter((s) => states.has(e2bState(s.state)))
      .filter((s) => startedAfter === undefined || Date.parse(s.createdAt) >= startedAfter)
      .filter((s) => !template || s.template === template)
      .sort((a, b) => sign * compareListCursors(a, b));
    // E2B's count of the running rows the filters match, before paging (and before the
    // cursor: the same on every page), given only when running ones were asked for.
    if (states.has("running")) {
      c.header(
        TOTAL_RUNNING_HEADER,
        String(rows.filter((s) => e2bState(s.state) === "running").length),
      );
    }
    const nextToken = c.req.query("nextToken");
    if (nextToken) {
      const cursor = decodeListCursor(nextToken, "node");
      rows = rows.filter((s) => sign * compareListCursors(s, cursor) > 0);
    }
    const page = rows.slice(0, limit);
    if (rows.length > limit) {
      const last = page[page.length - 1];
      c.header("x-next-token", encodeListCursor(last));
    }
    return c.json(page.map((s) => face.listed(s)));
  });

  // The samples of the range, from the node's history (a paused sandbox keeps what it did
  // while running, and reading never wakes it).
  app.get("/sandboxes/:id/metrics", async (c) => {
    const { fromMs, toMs } = parseMetricsRange(c.req.query("start"), c.req.query("end"));
    const s = face.mustGet(c, c.req.param("id"));
    return c.json((await face.ops.metricsHistory(face.at(c, s.id), fromMs, toMs)).map(e2bMetric));
  });
}

/**
 * Parses E2B's `metadata` filter: a query string (`k=v&k2=v2`) whose keys and values are
 * URL-encoded once more, so each is decoded again after the query string is parsed.
 *
 * @example
 * ```ts
 * import { parseMetadataQuery } from "./e2b_list_routes.ts";
 * parseMetadataQuery("team=a%2Bb"); // { team: "a+b" }
 * ```
 */
export function parseMetadataQuery(raw: string | undefined): Record<string, string> | undefined {
  if (raw === undefined || raw === "") return undefined;
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(raw)) {
    try {
      out[decodeURIComponent(k)] = decodeURIComponent(v);
    } catch {
      throw new HttpError(400, `'metadata' has a badly encoded pair '${k.slice(0, 40)}'`);
    }
  }
  return out;
}

/** The E2B states a v2 list asks for (`state`, repeated or comma-separated); both when none. */
function parseStates(raw: string[] | undefined): Set<"running" | "paused"> {
  const values = (raw ?? []).flatMap((r) => r.split(",")).map((s) => s.trim()).filter(Boolean);
  if (values.length === 0) return new Set(["running", "paused"]);
  const out = new Set<"running" | "paused">();
  for (const v of values) {
    if (v !== "running" && v !== "paused") {
      throw new HttpError(400, `'state' must be running or paused: received '${v.slice(0, 20)}'`);
    }
    out.add(v);
  }
  return out;
}
