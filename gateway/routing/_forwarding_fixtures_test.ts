/**
 * A gateway over the wire in front of a stub node, for the forwarding contract
 * (contract_forwarding_test.ts) and the bytes lane's own tests (gateway/faces/bytes_lane_test.ts).
 *
 * @module
 */
import assert from "node:assert/strict";
import { buildGateway, type BuiltGateway } from "../app.ts";
import { createH1Client, type H1Client, serveGuarded } from "../../shared/http1/mod.ts";
import { checkIn } from "../_fixtures_test.ts";
import type { GatewayBytesLane } from "../faces/bytes_lane.ts";
import { within } from "../../shared/http1/_server_fixtures_test.ts";

/** The fleet token of the rig's gateway and node. */
export const TOKEN = "t".repeat(32);
/** The rig's node id. */
export const NODE = "node-a";
const encoder = new TextEncoder();

/** A request the stub node got. */
export interface Seen {
  method: string;
  path: string;
  headers: Headers;
  body: string;
  signal: AbortSignal;
}

/** Whether `promise` settles within `ms` (false when it does not). */
export function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return within(promise.then(() => true), ms, "").catch(() => false);
}

/** A POST, its answer read whole, bounded by 5 s. */
export async function post(url: string, headers: Record<string, string>, body: string) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error(`no answer from ${url}`)), 5000);
  try {
    const res = await fetch(url, { method: "POST", headers, body, signal: controller.signal });
    return { status: res.status, headers: res.headers, text: await res.text() };
  } finally {
    clearTimeout(timer);
  }
}

/** The two ways a routed request reaches its node. */
export type ForwardingPath = "bytes lane" | "object path";

/** What a rig is built with. */
export interface RigOptions {
  /** The way routed requests take (the bytes lane by default). */
  path?: ForwardingPath;
  /** Names the stub's lookupSandbox finds (mutable through `rig.names`). */
  names?: string[];
  /** The stub's answer to every verb but lookupSandbox; a plain exec result when absent. */
  answer?: (seen: Seen) => Response | Promise<Response>;
  headTimeoutMs?: number;
  /** Told when the gateway hands a request's bytes to its HTTP/1.1 client for the node. */
  onSend?: () => void;
}

/**
 * A stub node checked in to a gateway over the wire: served by the bytes engine with its lane
 * (`path: "bytes lane"`, the default), or by Deno's engine, where every request takes the object
 * path (`path: "object path"`).
 */
export async function rig(options: RigOptions = {}) {
  const names = new Set(options.names ?? []);
  const seen: Seen[] = [];
  const stub = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const path = new URL(req.url).pathname;
    const s: Seen = {
      method: req.method,
      path,
      headers: req.headers,
      body: await req.text(),
      // Made only when a test asks: Deno.serve's legacy abort warns of every signal made.
      get signal() {
        return req.signal;
      },
    };
    seen.push(s);
    if (path === "/lookupSandbox") {
      const b = JSON.parse(s.body);
      const name = b.name ?? String(b.id).replace(/^id-/, "");
      const team = req.headers.get("x-dormice-team") ?? undefined;
      return Response.json(
        names.has(name)
          ? { found: true, sandbox: { id: `id-${name}`, name, state: "active", team } }
          : { found: false },
      );
    }
    return options.answer
      ? await options.answer(s)
      : Response.json({ exitCode: 0, stdout: "ok\n", stderr: "" });
  });
  const h1 = createH1Client();
  const client: H1Client = {
    ...h1,
    sendBytes(origin, bytes, signal) {
      options.onSend?.();
      return h1.sendBytes(origin, bytes, signal);
    },
    get open() {
      return h1.open;
    },
  };
  const gateway = buildGateway({
    token: TOKEN,
    nodeClient: client,
    headTimeoutMs: options.headTimeoutMs,
    lookupTimeoutMs: 1000,
  });
  const lane = gateway.lane!;
  assert.ok(lane, "a gateway with a nodeClient has a lane");
  const server = serveGuarded({
    hostname: "127.0.0.1",
    port: 0,
    ...(options.path === "object path" ? { engine: "deno" } : { engine: "bytes", lane }),
    handler: gateway.fetch,
  });
  const base = `http://127.0.0.1:${server.addr.port}`;
  const endpoint = `http://127.0.0.1:${stub.addr.port}`;
  const fleetAuth = { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" };
  const joined = await post(`${base}/checkIn`, fleetAuth, JSON.stringify(checkIn(NODE, endpoint)));
  assert.equal(joined.status, 200, joined.text);
  let stubDown = false;
  return {
    names,
    seen,
    gateway: gateway as BuiltGateway & { lane: GatewayBytesLane },
    lane,
    base,
    endpoint,
    fleetAuth,
    /** The served and handed-back counts since `mark()`. */
    mark() {
      const s = lane.served, h = lane.handedBack;
      return () => ({ served: lane.served - s, handedBack: lane.handedBack - h });
    },
    /** Caches `name` with a lookupSandbox through the gateway. */
    async cache(name: string, auth: Record<string, string> = fleetAuth) {
      const r = await post(`${base}/lookupSandbox`, auth, JSON.stringify({ name }));
      assert.equal(r.status, 200, r.text);
      assert.equal(JSON.parse(r.text).found, true, r.text);
    },
    exec(name: string, auth: Record<string, string> = fleetAuth, extra = {}) {
      return post(`${base}/execCommand`, { ...auth, ...extra }, execBody(name));
    },
    async stopStub() {
      stubDown = true;
      await stub.shutdown();
    },
    async close() {
      await within(server.shutdown(), 5000, "gateway server shutdown");
      if (!stubDown) await within(stub.shutdown(), 5000, "stub shutdown");
      client.close();
      gateway.close();
    },
  };
}

/** An execCommand body for `name`. */
export function execBody(name: string): string {
  return JSON.stringify({ name, command: ["echo", "hi"] });
}

/** A stub answer that holds until the node's request is aborted (or 4 s pass, on a red run). */
/**
 * A node answer that tells `arrived` when the request comes and `aborted` when the gateway aborts
 * it, and holds its answer until then (4 s at most).
 */
export function holding(arrived: PromiseWithResolvers<void>, aborted: PromiseWithResolvers<void>) {
  return (s: Seen) =>
    new Promise<Response>((resolve) => {
      arrived.resolve();
      const done = () => {
        clearTimeout(timer);
        resolve(Response.json({ late: true }));
      };
      const timer = setTimeout(done, 4000);
      s.signal.addEventListener("abort", () => {
        aborted.resolve();
        done();
      }, { once: true });
    });
}

/** A client that sends an execCommand for `name` and hangs up once the node has it. */
export async function hangUpOnExec(r: Rig, arrived: Promise<void>) {
  const body = encoder.encode(execBody("x"));
  const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(r.base).port) });
  try {
    const head = `POST /execCommand HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${TOKEN}\r\n` +
      `content-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`;
    const bytes = new Uint8Array([...encoder.encode(head), ...body]);
    for (let at = 0; at < bytes.length;) at += await conn.write(bytes.subarray(at));
    await within(arrived, 3000, "the node's request");
  } finally {
    conn.close();
  }
}

/** A rig, as `rig` makes it. */
export type Rig = Awaited<ReturnType<typeof rig>>;
