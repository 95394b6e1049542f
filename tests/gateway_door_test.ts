/**
 * The gateway's door against a real gateway process: a rogue check-in naming the gateway
 * itself (refused outright, or, through a relay the gateway cannot recognise, refused by the hop
 * marker at the first loop), and raw request paths with dot segments, sent over a plain socket
 * because `fetch` and `new Request()` would normalise them first.
 */
import assert from "node:assert/strict";
import { startGateway } from "./_gateway.ts";
import { newToken } from "./_processes.ts";

/** A check-in body with a fixed reading. */
function rogueCheckIn(nodeId: string, endpoint: string) {
  return {
    nodeId,
    endpoint,
    intervalSeconds: 60,
    build: "rogue",
    reading: {
      takenAt: Date.now(),
      cpuCount: 64,
      cpuUsedPct: 0,
      memoryTotalBytes: 512e9,
      memoryAvailableBytes: 512e9,
      swapTotalBytes: 0,
      swapFreeBytes: 0,
      dataDisk: null,
      sandboxes: { active: 0, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    },
  };
}

/**
 * A TCP relay to `port`: an address that reaches the gateway but is not the one it listens on.
 * Counts the HTTP requests that pass through it.
 */
function relayTo(port: number) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  let requests = 0;
  const conns: Deno.Conn[] = [];
  const pump = async (from: Deno.Conn, to: Deno.Conn, count: boolean) => {
    const buffer = new Uint8Array(64 * 1024);
    try {
      while (true) {
        const n = await from.read(buffer);
        if (n === null) break;
        const chunk = buffer.subarray(0, n);
        if (count) {
          requests +=
            new TextDecoder().decode(chunk).match(/^(GET|POST|DELETE) \S+ HTTP\/1\.1\r$/gm)
              ?.length ?? 0;
        }
        await to.write(chunk);
      }
    } catch { /* either side closed */ }
    try {
      to.close();
    } catch { /* already closed */ }
  };
  const accepting = (async () => {
    for await (const inbound of listener) {
      const outbound = await Deno.connect({ hostname: "127.0.0.1", port });
      conns.push(inbound, outbound);
      void pump(inbound, outbound, true);
      void pump(outbound, inbound, false);
    }
  })().catch(() => {});
  return {
    url: `http://127.0.0.1:${listener.addr.port}`,
    requests: () => requests,
    async close() {
      listener.close();
      for (const c of conns) {
        try {
          c.close();
        } catch { /* closed */ }
      }
      await accepting;
    },
  };
}

/** One HTTP/1.1 request with the path exactly as given; the status and the parsed JSON body. */
async function raw(
  port: number,
  method: string,
  path: string,
  headers: Record<string, string> = {},
  body = "",
  // deno-lint-ignore no-explicit-any
): Promise<{ status: number; body: any }> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const lines = [`${method} ${path} HTTP/1.1`, "Host: 127.0.0.1", "Connection: close"];
  for (const [k, v] of Object.entries(headers)) lines.push(`${k}: ${v}`);
  if (body !== "") lines.push(`Content-Length: ${new TextEncoder().encode(body).length}`);
  await conn.write(new TextEncoder().encode(lines.join("\r\n") + "\r\n\r\n" + body));
  const chunks: Uint8Array[] = [];
  const buffer = new Uint8Array(16 * 1024);
  while (true) {
    const n = await conn.read(buffer);
    if (n === null) break;
    chunks.push(buffer.slice(0, n));
  }
  conn.close();
  const text = new TextDecoder().decode(new Uint8Array(chunks.flatMap((c) => [...c])));
  const [head, ...rest] = text.split("\r\n\r\n");
  const status = Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1]);
  let payload = rest.join("\r\n\r\n");
  // Deno.serve may answer chunked: keep the JSON between the size lines.
  if (/transfer-encoding: chunked/i.test(head)) {
    payload = payload.replace(/^[0-9a-f]+\r\n|\r\n[0-9a-f]+\r\n/gi, "");
  }
  return { status, body: JSON.parse(payload.trim() || "null") };
}

Deno.test({
  name: "gateway door: a rogue check-in naming the gateway itself, and dot segments, are refused",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  const gw = await startGateway({ token });
  const relay = relayTo(gw.port);
  try {
    await t.step("a check-in naming the gateway's own address is a 400", async () => {
      for (const endpoint of [gw.url, `http://localhost:${gw.port}`]) {
        const r = await gw.json("checkIn", rogueCheckIn("rogue-self", endpoint));
        assert.equal(r.status, 400, endpoint);
        assert.match(r.body.message, /this gateway's own address.*DORMICE_NODE_ENDPOINT/);
      }
      const { body } = await gw.json("listNodes");
      assert.deepEqual(body.nodes, []);
    });

    await t.step("through a relay, the first loop is refused by the hop marker", async () => {
      const joined = await gw.json("checkIn", rogueCheckIn("rogue-relay", relay.url));
      assert.equal(joined.status, 200, JSON.stringify(joined.body));

      const listed = await gw.json("listSandboxes", {});
      assert.equal(listed.status, 200, JSON.stringify(listed.body));
      assert.equal(listed.body.unreachable.length, 1);
      assert.equal(listed.body.unreachable[0].nodeId, "rogue-relay");
      assert.match(listed.body.unreachable[0].cause, /HTTP 508: .*came back to the gateway/);
      // Without the marker each level fans out again (and the first one waits its full 5 s and
      // names a timeout): one request came back, and it went no further.
      assert.equal(relay.requests(), 1, "one request looped, and it went no further");

      const missed = await gw.json("execCommand", { name: "ghost", command: "true" });
      assert.equal(missed.status, 503, JSON.stringify(missed.body));
      // The cause is the loop's 508, not the 2 s lookup deadline (which would name no answer).
      assert.match(missed.body.message, /'rogue-relay'.*leads back to this gateway/);
      assert.doesNotMatch(missed.body.message, /No answer within/);
      assert.equal(relay.requests(), 2);

      const health = await fetch(`${gw.url}/healthz`);
      assert.equal(health.status, 200);
      await health.body?.cancel();
    });

    await t.step("a raw path with dot segments is a 400 in the face's dialect", async () => {
      const bearer = { authorization: `Bearer ${token}`, "content-type": "application/json" };
      const envd = await raw(gw.port, "POST", "/e2b/envd/../x", { "e2b-sandbox-id": "s1" }, "{}");
      assert.equal(envd.status, 400);
      assert.equal(envd.body.code, "invalid_argument");
      assert.match(envd.body.message, /'\/e2b\/envd\/\.\.\/x' has a '\.' or '\.\.' segment/);
      const api = await raw(gw.port, "GET", "/e2b/api/sandboxes/%2e%2e/x", { "x-api-key": token });
      assert.equal(api.status, 400);
      assert.equal(api.body.code, 400);
      const native = await raw(gw.port, "POST", "/x/../execCommand", bearer, '{"name":"a"}');
      assert.equal(native.status, 400);
      assert.match(native.body.message, /segment or a backslash/);
      // A file path in the query is not the route: it reaches envd (whose token check answers).
      const query = await raw(gw.port, "GET", "/e2b/envd/files?path=/a/../b", {
        "e2b-sandbox-id": "s1",
      });
      assert.equal(query.status, 401);
      assert.match(query.body.message, /X-Access-Token/);
    });
  } finally {
    await relay.close();
    await gw.stop();
  }
});
