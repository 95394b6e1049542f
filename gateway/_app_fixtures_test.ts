/**
 * The gateway app tests' fleet: in-process fake nodes behind a real `createGateway`, and the
 * native-verb call helper both test files use.
 *
 * @module
 */
import assert from "node:assert/strict";
import { buildGateway, type BuiltGateway } from "./app.ts";
import { checkIn, reading } from "./_fixtures_test.ts";
import type { FakeClock } from "../shared/clock.ts";
import type { ListenAddress } from "./door.ts";

export const token = "gateway-unit-test-token-0123456789abcdef";

export const auth = { authorization: `Bearer ${token}`, "content-type": "application/json" };

export interface StubSandbox {
  id: string;
  name: string;
  state: string;
}

/** An in-process node: a few native verbs over a map, reached through the injected fetch. */
export class StubNode {
  sandboxes = new Map<string, StubSandbox>();
  calls: string[] = [];
  /** How long an execCommand runs before the node answers. */
  execMs = 0;
  /** The hop marker of every request, in order. */
  hops: (string | null)[] = [];
  /** When set, every request fails as if the node did not answer. */
  silent = false;
  /** Status to answer acquireSandbox with instead of creating (e.g. 400 or 500). */
  acquireStatus: number | undefined;
  /** The ledger change number a node names on its creates and destroys, when it numbers them. */
  ledgerSeq: number | undefined;
  #seq = 0;
  constructor(readonly id: string, readonly endpoint: string) {}

  /** `answer`, naming the change number after it when the node numbers changes and it made one. */
  #numbered(answer: Response, changed: boolean): Response {
    if (this.ledgerSeq === undefined || !changed) return answer;
    answer.headers.set("x-dormice-ledger-seq", String(++this.ledgerSeq));
    return answer;
  }

  async handle(request: Request): Promise<Response> {
    const verb = new URL(request.url).pathname.slice(1);
    this.calls.push(verb);
    this.hops.push(request.headers.get("x-dormice-hop"));
    if (this.silent) throw new TypeError("error sending request: Connection refused");
    assert.equal(request.headers.get("authorization"), `Bearer ${token}`);
    const body = await request.json();
    switch (verb) {
      case "lookupSandbox": {
        const s = body.name !== undefined
          ? this.sandboxes.get(body.name)
          : [...this.sandboxes.values()].find((x) => x.id === body.id);
        return Response.json(s ? { found: true, sandbox: s } : { found: false });
      }
      case "acquireSandbox": {
        if (this.acquireStatus !== undefined) {
          return Response.json({ message: "refused" }, { status: this.acquireStatus });
        }
        // A yield, so concurrent acquires would interleave here if the gateway let them through.
        await new Promise((r) => setTimeout(r, 0));
        let s = this.sandboxes.get(body.name);
        const created = s === undefined;
        if (!s) {
          s = { id: `${this.id}-${++this.#seq}`, name: body.name, state: "active" };
          this.sandboxes.set(body.name, s);
        }
        return this.#numbered(
          Response.json({ status: "ready", created, sandbox: { ...s, nodeId: this.id } }),
          created,
        );
      }
      case "destroySandbox": {
        const destroyed = this.sandboxes.delete(body.name);
        return this.#numbered(Response.json({ destroyed }), destroyed);
      }
      case "execCommand": {
        if (!this.sandboxes.has(body.name)) {
          return Response.json({ message: `No sandbox named '${body.name}'` }, { status: 404 });
        }
        // Like a real node, the answer comes when the command ends.
        if (this.execMs > 0) await new Promise((r) => setTimeout(r, this.execMs));
        return Response.json({ exitCode: 0, stdout: `${this.id}\n`, stderr: "" });
      }
      case "listSandboxes":
        return Response.json({ sandboxes: [...this.sandboxes.values()] });
      case "setPools":
        return Response.json({ pools: body.pools });
      default:
        return Response.json({ message: "unknown" }, { status: 404 });
    }
  }
}

export function setup(
  options: {
    activeLimit?: number;
    clock?: FakeClock;
    listenAddress?: ListenAddress;
    headTimeoutMs?: number;
    nodeDeadAfterMs?: number;
  } = {},
) {
  const nodes = new Map<string, StubNode>();
  /** Requests the gateway sent to its own address (a node endpoint that loops back). */
  let selfCalls = 0;
  const fakeFetch = (input: RequestInfo | URL, init?: RequestInit) => {
    const request = new Request(input, init);
    if (new URL(request.url).origin === selfEndpoint) {
      selfCalls++;
      return gateway.fetch(request);
    }
    const node = nodes.get(new URL(request.url).origin);
    if (!node) return Promise.reject(new TypeError("error sending request: Connection refused"));
    // Like fetch, an abort rejects at once, whatever the node is doing.
    return new Promise<Response>((resolve, reject) => {
      const signal = request.signal;
      signal.addEventListener("abort", () => reject(signal.reason), { once: true });
      node.handle(request).then(resolve, reject);
    });
  };
  const gateway = buildGateway({
    token,
    fetch: fakeFetch as typeof fetch,
    lookupTimeoutMs: 500,
    activeLimit: options.activeLimit,
    clock: options.clock,
    listenAddress: options.listenAddress,
    headTimeoutMs: options.headTimeoutMs,
    nodeDeadAfterMs: options.nodeDeadAfterMs,
    instanceId: "gw-unit",
  });
  const add = (id: string) => {
    const endpoint = `http://${id}.test:3676`;
    const node = new StubNode(id, endpoint);
    nodes.set(endpoint, node);
    gateway.fleet.checkIn(
      checkIn(id, endpoint, { reading: reading({ memoryAvailableBytes: 8e9 }) }),
    );
    return node;
  };
  return { gateway, add, nodes, selfCalls: () => selfCalls };
}

/** The origin the injected fetch answers with the gateway under test itself. */
export const selfEndpoint = "http://gateway-itself.test:3677";

export function call(gateway: BuiltGateway, verb: string, body: unknown, init: RequestInit = {}) {
  return gateway.fetch(
    new Request(`http://gw.test/${verb}`, {
      method: "POST",
      headers: auth,
      body: JSON.stringify(body),
      ...init,
    }),
  );
}
