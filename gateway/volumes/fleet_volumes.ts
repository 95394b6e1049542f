/**
 * The fleet's volumes as the gateway serves them: the E2B routes (`POST/GET /volumes`,
 * `GET/DELETE /volumes/{id}`), the content API forwarded to the volume's node
 * (`/volumecontent/{id}/…`), the mounts of an E2B create turned into the volumes' ids and the
 * node that must take the create, and the operator's move (`move.ts`).
 *
 * Rules: a volume is its team's (another team's is a 404 as if absent; the operator reaches
 * all); a node that is down makes its volumes' mounts and content a 503 naming it (unless the
 * volume is on a shared root, which every node serves); a volume being created, moved or
 * deleted refuses mounts with a 409 saying so; a delete or a move while a sandbox mounts it (or
 * a create that mounts it is in flight) is a 409 naming them.
 *
 * @module
 */
import type { Context } from "hono";
import { HttpError } from "../../shared/http_error.ts";
import { readJsonObject } from "../../shared/json_body.ts";
import { newVolumeId, VOLUME_ID } from "../../shared/volumes.ts";
import { tokenMatcher } from "../../shared/token.ts";
import type { BodyCapOptions } from "../../shared/json_body.ts";
import type { Log } from "../../shared/log.ts";
import type { Fleet } from "../fleet/fleet.ts";
import type { FleetNode } from "../fleet/node.ts";
import type { GatewayRouting } from "../routing/routing.ts";
import { capture, forward } from "../routing/forward.ts";
import { type VolumeRow, type VolumeStore, volumeToken } from "./table.ts";
import { VolumeReconciler } from "./reconcile.ts";

/** E2B's rule for a volume name, with a length cap of our own. */
const VOLUME_NAME = /^[a-zA-Z0-9_-]{1,64}$/;

/** How long a node call about a volume (create, delete, users) may take. */
const NODE_CALL_TIMEOUT_MS = 30_000;

/** How many nodes one create asks when each answers that it has no room now (503). */
const CREATE_TRIES = 3;

/** How long one create may take across the nodes it asks. */
const CREATE_BUDGET_MS = 60_000;

/**
 * What the volumes use of the gateway's parts (`faces/parts.ts`): named here so this file does not
 * import the parts, which hold a `FleetVolumes` themselves.
 */
export interface VolumeParts {
  /** The nodes that checked in: where a volume lives and whether that node is up. */
  fleet: Fleet;
  /** The node headers, the node fetch and the fan-out the volume calls go through. */
  routing: GatewayRouting;
  /** The cap every JSON body is read under. */
  jsonBodyCap: BodyCapOptions;
  /** The gateway's log. */
  log: Log;
}

/** The gateway's side of managed volumes over one database and one fleet token. */
export class FleetVolumes {
  /** The table of who owns each volume and where it lives. */
  readonly table: VolumeStore;
  readonly #parts: VolumeParts;
  readonly #token: string;
  /** Creates in flight that mount a volume, by id: a delete or move waits for none. */
  readonly #mounting = new Map<string, number>();

  /** Finds and drops stale copies of volumes (`reconcile.ts`); the gateway's sweep ticks it. */
  readonly reconciler: VolumeReconciler;

  constructor(parts: VolumeParts, table: VolumeStore) {
    this.#parts = parts;
    this.table = table;
    this.reconciler = new VolumeReconciler(this, parts.fleet, parts.log);
    this.#token = parts.routing.nodeHeaders.authorization.slice("Bearer ".length);
  }

  /** The content token of a volume (see `table.ts`). */
  token(id: string): Promise<string> {
    return volumeToken(this.#token, id);
  }

  /** A node call whose whole answer is read. */
  async call(
    node: FleetNode,
    path: string,
    body: unknown,
    signal?: AbortSignal,
  ): Promise<{ status: number; text: string; json: Record<string, unknown> }> {
    const answer = await capture({ nodeId: node.id, endpoint: node.endpoint }, path, {
      method: "POST",
      headers: this.#parts.routing.nodeHeaders,
      body: JSON.stringify(body),
      fetch: this.#parts.routing.nodeFetch,
      timeoutMs: NODE_CALL_TIMEOUT_MS,
      signal,
    });
    let json: Record<string, unknown> = {};
    try {
      json = answer.text === "" ? {} : JSON.parse(answer.text);
    } catch { /* a node answer that is not JSON: its text is the message */ }
    return { status: answer.status, text: answer.text, json };
  }

  /**
   * The node a volume's requests go to: its own, up; on a shared root any up node when its own
   * is down.
   *
   * @throws {HttpError} 503 naming the node when it is down (and no other serves the volume).
   */
  nodeFor(row: VolumeRow): FleetNode {
    const fleet = this.#parts.fleet;
    const own = fleet.get(row.node);
    if (own !== undefined && !fleet.isDown(own)) return own;
    if (row.shared) {
      const other = [...fleet.nodes()].find((n) => !fleet.isDown(n) && n.volumes.includes(row.id));
      if (other !== undefined) return other;
    }
    throw new HttpError(
      503,
      `Volume '${row.name}' (${row.id}) lives on node '${row.node}', which is down: retry once ` +
        "it checks in again (its files are on that node's disk; nothing is served from elsewhere)",
      { headers: { "retry-after": "5" } },
    );
  }

  /** The row for a caller: its team's only, the operator's any. 404 otherwise. */
  async require(id: string, team: string | undefined): Promise<VolumeRow> {
    const row = VOLUME_ID.test(id) ? await this.table.get(id, team) : undefined;
    if (row === undefined) {
      throw new HttpError(404, `Volume '${id}' not found: GET /volumes lists your team's volumes`);
    }
    return row;
  }

  /** `POST /volumes {name}`: reserved in the table, placed on a node by disk, made there. */
  async create(c: Context, team: string): Promise<Response> {
    const { value } = await readJsonObject(c.req.raw, {
      ...this.#parts.jsonBodyCap,
      empty: "refuse",
      example: '{"name":"data"}',
    });
    const name = value.name;
    if (typeof name !== "string" || !VOLUME_NAME.test(name)) {
      throw new HttpError(
        400,
        "'name' must be 1–64 letters, digits, '_' or '-' (E2B's rule), such as \"data\"",
      );
    }
    const candidates = this.#candidates();
    const id = newVolumeId();
    await this.table.reserve({ id, team, name, node: candidates[0].id });
    // Bounded: at most CREATE_TRIES nodes, within CREATE_BUDGET_MS and the request's own life.
    const signal = AbortSignal.any([c.req.raw.signal, AbortSignal.timeout(CREATE_BUDGET_MS)]);
    const refused: string[] = [];
    try {
      for (const [i, node] of candidates.slice(0, CREATE_TRIES).entries()) {
        if (i > 0) await this.table.update(id, { node: node.id });
        const made = await this.call(node, "/createVolume", { id }, signal);
        if (made.status === 201) {
          await this.table.update(id, {
            state: "ready",
            shared: made.json.shared === true,
            sizeBytes: Number(made.json.sizeBytes ?? 0),
          });
          return c.json({ volumeID: id, name, token: await this.token(id) }, 201);
        }
        const said = String(made.json.message ?? made.text).slice(0, 300);
        // A node's 503 (no loop device free for the volume's image) says it lacks room now and
        // made nothing: the next node placement allows is asked. Anything else is answered at
        // once (a node that failed otherwise may have made part of it).
        if (made.status === 503) {
          refused.push(`node '${node.id}': ${said}`);
          continue;
        }
        throw new HttpError(
          made.status >= 500 ? 502 : made.status,
          `Node '${node.id}' could not create volume '${name}': ${said}`,
        );
      }
      throw new HttpError(
        503,
        `No node could create volume '${name}' now (${
          refused.join("; ")
        }): delete volumes, raise the loop module's max_loop, or add a node, then retry`,
        { headers: { "retry-after": "30" } },
      );
    } catch (error) {
      await this.table.delete(id);
      throw error;
    }
  }

  /** `GET /volumes`: the caller's team's volumes (every team's for the operator). */
  async list(c: Context, team: string | undefined): Promise<Response> {
    return c.json(
      (await this.table.list(team)).filter((r) => r.state !== "creating").map((r) => ({
        volumeID: r.id,
        name: r.name,
      })),
    );
  }

  /** `GET /volumes/{id}`. */
  async info(c: Context, id: string, team: string | undefined): Promise<Response> {
    const row = await this.require(id, team);
    return c.json({ volumeID: row.id, name: row.name, token: await this.token(row.id) });
  }

  /**
   * `DELETE /volumes/{id}`: refused while a sandbox mounts it (the node names them; on a shared
   * root every up node is asked), then deleted on its node and from the table.
   */
  async destroy(id: string, team: string | undefined, signal: AbortSignal): Promise<Response> {
    const row = await this.require(id, team);
    if (!row.shared && this.#parts.fleet.get(row.node) === undefined && row.state === "ready") {
      // Its node was removed from the fleet (removeNode): the files went with it.
      const claim = await this.table.claim(row.id, "deleting");
      if (claim === undefined) throw await this.claimLost(row, "delete");
      await this.table.remove(claim);
      this.#parts.log("warn", "a volume whose node left the fleet was deleted from the table", {
        volume: row.id,
        nodeId: row.node,
      });
      return new Response(null, { status: 204 });
    }
    const node = this.nodeFor(row);
    await this.refuseMounting(row, "delete");
    const claim = await this.table.claim(row.id, "deleting");
    if (claim === undefined) throw await this.claimLost(row, "delete");
    try {
      if (row.shared) await this.refuseUsedAnywhere(row, "delete", signal);
      const answer = await this.call(node, "/destroyVolume", { id: row.id }, signal);
      if (answer.status !== 200) {
        throw new HttpError(
          answer.status >= 500 ? 502 : answer.status,
          String(answer.json.message ?? answer.text).slice(0, 500),
          { details: answer.json.sandboxes ? { sandboxes: answer.json.sandboxes } : {} },
        );
      }
    } catch (error) {
      // A claim lost meanwhile is released by its new holder: the node's answer is the news.
      await this.table.release(claim).catch(() => {});
      throw error;
    }
    // Compared on the claim: a delete whose claim lapsed removes no row another gateway holds.
    await this.table.remove(claim);
    return new Response(null, { status: 204 });
  }

  /** A 409 naming the sandboxes on any up node that mount the volume (a shared root). */
  async refuseUsedAnywhere(row: VolumeRow, what: string, signal: AbortSignal): Promise<void> {
    const answers = await this.#parts.routing.fanOut(
      "/volumeUsers",
      JSON.stringify({ id: row.id }),
      signal,
    );
    const users: string[] = [];
    for (const a of answers) {
      if (!a.ok) continue;
      const sandboxes = (a.json as { sandboxes?: { id: string }[] }).sandboxes ?? [];
      users.push(...sandboxes.map((s) => `'${s.id}' (on ${a.node.id})`));
    }
    if (users.length > 0) {
      throw new HttpError(
        409,
        `Cannot ${what} volume '${row.name}': it is mounted by sandbox ${users.join(", ")}: ` +
          "kill them first",
      );
    }
  }

  /**
   * A 409 when a create that mounts the volume is in flight, through this gateway or (a shared
   * table) any other.
   */
  async refuseMounting(row: VolumeRow, what: string): Promise<void> {
    const n = (this.#mounting.get(row.id) ?? 0) +
      (this.table.mountsInFlight ? await this.table.mountsInFlight(row.id) : 0);
    if (n > 0) throw mountingNow(row, what, n);
  }

  /** Why a claim failed: the volume busy, or (a shared table) a create mounting it. */
  async claimLost(row: VolumeRow, what: string): Promise<HttpError> {
    const now = await this.table.get(row.id);
    if (now?.state === "ready") return mountingNow(row, what, 1);
    return busy(now ?? row, what);
  }

  /**
   * The mounts of an E2B create: each `volumeMounts[].name` that is one of the team's volumes
   * (by name or by id) becomes its id (a name the team has no volume by is left for the nodes'
   * declared volumes; an id that is not the team's is a 404, as another team's volume is).
   * Returns the body to forward, the ids, the node that must take the create, and a release to
   * call once the create is answered.
   *
   * @throws {HttpError} 409 for a volume being created, moved or deleted, or two local volumes
   *   on two nodes; 503 when its node is down.
   */
  async mountsOf(body: Record<string, unknown>, team: string): Promise<
    {
      body: Record<string, unknown>;
      /** The shared volumes' ids: a node must advertise them (or be among `holders`). */
      ids: string[];
      /** The nodes that made the shared volumes (they hold them before they advertise them). */
      holders: string[];
      /** The node of the local volumes: only it may take the create. */
      node: string | undefined;
      release: () => void;
    } | undefined
  > {
    if (!Array.isArray(body.volumeMounts)) return undefined;
    const rows: VolumeRow[] = [];
    const mounts = [];
    for (const m of body.volumeMounts) {
      const name = (m as { name?: unknown } | null)?.name;
      if (typeof name !== "string") {
        mounts.push(m);
        continue;
      }
      // A volume id is a managed volume's on every node: only its own team may name it so.
      const row = VOLUME_ID.test(name)
        ? await this.table.get(name, team)
        : await this.table.byName(team, name);
      if (row === undefined && VOLUME_ID.test(name)) {
        throw new HttpError(404, `Volume '${name}' not found: GET /volumes lists your team's`);
      }
      if (row === undefined) {
        mounts.push(m);
        continue;
      }
      if (row.state !== "ready") throw busy(row, "mount");
      rows.push(row);
      mounts.push({ ...(m as object), name: row.id });
    }
    if (rows.length === 0) return undefined;
    const local = rows.filter((r) => !r.shared);
    const nodes = [...new Set(local.map((r) => r.node))];
    if (nodes.length > 1) {
      throw new HttpError(
        409,
        `The volumes ${
          local.map((r) => `'${r.name}' (node ${r.node})`).join(", ")
        } live on different nodes, and a sandbox runs on one: move one of them (moveVolume)`,
      );
    }
    for (const r of rows) this.nodeFor(r);
    const ids = rows.map((r) => r.id);
    // On a shared table, marked where every gateway's delete or move sees it, and only while
    // none has claimed the volume.
    const marks: (() => Promise<void>)[] = [];
    if (this.table.mountStart) {
      for (const r of rows) {
        const mark = await this.table.mountStart(r.id);
        if (mark === undefined) {
          await Promise.all(marks.map((m) => m()));
          throw busy((await this.table.get(r.id)) ?? r, "mount");
        }
        marks.push(mark);
      }
    }
    for (const id of ids) this.#mounting.set(id, (this.#mounting.get(id) ?? 0) + 1);
    let released = false;
    const shared = rows.filter((r) => r.shared);
    return {
      body: { ...body, volumeMounts: mounts },
      ids: shared.map((r) => r.id),
      holders: shared.map((r) => r.node),
      node: nodes[0],
      release: () => {
        if (released) return;
        released = true;
        for (const id of ids) {
          const n = (this.#mounting.get(id) ?? 1) - 1;
          if (n <= 0) this.#mounting.delete(id);
          else this.#mounting.set(id, n);
        }
        for (const mark of marks) void mark();
      },
    };
  }

  /**
   * `/volumecontent/{id}/{dir|path|file}`: the volume's token checked, then streamed to its
   * node both ways.
   */
  async content(request: Request, id: string, op: string): Promise<Response> {
    const given = /^Bearer\s+(.+)$/i.exec(request.headers.get("authorization") ?? "")?.[1];
    // The token is derived from the id, so it is checked before the table is read: a request
    // without the volume's own token costs no read (in shared mode, no etcd round trip).
    const owned = given !== undefined && VOLUME_ID.test(id) &&
      tokenMatcher(await this.token(id))(given);
    const row = owned ? await this.table.get(id) : undefined;
    // A wrong token and an unknown id answer alike: a tenant learns nothing of other volumes.
    if (row === undefined || given === undefined) {
      throw new HttpError(
        given === undefined ? 401 : 404,
        given === undefined
          ? "Missing volume token: send 'Authorization: Bearer <token>' from POST or GET /volumes"
          : `Volume '${id}' not found, or the token is not its own`,
      );
    }
    if (row.state !== "ready") throw busy(row, "reach the files of");
    const node = this.nodeFor(row);
    const routing = this.#parts.routing;
    return await forward(request, { nodeId: node.id, endpoint: node.endpoint }, {
      path: `/volumecontent/${id}/${op}${new URL(request.url).search}`,
      headers: { authorization: routing.nodeHeaders.authorization },
      fetch: routing.nodeFetch,
      hangUps: routing.hangUps,
      hop: routing.hop,
      headTimeoutMs: routing.headTimeoutMs,
    });
  }

  /** The up nodes, the most available data disk first (ties by id). */
  #candidates(): FleetNode[] {
    const fleet = this.#parts.fleet;
    const up = [...fleet.nodes()].filter((n) => !fleet.isDown(n) && n.reading !== null);
    if (up.length === 0) {
      throw new HttpError(
        503,
        "No node is up to hold a new volume: start a node (or wait for its check-in), then retry",
        { headers: { "retry-after": "5" } },
      );
    }
    const avail = (n: FleetNode) => n.reading?.dataDisk?.availableBytes ?? 0;
    up.sort((a, b) => avail(b) - avail(a) || (a.id < b.id ? -1 : 1));
    return up;
  }
}

/** The 409 of a volume that creates in flight mount. */
function mountingNow(row: VolumeRow, what: string, n: number): HttpError {
  return new HttpError(
    409,
    `Cannot ${what} volume '${row.name}': ${n} sandbox create(s) mounting it are in flight: ` +
      "retry once they finish",
    { headers: { "retry-after": "2" } },
  );
}

/** The 409 of a volume that is not `ready`. */
export function busy(row: VolumeRow, what: string): HttpError {
  const why = row.state === "moving"
    ? "it is being moved to another node"
    : row.state === "deleting"
    ? "it is being deleted"
    : "it is still being created";
  return new HttpError(
    409,
    `Cannot ${what} volume '${row.name}' (${row.id}): ${why}: retry shortly`,
    {
      headers: { "retry-after": "2" },
    },
  );
}
