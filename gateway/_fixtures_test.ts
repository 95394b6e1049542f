// Test-only builders shared by the gateway's unit tests. Named *_test.ts so publishing
// excludes it; it holds no tests itself.
import type { CheckIn, HostReading } from "../shared/schemas.ts";
import type { Log, LogLevel } from "../shared/log.ts";

/** A reading with sensible defaults; override any field. */
export function reading(overrides: Partial<HostReading> & { active?: number } = {}): HostReading {
  const { active = 0, ...rest } = overrides;
  return {
    takenAt: 0,
    cpuCount: 4,
    cpuUsedPct: 10,
    memoryTotalBytes: 16e9,
    memoryAvailableBytes: 8e9,
    swapTotalBytes: 0,
    swapFreeBytes: 0,
    dataDisk: { path: "/data", totalBytes: 100e9, usedBytes: 20e9, availableBytes: 80e9 },
    sandboxes: { active, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
    ...rest,
  };
}

/** A check-in body for `nodeId` at `endpoint`. */
export function checkIn(
  nodeId: string,
  endpoint = `http://10.0.0.1:3676`,
  overrides: Partial<CheckIn> = {},
): CheckIn {
  return { nodeId, endpoint, intervalSeconds: 15, build: "test", reading: reading(), ...overrides };
}

/** A log that records its lines. */
export function recordingLog(): {
  log: Log;
  lines: { level: LogLevel; msg: string; fields: Record<string, unknown> }[];
} {
  const lines: { level: LogLevel; msg: string; fields: Record<string, unknown> }[] = [];
  return { log: (level, msg, fields = {}) => lines.push({ level, msg, fields }), lines };
}

/**
 * A `fetch` that hands each request to the in-process node serving its origin; any other origin
 * is refused the way a closed port is.
 */
export function fetchToNodes(
  nodes: ReadonlyMap<string, { handle(request: Request): Promise<Response> }>,
): typeof fetch {
  return ((input: RequestInfo | URL, init?: RequestInit) => {
    const request = new Request(input, init);
    const node = nodes.get(new URL(request.url).origin);
    if (!node) return Promise.reject(new TypeError("error sending request: Connection refused"));
    return node.handle(request);
  }) as typeof fetch;
}
