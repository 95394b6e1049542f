/**
 * A small fleet for the operator's-view tests: a gateway and two fake-executor nodes as real
 * processes on loopback, checking in and scanning deadlines every second, and ways to talk to it.
 *
 * @module
 */
import assert from "node:assert/strict";
import { newToken, type NodeProcess, startNode } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { type Exposition, parsePrometheus } from "./_prometheus.ts";

/** Waits `ms`. */
export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` every 100 ms until it holds or `ms` passes. */
export async function until(what: string, check: () => Promise<boolean> | boolean, ms = 15_000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await check()) return;
    await sleep(100);
  }
  throw new Error(`Gave up waiting ${ms} ms for ${what}`);
}

/** Scrapes `<url>/metrics` with the fleet token and parses it. */
export async function scrape(
  url: string,
  token: string,
): Promise<{ text: string; exposition: Exposition }> {
  const res = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${token}` } });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  assert.match(res.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
  return { text, exposition: parsePrometheus(text) };
}

/** Starts a gateway and two fake-executor nodes checking in every second, all up. */
export async function fleet(env: Record<string, string> = {}) {
  const token = newToken();
  // Other suites load this machine's two cores: a CPU limit would refuse placements at random.
  const gateway = await startGateway({
    token,
    env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100", ...env },
  });
  const nodes: NodeProcess[] = [];
  for (const id of ["node-a", "node-b"]) {
    nodes.push(
      await startNode({
        token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: gateway.url,
          DORMICE_NODE_ID: id,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
          DORMICE_SCAN_INTERVAL_SECONDS: "1",
        },
      }),
    );
  }
  await until("both nodes up", async () => {
    const { body } = await gateway.json("listNodes");
    return body.nodes?.filter((n: { state: string }) => n.state === "up").length === 2;
  });
  return {
    token,
    gateway,
    nodes,
    async stop() {
      await Promise.all([gateway.stop(), ...nodes.map((n) => n.stop())]);
    },
  };
}

/** Calls the gateway's E2B control plane with the fleet token. */
export function e2b(gateway: GatewayProcess, method: string, path: string, body?: unknown) {
  return fetch(`${gateway.url}/e2b/api${path}`, {
    method,
    headers: { "x-api-key": gateway.token, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
}
