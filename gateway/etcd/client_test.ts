import assert from "node:assert/strict";
import { EtcdClient, EtcdRequestError, EtcdUnavailableError } from "./client.ts";
import { FakeClock } from "../../shared/clock.ts";

/**
 * A cluster whose members hang like followers without a leader (`down`: the call waits out its
 * bound), refuse connections, answer, or refuse the request itself (a 4xx).
 */
function cluster() {
  const state = { mode: "down" as "down" | "closed" | "up" | "refuses", asked: 0 };
  const fetch = (_input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    state.asked++;
    if (state.mode === "down") {
      return new Promise((_, reject) =>
        init!.signal!.addEventListener("abort", () => reject(init!.signal!.reason))
      );
    }
    if (state.mode === "closed") return Promise.reject(new TypeError("connection refused"));
    if (state.mode === "refuses") {
      return Promise.resolve(new Response("etcdserver: bad request", { status: 400 }));
    }
    return Promise.resolve(Response.json({ ok: true }));
  };
  return { state, fetch };
}

Deno.test("EtcdClient.call() answers at once while etcd is known unreachable, asking again once a probeEveryMs", async () => {
  const clock = new FakeClock();
  const { state, fetch } = cluster();
  const client = new EtcdClient({
    endpoints: ["http://m1", "http://m2"],
    timeoutMs: 100,
    fetch,
    clock,
    probeEveryMs: 1000,
  });
  await assert.rejects(client.call("/v3/kv/range", {}), EtcdUnavailableError);
  assert.ok(state.asked >= 1, "the first call asked no member");
  const asked = state.asked;
  assert.equal(client.unreachable, true);

  // Within the probe interval: no member is asked, and the answer says why.
  clock.tick(999);
  await assert.rejects(client.call("/v3/kv/put", {}), (error: Error) => {
    assert.ok(error instanceof EtcdUnavailableError);
    assert.match(error.message, /http:\/\/m\d: timeout: no answer in time/);
    assert.match(error.message, /not asked again: no member answered 999 ms ago/);
    return true;
  });
  assert.equal(state.asked, asked, "a call within the probe interval asked a member");

  // The next call after the interval probes; once answered, every call asks again.
  state.mode = "up";
  clock.tick(1);
  assert.deepEqual(await client.call("/v3/kv/range", {}), { ok: true });
  assert.equal(client.unreachable, false);
  assert.deepEqual(await client.call("/v3/kv/range", {}), { ok: true });
  assert.equal(state.asked, asked + 2);
});

Deno.test("EtcdClient.call(): members that refuse connections are asked again by every call", async () => {
  // Refused at once costs nothing to try again, and heals at once when etcd is back.
  const clock = new FakeClock();
  const { state, fetch } = cluster();
  state.mode = "closed";
  const client = new EtcdClient({ endpoints: ["http://m1"], fetch, clock });
  await assert.rejects(client.call("/v3/kv/range", {}), EtcdUnavailableError);
  assert.equal(client.unreachable, false);
  state.mode = "up";
  assert.deepEqual(await client.call("/v3/kv/range", {}), { ok: true });
  assert.equal(state.asked, 2);
});

Deno.test("EtcdClient.call(): a member that refuses the request itself says etcd is reachable", async () => {
  const clock = new FakeClock();
  const { state, fetch } = cluster();
  const client = new EtcdClient({ endpoints: ["http://m1"], timeoutMs: 100, fetch, clock });
  await assert.rejects(client.call("/v3/kv/range", {}), EtcdUnavailableError);
  assert.equal(client.unreachable, true);
  clock.tick(1000);
  state.mode = "refuses";
  await assert.rejects(client.call("/v3/kv/range", {}), EtcdRequestError);
  assert.equal(client.unreachable, false);
  state.mode = "up";
  assert.deepEqual(await client.call("/v3/kv/range", {}), { ok: true });
});
