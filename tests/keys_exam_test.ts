/**
 * The keys exam: API keys and teams through real processes (a gateway in front of two nodes on
 * the fake executor). Clients hold minted keys, never the fleet token; each team sees only its
 * own sandboxes in every listing and face; the fleet's verbs refuse a key; limits answer 429.
 */
import assert from "node:assert/strict";
import { RateLimitError, Sandbox } from "e2b";
import { freePort, newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, postJson, startGateway } from "./_gateway.ts";
import { AccessTokens } from "../shared/access_tokens.ts";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The E2B Python SDK's own key rule (e2b/api/__init__.py: `\Ae2b_[0-9a-f]+\Z`). */
const pythonSdkKeyRule = /^e2b_[0-9a-f]+$/;

async function until(what: string, check: () => Promise<boolean>, ms = 8000): Promise<void> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

async function e2b(
  base: string,
  key: string,
  method: string,
  path: string,
  body?: unknown,
  // deno-lint-ignore no-explicit-any
): Promise<{ status: number; headers: Headers; body: any }> {
  const res = await fetch(`${base}/e2b/api${path}`, {
    method,
    headers: { "x-api-key": key, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  return { status: res.status, headers: res.headers, body: text ? JSON.parse(text) : null };
}

Deno.test({
  name: "keys and teams: two teams, one fleet, each sees only its own",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const token = newToken();
  const gwPort = freePort();
  const gwUrl = `http://127.0.0.1:${gwPort}`;
  const nodeEnv = (id: string) => ({
    DORMICE_GATEWAY_ENDPOINT: gwUrl,
    DORMICE_NODE_ID: id,
    DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
  });
  const started: { stop(): Promise<unknown> }[] = [];
  const keep = <T extends { stop(): Promise<unknown> }>(p: Promise<T>) =>
    p.then((x) => {
      started.push(x);
      return x;
    });
  let gw!: GatewayProcess;
  try {
    [gw] = await Promise.all([
      keep(
        startGateway({ token, port: gwPort, env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } }),
      ),
      keep(startNode({ token, env: nodeEnv("node-a") })) as Promise<NodeProcess>,
      keep(startNode({ token, env: nodeEnv("node-b") })) as Promise<NodeProcess>,
    ]);
    await until("both nodes up with a reading", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.filter((n: { state: string; reading: unknown }) =>
        n.state === "up" && n.reading !== null
      ).length === 2;
    });
    const as = (key: string, verb: string, body: unknown = {}) => postJson(gw.url, key, verb, body);

    let keyA!: string, keyB!: string, idA!: string, idB!: string, keyIdA!: string;
    await t.step("createApiKey mints e2b_ + 40 hex keys the Python SDK accepts", async () => {
      const a = await gw.json("createApiKey", { team: "team-a", label: "alice" });
      const b = await gw.json("createApiKey", { team: "team-b", maxSandboxes: 2 });
      assert.equal(a.status, 200, JSON.stringify(a.body));
      for (const minted of [a.body, b.body]) {
        assert.match(minted.key, /^e2b_[0-9a-f]{40}$/);
        assert.match(minted.key, pythonSdkKeyRule);
        assert.match(minted.id, /^key_[0-9a-f]{16}$/);
      }
      assert.equal(a.body.team, "team-a");
      assert.equal(a.body.label, "alice");
      assert.equal(b.body.maxSandboxes, 2);
      assert.equal(b.body.createsPerMinute, null);
      keyA = a.body.key;
      keyB = b.body.key;
      keyIdA = a.body.id;
      const listed = await gw.json("listApiKeys", {});
      assert.equal(listed.body.keys.length, 2);
      assert.ok(!JSON.stringify(listed.body).includes(keyA), "listApiKeys never shows a key");
      assert.deepEqual(Object.keys(listed.body.keys[0]).sort(), [
        "createdAt",
        "createsPerMinute",
        "id",
        "label",
        "lastUsedAt",
        "maxSandboxes",
        "team",
      ]);
      const db = await Deno.readTextFile(gw.dbPath).catch(() => "");
      assert.ok(!db.includes(keyA), "the database holds hashes, not keys");
    });

    await t.step("each team's key creates its own agent-1", async () => {
      const a = await as(keyA, "acquireSandbox", { name: "agent-1", template: "minimal" });
      const b = await as(keyB, "acquireSandbox", { name: "agent-1", template: "minimal" });
      assert.equal(a.status, 200, JSON.stringify(a.body));
      assert.equal(b.status, 200, JSON.stringify(b.body));
      assert.equal(a.body.created, true);
      assert.equal(b.body.created, true, "team B's agent-1 is another sandbox");
      assert.notEqual(a.body.sandbox.id, b.body.sandbox.id);
      assert.equal(a.body.sandbox.team, "team-a");
      assert.equal(b.body.sandbox.team, "team-b");
      idA = a.body.sandbox.id;
      idB = b.body.sandbox.id;
      await as(keyA, "writeFile", { name: "agent-1", path: "/who", content: "a" });
      await as(keyB, "writeFile", { name: "agent-1", path: "/who", content: "b" });
      const readA = await as(keyA, "readFile", { name: "agent-1", path: "/who" });
      const readB = await as(keyB, "readFile", { name: "agent-1", path: "/who" });
      assert.equal(atob(readA.body.contentBase64), "a");
      assert.equal(atob(readB.body.contentBase64), "b");
    });

    await t.step(
      "every listing shows the caller's team only; the fleet token sees all",
      async () => {
        for (const [key, id] of [[keyA, idA], [keyB, idB]]) {
          const native = await as(key, "listSandboxes");
          assert.deepEqual(native.body.sandboxes.map((s: { id: string }) => s.id), [id]);
          const v1 = await e2b(gw.url, key, "GET", "/sandboxes");
          assert.deepEqual(v1.body.map((s: { sandboxID: string }) => s.sandboxID), [id]);
          const v2 = await e2b(gw.url, key, "GET", "/v2/sandboxes");
          assert.deepEqual(v2.body.map((s: { sandboxID: string }) => s.sandboxID), [id]);
        }
        const all = await gw.json("listSandboxes");
        assert.deepEqual(
          all.body.sandboxes.map((s: { id: string }) => s.id).sort(),
          [idA, idB].sort(),
        );
        const e2bAll = await e2b(gw.url, token, "GET", "/v2/sandboxes");
        assert.equal(e2bAll.body.length, 2);
      },
    );

    await t.step("team B finds team A's id nowhere: native, E2B API, envd", async () => {
      const unknown = "sbx_doesnotexist0000000";
      const lookup = await as(keyB, "lookupSandbox", { id: idA });
      assert.deepEqual(lookup.body, { found: false });
      assert.deepEqual((await as(keyB, "lookupSandbox", { id: unknown })).body, { found: false });
      assert.equal((await as(keyA, "lookupSandbox", { id: idA })).body.found, true);
      assert.equal((await gw.json("lookupSandbox", { id: idA })).body.found, true, "operator");

      const get = await e2b(gw.url, keyB, "GET", `/sandboxes/${idA}`);
      assert.equal(get.status, 404);
      const getUnknown = await e2b(gw.url, keyB, "GET", `/sandboxes/${unknown}`);
      assert.equal(get.body.message, getUnknown.body.message.replace(unknown, idA));
      assert.equal((await e2b(gw.url, keyB, "DELETE", `/sandboxes/${idA}`)).status, 404);
      assert.equal((await e2b(gw.url, keyB, "POST", `/sandboxes/${idA}/pause`)).status, 404);
      assert.equal((await e2b(gw.url, keyA, "GET", `/sandboxes/${idA}`)).status, 200);

      // envd: a request naming team B's key gets exactly the answer of a sandbox that does not
      // exist (E2B's proxy answers that 502), no hint that team A's is there.
      // Each with the sandbox's own access token, as the SDK sends it (the gateway checks it).
      const envdTokens = AccessTokens.fromFleetToken(token);
      const envd = (id: string) =>
        fetch(`${gw.url}/e2b/envd/health`, {
          headers: {
            "e2b-sandbox-id": id,
            "x-access-token": envdTokens.forSandbox(id),
            "x-api-key": keyB,
          },
        });
      const other = await envd(idA);
      const none = await envd(unknown);
      const [otherBody, noneBody] = [await other.json(), await none.json()];
      assert.equal(other.status, none.status);
      assert.equal(otherBody.message, noneBody.message.replace(unknown, idA));
      const own = await fetch(`${gw.url}/e2b/envd/health`, {
        headers: {
          "e2b-sandbox-id": idA,
          "x-access-token": envdTokens.forSandbox(idA),
          "x-api-key": keyA,
        },
      });
      await own.body?.cancel();
      assert.ok(own.status < 300, `team A's own envd answers ${own.status}`);
      // Team A's sandbox is untouched.
      assert.equal((await as(keyA, "lookupSandbox", { name: "agent-1" })).body.sandbox.id, idA);
    });

    await t.step("a client key on the fleet's verbs is a 403 sentence", async () => {
      for (const verb of ["checkIn", "listNodes", "removeNode", "createApiKey", "listApiKeys"]) {
        const r = await as(keyA, verb, {});
        assert.equal(r.status, 403, `${verb}: ${JSON.stringify(r.body)}`);
        assert.match(r.body.message, /fleet token/);
        assert.ok(!r.body.message.includes(keyA), "the key never appears in an answer");
      }
      const bad = await postJson(gw.url, "e2b_" + "0".repeat(40), "listSandboxes");
      assert.equal(bad.status, 401);
    });

    await t.step(
      "maxSandboxes: 2 makes the third create a 429; a destroy lets the next in",
      async () => {
        assert.equal((await as(keyB, "acquireSandbox", { name: "agent-2" })).status, 200);
        const third = await as(keyB, "acquireSandbox", { name: "agent-3" });
        assert.equal(third.status, 429, JSON.stringify(third.body));
        assert.match(third.body.message, /maxSandboxes 2/);
        // Only a kill clears it: no Retry-After, as E2B answers its concurrency limit.
        assert.equal(third.headers.get("retry-after"), null);
        // The E2B face says the same in E2B's words, which the SDK turns into its rate-limit
        // error at once: with a Retry-After it would retry for 15 s first.
        const raw = await e2b(gw.url, keyB, "POST", "/sandboxes", { templateID: "minimal" });
        assert.equal(raw.status, 429);
        assert.equal(raw.headers.get("retry-after"), null);
        assert.equal(raw.body.code, 429);
        assert.match(raw.body.message, /^You have reached the maximum number of concurrent E2B /);
        const sdk = await Sandbox.create({
          apiUrl: `${gw.url}/e2b/api`,
          sandboxUrl: `${gw.url}/e2b/envd`,
          apiKey: keyB,
        }).catch((e) => e);
        assert.ok(sdk instanceof RateLimitError, String(sdk));
        assert.match(sdk.message, /maximum number of concurrent E2B sandboxes \(2\)/);
        // A wake of an existing name is not a create.
        assert.equal((await as(keyB, "acquireSandbox", { name: "agent-1" })).status, 200);
        // After a check-in too (the count comes from the nodes then), still 429.
        await sleep(1500);
        assert.equal((await as(keyB, "acquireSandbox", { name: "agent-3" })).status, 429);
        assert.equal((await as(keyB, "destroySandbox", { name: "agent-2" })).body.destroyed, true);
        const next = await as(keyB, "acquireSandbox", { name: "agent-3" });
        assert.equal(next.status, 200, JSON.stringify(next.body));
        // Team A is not held to team B's limit.
        assert.equal((await as(keyA, "acquireSandbox", { name: "agent-2" })).status, 200);
        assert.equal((await as(keyA, "acquireSandbox", { name: "agent-3" })).status, 200);
      },
    );

    await t.step("createsPerMinute: 2 makes the third create a 429 with Retry-After", async () => {
      const c = await gw.json("createApiKey", { team: "team-c", createsPerMinute: 2 });
      const keyC = c.body.key;
      assert.equal((await as(keyC, "acquireSandbox", { name: "c-1" })).status, 200);
      const e2bCreate = await e2b(gw.url, keyC, "POST", "/sandboxes", {
        templateID: "minimal",
        metadata: { name: "c-2" },
      });
      assert.equal(e2bCreate.status, 201, JSON.stringify(e2bCreate.body));
      const third = await as(keyC, "acquireSandbox", { name: "c-3" });
      assert.equal(third.status, 429, JSON.stringify(third.body));
      assert.match(third.body.message, /createsPerMinute 2/);
      const wait = Number(third.headers.get("retry-after"));
      assert.ok(wait >= 1 && wait <= 30, `Retry-After ${wait}`);
      const e2bThird = await e2b(gw.url, keyC, "POST", "/sandboxes", { templateID: "minimal" });
      assert.equal(e2bThird.status, 429);
      assert.equal(e2bThird.body.code, 429);
    });

    await t.step("the e2b SDK runs with a minted key", async () => {
      const minted = await gw.json("createApiKey", { team: "sdk" });
      const opts = {
        apiUrl: `${gw.url}/e2b/api`,
        sandboxUrl: `${gw.url}/e2b/envd`,
        apiKey: minted.body.key,
      };
      const sandbox = await Sandbox.create("minimal", opts);
      const r = await sandbox.commands.run("echo hi");
      assert.equal(r.stdout, "hi\n");
      await sandbox.files.write("/a.txt", "x");
      assert.equal(await sandbox.files.read("/a.txt"), "x");
      const page = await Sandbox.list(opts).nextItems();
      assert.deepEqual(page.map((s) => s.sandboxId), [sandbox.sandboxId]);
      assert.equal(await sandbox.kill(), true);
    });

    await t.step("a revoked key is a 401 on its next request", async () => {
      assert.equal((await as(keyA, "listSandboxes")).status, 200);
      const revoked = await gw.json("revokeApiKey", { id: keyIdA });
      assert.deepEqual(revoked.body, { revoked: true });
      const next = await as(keyA, "listSandboxes");
      assert.equal(next.status, 401);
      assert.match(next.body.message, /revoked/);
      assert.equal((await e2b(gw.url, keyA, "GET", "/v2/sandboxes")).status, 401);
      // Its team's sandboxes stay, for the operator to see or another key of the team.
      assert.equal((await gw.json("lookupSandbox", { id: idA })).body.found, true);
    });

    await t.step("bad input on the key verbs is a 4xx sentence", async () => {
      const cases: [string, unknown, number, RegExp][] = [
        ["createApiKey", {}, 400, /'team' is required/],
        ["createApiKey", { team: "a/b" }, 400, /'team'/],
        ["createApiKey", { team: "x", maxSandboxes: 0 }, 400, /'maxSandboxes'/],
        ["createApiKey", { team: "x", maxSandboxes: "2" }, 400, /'maxSandboxes'/],
        ["createApiKey", { team: "x", createsPerMinute: 1.5 }, 400, /'createsPerMinute'/],
        ["createApiKey", { team: "x", extra: 1 }, 400, /extra/],
        ["revokeApiKey", {}, 400, /'id' is required/],
        ["revokeApiKey", { id: "key_nope" }, 404, /No API key with id 'key_nope'/],
        ["listApiKeys", { x: 1 }, 400, /x/],
      ];
      for (const [verb, body, status, pattern] of cases) {
        const r = await gw.json(verb, body);
        assert.equal(
          r.status,
          status,
          `${verb} ${JSON.stringify(body)}: ${JSON.stringify(r.body)}`,
        );
        assert.match(r.body.message, pattern);
      }
    });
  } finally {
    await Promise.all(started.map((p) => p.stop()));
  }
});
