// The bytes lane (`bytes_lane.ts`) end to end: a real node stub, a gateway served by the bytes
// engine, clients over the wire. Each test reads `gateway.lane.served` / `handedBack` to prove
// which path answered.
import assert from "node:assert/strict";
import { buildGateway, type BuiltGateway } from "../app.ts";
import { createH1Client, type H1Client, serveGuarded, serveH1 } from "../../shared/http1/mod.ts";
import { checkIn } from "../_fixtures_test.ts";
import { teamScopedName } from "../../shared/teams.ts";
import type { GatewayBytesLane } from "./bytes_lane.ts";
import { rawClient, within } from "../../shared/http1/_server_fixtures_test.ts";

const TOKEN = "t".repeat(32);
const NODE = "node-a";
const encoder = new TextEncoder();

/** A request the stub node got. */
interface Seen {
  method: string;
  path: string;
  headers: Headers;
  body: string;
  signal: AbortSignal;
}

/** Whether `promise` settles within `ms` (false when it does not). */
function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  return within(promise.then(() => true), ms, "").catch(() => false);
}

/** A POST, its answer read whole, bounded by 5 s. */
async function post(url: string, headers: Record<string, string>, body: string) {
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new Error(`no answer from ${url}`)), 5000);
  try {
    const res = await fetch(url, { method: "POST", headers, body, signal: controller.signal });
    return { status: res.status, headers: res.headers, text: await res.text() };
  } finally {
    clearTimeout(timer);
  }
}

interface RigOptions {
  /** Names the stub's lookupSandbox finds (mutable through `rig.names`). */
  names?: string[];
  /** The stub's answer to every verb but lookupSandbox; a plain exec result when absent. */
  answer?: (seen: Seen) => Response | Promise<Response>;
  headTimeoutMs?: number;
  /** Told when the gateway hands a request's bytes to its HTTP/1.1 client for the node. */
  onSend?: () => void;
}

/** A stub node checked in to a gateway served by the bytes engine with its lane. */
async function rig(options: RigOptions = {}) {
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
    engine: "bytes",
    lane,
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

function execBody(name: string): string {
  return JSON.stringify({ name, command: ["echo", "hi"] });
}

Deno.test("a cached execCommand is served by the lane with the node's headers and the client's body", async () => {
  const r = await rig({
    names: ["x"],
    answer: () =>
      new Response('{"exitCode":0,"stdout":"lane\\n"}', {
        status: 202,
        headers: {
          "content-type": "application/json",
          "x-node-said": "hi",
          "keep-alive": "timeout=5",
          "x-dormice-ledger-seq": "1764626400000001",
        },
      }),
  });
  try {
    await r.cache("x");
    const delta = r.mark();
    const body = `{"name":"x",  "command":"echo  hi" , "env":{"A":"é"}}`;
    const res = await post(`${r.base}/execCommand`, {
      authorization: `Bearer ${TOKEN}`,
      "content-type": "application/json; charset=utf-8",
      "x-trace": "abc",
      connection: "keep-alive",
      te: "trailers",
    }, body);
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
    const got = r.seen.at(-1)!;
    assert.equal(got.method, "POST");
    assert.equal(got.path, "/execCommand");
    assert.equal(got.headers.get("authorization"), `Bearer ${TOKEN}`);
    assert.equal(got.headers.get("content-type"), "application/json");
    assert.equal(got.headers.get("x-dormice-hop"), r.gateway.instanceId);
    assert.equal(got.headers.get("x-trace"), "abc");
    assert.equal(got.headers.get("te"), null);
    assert.equal(got.headers.get("connection"), null);
    assert.equal(got.headers.get("x-dormice-team"), null);
    assert.equal(got.headers.get("content-length"), String(encoder.encode(body).length));
    assert.equal(got.body, body);
    assert.equal(res.status, 202);
    assert.equal(res.text, '{"exitCode":0,"stdout":"lane\\n"}');
    assert.equal(res.headers.get("x-node-said"), "hi");
    assert.equal(res.headers.get("content-type"), "application/json");
    assert.equal(res.headers.get("keep-alive"), null);
    assert.equal(res.headers.get("x-dormice-ledger-seq"), null, "the node's number is the hop's");
  } finally {
    await r.close();
  }
});

Deno.test("a node's 204 reaches the client without framing headers, and the connection serves on", async () => {
  const r = await rig({ names: ["x"], answer: () => new Response(null, { status: 204 }) });
  try {
    await r.cache("x");
    const delta = r.mark();
    for (let i = 0; i < 2; i++) {
      const res = await r.exec("x");
      assert.equal(res.status, 204);
      assert.equal(res.text, "");
      // RFC 9110 §8.6: a 204 carries no Content-Length (nor Transfer-Encoding).
      assert.equal(res.headers.get("content-length"), null);
      assert.equal(res.headers.get("transfer-encoding"), null);
    }
    assert.deepEqual(delta(), { served: 2, handedBack: 0 });
  } finally {
    await r.close();
  }
});

Deno.test("an API key's team reaches the node as x-dormice-team, replacing the client's", async () => {
  const r = await rig({ names: ["x"] });
  try {
    const minted = await post(`${r.base}/createApiKey`, r.fleetAuth, '{"team":"acme"}');
    assert.equal(minted.status, 200, minted.text);
    const keyAuth = {
      authorization: `Bearer ${JSON.parse(minted.text).key}`,
      "content-type": "application/json",
    };
    await r.cache("x", keyAuth);
    const lookup = r.seen.find((s) => s.path === "/lookupSandbox")!;
    assert.deepEqual(JSON.parse(lookup.body), { name: "x" });
    assert.equal(lookup.headers.get("x-dormice-team"), "acme");
    assert.ok(r.gateway.finder.cached("name", teamScopedName("acme", "x")));
    assert.equal(r.gateway.finder.cached("name", "x"), undefined);
    const delta = r.mark();
    const res = await r.exec("x", keyAuth, { "x-dormice-team": "other" });
    assert.equal(res.status, 200, res.text);
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
    const got = r.seen.at(-1)!;
    assert.equal(got.path, "/execCommand");
    assert.equal(got.headers.get("x-dormice-team"), "acme");
    assert.equal(got.headers.get("authorization"), `Bearer ${TOKEN}`);
    assert.equal(got.body, execBody("x"));
  } finally {
    await r.close();
  }
});

Deno.test("a streamed node answer reaches the client piece by piece, its head first", async () => {
  // Each piece is made only once the client has what came before it: the head, then "one,".
  const gates = [Promise.withResolvers<void>(), Promise.withResolvers<void>()];
  const inOrder: boolean[] = [];
  const r = await rig({
    names: ["x"],
    answer: () =>
      new Response(
        new ReadableStream<Uint8Array>({
          async pull(c) {
            const n = inOrder.length;
            if (n === 2) return c.close();
            inOrder.push(await settlesWithin(gates[n].promise, 3000));
            c.enqueue(encoder.encode(["one,", "two"][n]));
          },
        }),
        { headers: { "content-type": "text/plain" } },
      ),
  });
  try {
    await r.cache("x");
    const delta = r.mark();
    const res = await within(
      fetch(`${r.base}/execCommand`, { method: "POST", headers: r.fleetAuth, body: execBody("x") }),
      5000,
      "the streamed answer's head",
    );
    gates[0].resolve();
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("content-type"), "text/plain");
    assert.equal(res.headers.get("content-length"), null);
    const reader = res.body!.getReader();
    const decoder = new TextDecoder();
    const first = await within(reader.read(), 5000, "the first piece");
    assert.equal(decoder.decode(first.value), "one,");
    gates[1].resolve();
    let text = decoder.decode(first.value);
    for (let p = await within(reader.read(), 5000, "a piece"); !p.done;) {
      text += decoder.decode(p.value);
      p = await within(reader.read(), 5000, "a piece");
    }
    assert.equal(text, "one,two");
    assert.deepEqual(inOrder, [true, true], "the client had the head, then one, in time");
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
  } finally {
    for (const g of gates) g.resolve();
    await r.close();
  }
});

Deno.test("what the lane cannot serve exactly is handed back and answered by the object path", async () => {
  const r = await rig({ names: ["x", "fresh"] });
  try {
    await r.cache("x");
    /** Sent over the wire (the lane claims it) and to gateway.fetch (the object path). */
    const both = async (
      headers: Record<string, string>,
      body: string,
      status: number,
      claimed = true,
    ) => {
      const delta = r.mark();
      const wire = await post(`${r.base}/execCommand`, headers, body);
      assert.deepEqual(delta(), { served: 0, handedBack: claimed ? 1 : 0 }, body);
      const direct = await r.gateway.fetch(
        new Request("http://gw.test/execCommand", { method: "POST", headers, body }),
      );
      assert.equal(wire.status, status, wire.text);
      assert.equal(direct.status, status);
      assert.equal(wire.text, await direct.text());
      for (const [k, v] of direct.headers) assert.equal(wire.headers.get(k), v, k);
      return JSON.parse(wire.text);
    };
    const wrong = { authorization: `Bearer ${"w".repeat(32)}`, "content-type": "application/json" };
    // A stranger's request is not even claimed: its bearer is checked from the head.
    const unauthorized = await both(wrong, execBody("x"), 401, false);
    assert.equal(typeof unauthorized.message, "string");
    assert.match((await both(r.fleetAuth, "not json", 400)).message, /not valid JSON/);
    assert.equal(typeof (await both(r.fleetAuth, '{"name": 5}', 400)).message, "string");
    assert.ok(!r.seen.some((s) => s.path === "/execCommand"), "no refused body reached the node");

    // A name not cached: the lookup round runs, then the node answers.
    let delta = r.mark();
    const before = r.seen.length;
    const miss = await r.exec("fresh");
    assert.deepEqual(delta(), { served: 0, handedBack: 1 });
    assert.deepEqual(r.seen.slice(before).map((s) => s.path), ["/lookupSandbox", "/execCommand"]);
    assert.deepEqual(JSON.parse(r.seen[before].body), { name: "fresh" });
    assert.equal(miss.status, 200);
    assert.deepEqual(JSON.parse(miss.text), { exitCode: 0, stdout: "ok\n", stderr: "" });

    // A byte-order mark: the object path decodes it away and forwards the text.
    delta = r.mark();
    const bom = await post(`${r.base}/execCommand`, r.fleetAuth, "\uFEFF" + execBody("x"));
    assert.deepEqual(delta(), { served: 0, handedBack: 1 });
    assert.equal(bom.status, 200, bom.text);
    assert.deepEqual(JSON.parse(bom.text), { exitCode: 0, stdout: "ok\n", stderr: "" });
    assert.equal(r.seen.at(-1)!.path, "/execCommand");
    assert.equal(r.seen.at(-1)!.body, execBody("x"));
  } finally {
    await r.close();
  }
});

Deno.test("a body the lane saw lately is found again by its bytes, for its own verb only", async () => {
  const r = await rig({ names: ["x", "z"] });
  try {
    await r.cache("x");
    const body = JSON.stringify({ name: "x" });
    let delta = r.mark();
    for (let i = 0; i < 2; i++) {
      const res = await post(`${r.base}/getSandboxMetrics`, r.fleetAuth, body);
      assert.equal(res.status, 200, res.text);
      assert.equal(r.seen.at(-1)!.body, body);
    }
    assert.deepEqual(delta(), { served: 2, handedBack: 0 });
    // The same bytes to execCommand are that verb's schema's to judge: no command is a 400.
    delta = r.mark();
    const exec = await post(`${r.base}/execCommand`, r.fleetAuth, body);
    assert.equal(exec.status, 400, exec.text);
    assert.deepEqual(delta(), { served: 0, handedBack: 1 });
    // One byte off names another sandbox, not cached: its lookup round runs.
    delta = r.mark();
    const before = r.seen.length;
    const other = await post(
      `${r.base}/getSandboxMetrics`,
      r.fleetAuth,
      JSON.stringify({ name: "z" }),
    );
    assert.equal(other.status, 200, other.text);
    assert.deepEqual(delta(), { served: 0, handedBack: 1 });
    assert.deepEqual(r.seen.slice(before).map((s) => s.path), [
      "/lookupSandbox",
      "/getSandboxMetrics",
    ]);
  } finally {
    await r.close();
  }
});

/** A stub answer that holds until the node's request is aborted (or 4 s pass, on a red run). */
function holding(arrived: PromiseWithResolvers<void>, aborted: PromiseWithResolvers<void>) {
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

Deno.test("a stranger's request costs no body read: its 401 comes before the body", async () => {
  const r = await rig({ names: ["x"] });
  try {
    await r.cache("x");
    const delta = r.mark();
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(r.base).port) });
    try {
      // A body declared and never sent: read whole first, this would wait for the head timeout.
      const head = `POST /execCommand HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${
        "w".repeat(32)
      }\r\ncontent-type: application/json\r\ncontent-length: 500000\r\n\r\n`;
      await conn.write(encoder.encode(head));
      const buf = new Uint8Array(4096);
      const n = await within(conn.read(buf), 2000, "the 401");
      assert.match(new TextDecoder().decode(buf.subarray(0, n ?? 0)), /^HTTP\/1\.1 401 /);
    } finally {
      conn.close();
    }
    assert.deepEqual(delta(), { served: 0, handedBack: 0 });
  } finally {
    await r.close();
  }
});

Deno.test("a body just under the lane's 1 MiB and an answer of 256 KiB pass through the lane whole", async () => {
  const answer = JSON.stringify({ content: "z".repeat(256 * 1024) });
  const r = await rig({ names: ["x"], answer: () => new Response(answer) });
  try {
    await r.cache("x");
    const delta = r.mark();
    const content = "y".repeat(1000 * 1024);
    const body = JSON.stringify({ name: "x", path: "/big.txt", content });
    const res = await post(`${r.base}/writeFile`, r.fleetAuth, body);
    assert.equal(res.status, 200, res.text);
    assert.deepEqual(delta(), { served: 1, handedBack: 0 }, "the lane served it");
    assert.equal(r.seen.at(-1)!.body, body, "the node got the whole body");
    assert.equal(res.text, answer, "the client got the whole answer");
  } finally {
    await r.close();
  }
});

/** An execCommand for `name` as the bytes a client sends. */
function execRequest(name: string): Uint8Array {
  const body = execBody(name);
  return encoder.encode(
    `POST /execCommand HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer ${TOKEN}\r\n` +
      `content-length: ${encoder.encode(body).length}\r\n\r\n${body}`,
  );
}

/** Serves the one connection `conn` (a stand-in socket) with the rig's gateway and lane. */
function serveOne(r: Awaited<ReturnType<typeof rig>>, conn: object, what: string) {
  return within(
    serveH1(conn as unknown as Deno.Conn, {
      handler: r.gateway.fetch,
      onError: (e) => Promise.reject(e),
      scheme: "http",
      stop: new AbortController().signal,
      begun() {},
      ended() {},
      lane: r.lane,
    }),
    5000,
    what,
  );
}

Deno.test("an answer the client's socket takes 1000 bytes at a time reaches it whole", async () => {
  const answer = JSON.stringify({ exitCode: 0, stdout: "w".repeat(8000) });
  const r = await rig({ names: ["x"], answer: () => new Response(answer) });
  try {
    await r.cache("x");
    const delta = r.mark();
    const request = execRequest("x");
    // A connection whose writes take at most 1000 bytes, as a full socket's do.
    const writes: Uint8Array[] = [];
    let asked = false, received = "", hangUp!: () => void;
    const gone = new Promise<null>((resolve) => hangUp = () => resolve(null));
    const conn = {
      remoteAddr: { transport: "tcp", hostname: "127.0.0.1", port: 1 },
      read(p: Uint8Array): Promise<number | null> {
        if (asked) return gone;
        asked = true;
        p.set(request);
        return Promise.resolve(request.length);
      },
      write(p: Uint8Array): Promise<number> {
        const piece = p.slice(0, 1000);
        writes.push(piece);
        received += new TextDecoder().decode(piece);
        if (received.endsWith(answer)) hangUp();
        return Promise.resolve(piece.length);
      },
      close: () => hangUp(),
    };
    await serveOne(r, conn, "the answer's last piece");
    assert.deepEqual(delta(), { served: 1, handedBack: 0 }, "the lane served it");
    assert.ok(writes.length > 8, `the answer went out in pieces (${writes.length} writes)`);
    assert.match(received, /^HTTP\/1\.1 200 OK\r\n/);
    assert.equal(received.slice(received.indexOf("\r\n\r\n") + 4), answer);
  } finally {
    await r.close();
  }
});

/** One request's answer read off a plain socket (one char a byte): its head and sized body. */
async function rawAnswer(url: string, request: Uint8Array): Promise<string> {
  const client = await rawClient(Number(new URL(url).port));
  try {
    await client.write(request);
    await client.until((text) => {
      const end = text.indexOf("\r\n\r\n");
      const length = /\r\ncontent-length: *(\d+)/i.exec(text)?.[1];
      return end >= 0 && length !== undefined && text.length >= end + 4 + Number(length);
    }, 5000);
    return client.received();
  } finally {
    await client.close();
  }
}

Deno.test("a node's answer that needs no change reaches the client byte for byte", async () => {
  const r = await rig({
    names: ["x"],
    answer: () =>
      new Response('{"exitCode":0,"stdout":"as sent\\n"}', {
        headers: { "x-first": "1", "content-type": "application/json", "x-last": "2" },
      }),
  });
  try {
    await r.cache("x");
    const delta = r.mark();
    // The stub's date may tick over between the two answers; the rest is the same bytes.
    const undated = (t: string) => t.replace(/\r\ndate: [^\r]*/i, "\r\ndate: -");
    const direct = await rawAnswer(r.endpoint, execRequest("x"));
    const relayed = await rawAnswer(r.base, execRequest("x"));
    assert.deepEqual(delta(), { served: 1, handedBack: 0 }, "the lane served it");
    // Deno's server writes the length before the date: re-framed, it would move after it.
    assert.match(direct, /^HTTP\/1\.1 200 OK\r\n[^]*content-length: \d+\r\ndate: [^]*as sent/i);
    assert.equal(undated(relayed), undated(direct));
  } finally {
    await r.close();
  }
});

Deno.test("the node's request is written before the client's hang-up read starts", async () => {
  // At one connection the work before the node's request is written is the request's latency;
  // the hang-up read (an op call) is started after it, while the node works.
  const order: string[] = [];
  const r = await rig({ names: ["x"], onSend: () => order.push("the node's request") });
  try {
    await r.cache("x");
    const delta = r.mark();
    const request = execRequest("x");
    let reads = 0, hangUp!: () => void;
    const gone = new Promise<null>((resolve) => hangUp = () => resolve(null));
    const conn = {
      remoteAddr: { transport: "tcp", hostname: "127.0.0.1", port: 1 },
      read(p: Uint8Array): Promise<number | null> {
        if (reads++ > 0) {
          order.push("a read after the request");
          return gone;
        }
        order.push("the request");
        p.set(request);
        return Promise.resolve(request.length);
      },
      write(p: Uint8Array): Promise<number> {
        order.push("the answer");
        hangUp();
        return Promise.resolve(p.length);
      },
      close: () => hangUp(),
    };
    await serveOne(r, conn, "the answer");
    assert.deepEqual(delta(), { served: 1, handedBack: 0 }, "the lane served it");
    assert.deepEqual(order.slice(0, 4), [
      "the request",
      "the node's request",
      "a read after the request",
      "the answer",
    ]);
  } finally {
    await r.close();
  }
});

Deno.test("a body past the lane's 1 MiB is left to the object path, which reads it under its cap", async () => {
  const r = await rig({ names: ["x"] });
  try {
    await r.cache("x");
    const delta = r.mark();
    const content = "y".repeat(1536 * 1024);
    const body = JSON.stringify({ name: "x", path: "/big.txt", content });
    const res = await post(`${r.base}/writeFile`, r.fleetAuth, body);
    assert.equal(res.status, 200, res.text);
    assert.deepEqual(delta(), { served: 0, handedBack: 0 });
    assert.equal(r.seen.at(-1)!.path, "/writeFile");
    assert.equal(r.seen.at(-1)!.body, body);
  } finally {
    await r.close();
  }
});

Deno.test("a node that sends no head within headTimeoutMs is a 504 and its request is aborted", async () => {
  const arrived = Promise.withResolvers<void>(), aborted = Promise.withResolvers<void>();
  const r = await rig({ names: ["x"], headTimeoutMs: 300, answer: holding(arrived, aborted) });
  try {
    await r.cache("x");
    const delta = r.mark();
    const started = performance.now();
    const res = await r.exec("x");
    const ms = performance.now() - started;
    assert.equal(res.status, 504, res.text);
    const { message } = JSON.parse(res.text);
    assert.match(message, new RegExp(`Node '${NODE}'`));
    assert.match(message, /within 300 ms/);
    assert.match(message, /DORMICE_GATEWAY_HEAD_TIMEOUT_MS/);
    assert.ok(ms >= 250 && ms < 3000, `answered after ${ms} ms`);
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
    assert.ok(await settlesWithin(aborted.promise, 2000), "the node's request was aborted");
  } finally {
    await r.close();
  }
});

/** A client that sends an execCommand for `name` and hangs up once the node has it. */
async function hangUpOnExec(r: Awaited<ReturnType<typeof rig>>, arrived: Promise<void>) {
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

Deno.test("a client that hangs up aborts the node's request", async () => {
  const arrived = Promise.withResolvers<void>(), aborted = Promise.withResolvers<void>();
  const r = await rig({ names: ["x"], answer: holding(arrived, aborted) });
  try {
    await r.cache("x");
    const delta = r.mark();
    await hangUpOnExec(r, arrived.promise);
    assert.ok(await settlesWithin(aborted.promise, 2000), "the node's request was aborted");
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
  } finally {
    await r.close();
  }
});

Deno.test("a client that hangs up on a request the lane handed back aborts the node's request", async () => {
  // Not cached: the lane hands it back before asking a node, and the object path's lookup round
  // and forward hear the hang-up through the read the server starts for it.
  const arrived = Promise.withResolvers<void>(), aborted = Promise.withResolvers<void>();
  const r = await rig({ names: ["x"], answer: holding(arrived, aborted) });
  try {
    const delta = r.mark();
    await hangUpOnExec(r, arrived.promise);
    assert.ok(await settlesWithin(aborted.promise, 2000), "the node's request was aborted");
    assert.deepEqual(delta(), { served: 0, handedBack: 1 });
  } finally {
    await r.close();
  }
});

Deno.test("a node's 404 on a cached name makes the Finder re-check and evict it", async () => {
  const r = await rig({
    names: ["x"],
    answer: (s) => {
      r.names.delete(JSON.parse(s.body).name);
      return Response.json({ message: "No sandbox named 'x'" }, { status: 404 });
    },
  });
  try {
    await r.cache("x");
    const key = teamScopedName("default", "x");
    assert.ok(r.gateway.finder.cached("name", key));
    const delta = r.mark();
    const before = r.seen.length;
    const res = await r.exec("x");
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
    assert.equal(res.status, 404);
    assert.deepEqual(JSON.parse(res.text), { message: "No sandbox named 'x'" });
    const after = r.seen.slice(before);
    assert.deepEqual(after.map((s) => s.path), ["/execCommand", "/lookupSandbox"]);
    assert.deepEqual(JSON.parse(after[1].body), { id: "id-x" });
    assert.equal(r.gateway.finder.cached("name", key), undefined);
  } finally {
    await r.close();
  }
});

Deno.test("a node that went away is a 502 naming it", async () => {
  const r = await rig({ names: ["x"] });
  try {
    await r.cache("x");
    await r.stopStub();
    const delta = r.mark();
    const res = await r.exec("x");
    assert.equal(res.status, 502, res.text);
    const { message } = JSON.parse(res.text);
    assert.match(message, new RegExp(`Node '${NODE}' at ${r.endpoint} did not answer`));
    assert.deepEqual(delta(), { served: 1, handedBack: 0 });
  } finally {
    await r.close();
  }
});

/**
 * A second stub node, checked in through `r`, that holds `x` (as `idb-x`) and answers every verb
 * with "from b".
 */
async function nodeB(r: Awaited<ReturnType<typeof rig>>, onExec: () => void = () => {}) {
  const names = new Set<string>();
  const stub = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, async (req) => {
    const path = new URL(req.url).pathname;
    const body = await req.text();
    if (path === "/lookupSandbox") {
      const b = JSON.parse(body);
      const name = b.name ?? String(b.id).replace(/^idb-/, "");
      return Response.json(
        names.has(name)
          ? { found: true, sandbox: { id: `idb-${name}`, name, state: "active" } }
          : { found: false },
      );
    }
    onExec();
    return Response.json({ exitCode: 0, stdout: "from b\n", stderr: "" });
  });
  const endpoint = `http://127.0.0.1:${stub.addr.port}`;
  const joined = await post(
    `${r.base}/checkIn`,
    r.fleetAuth,
    JSON.stringify(checkIn("node-b", endpoint)),
  );
  assert.equal(joined.status, 200, joined.text);
  return { names, close: () => within(stub.shutdown(), 5000, "stub b shutdown") };
}

/** Node A's answer: its exec while it holds the name, else the node's 404 for an absent sandbox. */
function answerWhileHeld(names: Set<string>) {
  return (seen: Seen) =>
    names.has(JSON.parse(seen.body).name)
      ? Response.json({ exitCode: 0, stdout: "from a\n", stderr: "" })
      : Response.json({ message: "No sandbox named 'x' on this node" }, {
        status: 404,
        headers: { "x-dormice-absent": "1" },
      });
}

for (const path of ["lane", "object path"] as const) {
  Deno.test(`a stale cache entry costs no 404 (${path}): the request goes once to the node that holds the name now`, async () => {
    const held = new Set(["x"]);
    const r = await rig({ names: ["x"], answer: answerWhileHeld(held) });
    const b = await nodeB(r);
    try {
      await r.cache("x");
      // Another gateway destroyed x on node A and made it again on node B.
      r.names.delete("x");
      held.delete("x");
      b.names.add("x");
      const delta = r.mark();
      const res = path === "lane" ? await r.exec("x") : await (async () => {
        const answer = await r.gateway.fetch(
          new Request(`${r.base}/execCommand`, {
            method: "POST",
            headers: r.fleetAuth,
            body: execBody("x"),
          }),
        );
        return { status: answer.status, text: await answer.text() };
      })();
      assert.equal(res.status, 200, res.text);
      assert.match(res.text, /from b/);
      const sentToA = r.seen.filter((s) => s.path === "/execCommand").length;
      assert.equal(sentToA, 1, "node A heard the exec once");
      if (path === "lane") assert.deepEqual(delta(), { served: 1, handedBack: 1 });
    } finally {
      await b.close();
      await r.close();
    }
  });
}

Deno.test("a node's 404 about something else than the sandbox (no mark) is the answer, sent nowhere else", async () => {
  const r = await rig({
    names: ["x"],
    answer: () => Response.json({ message: "No such file: /nope" }, { status: 404 }),
  });
  const b = await nodeB(r);
  try {
    await r.cache("x");
    b.names.add("x");
    const res = await r.exec("x");
    assert.equal(res.status, 404);
    assert.match(res.text, /No such file/);
  } finally {
    await b.close();
    await r.close();
  }
});

for (const path of ["lane", "object path"] as const) {
  Deno.test(`two requests on one stale cache entry cost no 404 (${path}): the second's re-check finds the entry already gone and goes to the name's node too`, async () => {
    // Node A answers the first exec at once and holds the second's 404 until the first has been
    // answered from B: by then the first request's re-check evicted the stale entry and its
    // lookup cached x on B, which the second's re-check must not take for its own entry.
    let fromB!: () => void;
    const firstDone = new Promise<void>((resolve) => fromB = resolve);
    let arrivals = 0;
    const absent = () =>
      Response.json({ message: "No sandbox named 'x' on this node" }, {
        status: 404,
        headers: { "x-dormice-absent": "1" },
      });
    const r = await rig({
      names: ["x"],
      answer: async (seen) => {
        if (seen.path !== "/execCommand") return absent();
        if (++arrivals === 2) await within(firstDone, 5000, "the first exec answered from B");
        return absent();
      },
    });
    const b = await nodeB(r, () => fromB());
    try {
      await r.cache("x");
      // Another gateway destroyed x on node A and made it again on node B.
      r.names.delete("x");
      b.names.add("x");
      const send = async () => {
        if (path === "lane") return await r.exec("x");
        const answer = await r.gateway.fetch(
          new Request(`${r.base}/execCommand`, {
            method: "POST",
            headers: r.fleetAuth,
            body: execBody("x"),
          }),
        );
        return { status: answer.status, text: await answer.text() };
      };
      const [first, second] = await Promise.all([send(), send()]);
      assert.equal(arrivals, 2, "both execs went to node A first");
      for (const res of [first, second]) {
        assert.equal(res.status, 200, res.text);
        assert.match(res.text, /from b/);
      }
    } finally {
      await b.close();
      await r.close();
    }
  });
}
