/**
 * What the official clients hit at the E2B faces beyond the happy path, against a real gateway
 * process in front of a real node process (fake executor): the options older SDKs send by
 * default, the answers the SDK decides on by status and `code`, and the wording its own tests
 * compare. Each step drives the unmodified `e2b` SDK where it reaches the case, and raw HTTP
 * where the case is a header or a body the SDK hides.
 */
import assert from "node:assert/strict";
import { Sandbox, SandboxNotFoundError } from "e2b";
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
    const sdk = {
      apiUrl: `${gateway.url}/e2b/api`,
      sandboxUrl: `${gateway.url}/e2b/envd`,
      apiKey: token,
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
      assert.equal(body.message, "The sandbox is running but port is not open");
      assert.equal(body.port, 8000);
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

    await t.step(
      "an expired signed URL answers E2B's exact body, with what to do in a header",
      async () => {
        const sandbox = await Sandbox.create(sdk);
        await sandbox.files.write("/tmp/signed.txt", "hello");
        const signed = new URL(
          await sandbox.downloadUrl("/tmp/signed.txt", { useSignatureExpiration: -10_000 }),
        );
        const live = new URL(await sandbox.downloadUrl("/tmp/signed.txt"));
        // Where a signed URL is served: the sandbox's envd (by host in domain mode, which the
        // gateway turns into this header) and a node's root door (the SDK pointed at a node).
        const doors: { url: string; headers: Record<string, string> }[] = [
          {
            url: `${gateway.url}/e2b/envd/files`,
            headers: { "e2b-sandbox-id": sandbox.sandboxId },
          },
          { url: `${node!.url}/files`, headers: {} },
        ];
        for (const door of doors) {
          const fresh = await fetch(`${door.url}${live.search}`, { headers: door.headers });
          assert.equal(await fresh.text(), "hello", door.url);
          const res = await fetch(`${door.url}${signed.search}`, { headers: door.headers });
          const body = await res.json();
          assert.equal(res.status, 401, door.url);
          assert.equal(body.code, 401, door.url);
          // envd's answer, word for word (the SDK's own signing test compares the whole body);
          // what to do rides in a header beside it.
          assert.deepEqual(body, { code: 401, message: "signature is already expired" }, door.url);
          assert.match(res.headers.get("x-dormice-hint") ?? "", /fresh URL/, door.url);
        }
        await sandbox.kill();
      },
    );

    await t.step(
      "fork: a killed sandbox is not found; an existing one forks",
      async () => {
        const sandbox = await Sandbox.create(sdk);
        const [fork] = await Sandbox.fork(sandbox.sandboxId, { ...sdk, count: 1 });
        assert.ok(fork instanceof Sandbox, String(fork));
        assert.equal(await (fork as Sandbox).kill(), true);
        assert.equal(await sandbox.kill(), true);
        const killed = await Sandbox.fork(sandbox.sandboxId, { ...sdk, count: 1 })
          .then(() => undefined, (e) => e);
        assert.ok(killed instanceof SandboxNotFoundError, String(killed));
        assert.match(killed.message, /not found on any node of the fleet/);
      },
    );

    await t.step(
      "network.maskRequestHost is served",
      async () => {
        const masked = await Sandbox.create({
          ...sdk,
          network: { maskRequestHost: "localhost:${PORT}" },
        });
        assert.equal((await masked.getInfo()).network?.maskRequestHost, "localhost:${PORT}");
        // The port route takes it (nothing listens in the fake sandbox, so the proxy's 502).
        const res = await port(masked.sandboxId, 5173);
        assert.equal(res.status, 502);
        assert.equal((await res.json()).port, 5173);
        const bad = await api("/sandboxes", {
          method: "POST",
          body: JSON.stringify({ templateID: "base", network: { maskRequestHost: "a b" } }),
        });
        assert.equal(bad.status, 400);
        assert.match((await bad.json()).message, /^'network\.maskRequestHost' must be a host/);

        await masked.kill();
      },
    );
  } finally {
    await Promise.all([node?.stop(), gw?.stop()]);
  }
});
