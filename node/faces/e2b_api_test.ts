import assert from "node:assert/strict";
import { FakeClock } from "../../shared/clock.ts";
import { AccessTokens } from "../../shared/access_tokens.ts";
import { createE2bApi, parseMetadataQuery } from "./e2b_api.ts";
import { FakeExecutor } from "../executors/fake.ts";
import { Ledger } from "../ledger.ts";
import { SandboxService } from "../service.ts";

const apiToken = "fleet-token-0123456789abcdefghijklmnop";

function setup() {
  const clock = new FakeClock(1_800_000_000_000);
  const executor = new FakeExecutor({ clock });
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const service = new SandboxService({ ledger, executor, clock });
  const accessTokens = new AccessTokens("secret for the e2b api tests 0123456789");
  let n = 0;
  const app = createE2bApi(service, {
    apiToken,
    accessTokens,
    clock,
    randomName: () => `e2b-test-${++n}`,
  });
  const call = (method: string, path: string, body?: unknown, key: string | null = apiToken) =>
    app.request(path, {
      method,
      headers: {
        "content-type": "application/json",
        ...(key === null ? {} : { "x-api-key": key }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  return { clock, executor, service, ledger, accessTokens, call };
}

Deno.test("createE2bApi() refuses a missing or wrong X-API-KEY with {code:401}", async () => {
  const { call, executor } = setup();
  for (const key of [null, "wrong"]) {
    const res = await call("GET", "/sandboxes", undefined, key);
    assert.equal(res.status, 401);
    const body = await res.json();
    assert.equal(body.code, 401);
    assert.match(body.message, /E2B_API_KEY/);
  }
  await executor.close();
});

Deno.test("POST /v2/sandboxes creates with the default 300 s deadline and a token", async () => {
  const { call, clock, service, accessTokens, executor } = setup();
  const res = await call("POST", "/v2/sandboxes", { templateID: "base", envVars: { A: "1" } });
  assert.equal(res.status, 201);
  const body = await res.json();
  assert.equal(body.templateID, "base");
  assert.equal(body.envdVersion, "0.6.13");
  assert.equal(body.envdAccessToken, accessTokens.forSandbox(body.sandboxID));
  const row = service.get({ id: body.sandboxID })!;
  assert.equal(row.name, "e2b-test-1");
  assert.equal(row.deadlineAt, clock.now() + 300_000);
  assert.equal(row.deadlineAction, "kill");
  assert.deepEqual(row.env, { A: "1" });
  await executor.close();
});

Deno.test("POST /sandboxes with metadata.name is idempotent; autoPause sets pause", async () => {
  const { call, service, executor } = setup();
  const body = { templateID: "base", metadata: { name: "a-1" }, timeout: 60, autoPause: true };
  const first = await (await call("POST", "/sandboxes", body)).json();
  const second = await (await call("POST", "/v2/sandboxes", body)).json();
  assert.equal(first.sandboxID, second.sandboxID);
  assert.equal(service.get({ id: first.sandboxID })!.deadlineAction, "pause");
  await executor.close();
});

Deno.test("create answers 400 naming the field at fault", async () => {
  const { call, executor } = setup();
  const cases: [unknown, RegExp][] = [
    [{ templateID: "base", metadata: { name: "bad name!" } }, /metadata\.name/],
    [{ templateID: "base", timeout: -1 }, /'timeout'/],
    [{ templateID: "base", envVars: { A: 1 } }, /'envVars\.A'/],
    [{}, /'templateID' is required/],
  ];
  for (const [body, pattern] of cases) {
    const res = await call("POST", "/v2/sandboxes", body);
    assert.equal(res.status, 400);
    const json = await res.json();
    assert.equal(json.code, 400);
    assert.match(json.message, pattern);
  }
  const res = await call("POST", "/v2/sandboxes", undefined);
  assert.equal(res.status, 400);
  await res.body?.cancel();
  await executor.close();
});

Deno.test("GET/DELETE/pause/connect of a sandbox follow E2B's statuses", async () => {
  const { call, clock, service, executor } = setup();
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", {
    templateID: "base",
    metadata: { name: "s-1", team: "x" },
  })).json();
  const info = await (await call("GET", `/sandboxes/${sandboxID}`)).json();
  assert.equal(info.state, "running");
  assert.deepEqual(info.metadata, { name: "s-1", team: "x" });

  assert.equal((await call("POST", `/sandboxes/${sandboxID}/pause`, {})).status, 204);
  const again = await call("POST", `/sandboxes/${sandboxID}/pause`, {});
  assert.equal(again.status, 409);
  assert.equal((await again.json()).code, 409);

  const resumed = await call("POST", `/v2/sandboxes/${sandboxID}/connect`, { timeout: 10 });
  assert.equal(resumed.status, 201);
  await resumed.body?.cancel();
  // Connect only extends: a 10 s timeout does not shorten the 300 s deadline.
  assert.equal(service.get({ id: sandboxID })!.deadlineAt, clock.now() + 300_000);
  const running = await call("POST", `/sandboxes/${sandboxID}/connect`, {});
  assert.equal(running.status, 200);
  await running.body?.cancel();

  assert.equal((await call("POST", `/sandboxes/${sandboxID}/timeout`, { timeout: 5 })).status, 204);
  assert.equal(service.get({ id: sandboxID })!.deadlineAt, clock.now() + 5_000);
  const noTimeout = await call("POST", `/sandboxes/${sandboxID}/timeout`, {});
  assert.equal(noTimeout.status, 400);
  await noTimeout.body?.cancel();

  assert.equal((await call("DELETE", `/sandboxes/${sandboxID}`)).status, 204);
  const gone = await call("DELETE", `/sandboxes/${sandboxID}`);
  assert.equal(gone.status, 404);
  assert.equal((await gone.json()).code, 404);
  const missing = await call("POST", `/v2/sandboxes/${sandboxID}/connect`, {});
  assert.equal(missing.status, 404);
  await missing.body?.cancel();
  await executor.close();
});

Deno.test("GET /v2/sandboxes filters by double-encoded metadata and state, and pages", async () => {
  const { call, clock, executor } = setup();
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) {
    clock.tick(1000);
    const body = { templateID: "base", metadata: { name: `l-${i}`, team: "a&b=c" } };
    ids.push((await (await call("POST", "/v2/sandboxes", body)).json()).sandboxID);
  }
  await (await call("POST", "/v2/sandboxes", { templateID: "base", metadata: { team: "z" } }))
    .body?.cancel();
  await (await call("POST", `/sandboxes/${ids[0]}/pause`, {})).body?.cancel();

  // What the SDK sends: each key and value encoded, joined as a query string, encoded again.
  const inner = new URLSearchParams({ [encodeURIComponent("team")]: encodeURIComponent("a&b=c") })
    .toString();
  const filter = `metadata=${encodeURIComponent(inner)}`;
  const all = await (await call("GET", `/v2/sandboxes?${filter}`)).json();
  assert.deepEqual(all.map((s: { sandboxID: string }) => s.sandboxID), [...ids].reverse());
  const paused = await (await call("GET", `/v2/sandboxes?${filter}&state=paused`)).json();
  assert.deepEqual(paused.map((s: { sandboxID: string }) => s.sandboxID), [ids[0]]);

  const page1 = await call("GET", `/v2/sandboxes?${filter}&limit=2`);
  const token = page1.headers.get("x-next-token");
  assert.ok(token);
  assert.equal((await page1.json()).length, 2);
  const page2 = await call("GET", `/v2/sandboxes?${filter}&limit=2&nextToken=${token}`);
  assert.equal(page2.headers.get("x-next-token"), null);
  assert.deepEqual((await page2.json()).map((s: { sandboxID: string }) => s.sandboxID), [ids[0]]);

  const v1 = await (await call("GET", `/sandboxes?${filter}`)).json();
  assert.equal(v1.length, 2); // running only

  const bad = await call("GET", "/v2/sandboxes?state=gone");
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).message, /'state'/);
  await executor.close();
});

Deno.test("unknown E2B routes answer {code:404}", async () => {
  const { call, executor } = setup();
  const res = await call("GET", "/nope");
  assert.equal(res.status, 404);
  assert.equal((await res.json()).code, 404);
  await executor.close();
});

Deno.test("parseMetadataQuery() decodes each key and value once more", () => {
  assert.deepEqual(parseMetadataQuery("a%2Bb=c%26d&x=y"), { "a+b": "c&d", x: "y" });
  assert.equal(parseMetadataQuery(undefined), undefined);
});

Deno.test("create answers a body that is not one JSON object, or is over the cap, as {code}", async () => {
  const { executor } = setup();
  const app = createE2bApi(
    new SandboxService({
      ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
      executor,
    }),
    { apiToken },
  );
  const post = (body: string, headers: Record<string, string> = {}) =>
    app.request("/v2/sandboxes", {
      method: "POST",
      headers: { "content-type": "application/json", "x-api-key": apiToken, ...headers },
      body,
    });
  const array = await post("[1]");
  assert.equal(array.status, 400);
  const arrayBody = await array.json();
  assert.equal(arrayBody.code, 400);
  assert.match(arrayBody.message, /must be a JSON object such as \{"templateID":"base"\}/);
  // The control plane never carries a file: a one-piece message under 1 MiB.
  const big = await post('{"templateID":"base"}', { "content-length": String(2 * 1024 ** 2) });
  assert.equal(big.status, 413);
  const bigBody = await big.json();
  assert.equal(bigBody.code, 413);
  assert.match(bigBody.message, /cap of 1 MiB \(DORMICE_JSON_MESSAGE_LIMIT_KB\)/);
  await executor.close();
});

Deno.test("an unnamed create without a randomName option gets randomSandboxName's name", async () => {
  const executor = new FakeExecutor();
  const service = new SandboxService({
    ledger: Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" }),
    executor,
  });
  const app = createE2bApi(service, { apiToken });
  const res = await app.request("/v2/sandboxes", {
    method: "POST",
    headers: { "content-type": "application/json", "x-api-key": apiToken },
    body: JSON.stringify({ templateID: "base" }),
  });
  assert.equal(res.status, 201);
  const { sandboxID } = await res.json();
  assert.match(service.get({ id: sandboxID })!.name, /^e2b-[0-9a-f]{20}$/);
  await executor.close();
});

Deno.test("GET /sandboxes/{id} reports the sandbox's own cpu and memory, as its metrics do", async () => {
  const { call, executor } = setup();
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", { templateID: "base" })).json();
  const info = await (await call("GET", `/sandboxes/${sandboxID}`)).json();
  const [metric] = await (await call("GET", `/sandboxes/${sandboxID}/metrics`)).json();
  assert.equal(info.cpuCount, 1);
  assert.equal(info.cpuCount, metric.cpuCount);
  assert.equal(info.memoryMB, 512);
  assert.equal(info.memoryMB * 1024 * 1024, metric.memTotal);
  const [listed] = await (await call("GET", "/v2/sandboxes")).json();
  assert.deepEqual([listed.cpuCount, listed.memoryMB], [1, 512]);
  await executor.close();
});

Deno.test("create's lifecycle: onTimeout and autoResume in every wire form, kept across a pause", async () => {
  const { call, clock, service, executor } = setup();
  const forms: [object, string, boolean][] = [
    [{ lifecycle: { onTimeout: "pause", autoResume: true } }, "pause", true],
    [{ lifecycle: { onTimeout: { action: "pause" } } }, "pause", false],
    [{ autoPause: true, autoResume: { enabled: true } }, "pause", true],
    [{ autoPause: true, autoResume: { policy: "any" } }, "pause", true],
    // lifecycle wins over the older autoPause, as in the SDK.
    [{ lifecycle: { onTimeout: "kill" }, autoPause: true }, "kill", false],
    [{}, "kill", false],
  ];
  for (const [options, onTimeout, autoResume] of forms) {
    const res = await call("POST", "/v2/sandboxes", {
      templateID: "base",
      timeout: 60,
      ...options,
    });
    assert.equal(res.status, 201, JSON.stringify(options));
    const { sandboxID } = await res.json();
    const info = await (await call("GET", `/sandboxes/${sandboxID}`)).json();
    assert.deepEqual(info.lifecycle, { onTimeout, autoResume }, JSON.stringify(options));
    const row = service.get({ id: sandboxID })!;
    assert.equal(row.deadlineAction, onTimeout);
    assert.deepEqual(row.e2b, { onTimeout, autoResume, timeoutSeconds: 60 });
  }

  // A pause deadline clears itself; connect gives the new deadline the lifecycle's action.
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", {
    templateID: "base",
    timeout: 10,
    lifecycle: { onTimeout: "pause" },
  })).json();
  clock.tick(10_000);
  assert.equal(await service.expireIfDue(sandboxID), "paused");
  const resumed = await call("POST", `/v2/sandboxes/${sandboxID}/connect`, { timeout: 30 });
  assert.equal(resumed.status, 201);
  await resumed.body?.cancel();
  assert.equal(service.get({ id: sandboxID })?.deadlineAction, "pause");
  assert.equal(
    (await (await call("GET", `/sandboxes/${sandboxID}`)).json()).lifecycle.onTimeout,
    "pause",
  );
  await executor.close();
});

Deno.test("create refuses lifecycle options this node cannot honour, naming them", async () => {
  const { call, executor } = setup();
  const cases: [object, RegExp][] = [
    [{ autoResume: { enabled: true } }, /'autoResume' needs the timeout to pause/],
    [{ lifecycle: { onTimeout: "kill", autoResume: true } }, /'autoResume' needs/],
    [{ lifecycle: { onTimeout: "later" } }, /'lifecycle\.onTimeout'/],
    [{ autoResume: { policy: "sometimes" } }, /'autoResume'/],
  ];
  for (const [options, pattern] of cases) {
    const res = await call("POST", "/v2/sandboxes", { templateID: "base", ...options });
    assert.equal(res.status, 400, JSON.stringify(options));
    const body = await res.json();
    assert.equal(body.code, 400);
    assert.match(body.message, pattern);
  }
  await executor.close();
});

Deno.test("POST /sandboxes/{id}/refreshes extends the deadline only, by at least 15 s", async () => {
  const { call, clock, service, executor } = setup();
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", {
    templateID: "base",
    timeout: 5,
  })).json();
  const refresh = (body?: unknown) => call("POST", `/sandboxes/${sandboxID}/refreshes`, body);
  assert.equal((await refresh({ duration: 60 })).status, 204);
  assert.equal(service.get({ id: sandboxID })?.deadlineAt, clock.now() + 60_000);
  // An empty body is E2B's default 15 s, which does not shorten the 60 s.
  assert.equal((await refresh()).status, 204);
  assert.equal(service.get({ id: sandboxID })?.deadlineAt, clock.now() + 60_000);
  clock.tick(55_000);
  assert.equal((await refresh({ duration: 1 })).status, 204);
  assert.equal(service.get({ id: sandboxID })?.deadlineAt, clock.now() + 15_000, "the 15 s floor");
  const tooLong = await refresh({ duration: 3601 });
  assert.equal(tooLong.status, 400);
  assert.match((await tooLong.json()).message, /'duration'/);
  await (await call("POST", `/sandboxes/${sandboxID}/pause`, {})).body?.cancel();
  const paused = await refresh({ duration: 60 });
  assert.equal(paused.status, 409);
  await paused.body?.cancel();
  const missing = await call("POST", "/sandboxes/sbx_nope/refreshes", {});
  assert.equal(missing.status, 404);
  await missing.body?.cancel();
  await executor.close();
});

Deno.test("create honours allowInternetAccess as the spec's egress and records secure", async () => {
  const { call, service, executor } = setup();
  const make = async (options: object) => {
    const res = await call("POST", "/v2/sandboxes", { templateID: "base", ...options });
    assert.equal(res.status, 201, JSON.stringify(options));
    const { sandboxID } = await res.json();
    const info = await (await call("GET", `/sandboxes/${sandboxID}`)).json();
    return { row: service.get({ id: sandboxID })!, info };
  };
  const open = await make({ allow_internet_access: true, secure: true });
  assert.equal(open.row.spec.network, true);
  assert.equal(open.row.e2b.secure, true);
  assert.equal(open.info.allowInternetAccess, true);
  const camel = await make({ allowInternetAccess: true });
  assert.equal(camel.row.spec.network, true);
  const closed = await make({ allow_internet_access: false });
  assert.equal(closed.row.spec.network, undefined);
  assert.equal(closed.info.allowInternetAccess, false);
  const unset = await make({});
  assert.equal(unset.row.spec.network, undefined);
  assert.equal(unset.info.allowInternetAccess, null);
  // Denying every address is no egress, which the node can do.
  const denied = await make({ network: { denyOut: ["0.0.0.0/0"], allowPublicTraffic: false } });
  assert.equal(denied.info.allowInternetAccess, false);
  assert.deepEqual(denied.info.network, { allowPublicTraffic: false });
  // HTTPS ports go into the spec (repeats dropped) and come back in the detail, as E2B's do.
  const https = await make({ network: { httpsPorts: [8443, 8443, 3000] } });
  assert.deepEqual(https.row.spec.httpsPorts, [8443, 3000]);
  assert.deepEqual(https.info.network, { httpsPorts: [8443, 3000] });
  await executor.close();
});

Deno.test("create reads network.allowOut / denyOut into the spec's egress rules, as E2B means them", async () => {
  const { call, service, executor } = setup();
  const make = async (options: object) => {
    const res = await call("POST", "/v2/sandboxes", { templateID: "base", ...options });
    assert.equal(res.status, 201, JSON.stringify(options));
    const { sandboxID } = await res.json();
    return service.get({ id: sandboxID })!.spec;
  };
  // Canonical CIDRs, duplicates dropped; rules give the sandbox egress judged by them.
  assert.deepEqual(
    await make({ network: { allowOut: ["198.18.0.1", "198.18.0.1/32"], denyOut: ["0.0.0.0/0"] } }),
    { network: true, egressRules: { allowOut: ["198.18.0.1/32"], denyOut: ["0.0.0.0/0"] } },
  );
  assert.deepEqual(await make({ network: { denyOut: ["10.1.2.3/8"] } }), {
    network: true,
    egressRules: { allowOut: [], denyOut: ["10.0.0.0/8"] },
  });
  // allowInternetAccess: false is a deny of every address, the allowed ones kept (E2B's).
  assert.deepEqual(
    await make({
      allowInternetAccess: false,
      network: { allowOut: ["1.1.1.1"], denyOut: ["8.8.8.8"] },
    }),
    { network: true, egressRules: { allowOut: ["1.1.1.1/32"], denyOut: ["0.0.0.0/0"] } },
  );
  await executor.close();
});

Deno.test("create answers a trafficAccessToken for allowPublicTraffic: false, not for secure", async () => {
  const { call, accessTokens, executor } = setup();
  const make = async (options: object) => {
    const res = await call("POST", "/v2/sandboxes", { templateID: "base", ...options });
    assert.equal(res.status, 201, JSON.stringify(options));
    return await res.json() as { sandboxID: string; trafficAccessToken?: string };
  };
  // What the JS SDK up to 2.45 and the Python SDK 2.34 send by default: ports stay public.
  const secure = await make({ secure: true });
  assert.equal(secure.trafficAccessToken, undefined);
  const closed = await make({ secure: true, network: { allowPublicTraffic: false } });
  assert.equal(closed.trafficAccessToken, accessTokens.forTraffic(closed.sandboxID));
  await executor.close();
});

Deno.test("create keeps network.maskRequestHost and get reports it", async () => {
  const { call, service, executor } = setup();
  for (const mask of ["localhost:${PORT}", "${PORT}-app.example.com", "[::1]:8080", "example"]) {
    const res = await call("POST", "/v2/sandboxes", {
      templateID: "base",
      network: { maskRequestHost: mask },
    });
    assert.equal(res.status, 201, mask);
    const { sandboxID } = await res.json();
    assert.equal(service.get({ id: sandboxID })!.e2b.maskRequestHost, mask);
    const info = await (await call("GET", `/sandboxes/${sandboxID}`)).json();
    assert.deepEqual(info.network, { maskRequestHost: mask });
  }
  await executor.close();
});

Deno.test("pause {memory:false} keeps the files only; connect restores them under the same id; kill drops them", async () => {
  const { call, service, executor } = setup();
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", { templateID: "base" })).json();
  await service.writeFile(
    { id: sandboxID },
    "/home/user/kept.txt",
    new TextEncoder().encode("kept"),
  );
  const paused = await call("POST", `/sandboxes/${sandboxID}/pause`, { memory: false });
  assert.equal(paused.status, 204);
  assert.equal(service.get({ id: sandboxID })!.state, "archived");
  assert.equal(executor.hooks.calls.archive, 1);
  assert.equal(executor.hooks.calls.pause, 0, "not frozen: removed");
  // No memory, no CPU: nothing to read resource use from.
  await assert.rejects(service.metrics({ id: sandboxID }), /paused to disk/);
  // E2B sees it paused; a second pause of either kind is its 409.
  const info = await (await call("GET", `/sandboxes/${sandboxID}`)).json();
  assert.equal(info.state, "paused");
  assert.equal((await call("POST", `/sandboxes/${sandboxID}/pause`, {})).status, 409);
  const connected = await call("POST", `/v2/sandboxes/${sandboxID}/connect`, { timeout: 30 });
  assert.equal(connected.status, 201);
  assert.equal((await connected.json()).sandboxID, sandboxID);
  assert.equal(service.get({ id: sandboxID })!.state, "active");
  assert.equal(executor.hooks.calls.restore, 1);
  const read = await service.readFile({ id: sandboxID }, "/home/user/kept.txt");
  assert.equal(new TextDecoder().decode(read), "kept");
  // Paused to disk again and killed: the executor holds nothing of it.
  assert.equal(
    (await call("POST", `/sandboxes/${sandboxID}/pause`, { memory: false })).status,
    204,
  );
  assert.equal((await call("DELETE", `/sandboxes/${sandboxID}`)).status, 204);
  assert.deepEqual(await executor.list(), []);
  await executor.close();
});

Deno.test("lifecycle.onTimeout {pause, keepMemory: false} pauses to disk at the deadline", async () => {
  const { call, clock, service, executor } = setup();
  for (
    const options of [
      { lifecycle: { onTimeout: { action: "pause", keepMemory: false } } },
      { autoPause: true, autoPauseMemory: false },
    ]
  ) {
    const res = await call("POST", "/v2/sandboxes", {
      templateID: "base",
      timeout: 10,
      ...options,
    });
    assert.equal(res.status, 201, JSON.stringify(options));
    const { sandboxID } = await res.json();
    assert.equal(service.get({ id: sandboxID })!.e2b.keepMemory, false);
    clock.tick(10_000);
    assert.equal(await service.expireIfDue(sandboxID), "paused");
    const row = service.get({ id: sandboxID })!;
    assert.equal(row.state, "archived");
    assert.equal(row.deadlineAt, null, "a pause deadline clears itself");
    assert.ok((await executor.list()).includes(sandboxID), "its files are kept");
    const resumed = await call("POST", `/sandboxes/${sandboxID}/resume`, { timeout: 30 });
    assert.equal(resumed.status, 201);
    await resumed.body?.cancel();
    assert.equal(service.get({ id: sandboxID })!.state, "active");
  }
  await executor.close();
});

Deno.test("create refuses network options this node cannot honour, naming each", async () => {
  const { call, executor } = setup();
  const cases: [object, RegExp][] = [
    [{ network: { allowOut: ["localhost"] } }, /^'network\.allowOut\[0\]'.* single-label/],
    [{ network: { denyOut: ["10.0.0.0/33"] } }, /^'network\.denyOut\[0\]' .* prefix length/],
    [{ network: { denyOut: ["1.2.3.4", "10.0.0.256"] } }, /^'network\.denyOut\[1\]' .* IPv4/],
    [{ network: { allowOut: ["8.8.8.8:53"] } }, /^'network\.allowOut\[0\]' .* names a port/],
    [{ network: { allowOut: ["2001:db8::1"] } }, /^'network\.allowOut\[0\]' .* IPv6/],
    [{ network: { egressProxy: { address: "p:1080" } } }, /^'network\.egressProxy'/],
    [{ network: { rules: { "1.2.3.4": [] } } }, /^'network\.rules\.1\.2\.3\.4': a rule's key/],
    [{ network: { httpsPorts: [0] } }, /^'network\.httpsPorts' holds 0, which is not a port/],
    [{ network: { httpsPorts: [3000.5] } }, /^'network\.httpsPorts' holds 3000\.5/],
    [{ network: { httpsPorts: ["3000"] } }, /^'network\.httpsPorts' holds "3000"/],
    [{ network: { httpsPorts: [70000] } }, /^'network\.httpsPorts' holds 70000/],
    [{ network: { httpsPorts: [49983] } }, /^'network\.httpsPorts' holds 49983, envd's port/],
    [{ network: { httpsPorts: 3000 } }, /^'network\.httpsPorts' must be a list/],
    [
      { network: { httpsPorts: Array.from({ length: 33 }, (_, i) => 3000 + i) } },
      /^'network\.httpsPorts' lists 33 ports, more than 32/,
    ],
    [{ network: { maskRequestHost: "a b" } }, /^'network\.maskRequestHost' must be a host/],
    [{ network: { maskRequestHost: "x\r\ny: 1" } }, /'network\.maskRequestHost'/],
    [{ network: { maskRequestHost: "h:${PORT}/path" } }, /'network\.maskRequestHost'/],
    [{ network: { somethingNew: true } }, /somethingNew/],
    [{ allow_internet_access: true, allowInternetAccess: false }, /disagree/],
    [{ allowInternetAccess: true, network: { denyOut: ["0.0.0.0/0"] } }, /disagree/],
    [{ secure: "yes" }, /'secure'/],
    // The SDK's workload identity (iam) and the placeholders its transform callbacks write.
    [
      { iam: { tokens: { aws: { audience: "sts.amazonaws.com", tokenType: "JWT-SVID" } } } },
      /^'iam' is not supported on this fleet/,
    ],
    [
      {
        network: {
          allowOut: ["api.example.com"],
          rules: {
            "api.example.com": [{
              transform: { headers: { Authorization: "Bearer ${e2b.identity.tokens.aws}" } },
            }],
          },
        },
      },
      /^'network\.rules\.api\.example\.com\[0\]\.transform\.headers\.Authorization' refers to a workload identity token/,
    ],
  ];
  for (const [options, pattern] of cases) {
    const res = await call("POST", "/v2/sandboxes", { templateID: "base", ...options });
    assert.equal(res.status, 400, JSON.stringify(options));
    const body = await res.json();
    assert.equal(body.code, 400);
    assert.match(body.message, pattern);
  }
  await executor.close();
});

Deno.test("PUT /sandboxes/:id/network replaces the rules whole, reported by get; bad input is a 400 naming it", async () => {
  const { call, executor } = setup();
  const create = async (body: object) =>
    (await (await call("POST", "/v2/sandboxes", { templateID: "base", ...body })).json())
      .sandboxID as string;
  const id = await create({ network: { allowOut: ["198.18.0.1"], denyOut: ["0.0.0.0/0"] } });
  assert.deepEqual(executor.egressRulesOf(id), {
    allowOut: ["198.18.0.1/32"],
    denyOut: ["0.0.0.0/0"],
  });
  const put = (sandbox: string, body: object) => call("PUT", `/sandboxes/${sandbox}/network`, body);
  assert.equal((await put(id, { allowOut: ["198.18.0.2"], denyOut: ["0.0.0.0/0"] })).status, 204);
  assert.deepEqual(executor.egressRulesOf(id), {
    allowOut: ["198.18.0.2/32"],
    denyOut: ["0.0.0.0/0"],
  });
  const info = await (await call("GET", `/sandboxes/${id}`)).json();
  assert.deepEqual(info.network, { allowOut: ["198.18.0.2/32"], denyOut: ["0.0.0.0/0"] });
  // Omitting a list clears it (E2B's); allowInternetAccess: false denies every address.
  assert.equal((await put(id, {})).status, 204);
  assert.deepEqual(executor.egressRulesOf(id), { allowOut: [], denyOut: [] });
  assert.equal(
    (await put(id, { allow_internet_access: false, allowOut: ["1.1.1.1"] })).status,
    204,
  );
  assert.deepEqual(executor.egressRulesOf(id), {
    allowOut: ["1.1.1.1/32"],
    denyOut: ["0.0.0.0/0"],
  });
  assert.equal(executor.egressHistoryOf(id).length, 4, "each PUT replaced the set once, whole");
  assert.equal(
    (await put(id, {
      allowOut: ["1.1.1.1", "*.Allowed.test"],
      denyOut: ["0.0.0.0/0"],
      rules: { "api.allowed.test": [{ transform: { headers: { "X-Key": "s3cret" } } }] },
    })).status,
    204,
  );
  assert.deepEqual(executor.egressRulesOf(id), {
    allowOut: ["1.1.1.1/32"],
    denyOut: ["0.0.0.0/0"],
    allowDomains: ["*.allowed.test"],
    transforms: { "api.allowed.test": [{ headers: { "X-Key": "s3cret" } }] },
  });
  const named = await (await call("GET", `/sandboxes/${id}`)).json();
  assert.deepEqual(named.network, {
    allowOut: ["1.1.1.1/32", "*.allowed.test"],
    denyOut: ["0.0.0.0/0"],
    rules: { "api.allowed.test": [{ transform: { headers: { "X-Key": "***" } } }] },
  });
  assert.equal(
    (await put(id, { allow_internet_access: false, allowOut: ["1.1.1.1"] })).status,
    204,
  );

  const refusals: [object, RegExp][] = [
    [{ denyOut: ["10.0.0.0/40"] }, /^'denyOut\[0\]' '10\.0\.0\.0\/40' has a prefix length/],
    [{ allowOut: ["localhost"] }, /^'allowOut\[0\]' 'localhost' is a single-label name/],
    [
      { rules: { "a.com": [{ transform: { headers: { Host: "b" } } }] } },
      /^'rules\.a\.com\[0\]\.transform\.headers' names 'Host'/,
    ],
    [{ egressProxy: { address: "p:1080" } }, /^'egressProxy' is not supported/],
    [{ allowInternetAccess: true, denyOut: ["0.0.0.0/0"] }, /disagree/],
    [{ somethingNew: 1 }, /somethingNew/],
  ];
  for (const [body, pattern] of refusals) {
    const res = await put(id, body);
    assert.equal(res.status, 400, JSON.stringify(body));
    const answer = await res.json();
    assert.equal(answer.code, 400);
    assert.match(answer.message, pattern);
  }
  assert.deepEqual(executor.egressRulesOf(id), {
    allowOut: ["1.1.1.1/32"],
    denyOut: ["0.0.0.0/0"],
  });

  // Without egress there is no route for rules to open: a 409 saying how to create it.
  const closed = await create({});
  const noRoute = await put(closed, { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] });
  assert.equal(noRoute.status, 409);
  assert.match((await noRoute.json()).message, /was made without egress/);
  assert.equal(executor.egressRulesOf(closed), undefined);
  assert.equal((await put("nope", {})).status, 404);
  // Destroyed with its sandbox.
  assert.equal((await call("DELETE", `/sandboxes/${id}`)).status, 204);
  assert.equal(executor.egressRulesOf(id), undefined);
  await executor.close();
});

Deno.test("a node whose executor cannot enforce rules refuses a create asking for them, and their update", async () => {
  const executor = new FakeExecutor({ egressRules: false });
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const app = createE2bApi(new SandboxService({ ledger, executor }), { apiToken });
  const call = (method: string, path: string, body: unknown) =>
    app.request(path, {
      method,
      headers: { "content-type": "application/json", "x-api-key": apiToken },
      body: JSON.stringify(body),
    });
  const ruled = await call("POST", "/v2/sandboxes", {
    templateID: "base",
    network: { allowOut: ["1.1.1.1"], denyOut: ["0.0.0.0/0"] },
  });
  assert.equal(ruled.status, 400);
  assert.match((await ruled.json()).message, /cannot enforce egress address rules/);
  const open = await call("POST", "/v2/sandboxes", {
    templateID: "base",
    allowInternetAccess: true,
  });
  const { sandboxID } = await open.json();
  const update = await call("PUT", `/sandboxes/${sandboxID}/network`, { denyOut: ["8.8.8.8"] });
  assert.equal(update.status, 409);
  assert.match((await update.json()).message, /cannot enforce egress address rules/);
  assert.deepEqual((await executor.capabilities()).egressRules, false);
  await executor.close();
});

Deno.test("routes not built yet answer 501 {code, message}; about a missing sandbox, 404", async () => {
  const { call, executor } = setup();
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", { templateID: "base" })).json();
  const routes = (_id: string) => [
    // Deleting a template (an id that is not a snapshot's) is not built; snapshots are.
    ["DELETE", `/templates/base`],
  ];
  for (const [method, path] of routes(sandboxID)) {
    const res = await call(method, path, method === "GET" ? undefined : {});
    assert.equal(res.status, 501, `${method} ${path}`);
    const body = await res.json();
    assert.equal(body.code, 501);
    assert.ok(body.message.length > 30, body.message);
  }
  // A route about a killed sandbox would be E2B's not-found; a template's stays a 501.
  assert.equal((await call("DELETE", `/sandboxes/${sandboxID}`)).status, 204);
  for (const [method, path] of routes(sandboxID)) {
    const res = await call(method, path, method === "GET" ? undefined : {});
    const expected = path.startsWith("/sandboxes/") ? 404 : 501;
    assert.equal(res.status, expected, `${method} ${path}`);
    assert.equal((await res.json()).code, expected);
  }
  await executor.close();
});

Deno.test("GET /sandboxes/{id}/metrics answers the history within start and end", async () => {
  const { call, clock, service, executor } = setup();
  const t0 = clock.now();
  const { sandboxID } = await (await call("POST", "/v2/sandboxes", { templateID: "base" })).json();
  const metrics = async (query = "") => {
    const res = await call("GET", `/sandboxes/${sandboxID}/metrics${query}`);
    assert.equal(res.status, 200, query);
    return (await res.json()).map((m: { timestampUnix: number }) => m.timestampUnix - t0 / 1000);
  };
  // The first read samples a sandbox the sampler has not reached yet.
  assert.deepEqual(await metrics(), [0]);
  for (let i = 0; i < 3; i++) {
    clock.tick(5_000);
    service.history.add(sandboxID, await executor.stats(sandboxID));
  }
  assert.deepEqual(await metrics(), [0, 5, 10, 15]);
  const s = (offset: number) => t0 / 1000 + offset;
  assert.deepEqual(await metrics(`?start=${s(5)}&end=${s(10)}`), [5, 10]);
  assert.deepEqual(await metrics(`?start=${s(11)}`), [15]);
  assert.deepEqual(await metrics(`?end=${s(4)}`), [0]);
  assert.deepEqual(await metrics(`?start=${s(-3600)}&end=${s(-1800)}`), []);
  // Paused: what it did while running stays, and reading neither wakes nor samples it.
  await (await call("POST", `/sandboxes/${sandboxID}/pause`, {})).body?.cancel();
  clock.tick(5_000);
  assert.deepEqual(await metrics(), [0, 5, 10, 15]);
  assert.equal(service.get({ id: sandboxID })?.state, "frozen");
  for (const bad of ["?start=abc", "?start=-1", `?start=${s(10)}&end=${s(5)}`]) {
    const res = await call("GET", `/sandboxes/${sandboxID}/metrics${bad}`);
    assert.equal(res.status, 400, bad);
    assert.match((await res.json()).message, /'start'|'end'/);
  }
  await call("DELETE", `/sandboxes/${sandboxID}`);
  assert.deepEqual(service.history.ids(), [], "dropped at destroy");
  await executor.close();
});

Deno.test("GET /sandboxes/metrics answers each known id's newest sample, at most 100 ids", async () => {
  const { call, executor } = setup();
  const ids: string[] = [];
  for (let i = 0; i < 2; i++) {
    ids.push(
      (await (await call("POST", "/v2/sandboxes", { templateID: "base" })).json()).sandboxID,
    );
  }
  const res = await call("GET", `/sandboxes/metrics?sandbox_ids=${ids.join(",")},sbx_unknown`);
  assert.equal(res.status, 200);
  const { sandboxes } = await res.json();
  assert.deepEqual(Object.keys(sandboxes).sort(), [...ids].sort());
  assert.equal(sandboxes[ids[0]].cpuCount, 1);
  const many = Array.from({ length: 101 }, (_, i) => `sbx_${i}`).join(",");
  const tooMany = await call("GET", `/sandboxes/metrics?sandbox_ids=${many}`);
  assert.equal(tooMany.status, 400);
  assert.match((await tooMany.json()).message, /at most 100/);
  const none = await call("GET", "/sandboxes/metrics");
  assert.equal(none.status, 400);
  assert.match((await none.json()).message, /'sandbox_ids' is required/);
  await executor.close();
});

Deno.test("GET /v2/sandboxes filters by template and startedAfter, orders, and counts running", async () => {
  const { clock, executor } = setup();
  // A second template, as DORMICE_TEMPLATES would name it.
  const multi = new FakeExecutor({ clock, templates: ["base", "python"] });
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const ops = new SandboxService({ ledger, executor: multi, clock });
  const app = createE2bApi(ops, { apiToken, clock });
  const call = (method: string, path: string, body?: unknown) =>
    app.request(path, {
      method,
      headers: { "content-type": "application/json", "x-api-key": apiToken },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  const ids: string[] = [];
  for (const template of ["base", "python", "python", "base"]) {
    clock.tick(1000);
    ids.push(
      (await (await call("POST", "/v2/sandboxes", { templateID: template })).json()).sandboxID,
    );
  }
  await (await call("POST", `/sandboxes/${ids[2]}/pause`, {})).body?.cancel();
  const list = async (query: string) => {
    const res = await call("GET", `/v2/sandboxes?${query}`);
    assert.equal(res.status, 200, query);
    return {
      ids: (await res.json()).map((s: { sandboxID: string }) => s.sandboxID),
      total: res.headers.get("x-total-running"),
      next: res.headers.get("x-next-token"),
    };
  };
  assert.deepEqual((await list("template=python&order=asc")).ids, [ids[1], ids[2]]);
  const after = new Date(Date.parse(ops.get({ id: ids[1] })!.createdAt)).toISOString();
  assert.deepEqual((await list(`startedAfter=${after}&order=asc`)).ids, ids.slice(1));
  assert.deepEqual((await list("order=desc")).ids, [...ids].reverse());
  // Counted before paging and before the cursor: every page says the same.
  const first = await list("limit=1&order=asc");
  assert.deepEqual([first.ids, first.total], [[ids[0]], "3"]);
  const second = await list(`limit=1&order=asc&nextToken=${first.next}`);
  assert.deepEqual([second.ids, second.total], [[ids[1]], "3"]);
  assert.equal((await list("state=paused")).total, null, "only when running ones were asked");
  assert.equal((await list("template=python")).total, "1");
  const bad = await call("GET", "/v2/sandboxes?startedAfter=yesterday");
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).message, /'startedAfter'/);
  await multi.close();
  await executor.close();
});

Deno.test("create refuses metadata past 64 keys or 16 KiB and env past 1,000 vars or 256 KiB", async () => {
  const { call, service, executor } = setup();
  const many = (n: number, value = "v") =>
    Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, value]));
  const cases: [string, unknown, RegExp][] = [
    ["65 metadata keys", { metadata: many(65) }, /'metadata'.*holds 65 keys.*at most 64 keys/],
    ["17 KiB of metadata", { metadata: many(5, "x".repeat(3500)) }, /at most 64 keys of 16 KiB/],
    ["1,001 env vars", { envVars: many(1001) }, /'envVars'.*holds 1001 variables.*at most 1000/],
    ["257 KiB of env", { envVars: many(2, "x".repeat(132_000)) }, /of 256 KiB/],
  ];
  for (const [label, extra, message] of cases) {
    const res = await call("POST", "/sandboxes", { templateID: "base", ...extra as object });
    assert.equal(res.status, 400, label);
    const body = await res.json();
    assert.equal(body.code, 400, label);
    assert.match(body.message, message, label);
  }
  assert.equal(service.list().length, 0);
  // At the limits, a create goes through.
  const ok = await call("POST", "/sandboxes", {
    templateID: "base",
    metadata: many(64),
    envVars: many(1000),
  });
  assert.equal(ok.status, 201, await ok.clone().text());
  await ok.body?.cancel();
  await executor.close();
});

Deno.test("GET /sandboxes reads the ledger a page at a time, letting the event loop run between", async () => {
  const { call, ledger, executor } = setup();
  for (let i = 0; i < 1200; i++) {
    ledger.insert({
      id: `sbx${String(i).padStart(5, "0")}`,
      name: `s${i}`,
      state: "active",
      template: "base",
      metadata: {},
      spec: {},
      env: {},
      createdAt: 1_800_000_000_000 + i,
      deadlineAt: null,
      deadlineAction: null,
    });
  }
  // A timer due now runs before the answer only if the listing let the loop run.
  let ranBefore = false;
  let answered = false;
  setTimeout(() => ranBefore = !answered, 0);
  for (const path of ["/sandboxes", "/v2/sandboxes?limit=1000"]) {
    const res = await call("GET", path);
    answered = true;
    assert.equal(res.status, 200);
    assert.equal((await res.json()).length, path === "/sandboxes" ? 1200 : 1000);
  }
  assert.ok(ranBefore, "the listing held the event loop until it answered");
  await executor.close();
});
