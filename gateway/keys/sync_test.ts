import assert from "node:assert/strict";
import { EtcdClient } from "../etcd/client.ts";
import { ApiKeys } from "./keys.ts";
import { KeySync } from "./sync.ts";
import { callerCheck } from "./auth.ts";
import { FakeClock } from "../../shared/clock.ts";
import type { HttpError } from "../../shared/http_error.ts";
import { buildGateway } from "../app.ts";
import { plainArgs } from "../../shared/_fetch_fixtures_test.ts";

/**
 * An etcd of one map, over the calls KeySync makes (range by prefix, put, deleterange), that can
 * be cut off (`down`: connections refused).
 */
function memoryEtcd() {
  const kv = new Map<string, string>();
  const state = { down: false };
  const fetch = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    if (state.down) throw new TypeError("connection refused");
    ({ url: input, init } = await plainArgs(input, init));
    const path = new URL(String(input)).pathname;
    const body = JSON.parse(String(init?.body ?? "{}"));
    const key = atob(body.key ?? "");
    if (path === "/v3/kv/put") {
      kv.set(key, atob(body.value));
      return Promise.resolve(Response.json({ header: { revision: "1" } }));
    }
    if (path === "/v3/kv/deleterange") {
      const had = kv.delete(key);
      return Promise.resolve(Response.json({ deleted: had ? "1" : "0" }));
    }
    if (path === "/v3/kv/range") {
      const kvs = [...kv].filter(([k]) => body.range_end ? k.startsWith(key) : k === key)
        .map(([k, v]) => ({ key: btoa(k), value: btoa(v) }));
      return Promise.resolve(Response.json({ kvs }));
    }
    return Promise.resolve(new Response("unknown", { status: 404 }));
  };
  return { state, fetch, client: new EtcdClient({ endpoints: ["http://etcd"], fetch }) };
}

/** One gateway's key table kept in step with the shared etcd. */
function gateway(client: EtcdClient, clock: FakeClock) {
  const keys = new ApiKeys({ clock });
  const sync = new KeySync({ client, prefix: "/t/", keys, clock, staleAfterMs: 5000 });
  return { keys, sync };
}

Deno.test("KeySync.revoke() goes to etcd: a key minted through another gateway a moment ago is revoked, not a 404", async () => {
  const clock = new FakeClock();
  const { client } = memoryEtcd();
  const a = gateway(client, clock);
  const b = gateway(client, clock);
  try {
    await a.sync.syncOnce();
    await b.sync.syncOnce();
    const minted = await a.sync.create({ team: "acme" });
    // B has not read the table since the mint: the key is not in its copy yet.
    assert.equal(b.keys.record(minted.id), undefined, "precondition: B has not heard of the key");
    await b.sync.revoke(minted.id);
    await a.sync.syncOnce();
    assert.equal(
      a.keys.verify(minted.key),
      undefined,
      "the key still works on the gateway that minted it",
    );
    // An id etcd does not hold is still the 404 that names it.
    await assert.rejects(
      b.sync.revoke("key_00000000"),
      (e: HttpError) => e.status === 404 && /No API key with id 'key_00000000'/.test(e.message),
    );
  } finally {
    a.keys.close();
    b.keys.close();
  }
});

Deno.test("KeySync.unconfirmed(): a copy older than staleAfterMs refuses every key with a 503 naming etcd", async () => {
  const clock = new FakeClock();
  const { state, client } = memoryEtcd();
  const a = gateway(client, clock);
  const token = "t".repeat(32);
  const identify = callerCheck(token, a.keys, a.sync.unconfirmed);
  try {
    await a.sync.syncOnce();
    const minted = await a.sync.create({ team: "acme" });
    assert.equal(identify(minted.key)?.kind, "key");

    // etcd goes away: the copy is trusted up to the bound, then no key is.
    state.down = true;
    clock.tick(3000);
    await a.sync.syncOnce();
    assert.equal(identify(minted.key)?.kind, "key", "refused before the bound");
    clock.tick(2001);
    assert.throws(
      () => identify(minted.key),
      (e: HttpError) =>
        e.status === 503 && /cannot confirm API keys/.test(e.message) &&
        /ECONNREFUSED/.test(e.message) && /DORMICE_GATEWAY_ETCD/.test(e.message),
    );
    // The fleet token is no key: the operator still gets in.
    assert.equal(identify(token)?.kind, "operator");

    // One read that succeeds trusts the copy again.
    state.down = false;
    await a.sync.syncOnce();
    assert.equal(identify(minted.key)?.kind, "key");
  } finally {
    a.keys.close();
  }
});

Deno.test("createGateway({ etcd }): an unconfirmed key is each face's 503, in its dialect", async () => {
  const clock = new FakeClock();
  const { state, fetch } = memoryEtcd();
  const token = "t".repeat(32);
  const gateway = buildGateway({
    token,
    clock,
    etcd: { endpoints: ["http://etcd"], fetch, pollMs: 60_000 },
  });
  const call = (path: string, headers: Record<string, string>, body: unknown) =>
    gateway.fetch(
      new Request(`http://gw${path}`, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: JSON.stringify(body),
      }),
    );
  try {
    await gateway.shared!.keySync.syncOnce();
    const minted = await (await call("/createApiKey", { authorization: `Bearer ${token}` }, {
      team: "acme",
    })).json();
    assert.match(minted.key, /^e2b_/);
    state.down = true;
    clock.tick(6000);
    const native = await call("/execCommand", { authorization: `Bearer ${minted.key}` }, {
      name: "a",
      command: "true",
    });
    assert.equal(native.status, 503);
    assert.match((await native.json()).message, /cannot confirm API keys/);
    const e2b = await call("/e2b/api/sandboxes", { "x-api-key": minted.key }, {
      templateID: "base",
    });
    assert.equal(e2b.status, 503);
    const answer = await e2b.json();
    assert.equal(answer.code, 503);
    assert.match(answer.message, /cannot confirm API keys/);
  } finally {
    await gateway.shared!.close();
    gateway.close();
  }
});
