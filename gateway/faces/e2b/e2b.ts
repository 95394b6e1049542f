/**
 * `gateway/faces/e2b/` owns the E2B faces: their assembly (`e2b.ts`), the control plane
 * (`control.ts`), envd and the signed `/files` door (`envd.ts`), what every E2B face checks at its
 * door and how it answers an error (`door.ts`), the snapshot routes (`snapshots.ts`), and the merge
 * of answers fanned out to every node (`merge.ts`).
 *
 * The gateway's E2B faces: the control plane under `/e2b/api` (create placed or woken through
 * the name's slot, everything with an id found by id and forwarded, lists and metrics merged
 * across nodes by `merge.ts`), envd under `/e2b/envd` (routed by the `E2b-Sandbox-Id`
 * header, streamed both ways), and the SDK's bare signed `/files` door at the root. This file
 * assembles them; the control plane is `control.ts`, envd and the `/files` door
 * `envd.ts`, and what both check at their door and how they answer errors `door.ts`.
 *
 * @module
 */
import type { Hono } from "hono";
import type { GatewayParts } from "../parts.ts";
import { createE2bApi } from "./control.ts";
import { createE2bEnvd, createFilesDoor } from "./envd.ts";
import { randomSandboxName } from "../../../shared/random_name.ts";

/** Options of {@linkcode createE2bFaces} and {@linkcode mountE2b}. */
export interface E2bFacesOptions {
  /** Where each node serves its E2B control plane. Default `/e2b/api`. */
  nodeApiPath?: string;
  /** Where each node serves envd. Default `/e2b/envd`. */
  nodeEnvdPath?: string;
  /**
   * Names an unnamed create, so the slot and placement rules have a key and the Finder knows
   * the sandbox by name too. Default `randomSandboxName` (`e2b-` and 20 random hex digits), the
   * node's own form.
   */
  randomName?: () => string;
}

/** The three faces, each a Hono app to mount. */
export interface E2bFaces {
  /** The control plane; mount at `/e2b/api`. */
  api: Hono;
  /** envd; mount at `/e2b/envd`. */
  envd: Hono;
  /** The root `/files` door; mount at `/`. */
  files: Hono;
}

export { SANDBOX_NAME_HEADER } from "./control.ts";
export { UNREACHABLE_COUNT_HEADER, UNREACHABLE_HEADER } from "./merge.ts";

/**
 * Builds the gateway's E2B faces over the gateway's parts (`createGateway` mounts them; see
 * `buildGateway({ faces: { e2b: false }, mount })` to mount them with other options).
 *
 * - `api`: auth `X-API-KEY` (or `Authorization: Bearer`), errors always `{code:<int>, message}`.
 *   `POST /v2/sandboxes` and `/sandboxes` with `metadata.name` go through the name's slot, the
 *   creators' confirm and placement exactly like `acquireSandbox`; an unnamed create is named
 *   here (see `randomName`) and placed. Every route with an id is found by id and streamed;
 *   `DELETE /sandboxes/{id}` takes the name's slot, gives a fresh placement back and evicts.
 *   `GET /v2/sandboxes` and `GET /sandboxes` merge every node's list; nodes that did not answer
 *   are named in `x-dormice-unreachable` (every node silent is a 503). Paging is keyset paging
 *   over the nodes' own order (start time, then id): each node is asked for `limit + 1` rows
 *   after the cursor, the answers are merged and cut at `limit`, and `x-next-token` is the
 *   position of the last row shown, in the node's token form, so every node understands it and
 *   the gateway keeps no paging state. A node silent on one page and back on the next is not
 *   revisited for the rows it missed: the header says which page lacked it.
 *   `GET /sandboxes/metrics?sandbox_ids=` (at most 100 ids) asks every node and merges their
 *   `sandboxes` maps the same way. Snapshots (`snapshots.ts`): `GET /snapshots` is every
 *   node's rows merged and paged, `DELETE /templates/{snapshot id}` is told to every node, a
 *   create from a snapshot is placed on a node that advertises it, and taking one or forking is
 *   streamed to the sandbox's node. The routes the fleet does not build yet (network updates,
 *   template deletion: `shared/e2b_unbuilt.ts`) are a 501 answered here.
 * - `envd`: the id in `E2b-Sandbox-Id` and that sandbox's `X-Access-Token` (or, on REST paths,
 *   a signed URL) are checked first, so a request without them is a 400 or 401 that asks no
 *   node; then the node is found by the id; requests and answers stream both ways;
 *   routing errors are Connect `{code:"unavailable"|…, message}` on RPC paths and
 *   `{code:<int>, message}` on `/files` and `/health`.
 * - `files`: the root signed `/files` is a 501 (the signature does not name the sandbox) unless
 *   the request names its sandbox with `E2b-Sandbox-Id`; then its signature (or token) is
 *   checked like envd's before it is forwarded.
 *
 * @example
 * ```ts
 * import { buildGateway } from "../../app.ts";
 * import { createE2bFaces } from "./e2b.ts";
 * await using gateway = buildGateway({ token: "t".repeat(32) });
 * const faces = createE2bFaces(gateway, { randomName: () => "e2b-mine" });
 * console.log(typeof faces.api.fetch); // "function"
 * ```
 */
export function createE2bFaces(parts: GatewayParts, options: E2bFacesOptions = {}): E2bFaces {
  const nodeEnvd = options.nodeEnvdPath ?? "/e2b/envd";
  return {
    api: createE2bApi(
      parts,
      options.nodeApiPath ?? "/e2b/api",
      options.randomName ?? randomSandboxName,
    ),
    envd: createE2bEnvd(parts, nodeEnvd),
    files: createFilesDoor(parts, nodeEnvd),
  };
}

/**
 * Mounts the E2B faces at `/e2b/api`, `/e2b/envd` and the root `/files`. `createGateway` mounts
 * them itself; with `faces: { e2b: false }`, `buildGateway`'s `mount` option mounts them with
 * options of one's own.
 *
 * @example
 * ```ts
 * import { buildGateway } from "../../app.ts";
 * import { mountE2b } from "./e2b.ts";
 * const gateway = buildGateway({
 *   token: "t".repeat(32),
 *   faces: { e2b: false },
 *   mount: (app, parts) => mountE2b(app, parts, { randomName: () => "e2b-mine" }),
 * });
 * const res = await gateway.fetch(new Request("http://gw/e2b/api/v2/sandboxes"));
 * console.log(res.status); // 401: no X-API-KEY
 * await res.body?.cancel();
 * gateway.close();
 * ```
 */
export function mountE2b(app: Hono, parts: GatewayParts, options: E2bFacesOptions = {}): void {
  const faces = createE2bFaces(parts, options);
  app.route("/e2b/api", faces.api);
  app.route("/e2b/envd", faces.envd);
  app.route("/", faces.files);
}
