import assert from "node:assert/strict";
import { createPlacementService } from "./embed_placer.ts";

const token = "embed-placer-test-token-0123456789abcdef";

function checkIn(nodeId: string, port: number, active: number) {
  return new Request("http://svc/checkIn", {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({
      nodeId,
      endpoint: `http://10.0.0.${port}:3676`,
      intervalSeconds: 15,
      build: "test",
      reading: {
        takenAt: 0,
        cpuCount: 4,
        cpuUsedPct: 10,
        memoryTotalBytes: 16e9,
        memoryAvailableBytes: 8e9,
        swapTotalBytes: 0,
        swapFreeBytes: 0,
        dataDisk: null,
        sandboxes: { active, frozen: 0, stopped: 0, archived: 0, restoring: 0 },
      },
    }),
  });
}

Deno.test("the embedded placer answers where a sandbox should go from the check-ins it received", async () => {
  const service = createPlacementService({ token });
  try {
    const empty = await service.app.request("/where?name=a");
    assert.equal(empty.status, 503);
    assert.match((await empty.json()).message, /No node has checked in/);

    assert.equal((await service.app.request(checkIn("busy", 1, 3))).status, 200);
    assert.equal((await service.app.request(checkIn("idle", 2, 0))).status, 200);
    const where = await (await service.app.request("/where?name=a")).json();
    assert.equal(where.nodeId, "idle");
    assert.equal(where.endpoint, "http://10.0.0.2:3676");
    assert.equal(where.explain.considered, 2);

    // Three placements on "idle" make it as loaded as "busy"; the fourth goes to "busy" (ties
    // by memory, then id: "busy" < "idle").
    for (const name of ["b", "c"]) {
      await (await service.app.request(`/where?name=${name}`)).body?.cancel();
    }
    assert.equal((await (await service.app.request("/where?name=d")).json()).nodeId, "busy");

    const unauthorized = await service.app.request(
      new Request("http://svc/checkIn", { method: "POST" }),
    );
    assert.equal(unauthorized.status, 401);
    await unauthorized.body?.cancel();
    assert.equal((await service.app.request("/jobs")).status, 200);
  } finally {
    service.close();
  }
});
