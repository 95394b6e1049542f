/**
 * A client's hang-up reaches a node the gateway talks to through an embedder's `FetchHandler`.
 * The gateway hands such a handler a `Request` it built, whose signal follows the client's, rather
 * than the client's own: these tests hold that the abort arrives on that built `Request` (which is
 * what the node's `fetch` sees), whether the client is in process or hangs up a real connection,
 * and that the gateway lets go of the call at once, as it would of a `fetch`, even while the node
 * has not answered.
 */
import assert from "node:assert/strict";
import { createGateway } from "@dormice/cluster";
import { createNodeApp, FakeExecutor, Ledger, type NodeApp } from "@dormice/cluster/node";
import { serveGuarded } from "@dormice/cluster/shared";

const token = "a".repeat(32);
const headers = {
  authorization: `Bearer ${token}`,
  "content-type": "application/json",
};

/** Resolves with `promise`, or rejects saying `what` did not happen within `ms`. */
function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} within ${ms} ms`)), ms);
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * A gateway and a node in process, the gateway reaching the node through `fetch: (request) => …`,
 * with one sandbox and every exec parked at the executor: an `execCommand` through the gateway
 * stays in flight until the test lets it go.
 */
async function fleetWithParkedExec() {
  const executor = new FakeExecutor();
  const toNode: Request[] = [];
  const box: { node?: NodeApp } = {};
  const gateway = createGateway({
    token,
    sweepIntervalMs: 0,
    // The embedder's handler: it sees the Request the gateway built, and passes it to the node.
    fetch: (request) => {
      if (new URL(request.url).pathname === "/execCommand") {
        toNode.push(request);
      }
      return box.node!.fetch(request);
    },
  });
  const node = createNodeApp({
    config: {
      apiToken: token,
      dataDir: ".",
      nodeId: "node-a",
      nodeEndpoint: "http://node-a.test:3676",
      gatewayEndpoint: "http://gateway.test",
      checkInIntervalSeconds: 15,
      scanIntervalSeconds: 60,
    },
    executor,
    ledger: Ledger.inMemory({
      nodeId: "node-a",
      endpoint: "http://node-a.test:3676",
    }),
    fetch: (request) => gateway.fetch(request),
  });
  box.node = node;
  assert.deepEqual(await node.checkInNow(), { ok: true, status: 200 });
  const made = await gateway.fetch(
    new Request("http://gateway.test/acquireSandbox", {
      method: "POST",
      headers,
      body: JSON.stringify({ name: "held" }),
    }),
  );
  assert.equal(made.status, 200, await made.text());
  const release = executor.hooks.park("exec");
  const execInit = (signal: AbortSignal): RequestInit => ({
    method: "POST",
    headers,
    body: JSON.stringify({ name: "held", command: "echo hi" }),
    signal,
  });
  return {
    gateway,
    toNode,
    execInit,
    /** Resolves once the node's exec is parked, with the Request the embedder's handler got. */
    async arrived(): Promise<Request> {
      await within(
        executor.hooks.parked("exec"),
        10_000,
        "the exec reached the executor",
      );
      assert.equal(toNode.length, 1);
      assert.equal(
        toNode[0].signal.aborted,
        false,
        "nothing aborted before the hang-up",
      );
      return toNode[0];
    },
    async close() {
      release();
      await node.close();
      await gateway.close();
    },
  };
}

/** Resolves once `request`'s signal has aborted. */
function abortOf(request: Request): Promise<void> {
  if (request.signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    request.signal.addEventListener("abort", () => resolve(), { once: true });
  });
}

Deno.test("createGateway({ fetch }): an in-process caller's abort reaches the Request the handler got", async () => {
  const fleet = await fleetWithParkedExec();
  try {
    const client = new AbortController();
    const answer = fleet.gateway.fetch(
      new Request(
        "http://gateway.test/execCommand",
        fleet.execInit(client.signal),
      ),
    );
    const atNode = await fleet.arrived();
    client.abort();
    await within(abortOf(atNode), 5_000, "the node's Request aborted");
    // The node is still parked: the gateway answers its caller without waiting for it.
    const settled = await within(
      answer.then(
        (res) => res.body?.cancel().then(() => res.status),
        (error) => error,
      ),
      5_000,
      "the gateway let go of the aborted call while the node is parked",
    );
    // 499: the gateway's word for a client that went away (nginx's).
    assert.equal(settled, 499);
  } finally {
    await fleet.close();
  }
});

Deno.test("createGateway({ fetch }): a client hanging up its connection aborts the Request the handler got", async () => {
  const fleet = await fleetWithParkedExec();
  const server = serveGuarded({
    hostname: "127.0.0.1",
    port: 0,
    handler: fleet.gateway.fetch,
  });
  try {
    const client = new AbortController();
    const answer = fetch(
      `http://127.0.0.1:${server.addr.port}/execCommand`,
      fleet.execInit(client.signal),
    ).then((r) => r.body?.cancel(), () => undefined);
    const atNode = await fleet.arrived();
    // The client's fetch closes its connection; the server's Request, then the built one, abort.
    client.abort();
    await within(abortOf(atNode), 5_000, "the node's Request aborted");
    assert.equal(atNode.signal.aborted, true);
    await answer;
  } finally {
    await fleet.close();
    await server.shutdown();
  }
});
