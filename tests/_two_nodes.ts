/**
 * What the E2B SDK exams share: the SDK's settings for a gateway, the node a sandbox runs on, and
 * a gateway in front of two nodes (fake or Docker, as the caller starts them) that waits until
 * both are up with a reading.
 */
import assert from "node:assert/strict";
import type { NodeProcess } from "./_processes.ts";
import { type GatewayProcess, startGateway } from "./_gateway.ts";
import { until } from "./_docker.ts";

/** The SDK's three settings for a gateway at `base` and a key. */
export function sdkOptions(
  base: string,
  apiKey: string,
): { apiUrl: string; sandboxUrl: string; apiKey: string } {
  return { apiUrl: `${base}/e2b/api`, sandboxUrl: `${base}/e2b/envd`, apiKey };
}

/** The node a sandbox runs on, as the control plane's `clientID` says. */
export async function nodeOf(
  opts: { apiUrl: string; apiKey: string },
  sandboxId: string,
): Promise<string> {
  const res = await fetch(`${opts.apiUrl}/sandboxes/${sandboxId}`, {
    headers: { "x-api-key": opts.apiKey },
  });
  assert.equal(res.status, 200);
  return (await res.json()).clientID;
}

/** A gateway and the two nodes in front of it. */
export interface TwoNodeFleet {
  gw: GatewayProcess;
  /** The nodes' ids, in the order they were started. */
  ids: string[];
  /** The nodes by id; a test that stops one for good deletes it here. */
  nodes: Map<string, NodeProcess>;
  /** Stops every node left in `nodes`, then the gateway. */
  stop(): Promise<void>;
}

/** A gateway and two nodes started by `startOne`, up with a reading. */
export async function startTwoNodeFleet(
  startOne: (gw: GatewayProcess, id: string) => Promise<NodeProcess>,
  ids: [string, string],
): Promise<TwoNodeFleet> {
  const gw = await startGateway({ env: { DORMICE_GATEWAY_NODE_CPU_LIMIT_PCT: "100" } });
  const nodes = new Map<string, NodeProcess>();
  const stop = async () => {
    await Promise.all([...nodes.values()].map((n) => n.stop()));
    await gw.stop();
  };
  try {
    for (const id of ids) nodes.set(id, await startOne(gw, id));
    await until("both nodes up with a reading at the gateway", async () => {
      const { body } = await gw.json("listNodes");
      return body.nodes.filter((n: { id: string; state: string; reading: unknown }) =>
        ids.includes(n.id) && n.state === "up" && n.reading !== null
      ).length === 2;
    });
  } catch (error) {
    await stop();
    throw error;
  }
  return { gw, ids, nodes, stop };
}
