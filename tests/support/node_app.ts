/**
 * A node app in process, for the node's unit tests and the benchmarks' port node: an in-memory
 * ledger, the fake executor, no gateway, and a host reading that never changes, so only what a
 * caller sets differs between them.
 *
 * @module
 */
import {
  buildNode,
  type BuiltNode,
  type NodeAppConfig,
  type NodeAppOptions,
} from "../../node/app.ts";
import type { HostSampler } from "../../node/host_reading.ts";
import { Ledger } from "../../node/ledger.ts";

/** Two cores, 4 GB of memory with half free, no swap, no data disk reading. */
export const steadySampler: HostSampler = {
  cpuCount: () => 2,
  cpuTimes: () => null,
  memory: () => ({
    memoryTotalBytes: 4e9,
    memoryAvailableBytes: 2e9,
    swapTotalBytes: 0,
    swapFreeBytes: 0,
  }),
  dataDisk: () => null,
};

/** What a test sets: the token and endpoint always, anything else of the config or options. */
export interface TestNodeOptions extends Omit<NodeAppOptions, "config" | "ledger"> {
  token: string;
  endpoint: string;
  config?: Partial<NodeAppConfig>;
}

/** A standalone node app (node-1, 15 s check-ins, 60 s scans) with an in-memory ledger. */
export function testNodeApp(options: TestNodeOptions): BuiltNode {
  const { token, endpoint, config, ...rest } = options;
  const nodeId = config?.nodeId ?? "node-1";
  return buildNode({
    ...rest,
    config: {
      apiToken: token,
      dataDir: "/nonexistent",
      nodeId,
      nodeEndpoint: endpoint,
      gatewayEndpoint: null,
      checkInIntervalSeconds: 15,
      scanIntervalSeconds: 60,
      ...config,
    },
    ledger: Ledger.inMemory({ nodeId, endpoint }),
  });
}
