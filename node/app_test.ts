import assert from "node:assert/strict";
import { testNodeApp } from "./_app_fixtures_test.ts";

const token = "node-app-test-token-0123456789abcdef";
const endpoint = "http://127.0.0.1:3676";

Deno.test("createNodeApp(): GET /metrics asks for the fleet token and answers it with Prometheus text", async () => {
  const node = testNodeApp({ token, endpoint });
  try {
    for (const headers of [{}, { authorization: "Bearer wrong-token" }] as HeadersInit[]) {
      const res = await node.fetch(new Request("http://node.test/metrics", { headers }));
      assert.equal(res.status, 401);
      assert.equal(res.headers.get("www-authenticate"), "Bearer");
      const { message } = await res.json();
      assert.match(message, /GET \/metrics takes the fleet token/);
      assert.match(message, /Authorization: Bearer <DORMICE_API_TOKEN>/);
    }
    const ok = await node.fetch(
      new Request("http://node.test/metrics", { headers: { authorization: `Bearer ${token}` } }),
    );
    assert.equal(ok.status, 200);
    assert.match(await ok.text(), /^# HELP dormice_node_/m);
  } finally {
    await node.close();
  }
});

Deno.test("createNodeApp(): an answer that changed the ledger names its change number, which readings carry", async () => {
  const node = testNodeApp({ token, endpoint });
  const post = (verb: string, body: unknown) =>
    node.fetch(
      new Request(`http://node.test/${verb}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
  try {
    const before = node.hostReader.read().ledgerSeq!;
    const made = await post("acquireSandbox", { name: "agent-1" });
    assert.equal(made.status, 200);
    await made.body?.cancel();
    const at = Number(made.headers.get("x-dormice-ledger-seq"));
    assert.ok(at > before, `the create's number ${at} follows ${before}`);
    // A reading taken now counts the create: its number is at least the answer's.
    const after = node.hostReader.read();
    assert.ok(after.ledgerSeq! >= at);
    assert.equal(after.teams?.default, 1);
    // An answer that changed nothing names no number.
    const looked = await post("lookupSandbox", { name: "agent-1" });
    await looked.body?.cancel();
    assert.equal(looked.headers.get("x-dormice-ledger-seq"), null);
    const gone = await post("destroySandbox", { name: "agent-1" });
    await gone.body?.cancel();
    assert.ok(
      Number(gone.headers.get("x-dormice-ledger-seq")) > at,
      "the destroy's number is later",
    );
  } finally {
    await node.close();
  }
});

Deno.test("createNodeApp(): await using stops a started node's loops and closes it (the sanitizers check)", async () => {
  let node;
  {
    await using started = testNodeApp({ token, endpoint });
    started.start();
    const res = await started.fetch(new Request("http://node.test/healthz"));
    assert.equal(res.status, 200);
    await res.body?.cancel();
    node = started;
  }
  const again = node.close();
  assert.equal(node.close(), again, "close() again is the same promise");
  await again;
  assert.throws(() => node.ledger.all(), "the ledger is closed");
});

Deno.test("createNodeApp(): DORMICE_SNAPSHOT_HEAL=off says heals: false in the check-in and serves no image", async () => {
  for (const snapshotHeal of [false, undefined]) {
    const bodies: Record<string, unknown>[] = [];
    const node = testNodeApp({
      token,
      endpoint,
      config: { gatewayEndpoint: "http://gateway.test", snapshotHeal },
      fetch: async (request) => {
        bodies.push(await request.json());
        return Response.json({ ok: true });
      },
    });
    try {
      await node.checkInNow();
      assert.equal(bodies.length, 1, "one check-in was posted");
      assert.equal(bodies[0].heals, snapshotHeal === false ? false : undefined);
      const res = await node.fetch(
        new Request("http://node.test/images/snap-aaaaaaaaaaaaaaaaaaaa", {
          headers: { authorization: `Bearer ${token}` },
        }),
      );
      const { message } = await res.json();
      if (snapshotHeal === false) {
        assert.equal(res.status, 503);
        assert.match(message, /DORMICE_SNAPSHOT_HEAL=off on this node/);
      } else assert.notEqual(res.status, 503, message);
    } finally {
      await node.close();
    }
  }
});

Deno.test("createNodeApp(): an E2B create that does not say allowInternetAccess gets egress only with e2bDefaultEgress", async () => {
  const e2b = (node: ReturnType<typeof testNodeApp>, method: string, path: string, body: unknown) =>
    node.fetch(
      new Request(`http://node.test/e2b/api${path}`, {
        method,
        headers: { "x-api-key": token, "content-type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
  const digests: string[] = [];
  for (const e2bDefaultEgress of [undefined, false, true]) {
    const node = testNodeApp({ token, endpoint, config: { e2bDefaultEgress } });
    try {
      digests.push(node.configDigest);
      const made = await e2b(node, "POST", "/sandboxes", { templateID: "base" });
      assert.equal(made.status, 201);
      const { sandboxID } = await made.json();
      const row = node.service.get({ id: sandboxID })!;
      assert.equal(row.spec.network, e2bDefaultEgress ? true : undefined, `${e2bDefaultEgress}`);
      // The ledger keeps what the create said (nothing), as getInfo reports it.
      assert.equal(row.e2b?.allowInternetAccess, undefined);
      // The SDK's "updateNetwork applies new egress rules": rules need a route out to open.
      const update = await e2b(node, "PUT", `/sandboxes/${sandboxID}/network`, {
        denyOut: ["8.8.8.8"],
      });
      assert.equal(update.status, e2bDefaultEgress ? 204 : 409, await update.text());
      // What a create says wins over the default, either way.
      for (const allowInternetAccess of [true, false]) {
        const said = await e2b(node, "POST", "/sandboxes", {
          templateID: "base",
          allowInternetAccess,
        });
        assert.equal(said.status, 201);
        const id = (await said.json()).sandboxID;
        assert.equal(
          node.service.get({ id })!.spec.network,
          allowInternetAccess ? true : undefined,
        );
      }
      // Native creates state their network: no default applies to them.
      const native = await node.fetch(
        new Request("http://node.test/acquireSandbox", {
          method: "POST",
          headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
          body: JSON.stringify({ name: "native-1" }),
        }),
      );
      assert.equal(native.status, 200);
      await native.body?.cancel();
      assert.equal(
        node.service.get({ name: "native-1", team: "default" })!.spec.network,
        undefined,
      );
    } finally {
      await node.close();
    }
  }
  // Part of the config digest when on, so a fleet that disagrees is reported; off (unset or
  // said) leaves the digest as it was.
  assert.equal(digests[0], digests[1]);
  assert.notEqual(digests[2], digests[0]);
});
