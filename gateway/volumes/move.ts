/**
 * The operator's `moveVolume {volumeId, toNode}`: copies a volume from its node to another while
 * no sandbox mounts it, then flips where it lives. Meanwhile the volume is `moving`: mounts and
 * its content API are a 409 saying so. The copy is the source node's entry stream
 * (`exportVolume`) piped through the gateway into the target's `importVolume`, which renames it
 * into place only once it arrived whole; the table then names the target, and the source's copy
 * is deleted (a failure there is logged and leaves a stale copy, never a second live one: the
 * table names one node; `reconcile.ts` drops such copies, and a target's that took the image but
 * was never recorded, once the node holding it checks in again).
 *
 * @module
 */
import { z } from "zod";
import { HttpError } from "../../shared/http_error.ts";
import { volumeIdSchema } from "../../shared/volumes.ts";
import { nodeIdSchema } from "../../shared/schemas.ts";
import type { GatewayParts } from "../faces/parts.ts";
import type { FleetVolumes } from "./fleet_volumes.ts";

/** The body of `moveVolume`. */
export const moveVolumeSchema: z.ZodObject<{ volumeId: z.ZodString; toNode: z.ZodString }> = z
  .object({ volumeId: volumeIdSchema, toNode: nodeIdSchema }).strict();

/** How long the copy of one volume may take, end to end. */
const MOVE_TIMEOUT_MS = 30 * 60_000;

/**
 * Moves a volume (see the module doc). Answers `{volumeId, from, to, bytes}`.
 *
 * @throws {HttpError} 404 unknown volume or node, 409 mounted / busy / shared / same node /
 *   another gateway took the volume over mid-move (nothing recorded, the source keeps it),
 *   503 a node down, 502 the copy failed (the volume stays where it was).
 */
export async function moveVolume(
  parts: GatewayParts,
  volumes: FleetVolumes,
  body: z.infer<typeof moveVolumeSchema>,
  signal: AbortSignal,
): Promise<{ volumeId: string; from: string; to: string; bytes: number }> {
  const row = await volumes.require(body.volumeId, undefined);
  if (row.shared) {
    throw new HttpError(
      409,
      `Volume '${row.id}' is on the shared volume root (DORMICE_VOLUME_ROOT): every node serves ` +
        "it already, so there is nothing to move",
    );
  }
  if (row.node === body.toNode) {
    throw new HttpError(409, `Volume '${row.id}' is already on node '${body.toNode}'`);
  }
  const target = parts.fleet.get(body.toNode);
  if (target === undefined) {
    throw new HttpError(404, `No node '${body.toNode}' in the fleet: listNodes shows the ids`);
  }
  if (parts.fleet.isDown(target)) {
    throw new HttpError(503, `Node '${target.id}' is down: move the volume once it checks in`, {
      headers: { "retry-after": "5" },
    });
  }
  const source = volumes.nodeFor(row);
  await volumes.refuseMounting(row, "move");
  const claim = await volumes.table.claim(row.id, "moving");
  if (claim === undefined) throw await volumes.claimLost(row, "move");
  const bound = AbortSignal.any([signal, AbortSignal.timeout(MOVE_TIMEOUT_MS)]);
  let bytes = 0;
  try {
    const users = await volumes.call(source, "/volumeUsers", { id: row.id }, bound);
    const sandboxes = (users.json.sandboxes as { id: string }[] | undefined) ?? [];
    if (users.status !== 200 || users.json.present !== true) {
      throw new HttpError(
        502,
        `Node '${source.id}' does not hold volume '${row.id}' (${
          String(users.json.message ?? users.text).slice(0, 200)
        }): the volume stays where it is`,
      );
    }
    if (sandboxes.length > 0) {
      throw new HttpError(
        409,
        `Cannot move volume '${row.name}': it is mounted by sandbox ${
          sandboxes.map((s) => `'${s.id}'`).join(", ")
        } on node '${source.id}': kill them first`,
        { details: { sandboxes: sandboxes.map((s) => s.id) } },
      );
    }
    const fetchFn = parts.routing.nodeFetch;
    const auth = parts.routing.nodeHeaders.authorization;
    const exported = await fetchFn(`${source.endpoint}/exportVolume`, {
      method: "POST",
      headers: { authorization: auth, "content-type": "application/json" },
      body: JSON.stringify({ id: row.id }),
      signal: bound,
    });
    if (!exported.ok || exported.body === null) {
      const text = await exported.text();
      throw new HttpError(
        exported.status === 409 ? 409 : 502,
        `Node '${source.id}' could not export volume '${row.id}': ${text.slice(0, 300)}`,
      );
    }
    // The cap is the one this table recorded at create: a source node's word (its header) only
    // for a row from before caps were recorded, so a source cannot grow the volume, or make the
    // target build an image of a petabyte.
    const size = row.sizeBytes > 0
      ? String(row.sizeBytes)
      : exported.headers.get("x-dormice-volume-size") ?? "1e10";
    const imported = await fetchFn(
      `${target.endpoint}/importVolume?id=${row.id}&sizeBytes=${encodeURIComponent(size)}`,
      {
        method: "POST",
        headers: { authorization: auth, "content-type": "application/octet-stream" },
        body: exported.body,
        signal: bound,
        duplex: "half",
      } as RequestInit,
    );
    const text = await imported.text();
    if (imported.status !== 201) {
      // 409 (links the target cannot make) and 507 (more than the cap, or a cap larger than the
      // target's filesystem keeps in one image) are the operator's to act on, as the node says.
      throw new HttpError(
        imported.status === 409 || imported.status === 507 ? imported.status : 502,
        `Node '${target.id}' could not take volume '${row.id}' (HTTP ${imported.status}: ${
          text.slice(0, 300)
        }): the volume stays on '${source.id}'`,
      );
    }
    try {
      bytes = Number(JSON.parse(text).bytes ?? 0);
    } catch { /* the count is informative only */ }
  } catch (error) {
    // A claim lost meanwhile is released by its new holder: the copy's own failure is the news.
    await volumes.table.release(claim).catch(() => {});
    if (error instanceof HttpError) throw error;
    throw new HttpError(
      502,
      `The copy of volume '${row.id}' from '${source.id}' to '${target.id}' failed (${
        (error as Error).message
      }): the volume stays on '${source.id}'`,
    );
  }
  // Compared on the claim and the row as claimed: a move whose claim lapsed (another gateway
  // took the volume over) records nothing and leaves the source's copy; the target's unrecorded
  // copy is dropped by reconcile.
  await volumes.table.release(claim, { node: target.id });
  try {
    const gone = await volumes.call(source, "/destroyVolume", { id: row.id });
    if (gone.status !== 200) throw new Error(gone.text.slice(0, 200));
  } catch (error) {
    parts.log("warn", "a moved volume's old copy could not be deleted", {
      volume: row.id,
      nodeId: source.id,
      error: (error as Error).message,
      fix: "none needed: once that node checks in again, the gateway drops its stale copy",
    });
  }
  parts.log("info", "volume moved", { volume: row.id, from: source.id, to: target.id });
  return { volumeId: row.id, from: source.id, to: target.id, bytes };
}
