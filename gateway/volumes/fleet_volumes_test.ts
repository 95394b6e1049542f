import assert from "node:assert/strict";
import { buildGateway } from "../app.ts";
import { checkIn, reading } from "../_fixtures_test.ts";
import { placementFilters } from "../placer/filters.ts";
import type { FilterInput } from "../placer/filters.ts";
import type { FleetNode } from "../fleet/node.ts";
import { FakeClock } from "../../shared/clock.ts";
import { DatabaseSync } from "node:sqlite";
import { VolumeTable } from "./table.ts";

const token = "gateway-volume-unit-test-token-0123456789abcdef";
const headers = { "x-api-key": token, "content-type": "application/json" };

/** A gateway with two nodes that checked in and whose calls are answered by `handle`. */
function fleet(
  handle: (request: Request) => Response | Promise<Response> = () =>
    new Response("{}", { status: 500 }),
  clock: FakeClock = new FakeClock(),
) {
  const gateway = buildGateway({
    token,
    clock,
    timers: clock,
    fetch: (input: RequestInfo | URL, init?: RequestInit) =>
      Promise.resolve(handle(new Request(input, init))),
  });
  gateway.fleet.checkIn(checkIn("node-a", "http://10.0.0.1:3676"));
  gateway.fleet.checkIn(checkIn("node-b", "http://10.0.0.2:3676"));
  return gateway;
}

async function addVolume(
  gateway: ReturnType<typeof fleet>,
  id: string,
  name: string,
  node: string,
  state: "ready" | "moving" | "deleting" = "ready",
) {
  await gateway.volumes!.table.reserve({ id, team: "default", name, node });
  await gateway.volumes!.table.update(id, { state, sizeBytes: 1e9 });
}

const create = (gateway: ReturnType<typeof fleet>, mounts: { name: string; path: string }[]) =>
  gateway.fetch(
    new Request("http://gw/e2b/api/v2/sandboxes", {
      method: "POST",
      headers,
      body: JSON.stringify({ templateID: "base", volumeMounts: mounts }),
    }),
  );

Deno.test("FleetVolumes: a volume being moved refuses mounts and its content with a 409 saying so", async () => {
  await using gateway = fleet();
  const id = "vol-0000000000000000000a";
  await addVolume(gateway, id, "data", "node-a", "moving");
  const res = await create(gateway, [{ name: "data", path: "/data" }]);
  const body = await res.json();
  assert.equal(res.status, 409);
  assert.match(body.message, /Cannot mount volume 'data' .*being moved to another node/);
  const content = await gateway.fetch(
    new Request(`http://gw/e2b/api/volumecontent/${id}/file?path=/a`, {
      headers: { authorization: `Bearer ${await gateway.volumes!.token(id)}` },
    }),
  );
  assert.equal(content.status, 409);
  assert.match((await content.json()).message, /being moved/);
});

Deno.test("FleetVolumes: local volumes on two nodes in one create are a 409 naming both", async () => {
  await using gateway = fleet();
  await addVolume(gateway, "vol-0000000000000000000a", "one", "node-a");
  await addVolume(gateway, "vol-0000000000000000000b", "two", "node-b");
  const res = await create(gateway, [
    { name: "one", path: "/one" },
    { name: "two", path: "/two" },
  ]);
  const body = await res.json();
  assert.equal(res.status, 409);
  assert.match(
    body.message,
    /'one' \(node node-a\), 'two' \(node node-b\) live on different nodes/,
  );
});

Deno.test("FleetVolumes: a delete while a create mounting the volume is in flight is a 409", async () => {
  await using gateway = fleet();
  const id = "vol-0000000000000000000a";
  await addVolume(gateway, id, "data", "node-a");
  const mounts = (await gateway.volumes!.mountsOf(
    { volumeMounts: [{ name: "data", path: "/d" }] },
    "default",
  ))!;
  assert.deepEqual(mounts.node, "node-a");
  await assert.rejects(
    gateway.volumes!.destroy(id, undefined, new AbortController().signal),
    /1 sandbox create\(s\) mounting it are in flight/,
  );
  mounts.release();
  mounts.release();
  // Released (twice is once): the delete reaches the node, whose 409 names the mounting sandbox.
  await gateway.volumes!.destroy(id, undefined, new AbortController().signal).then(
    () => assert.fail("the stub node refuses"),
    (e) => assert.doesNotMatch(e.message, /in flight/),
  );
  assert.equal(
    (await gateway.volumes!.table.get(id))?.state,
    "ready",
    "a failed delete leaves it ready",
  );
});

Deno.test("FleetVolumes: a volume whose node is down is a 503 naming the node", async () => {
  const clock = new FakeClock();
  await using gateway = fleet(undefined, clock);
  const id = "vol-0000000000000000000a";
  await addVolume(gateway, id, "data", "node-a");
  clock.tick(60_000);
  const auth = { authorization: `Bearer ${await gateway.volumes!.token(id)}` };
  const content = await gateway.fetch(
    new Request(`http://gw/e2b/api/volumecontent/${id}/file?path=/a`, { headers: auth }),
  );
  assert.equal(content.status, 503);
  assert.match((await content.json()).message, /lives on node 'node-a', which is down/);
  const res = await create(gateway, [{ name: "data", path: "/data" }]);
  assert.equal(res.status, 503);
  assert.match((await res.json()).message, /node 'node-a', which is down/);
});

Deno.test("placementFilters: volumeNode admits only that node; volumeHolders pass without advertising", () => {
  const volume = placementFilters.find((f) => f.reason === "volume")!;
  const node = (id: string, volumes: string[] = []) =>
    ({ id, volumes, reading: reading() }) as unknown as FleetNode;
  const input = (n: FleetNode, ask: FilterInput["ask"]): FilterInput => ({
    node: n,
    now: 0,
    inFlight: 0,
    limits: { cpuLimitPct: 70, activeLimit: 400, minDiskBytes: 0 },
    down: false,
    ask,
  });
  const id = "vol-0000000000000000000a";
  // A moved volume's old node still advertises it: only the table's node takes the create.
  assert.match(
    volume.check(input(node("old", [id]), { volumes: [], volumeNode: "new" }))!,
    /they live on node 'new'/,
  );
  assert.equal(volume.check(input(node("new"), { volumes: [], volumeNode: "new" })), undefined);
  // A shared volume: its maker passes before it advertises; other nodes once they do.
  assert.equal(
    volume.check(input(node("maker"), { volumes: [id], volumeHolders: ["maker"] })),
    undefined,
  );
  assert.match(
    volume.check(input(node("other"), { volumes: [id], volumeHolders: ["maker"] }))!,
    /lacks volume/,
  );
  assert.equal(
    volume.check(input(node("other", [id]), { volumes: [id], volumeHolders: ["maker"] })),
    undefined,
  );
});

Deno.test("FleetVolumes: with a sandbox domain, api.<domain> serves the volume routes at the root", async () => {
  await using gateway = buildGateway({ token, sandboxDomain: "sbx.test" });
  const id = "vol-0000000000000000000a";
  await gateway.volumes!.table.reserve({ id, team: "default", name: "data", node: "node-a" });
  await gateway.volumes!.table.update(id, { state: "ready" });
  const list = await gateway.fetch(
    new Request("http://api.sbx.test/volumes", { headers: { "x-api-key": token } }),
  );
  assert.deepEqual(await list.json(), [{ volumeID: id, name: "data" }]);
  // The SDK's content requests go to https://api.<domain>/volumecontent/…: they reach the route
  // (here a 503, as node-a never checked in).
  const content = await gateway.fetch(
    new Request(`http://api.sbx.test/volumecontent/${id}/file?path=/a`, {
      headers: { authorization: `Bearer ${await gateway.volumes!.token(id)}` },
    }),
  );
  assert.equal(content.status, 503);
  assert.match((await content.json()).message, /node 'node-a', which is down/);
});

Deno.test("VolumeTable: a gateway started again frees the rows a stop left mid-move or mid-delete", async () => {
  const db = new DatabaseSync(":memory:");
  const first = new VolumeTable(db);
  for (const [id, state] of [["a", "moving"], ["b", "deleting"], ["c", "creating"]] as const) {
    const vid = `vol-000000000000000000${id}0`;
    await first.reserve({ id: vid, team: "t", name: id, node: "n" });
    if (state !== "creating") await first.update(vid, { state });
  }
  const again = new VolumeTable(db);
  assert.deepEqual((await again.list()).map((r) => [r.name, r.state]), [["a", "ready"], [
    "b",
    "ready",
  ]]);
});

Deno.test("moveVolume: the target's image is the cap the gateway recorded, whatever size the source's export claims", async () => {
  const asked: string[] = [];
  await using gateway = fleet(async (request) => {
    const url = new URL(request.url);
    if (url.pathname === "/volumeUsers") return Response.json({ present: true, sandboxes: [] });
    if (url.pathname === "/exportVolume") {
      // A source node that claims a cap of a petabyte (a sparse image that large on the target).
      return new Response(new Uint8Array(4), {
        headers: { "x-dormice-volume-size": String(2 ** 50) },
      });
    }
    if (url.pathname === "/importVolume") {
      asked.push(url.searchParams.get("sizeBytes")!);
      await request.body?.cancel();
      return Response.json({ id: url.searchParams.get("id"), bytes: 0 }, { status: 201 });
    }
    if (url.pathname === "/destroyVolume") return Response.json({ destroyed: true });
    return new Response("{}", { status: 404 });
  });
  const id = "vol-0000000000000000000m";
  await addVolume(gateway, id, "data", "node-a");
  const res = await gateway.fetch(
    new Request("http://gw/moveVolume", {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ volumeId: id, toNode: "node-b" }),
    }),
  );
  assert.equal(res.status, 200, await res.text());
  assert.deepEqual(asked, [String(1e9)]);
  assert.equal((await gateway.volumes!.table.get(id))?.node, "node-b");
});

Deno.test("FleetVolumes: a content request without the volume's own token reads nothing of the table", async () => {
  await using gateway = fleet();
  const id = "vol-0000000000000000000c";
  await addVolume(gateway, id, "data", "node-a");
  const table = gateway.volumes!.table;
  let reads = 0;
  const get = table.get.bind(table);
  table.get = (...args) => {
    reads++;
    return get(...args);
  };
  const content = (volume: string, authorization?: string) =>
    gateway.fetch(
      new Request(`http://gw/e2b/api/volumecontent/${volume}/file?path=/a`, {
        headers: authorization ? { authorization } : {},
      }),
    );
  const none = await content(id);
  assert.equal(none.status, 401);
  await none.body?.cancel();
  for (const volume of [id, "vol-0000000000000000000x"]) {
    const wrong = await content(volume, "Bearer not-its-token");
    assert.equal(wrong.status, 404);
    assert.match((await wrong.json()).message, /not found, or the token is not its own/);
  }
  assert.equal(reads, 0, "no table read for a request without the volume's token");
  // Its own token for a volume the table no longer holds: read, and the same 404.
  const gone = "vol-0000000000000000000g";
  const res = await content(gone, `Bearer ${await gateway.volumes!.token(gone)}`);
  assert.equal(res.status, 404);
  await res.body?.cancel();
  assert.equal(reads, 1);
});

Deno.test("FleetVolumes: a node out of loop devices makes the create a 503 quoting it, and no row", async () => {
  await using gateway = fleet((request) =>
    new URL(request.url).pathname === "/createVolume"
      ? Response.json({ code: 503, message: "No loop device is free on this node" }, {
        status: 503,
        headers: { "retry-after": "30" },
      })
      : new Response("{}", { status: 404 })
  );
  const res = await gateway.fetch(
    new Request("http://gw/e2b/api/volumes", {
      method: "POST",
      headers,
      body: JSON.stringify({ name: "data" }),
    }),
  );
  const body = await res.json();
  assert.equal(res.status, 503, JSON.stringify(body));
  assert.equal(res.headers.get("retry-after"), "30");
  assert.match(body.message, /No node could create volume 'data' now/);
  assert.match(body.message, /node 'node-a': No loop device is free/);
  assert.match(body.message, /node 'node-b': No loop device is free/);
  assert.deepEqual(await gateway.volumes!.table.list(undefined), []);
});

const postVolume = (gateway: ReturnType<typeof fleet>, name: string) =>
  gateway.fetch(
    new Request("http://gw/e2b/api/volumes", {
      method: "POST",
      headers,
      body: JSON.stringify({ name }),
    }),
  );

Deno.test("FleetVolumes: a create a node refuses for want of loop devices is made on the next node", async () => {
  const asked: string[] = [];
  await using gateway = fleet((request) => {
    const url = new URL(request.url);
    if (url.pathname !== "/createVolume") return new Response("{}", { status: 404 });
    asked.push(url.host);
    return url.host === "10.0.0.1:3676"
      ? Response.json({ code: 503, message: "No loop device is free on this node" }, {
        status: 503,
      })
      : Response.json({ id: "x", sizeBytes: 1e9, shared: false }, { status: 201 });
  });
  // node-a first: it has the most available disk.
  gateway.fleet.checkIn(checkIn("node-a", "http://10.0.0.1:3676", {
    reading: reading({
      dataDisk: { path: "/data", totalBytes: 1e13, usedBytes: 0, availableBytes: 9e12 },
    }),
  }));
  const res = await postVolume(gateway, "data");
  const body = await res.json();
  assert.equal(res.status, 201, JSON.stringify(body));
  assert.deepEqual(asked, ["10.0.0.1:3676", "10.0.0.2:3676"]);
  const rows = await gateway.volumes!.table.list(undefined);
  assert.deepEqual(rows.map((r) => [r.id, r.node, r.state]), [[body.volumeID, "node-b", "ready"]]);
});

Deno.test("FleetVolumes: a create asks at most three nodes out of loop devices, and stops at another error", async () => {
  const asked: string[] = [];
  await using gateway = fleet((request) => {
    const url = new URL(request.url);
    if (url.pathname !== "/createVolume") return new Response("{}", { status: 404 });
    asked.push(url.host);
    return url.host === "10.0.0.9:3676"
      ? Response.json({ code: 500, message: "mkfs failed" }, { status: 500 })
      : Response.json({ code: 503, message: "No loop device is free" }, { status: 503 });
  });
  for (let i = 3; i <= 6; i++) {
    gateway.fleet.checkIn(checkIn(`node-${i}`, `http://10.0.0.${i}:3676`));
  }
  const res = await postVolume(gateway, "data");
  assert.equal(res.status, 503);
  assert.match((await res.json()).message, /No node could create volume 'data'/);
  assert.equal(asked.length, 3, asked.join());
  // A node that fails otherwise is answered at once: it may have made part of the volume.
  asked.length = 0;
  gateway.fleet.checkIn(checkIn("node-9", "http://10.0.0.9:3676", {
    reading: reading({
      dataDisk: { path: "/data", totalBytes: 1e13, usedBytes: 0, availableBytes: 9e12 },
    }),
  }));
  const failed = await postVolume(gateway, "other");
  assert.equal(failed.status, 502);
  assert.match(
    (await failed.json()).message,
    /Node 'node-9' could not create volume 'other': mkfs failed/,
  );
  assert.deepEqual(asked, ["10.0.0.9:3676"]);
  assert.deepEqual(await gateway.volumes!.table.list(undefined), []);
});
