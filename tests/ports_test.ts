// Sandbox ports and the sandbox domain, in one process on real sockets: a gateway with a domain
// and one node on the fake executor, whose in-process port handlers stand in for servers started
// in the sandbox. Host routing is driven through gateway.fetch with the Host in the URL (Deno's
// fetch cannot send another Host); WebSockets go over the gateway's socket by header.
import assert from "node:assert/strict";
import { createGateway, type Gateway } from "../gateway/app.ts";
import type { NodeApp } from "../node/app.ts";
import { steadySampler, testNodeApp } from "../node/_app_fixtures_test.ts";
import { FakeExecutor } from "../node/executors/fake.ts";
import { checkIn } from "../gateway/_fixtures_test.ts";
import { AccessTokens } from "../shared/access_tokens.ts";

const token = "t".repeat(40);
const domain = "sbx.test";

interface Fleet {
  gateway: Gateway;
  gatewayUrl: string;
  node: NodeApp;
  executor: FakeExecutor;
  close(): Promise<void>;
}

async function fleet(): Promise<Fleet> {
  const executor = new FakeExecutor();
  const nodeServer = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    (r) => node.fetch(r),
  );
  const endpoint = `http://127.0.0.1:${nodeServer.addr.port}`;
  const node = testNodeApp({ token, endpoint, executor, sampler: steadySampler });
  const gateway = createGateway({ token, sandboxDomain: domain });
  const gatewayServer = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen: () => {} },
    (r) => gateway.fetch(r),
  );
  const gatewayUrl = `http://127.0.0.1:${gatewayServer.addr.port}`;
  const res = await gateway.fetch(
    new Request(`${gatewayUrl}/checkIn`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(checkIn("node-1", endpoint)),
    }),
  );
  assert.equal(res.status, 200, await res.text());
  return {
    gateway,
    gatewayUrl,
    node,
    executor,
    close: async () => {
      await executor.close();
      await gatewayServer.shutdown();
      await nodeServer.shutdown();
      gateway.close();
      await node.close();
    },
  };
}

async function create(f: Fleet, body: Record<string, unknown> = {}) {
  const res = await f.gateway.fetch(
    new Request(`http://api.${domain}/v2/sandboxes`, {
      method: "POST",
      headers: { "x-api-key": token, "content-type": "application/json" },
      body: JSON.stringify({ templateID: "base", ...body }),
    }),
  );
  assert.equal(res.status, 201);
  return await res.json() as {
    sandboxID: string;
    domain: string;
    trafficAccessToken?: string;
    envdAccessToken?: string;
  };
}

Deno.test("api.<domain> serves the control plane at root paths and create answers the domain", async () => {
  const f = await fleet();
  try {
    const sbx = await create(f);
    assert.equal(sbx.domain, domain);
    assert.equal(sbx.trafficAccessToken, undefined);
    const list = await f.gateway.fetch(
      new Request(`http://api.${domain}/v2/sandboxes`, { headers: { "x-api-key": token } }),
    );
    assert.deepEqual((await list.json() as { sandboxID: string }[]).map((s) => s.sandboxID), [
      sbx.sandboxID,
    ]);
    const health = await f.gateway.fetch(new Request(`http://api.${domain}/healthz`));
    assert.equal(health.status, 200);
    await health.body?.cancel();
    // envd by host, with the access token the SDK sends (the gateway checks it).
    const envd = await f.gateway.fetch(
      new Request(`http://49983-${sbx.sandboxID}.${domain}/health`, {
        headers: { "x-access-token": sbx.envdAccessToken! },
      }),
    );
    assert.equal(envd.status, 204);
    await envd.body?.cancel();
  } finally {
    await f.close();
  }
});

Deno.test("<port>-<id>.<domain> reaches the port: method, path, query, headers and body pass", async () => {
  const f = await fleet();
  try {
    const { sandboxID: id } = await create(f);
    await f.executor.servePort(id, 8000, async (r) => {
      const url = new URL(r.url);
      return Response.json({
        method: r.method,
        path: url.pathname + url.search,
        body: await r.text(),
        auth: r.headers.get("authorization"),
        forwardedHost: r.headers.get("x-forwarded-host"),
      }, { headers: { "x-app": "yes" } });
    });
    const res = await f.gateway.fetch(
      new Request(`http://8000-${id}.${domain}/a/b?x=1`, {
        method: "PUT",
        headers: { authorization: "Bearer app-own" },
        body: "hello",
      }),
    );
    assert.equal(res.status, 200);
    assert.equal(res.headers.get("x-app"), "yes");
    assert.deepEqual(await res.json(), {
      method: "PUT",
      path: "/a/b?x=1",
      body: "hello",
      auth: "Bearer app-own",
      forwardedHost: `8000-${id}.${domain}`,
    });
    // The same port by header on the envd route, on any host.
    const byHeader = await fetch(`${f.gatewayUrl}/e2b/envd/c?y=2`, {
      headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8000" },
    });
    assert.equal(((await byHeader.json()) as { path: string }).path, "/c?y=2");
  } finally {
    await f.close();
  }
});

Deno.test("an sbx_ id of an earlier ledger stays routable by header, native verb and host", async () => {
  const f = await fleet();
  try {
    // Ledgers of earlier versions minted `sbx_` ids; the row and its sandbox as they left them.
    const id = "sbx_olf4gmih3aiuc77zzezl";
    await f.executor.create({ id, name: "old-1", template: "base", spec: {}, env: {} });
    f.node.ledger.insert({
      id,
      name: "old-1",
      state: "active",
      template: "base",
      metadata: {},
      spec: {},
      env: {},
      createdAt: Date.now(),
      deadlineAt: null,
      deadlineAction: null,
    });
    const lookup = await fetch(`${f.gatewayUrl}/lookupSandbox`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}` },
      body: JSON.stringify({ id }),
    });
    assert.equal((await lookup.json() as { sandbox: { name: string } }).sandbox.name, "old-1");
    const envd = await fetch(`${f.gatewayUrl}/e2b/envd/health`, {
      headers: {
        "e2b-sandbox-id": id,
        "x-access-token": AccessTokens.fromFleetToken(token).forSandbox(id),
      },
    });
    assert.equal(envd.status, 204);
    await f.executor.servePort(id, 8000, () => new Response(`inside ${id}`));
    const byHost = await f.gateway.fetch(new Request(`http://8000-${id}.${domain}/`));
    assert.equal(await byHost.text(), `inside ${id}`);
  } finally {
    await f.close();
  }
});

Deno.test("a port route answers E2B's 502 shapes: unknown sandbox, nothing listening; a bad port label is a 400", async () => {
  const f = await fleet();
  try {
    const unknown = await f.gateway.fetch(new Request(`http://8000-sbx_nope.${domain}/`));
    assert.equal(unknown.status, 502);
    assert.deepEqual(await unknown.json(), {
      message: "The sandbox was not found",
      sandboxId: "sbx_nope",
      code: 502,
    });
    const { sandboxID: id } = await create(f);
    const closed = await f.gateway.fetch(new Request(`http://8001-${id}.${domain}/`));
    assert.equal(closed.status, 502);
    const body = await closed.json() as {
      message: string;
      sandboxId: string;
      code: number;
      port: number;
    };
    assert.equal(body.message, "The sandbox is running but port is not open");
    assert.equal(body.port, 8001);
    assert.equal(body.sandboxId, id);
    assert.equal(body.code, 502);
    // A malformed port label is a 400 naming it, never the native API nor another port.
    for (const label of ["0", "65536", "abc", "08000"]) {
      const bad = await f.gateway.fetch(
        new Request(`http://${label}-${id}.${domain}/listSandboxes`, { method: "POST" }),
      );
      assert.equal(bad.status, 400, label);
      const refusal = await bad.json() as { message: string; code: number };
      assert.equal(refusal.code, 400);
      assert.match(refusal.message, new RegExp(`^The host '${label}-${id}\\.`));
    }
  } finally {
    await f.close();
  }
});

Deno.test("an event stream's first event arrives before the last is written, through both hops", async () => {
  const f = await fleet();
  try {
    const { sandboxID: id } = await create(f);
    let release!: () => void;
    const released = new Promise<void>((r) => release = r);
    await f.executor.servePort(id, 8000, () =>
      new Response(
        new ReadableStream({
          async start(c) {
            c.enqueue(new TextEncoder().encode("data: first\n\n"));
            await released;
            c.enqueue(new TextEncoder().encode("data: last\n\n"));
            c.close();
          },
        }),
        { headers: { "content-type": "text/event-stream" } },
      ));
    const res = await fetch(`${f.gatewayUrl}/e2b/envd/events`, {
      headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8000" },
    });
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    const first = await Promise.race([
      reader.read(),
      new Promise((_, no) => setTimeout(() => no(new Error("no first event in 5 s")), 5000)),
    ]) as ReadableStreamReadResult<string>;
    assert.equal(first.value, "data: first\n\n");
    release();
    let rest = "";
    for (let r = await reader.read(); !r.done; r = await reader.read()) rest += r.value;
    assert.equal(rest, "data: last\n\n");
  } finally {
    await f.close();
  }
});

Deno.test("a WebSocket echoes through both hops, subprotocol included", async () => {
  const f = await fleet();
  try {
    const { sandboxID: id } = await create(f);
    await f.executor.servePort(id, 8765, (r) => {
      const { socket, response } = Deno.upgradeWebSocket(r, { protocol: "echo" });
      socket.onmessage = (e) => socket.send(typeof e.data === "string" ? `echo ${e.data}` : e.data);
      return response;
    });
    const ws = new WebSocket(`${f.gatewayUrl.replace("http", "ws")}/e2b/envd/ws`, {
      headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": "8765" },
      protocols: ["echo"],
    } as unknown as string[]);
    ws.binaryType = "arraybuffer";
    const got: unknown[] = [];
    await new Promise<void>((resolve, reject) => {
      ws.onopen = () => {
        ws.send("hi");
        ws.send(new Uint8Array([1, 2, 3]));
      };
      ws.onmessage = (e) => {
        got.push(typeof e.data === "string" ? e.data : [...new Uint8Array(e.data)]);
        if (got.length === 2) resolve();
      };
      ws.onerror = () => reject(new Error("WebSocket failed"));
      setTimeout(() => reject(new Error("no echo in 5 s")), 5000);
    });
    assert.equal(ws.protocol, "echo");
    assert.deepEqual(got, ["echo hi", [1, 2, 3]]);
    const closed = new Promise((r) => ws.onclose = r);
    ws.close();
    await closed;
  } finally {
    await f.close();
  }
});

Deno.test("ports require the traffic token only with allowPublicTraffic: false; secure leaves them open", async () => {
  const f = await fleet();
  try {
    // `secure` guards envd in E2B, and older SDKs send it by default: ports stay public.
    const sbx = await create(f, { secure: true });
    assert.equal(sbx.trafficAccessToken, undefined);
    const open = await create(f, { network: { allowPublicTraffic: true } });
    assert.equal(open.trafficAccessToken, undefined);
    const closed = await create(f, { secure: true, network: { allowPublicTraffic: false } });
    assert.equal(typeof closed.trafficAccessToken, "string");
    const other = await create(f, { secure: true, network: { allowPublicTraffic: false } });
    await f.executor.servePort(sbx.sandboxID, 8000, () => new Response("secure, public"));
    await f.executor.servePort(closed.sandboxID, 8000, () => new Response("inside"));
    const publicPort = await f.gateway.fetch(
      new Request(`http://8000-${sbx.sandboxID}.${domain}/`),
    );
    assert.equal(await publicPort.text(), "secure, public");

    const url = `http://8000-${closed.sandboxID}.${domain}/`;
    const without = await f.gateway.fetch(new Request(url));
    assert.equal(without.status, 403);
    assert.match((await without.json() as { message: string }).message, /e2b-traffic-access-token/);
    const wrong = await f.gateway.fetch(
      new Request(url, { headers: { "e2b-traffic-access-token": other.trafficAccessToken! } }),
    );
    assert.equal(wrong.status, 403);
    await wrong.body?.cancel();
    const right = await f.gateway.fetch(
      new Request(url, { headers: { "e2b-traffic-access-token": closed.trafficAccessToken! } }),
    );
    assert.equal(await right.text(), "inside");
  } finally {
    await f.close();
  }
});

Deno.test("network.maskRequestHost: the sandbox's server sees that Host on requests and WebSocket handshakes", async () => {
  const f = await fleet();
  try {
    const masked = await create(f, { network: { maskRequestHost: "localhost:${PORT}" } });
    const plain = await create(f);
    for (const { sandboxID } of [masked, plain]) {
      await f.executor.servePort(sandboxID, 5173, async (r) => {
        const host = r.headers.get("host");
        if (r.headers.get("upgrade") !== "websocket") {
          return Response.json({ host, body: await r.text() });
        }
        const { socket, response } = Deno.upgradeWebSocket(r);
        socket.binaryType = "arraybuffer";
        socket.onopen = () => socket.send(`host ${host}`);
        socket.onmessage = (e) => {
          if (e.data === "bye") return socket.close(4001, "asked to");
          socket.send(typeof e.data === "string" ? `echo ${e.data}` : e.data);
        };
        return response;
      });
    }
    // A plain request with a streamed body, by host through the gateway.
    const res = await f.gateway.fetch(
      new Request(`http://5173-${masked.sandboxID}.${domain}/hmr?x=1`, {
        method: "POST",
        body: "payload",
      }),
    );
    assert.deepEqual(await res.json(), { host: "localhost:5173", body: "payload" });
    // Without the option the server sees the address the node reached it at, as before.
    const unmasked = await f.gateway.fetch(
      new Request(`http://5173-${plain.sandboxID}.${domain}/`),
    );
    const seen = (await unmasked.json() as { host: string }).host;
    assert.notEqual(seen, "localhost:5173");
    assert.match(seen, /^127\.0\.0\.1:\d+$/);

    // A WebSocket (a dev server's hot reload) by header, through both hops.
    const ws = new WebSocket(`${f.gatewayUrl.replace("http", "ws")}/e2b/envd/ws`, {
      headers: { "e2b-sandbox-id": masked.sandboxID, "e2b-sandbox-port": "5173" },
    } as unknown as string[]);
    ws.binaryType = "arraybuffer";
    const big = new Uint8Array(200_000).map((_, i) => i % 251);
    const got: unknown[] = [];
    const closed = new Promise<CloseEvent>((resolve, reject) => {
      ws.onmessage = (e) => {
        got.push(typeof e.data === "string" ? e.data : new Uint8Array(e.data).length);
        if (got.length === 1) {
          ws.send("hi");
          ws.send(big);
        }
        if (got.length === 3) ws.send("bye");
      };
      ws.onclose = resolve;
      ws.onerror = () => reject(new Error("WebSocket failed"));
      setTimeout(() => reject(new Error(`no close in 5 s: ${JSON.stringify(got)}`)), 5000);
    });
    const close = await closed;
    assert.deepEqual(got, ["host localhost:5173", "echo hi", 200_000]);
    assert.equal(close.code, 4001);
  } finally {
    await f.close();
  }
});

Deno.test("a port request resumes a paused sandbox created with autoResume; else a 502 says paused", async () => {
  const f = await fleet();
  try {
    const waking = await create(f, { lifecycle: { onTimeout: "pause", autoResume: true } });
    const staying = await create(f, { lifecycle: { onTimeout: "pause" } });
    for (const { sandboxID } of [waking, staying]) {
      await f.executor.servePort(sandboxID, 8000, () => new Response(`inside ${sandboxID}`));
      const paused = await f.gateway.fetch(
        new Request(`http://api.${domain}/sandboxes/${sandboxID}/pause`, {
          method: "POST",
          headers: { "x-api-key": token },
        }),
      );
      assert.equal(paused.status, 204);
    }
    const state = async (id: string) => {
      const res = await f.gateway.fetch(
        new Request(`http://api.${domain}/sandboxes/${id}`, { headers: { "x-api-key": token } }),
      );
      return (await res.json() as { state: string }).state;
    };
    const woken = await f.gateway.fetch(new Request(`http://8000-${waking.sandboxID}.${domain}/`));
    assert.equal(await woken.text(), `inside ${waking.sandboxID}`);
    assert.equal(await state(waking.sandboxID), "running");

    const refused = await f.gateway.fetch(
      new Request(`http://8000-${staying.sandboxID}.${domain}/`),
    );
    assert.equal(refused.status, 502);
    const body = await refused.json() as { message: string; sandboxId: string; code: number };
    assert.match(body.message, /^The sandbox is paused: .*autoResume/);
    assert.deepEqual([body.sandboxId, body.code], [staying.sandboxID, 502]);
    assert.equal(await state(staying.sandboxID), "paused");
  } finally {
    await f.close();
  }
});
