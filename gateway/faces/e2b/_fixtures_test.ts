/**
 * The E2B face tests' fleet: in-process stub nodes (lookupSandbox, a small E2B control plane and
 * envd over a map) behind a real gateway, and the request helpers both test files use.
 *
 * @module
 */
import assert from "node:assert/strict";
import { buildGateway, type BuiltGateway } from "../../app.ts";
import { mountE2b, SANDBOX_NAME_HEADER } from "./e2b.ts";
import { checkIn, fetchToNodes, reading } from "../../_fixtures_test.ts";
import { AccessTokens } from "../../../shared/access_tokens.ts";
import type { Clock } from "../../../shared/clock.ts";
import { encodeListCursor } from "../../../shared/list_cursor.ts";
import {
  pageSnapshots,
  parseSnapshotQuery,
  snapshotCursor,
  type SnapshotRow,
} from "../../../shared/snapshots.ts";

export const token = "gateway-e2b-unit-test-token-0123456789abcdef";

export const key = { "x-api-key": token, "content-type": "application/json" };

/** The envd access tokens every node of this fleet mints (derived from the fleet token). */
export const envdTokens = AccessTokens.fromFleetToken(token);

export interface StubSandbox {
  id: string;
  name: string;
  metadata: Record<string, string>;
  startedAt: string;
}

/** An in-process node: lookupSandbox and a small E2B control plane and envd over a map. */
export class StubNode {
  sandboxes = new Map<string, StubSandbox>();
  /** Paths the node was asked, with the method. */
  calls: string[] = [];
  /** Each lookup's body, in order. */
  lookups: Record<string, string>[] = [];
  /** Each create's name header. */
  nameHeaders: (string | null)[] = [];
  /** When set, every request fails as if the node did not answer. */
  silent = false;
  /** Status to answer creates with instead of creating. */
  createStatus: number | undefined;
  /** The last envd request's headers and body. */
  envdSeen: { headers: Headers; body: string; path: string } | undefined;
  /** The signal of the last held stream. */
  held: AbortSignal | undefined;
  /** The snapshots it holds (every team's: the stub does not filter by team). */
  snapshots: SnapshotRow[] = [];
  /** Each create's body, in order. */
  createBodies: Record<string, unknown>[] = [];
  /** Each create's `x-dormice-heal-from` header (the holders to heal from), in order. */
  healFrom: (string | null)[] = [];
  /** Each fork's body, in order. */
  forkBodies: { count?: number }[] = [];
  /** The creation time a take records, ms; the wall clock when unset. */
  takenAt?: number;
  /**
   * Runs before a take under an id the gateway named is answered, as a node pushes its
   * check-in then (`snapshotRetaken`).
   */
  onRetake?: (taken: SnapshotRow) => Promise<void> | void;
  /** The template builds it ran or runs (`<template id>/<build id>`): their status reads ready. */
  builds = new Set<string>();
  /** The tag records it keeps (`GET /templates/{id}/tags`), by template id. */
  tagRecords = new Map<string, unknown>();
  /** How many of each fork's first copies fail (an error entry each). */
  forkFailures = 0;
  #seq = 0;
  constructor(readonly id: string, readonly endpoint: string) {}

  byId(id: string): StubSandbox | undefined {
    return [...this.sandboxes.values()].find((s) => s.id === id);
  }

  add(name: string, metadata: Record<string, string> = {}, startedAt = new Date().toISOString()) {
    const s = { id: `${this.id}-${++this.#seq}`, name, metadata: { ...metadata }, startedAt };
    this.sandboxes.set(name, s);
    return s;
  }

  async handle(request: Request): Promise<Response> {
    const url = new URL(request.url);
    const path = url.pathname;
    this.calls.push(`${request.method} ${path}`);
    if (this.silent) throw new TypeError("error sending request: Connection refused");
    if (path === "/e2b/envd/process.Process/Start") {
      // A stream that never ends: only the client hanging up (through the gateway) stops it.
      this.held = request.signal;
      return new Response(
        new ReadableStream({
          start: (controller) => controller.enqueue(new TextEncoder().encode("first")),
        }),
        { headers: { "content-type": "application/connect+json" } },
      );
    }
    if (path.startsWith("/e2b/envd/")) {
      this.envdSeen = {
        headers: request.headers,
        body: await request.text(),
        path: path + url.search,
      };
      return new Response("from " + this.id, { headers: { "content-type": "text/plain" } });
    }
    assert.equal(request.headers.get("authorization"), `Bearer ${token}`);
    if (path === "/lookupSandbox") {
      const body = await request.json();
      this.lookups.push(body);
      const s = body.name !== undefined ? this.sandboxes.get(body.name) : this.byId(body.id);
      return Response.json(
        s
          ? { found: true, sandbox: { id: s.id, name: s.name, state: "active" } }
          : { found: false },
      );
    }
    const take = /^\/e2b\/api\/sandboxes\/([^/]+)\/snapshots$/.exec(path);
    if (take && request.method === "POST") {
      // A take: the build goes under the id the gateway names (a name already held), else anew.
      const body = await request.json() as { name?: string };
      const id = request.headers.get("x-dormice-snapshot-id") ?? `snap-${this.id}${++this.#seq}`;
      const taken: SnapshotRow = {
        snapshotID: id,
        names: body.name ? [body.name] : [],
        sandboxID: take[1],
        node: this.id,
        createdAt: new Date(this.takenAt ?? Date.now()).toISOString(),
      };
      this.snapshots.push(taken);
      if (request.headers.has("x-dormice-snapshot-id")) await this.onRetake?.(taken);
      return Response.json({ snapshotID: id, names: taken.names }, { status: 201 });
    }
    if (path === "/e2b/api/v2/sandboxes" && request.method === "POST") {
      const body = await request.json();
      this.createBodies.push(body);
      this.healFrom.push(request.headers.get("x-dormice-heal-from"));
      this.nameHeaders.push(request.headers.get(SANDBOX_NAME_HEADER));
      if (this.createStatus !== undefined) {
        return Response.json({ code: this.createStatus, message: "refused" }, {
          status: this.createStatus,
        });
      }
      // A yield, so concurrent creates would interleave here if the gateway let them through.
      await new Promise((r) => setTimeout(r, 0));
      const name = body.metadata?.name ?? request.headers.get(SANDBOX_NAME_HEADER) ?? "random";
      const s = this.sandboxes.get(name) ?? this.add(name, body.metadata);
      return Response.json({ sandboxID: s.id, templateID: "base", envdVersion: "0.6.13" }, {
        status: 201,
      });
    }
    if (path === "/e2b/api/v2/sandboxes" && request.method === "GET") {
      // Newest first, after the cursor, `limit` rows: the node's own paging.
      const limit = Number(url.searchParams.get("limit") ?? 100);
      const token = url.searchParams.get("nextToken");
      const cursor = token ? JSON.parse(atob(token.replace(/-/g, "+").replace(/_/g, "/"))) : null;
      const rows = [...this.sandboxes.values()]
        .map((s) => ({ sandboxID: s.id, startedAt: s.startedAt, metadata: s.metadata }))
        .sort((x, y) => Date.parse(y.startedAt) - Date.parse(x.startedAt))
        .filter((r) => !cursor || Date.parse(r.startedAt) < Date.parse(cursor[0]));
      return Response.json(rows.slice(0, limit), {
        headers: { "x-total-running": String(rows.length) },
      });
    }
    if (path === "/e2b/api/snapshots") {
      try {
        const { page, more } = pageSnapshots(
          this.snapshots,
          parseSnapshotQuery(url.searchParams, "node"),
        );
        const headers: Record<string, string> = more && page.length > 0
          ? { "x-next-token": encodeListCursor(snapshotCursor(page[page.length - 1])) }
          : {};
        return Response.json(page, { headers });
      } catch (error) {
        return Response.json({ code: 400, message: String(error) }, { status: 400 });
      }
    }
    const tags = /^\/e2b\/api\/templates\/([^/]+)\/tags$/.exec(path);
    if (tags && request.method === "GET") {
      const record = this.tagRecords.get(tags[1]);
      return record === undefined
        ? Response.json({ code: 404, message: "no tags here" }, { status: 404 })
        : Response.json(record);
    }
    const update = /^\/e2b\/api\/v2\/templates\/([^/]+)$/.exec(path);
    if (update && request.method === "PATCH") {
      return this.snapshots.some((r) => r.snapshotID === update[1])
        ? Response.json({ templateID: update[1], ...await request.json() })
        : Response.json({ code: 404, message: "not here" }, { status: 404 });
    }
    const status = /^\/e2b\/api\/templates\/([^/]+)\/builds\/([^/]+)\/status$/.exec(path);
    if (status && request.method === "GET") {
      return this.builds.has(`${status[1]}/${status[2]}`)
        ? Response.json({ templateID: status[1], buildID: status[2], status: "ready", logs: [] })
        : Response.json({ code: 404, message: "no such build here" }, { status: 404 });
    }
    const template = /^\/e2b\/api\/templates\/([^/]+)$/.exec(path);
    if (template && request.method === "DELETE") {
      const before = this.snapshots.length;
      this.snapshots = this.snapshots.filter((r) => r.snapshotID !== template[1]);
      return before === this.snapshots.length
        ? Response.json({ code: 404, message: "not here" }, { status: 404 })
        : new Response(null, { status: 204 });
    }
    if (path === "/e2b/api/sandboxes/metrics") {
      const asked = (url.searchParams.get("sandbox_ids") ?? "").split(",");
      const sandboxes = Object.fromEntries(
        asked.filter((id) => this.byId(id)).map((id) => [id, { cpuCount: 1, from: this.id }]),
      );
      return Response.json({ sandboxes });
    }
    const fork = /^\/e2b\/api\/sandboxes\/([^/]+)\/fork$/.exec(path);
    if (fork && request.method === "POST") {
      const body = await request.json();
      this.forkBodies.push(body);
      if (!this.byId(fork[1])) {
        return Response.json({ code: 404, message: "not here" }, { status: 404 });
      }
      const copies = Array.from({ length: body.count ?? 1 }, (_, i) => {
        if (i < this.forkFailures) {
          return { error: { code: 500, message: "the engine failed this copy" } };
        }
        const s = this.add(`fork-${this.forkBodies.length}-${i}`);
        return { sandbox: { sandboxID: s.id, templateID: "base", envdVersion: "0.6.13" } };
      });
      return Response.json(copies, { status: 201 });
    }
    const m = /^\/e2b\/api\/sandboxes\/([^/]+)$/.exec(path);
    if (m) {
      const s = this.byId(m[1]);
      if (!s) return Response.json({ code: 404, message: "not here" }, { status: 404 });
      if (request.method === "DELETE") {
        this.sandboxes.delete(s.name);
        return new Response(null, { status: 204 });
      }
      return Response.json({ sandboxID: s.id, metadata: s.metadata, state: "running" });
    }
    return Response.json({ code: 404, message: "no route" }, { status: 404 });
  }
}

export function setup({ clock }: { clock?: Clock } = {}) {
  const nodes = new Map<string, StubNode>();
  const fakeFetch = fetchToNodes(nodes);
  let names = 0;
  const gateway = buildGateway({
    token,
    ...(clock ? { clock } : {}),
    fetch: fakeFetch,
    lookupTimeoutMs: 500,
    // Its own E2B faces, so unnamed creates get names the tests can predict.
    faces: { e2b: false },
    mount: (app, parts) => mountE2b(app, parts, { randomName: () => `e2b-gen-${++names}` }),
  });
  const add = (id: string, memoryAvailableBytes = 8e9) => {
    const endpoint = `http://${id}.test:3676`;
    const node = new StubNode(id, endpoint);
    nodes.set(endpoint, node);
    gateway.fleet.checkIn(checkIn(id, endpoint, { reading: reading({ memoryAvailableBytes }) }));
    return node;
  };
  return { gateway, add };
}

export function api(
  gateway: BuiltGateway,
  method: string,
  path: string,
  body?: unknown,
  headers = key,
) {
  return gateway.fetch(
    new Request(`http://gw.test/e2b/api${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    }),
  );
}

/** A named create through the gateway; its status and sandbox id. */
export async function createNamed(gateway: BuiltGateway, name: string) {
  const res = await api(gateway, "POST", "/v2/sandboxes", {
    templateID: "base",
    metadata: { name },
  });
  const body = await res.json();
  return { status: res.status, body, id: body.sandboxID as string | undefined };
}

export function envd(
  gateway: BuiltGateway,
  path: string,
  headers: Record<string, string>,
  body?: BodyInit,
) {
  return gateway.fetch(
    new Request(`http://gw.test/e2b/envd${path}`, { method: "POST", headers, body }),
  );
}

/** The built template of {@linkcode templateFleet}. */
export const FLEET_TEMPLATE = "snap-agentagentagentagent";

/**
 * `size` stub nodes; the middle one built template `agent` (`v1` names its newest build) and
 * advertises it in its check-in as a builder does.
 */
export function templateFleet(size: number) {
  const { gateway, add } = setup();
  const nodes: StubNode[] = [];
  for (let i = 0; i < size; i++) {
    const node = add(`n${i}`);
    // Each declares its fleet templates, as real nodes do: a name that is none is a snapshot's.
    gateway.fleet.checkIn(
      checkIn(node.id, node.endpoint, { reading: reading(), templates: ["base"] }),
    );
    nodes.push(node);
  }
  const holder = nodes[Math.floor(size / 2)];
  holder.snapshots.push({
    snapshotID: FLEET_TEMPLATE,
    names: ["agent"],
    sandboxID: "built",
    node: holder.id,
    createdAt: new Date().toISOString(),
  });
  const at = new Date().toISOString();
  holder.tagRecords.set(FLEET_TEMPLATE, {
    team: "default",
    updatedAt: Date.now(),
    latest: { buildID: "b1", createdAt: at },
    tags: { default: { buildID: "b1", createdAt: at }, v1: { buildID: "b1", createdAt: at } },
  });
  gateway.fleet.checkIn(checkIn(holder.id, holder.endpoint, {
    reading: reading(),
    templates: ["base"],
    snapshots: [FLEET_TEMPLATE],
    snapshotNames: ["default/agent"],
  }));
  return { gateway, nodes, holder };
}
