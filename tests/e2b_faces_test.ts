/**
 * What the official clients hit at the E2B faces beyond the happy path, against a real gateway
 * process in front of a real node process (fake executor): the options older SDKs send by
 * default, the answers the SDK decides on by status and `code`, and the wording its own tests
 * compare. Each step drives the unmodified `e2b` SDK where it reaches the case, and raw HTTP
 * where the case is a header or a body the SDK hides.
 */
import assert from "node:assert/strict";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";

async function until(what: string, check: () => Promise<boolean>, ms = 20_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

Deno.test({
  name: "the E2B faces answer what the official clients send as E2B would",
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  const gwPort = freePort();
  let gw: GatewayProcess | undefined;
  let node: NodeProcess | undefined;
  try {
    [gw, node] = await Promise.all([
      startGateway({ token, port: gwPort, env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } }),
      startNode({
        token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: `http://127.0.0.1:${gwPort}`,
          DORMICE_NODE_ID: "node-faces",
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
        },
      }),
    ]);
    const gateway = gw;
    await until("the node up with a reading", async () => {
      const { body } = await gateway.json("listNodes");
      return body.nodes.some((n: { state: string; reading: unknown }) =>
        n.state === "up" && n.reading !== null
      );
    });
    const api = (path: string, init: RequestInit = {}) =>
      fetch(`${gateway.url}/e2b/api${path}`, {
        ...init,
        headers: { "x-api-key": token, "content-type": "application/json", ...init.headers },
      });
    const create = async (body: Record<string, unknown>) => {
      const res = await api("/sandboxes", {
        method: "POST",
        body: JSON.stringify({ templateID: "base", ...body }),
      });
      const answer = await res.json();
      assert.equal(res.status, 201, JSON.stringify(answer));
      return answer as { sandboxID: string; trafficAccessToken?: string; envdAccessToken: string };
    };
    /** A port of a sandbox by header, as the SDK reaches it with E2B_SANDBOX_URL. */
    const port = (id: string, n: number, headers: Record<string, string> = {}) =>
      fetch(`${gateway.url}/e2b/envd/`, {
        headers: { "e2b-sandbox-id": id, "e2b-sandbox-port": String(n), ...headers },
      });

    await t.step("secure: true (older SDKs' default) leaves the ports public", async () => {
      const secure = await create({ secure: true });
      assert.equal(secure.trafficAccessToken, undefined);
      // Past the traffic check: the port is asked, and nothing listens there.
      const open = await port(secure.sandboxID, 8000);
      const body = await open.json();
      assert.equal(open.status, 502, JSON.stringify(body));
      assert.match(body.message, /nothing listens on port 8000/);
      // The check itself runs: without public traffic the same request is refused first.
      const closed = await create({ secure: true, network: { allowPublicTraffic: false } });
      assert.equal(typeof closed.trafficAccessToken, "string");
      const refused = await port(closed.sandboxID, 8000);
      assert.equal(refused.status, 403);
      assert.match((await refused.json()).message, /e2b-traffic-access-token/);
      const admitted = await port(closed.sandboxID, 8000, {
        "e2b-traffic-access-token": closed.trafficAccessToken!,
      });
      assert.equal(admitted.status, 502);
      await admitted.body?.cancel();
    });
  } finally {
    await Promise.all([node?.stop(), gw?.stop()]);
  }
});
