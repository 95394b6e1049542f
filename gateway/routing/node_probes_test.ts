import assert from "node:assert/strict";
import { NodeProbes } from "./node_probes.ts";
import type { FleetNode } from "../fleet/node.ts";

function node(id: string, endpoint: string): FleetNode {
  return { id, endpoint } as FleetNode;
}

/** Lets the probe's fetch settle (promise turns, no timer). */
async function settle() {
  for (let i = 0; i < 5; i++) await Promise.resolve();
}

Deno.test("NodeProbes.failure() probes /healthz, says why it failed, and re-asks only when stale", async () => {
  let now = 0;
  const asked: string[] = [];
  let answer: "refuse" | "ok" = "refuse";
  const probes = new NodeProbes({
    now: () => now,
    freshMs: 5000,
    fetch: ((url: string) => {
      asked.push(url);
      return answer === "ok"
        ? Promise.resolve(new Response("ok"))
        : Promise.reject(new TypeError("tcp connect error: Connection refused (os error 111)"));
    }) as typeof fetch,
  });
  const a = node("a", "http://10.0.0.1:3676");
  assert.equal(probes.failure(a), undefined, "no probe has ended yet");
  assert.deepEqual(asked, ["http://10.0.0.1:3676/healthz"]);
  await settle();
  assert.match(probes.failure(a)!, /refused/i);
  assert.equal(asked.length, 1, "fresh: not asked again");
  now += 5001;
  answer = "ok";
  assert.match(probes.failure(a)!, /refused/i, "the old verdict stands until the new one");
  await settle();
  assert.equal(probes.failure(a), undefined);
  assert.equal(asked.length, 2);
  // Another endpoint is another node: its verdict starts over.
  answer = "refuse";
  assert.equal(probes.failure(node("a", "http://10.0.0.9:3676")), undefined);
  assert.equal(asked.at(-1), "http://10.0.0.9:3676/healthz");
  probes.forget("a");
  assert.equal(probes.size, 0);
});

Deno.test("NodeProbes.failure() names the bound when a node never answers", async () => {
  const bound = new AbortController();
  const probes = new NodeProbes({
    now: () => 0,
    timeoutMs: 2000,
    timeout: () => bound.signal,
    fetch: ((_url: string, init?: RequestInit) =>
      new Promise((_, reject) => {
        init!.signal!.addEventListener("abort", () => reject(init!.signal!.reason));
      })) as typeof fetch,
  });
  const a = node("a", "http://10.0.0.1:3676");
  probes.failure(a);
  await settle();
  assert.equal(probes.failure(a), undefined, "still waiting");
  bound.abort(new DOMException("timed out", "TimeoutError"));
  await settle();
  assert.equal(probes.failure(a), "no answer to a health check within 2000 ms");
});

Deno.test("NodeProbes keeps at most maxNodes, letting the oldest go", () => {
  const probes = new NodeProbes({
    now: () => 0,
    maxNodes: 2,
    fetch: (() => Promise.resolve(new Response("ok"))) as typeof fetch,
  });
  for (const id of ["a", "b", "c"]) probes.failure(node(id, `http://${id}:1`));
  assert.equal(probes.size, 2);
});
