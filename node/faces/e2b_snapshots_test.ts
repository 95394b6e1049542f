/**
 * The node's E2B snapshot routes: create a snapshot, list (filters and paging), delete, create
 * from a snapshot by id or name, fork, team isolation and the data-disk floor.
 */
import assert from "node:assert/strict";
import { FakeClock } from "../../shared/clock.ts";
import type { HostReading } from "../../shared/schemas.ts";
import { createE2bApi } from "./e2b_api.ts";
import { ExecutorError } from "../executors/contract.ts";
import { FakeExecutor } from "../executors/fake.ts";
import { Ledger } from "../ledger.ts";
import { SandboxService } from "../service.ts";
import { NodeSnapshots } from "../snapshots.ts";

const apiToken = "fleet-token-0123456789abcdefghijklmnop";

function setup({ availableBytes }: { availableBytes?: number } = {}) {
  const clock = new FakeClock(1_800_000_000_000);
  const executor = new FakeExecutor({ clock, nodeId: "node-1" });
  const ledger = Ledger.inMemory({ nodeId: "node-1", endpoint: "http://127.0.0.1:3676" });
  const service = new SandboxService({ ledger, executor, clock });
  const hostReading = availableBytes === undefined ? undefined : () =>
    ({
      dataDisk: {
        path: "/var/lib/dormice",
        totalBytes: 10e9,
        usedBytes: 10e9 - availableBytes,
        availableBytes,
      },
    }) as unknown as HostReading;
  const snapshots = new NodeSnapshots({
    executor,
    service,
    queue: service.queue,
    minDiskBytes: 1e9,
    templates: async () => (await executor.capabilities()).templates,
    ...(hostReading ? { hostReading } : {}),
  });
  let n = 0;
  const app = createE2bApi(service, {
    apiToken,
    clock,
    randomName: () => `snap-test-${++n}`,
    snapshots,
  });
  const call = (method: string, path: string, body?: unknown, team?: string) =>
    app.request(path, {
      method,
      headers: {
        "content-type": "application/json",
        "x-api-key": apiToken,
        ...(team === undefined ? {} : { "x-dormice-team": team }),
      },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  const sandbox = async (team?: string) => {
    const res = await call("POST", "/v2/sandboxes", { templateID: "base" }, team);
    assert.equal(res.status, 201);
    return (await res.json()).sandboxID as string;
  };
  const read = (id: string, path: string) =>
    executor.readFile(id, path).then((b) => new TextDecoder().decode(b));
  const write = (id: string, path: string, text: string) =>
    executor.writeFile(id, path, new TextEncoder().encode(text));
  return { clock, executor, service, snapshots, call, sandbox, read, write };
}

Deno.test("POST /sandboxes/{id}/snapshots keeps the files; a create by id or name starts from them", async () => {
  const { call, sandbox, read, write, executor } = setup();
  const source = await sandbox("team-a");
  await write(source, "/home/user/state.txt", "before");
  const res = await call("POST", `/sandboxes/${source}/snapshots`, { name: "ready" }, "team-a");
  assert.equal(res.status, 201);
  const snap = await res.json();
  assert.match(snap.snapshotID, /^snap-[a-z0-9]{20}$/);
  assert.deepEqual(snap.names, ["ready"]);
  assert.equal(snap.sandboxID, source);
  await write(source, "/home/user/state.txt", "after");
  for (const templateID of [snap.snapshotID, "ready"]) {
    const made = await call("POST", "/v2/sandboxes", { templateID }, "team-a");
    assert.equal(made.status, 201, templateID);
    const body = await made.json();
    assert.equal(body.templateID, snap.snapshotID);
    assert.equal(await read(body.sandboxID, "/home/user/state.txt"), "before");
  }
  // The same name again is a new build of that snapshot (E2B): its id, the files as now.
  const again = await call("POST", `/sandboxes/${source}/snapshots`, { name: "ready" }, "team-a");
  assert.equal(again.status, 201);
  assert.equal((await again.json()).snapshotID, snap.snapshotID);
  const rebuilt = await call("POST", "/v2/sandboxes", { templateID: "ready" }, "team-a");
  assert.equal(rebuilt.status, 201);
  const rebuiltId = (await rebuilt.json()).sandboxID;
  assert.equal(await read(rebuiltId, "/home/user/state.txt"), "after");
  await write(source, "/home/user/state.txt", "before");
  // A name that is a template, or not a name, is a 400.
  for (const name of ["base", "a b", "snap-aaaaaaaaaaaaaaaaaaaa"]) {
    const bad = await call("POST", `/sandboxes/${source}/snapshots`, { name }, "team-a");
    assert.equal(bad.status, 400, name);
  }
  // A missing sandbox is E2B's 404 (the SDK's SandboxNotFoundError).
  assert.equal((await call("POST", "/sandboxes/nope/snapshots", {}, "team-a")).status, 404);
  await executor.close();
});

Deno.test("snapshots belong to their team: another team neither lists, starts from nor deletes them", async () => {
  const { call, sandbox, executor } = setup();
  const source = await sandbox("team-a");
  const snap =
    await (await call("POST", `/sandboxes/${source}/snapshots`, { name: "mine" }, "team-a"))
      .json();
  const list = async (team: string) =>
    (await (await call("GET", "/snapshots", undefined, team)).json()).map((
      s: { snapshotID: string },
    ) => s.snapshotID);
  assert.deepEqual(await list("team-a"), [snap.snapshotID]);
  assert.deepEqual(await list("team-b"), []);
  const byId = await call("POST", "/v2/sandboxes", { templateID: snap.snapshotID }, "team-b");
  assert.equal(byId.status, 404);
  assert.match((await byId.json()).message, /^Snapshot 'snap-.*' not found/);
  // By name, another team's snapshot is no snapshot at all: the name reads as a template.
  const byName = await call("POST", "/v2/sandboxes", { templateID: "mine" }, "team-b");
  assert.equal(byName.status, 400);
  assert.match((await byName.json()).message, /^Template 'mine' is not known/);
  assert.equal(
    (await call("DELETE", `/templates/${snap.snapshotID}`, undefined, "team-b")).status,
    404,
  );
  // Team B may use the same name.
  const b = await sandbox("team-b");
  assert.equal(
    (await call("POST", `/sandboxes/${b}/snapshots`, { name: "mine" }, "team-b")).status,
    201,
  );
  assert.equal(
    (await call("DELETE", `/templates/${snap.snapshotID}`, undefined, "team-a")).status,
    204,
  );
  assert.equal(
    (await call("DELETE", `/templates/${snap.snapshotID}`, undefined, "team-a")).status,
    404,
  );
  assert.deepEqual(await list("team-a"), []);
  await executor.close();
});

Deno.test("GET /snapshots filters by sandboxID and name and pages with X-Next-Token", async () => {
  const { call, sandbox, clock, executor } = setup();
  const one = await sandbox();
  const two = await sandbox();
  const ids: string[] = [];
  for (const [id, name] of [[one, "a"], [one, undefined], [two, "c"]] as const) {
    clock.tick(1000);
    const res = await call("POST", `/sandboxes/${id}/snapshots`, name ? { name } : {});
    ids.push((await res.json()).snapshotID);
  }
  const get = async (query: string) => {
    const res = await call("GET", `/snapshots${query}`);
    assert.equal(res.status, 200, query);
    return {
      ids: (await res.json()).map((s: { snapshotID: string }) => s.snapshotID),
      next: res.headers.get("x-next-token"),
    };
  };
  assert.deepEqual((await get("")).ids, ids);
  assert.deepEqual((await get(`?sandboxID=${one}`)).ids, ids.slice(0, 2));
  assert.deepEqual((await get("?name=c")).ids, [ids[2]]);
  assert.deepEqual((await get("?name=c:default")).ids, [ids[2]], "a tag is ignored");
  assert.deepEqual((await get(`?name=${ids[1]}`)).ids, [ids[1]]);
  const first = await get("?limit=2");
  assert.deepEqual(first.ids, ids.slice(0, 2));
  assert.ok(first.next);
  const second = await get(`?limit=2&nextToken=${first.next}`);
  assert.deepEqual(second.ids, [ids[2]]);
  assert.equal(second.next, null);
  for (const query of ["?limit=0", "?limit=101", "?nextToken=garbage"]) {
    const res = await call("GET", `/snapshots${query}`);
    assert.equal(res.status, 400, query);
    assert.equal((await res.json()).code, 400);
  }
  await executor.close();
});

Deno.test("POST /sandboxes/{id}/fork answers each copy on its own, with the source's files", async () => {
  const { call, sandbox, read, write, executor, snapshots } = setup();
  const source = await sandbox("team-a");
  await write(source, "/tmp/shared.txt", "origin");
  // The second create fails; the others are answered.
  let creates = 0;
  const original = executor.create.bind(executor);
  executor.create = (request) => {
    if (++creates === 2) {
      return Promise.reject(new ExecutorError("unavailable", "The engine is busy: retry"));
    }
    return original(request);
  };
  const res = await call("POST", `/sandboxes/${source}/fork`, { count: 3, timeout: 60 }, "team-a");
  assert.equal(res.status, 201);
  const results = await res.json();
  assert.equal(results.length, 3);
  const failed = results.filter((r: { error?: unknown }) => r.error);
  assert.equal(failed.length, 1);
  assert.deepEqual(failed[0].error, { code: 503, message: "The engine is busy: retry" });
  const forks = results.filter((r: { sandbox?: unknown }) => r.sandbox)
    .map((r: { sandbox: { sandboxID: string } }) => r.sandbox.sandboxID);
  assert.equal(forks.length, 2);
  for (const id of forks) assert.equal(await read(id, "/tmp/shared.txt"), "origin");
  await write(forks[0], "/tmp/shared.txt", "fork one");
  assert.equal(await read(forks[1], "/tmp/shared.txt"), "origin");
  assert.equal(await read(source, "/tmp/shared.txt"), "origin");
  // The fork's snapshot is not left behind.
  assert.deepEqual(await snapshots.list(), []);
  // A fork of a missing sandbox is E2B's 404; a count past 100 is a 400.
  assert.equal((await call("POST", "/sandboxes/nope/fork", { count: 1 }, "team-a")).status, 404);
  assert.equal(
    (await call("POST", `/sandboxes/${source}/fork`, { count: 101 }, "team-a")).status,
    400,
  );
  await executor.close();
});

Deno.test("a snapshot that would cross the data-disk floor is a 507 naming the floor", async () => {
  const { call, sandbox, write, executor, snapshots } = setup({ availableBytes: 1e9 + 10 });
  const source = await sandbox();
  await write(source, "/tmp/big.bin", "x".repeat(100));
  const res = await call("POST", `/sandboxes/${source}/snapshots`, {});
  assert.equal(res.status, 507);
  const body = await res.json();
  assert.equal(body.code, 507);
  assert.match(body.message, /below the snapshot floor 1\.0 GB \(DORMICE_SNAPSHOT_MIN_DISK_GB\)/);
  assert.deepEqual(await snapshots.list(), []);
  // A pause to disk keeps the same floor; a memory pause writes nothing to the disk.
  const pause = await call("POST", `/sandboxes/${source}/pause`, { memory: false });
  assert.equal(pause.status, 507);
  assert.match(
    (await pause.json()).message,
    /^A pause to disk of sandbox .* below the snapshot floor/,
  );
  assert.equal((await call("POST", `/sandboxes/${source}/pause`, {})).status, 204);
  await executor.close();
});

Deno.test("NodeSnapshots.advertised() lists the ids held, newest first, after every take and delete", async () => {
  const { call, sandbox, clock, snapshots, executor } = setup();
  const id = await sandbox();
  assert.deepEqual(snapshots.advertised(), { snapshots: [] });
  const taken: string[] = [];
  for (let i = 0; i < 2; i++) {
    clock.tick(1000);
    taken.push((await (await call("POST", `/sandboxes/${id}/snapshots`, {})).json()).snapshotID);
  }
  assert.deepEqual(snapshots.advertised(), { snapshots: [taken[1], taken[0]] });
  await call("DELETE", `/templates/${taken[1]}`);
  assert.deepEqual(snapshots.advertised(), { snapshots: [taken[0]] });
  await executor.close();
});

Deno.test("a sandbox paused to disk is neither snapshotted nor forked until resumed, and lists no snapshot", async () => {
  const { call, sandbox, executor } = setup();
  try {
    const id = await sandbox();
    assert.equal((await call("POST", `/sandboxes/${id}/pause`, { memory: false })).status, 204);
    for (const route of ["snapshots", "fork"]) {
      const res = await call("POST", `/sandboxes/${id}/${route}`, {});
      assert.equal(res.status, 409, route);
      assert.match((await res.json()).message, /is paused to disk .*connect to resume it/);
    }
    // What the pause keeps is no snapshot of the team's.
    assert.deepEqual(await (await call("GET", "/snapshots")).json(), []);
    assert.equal((await call("POST", `/v2/sandboxes/${id}/connect`, {})).status, 201);
    assert.equal((await call("POST", `/sandboxes/${id}/snapshots`, {})).status, 201);
  } finally {
    await executor.close();
  }
});
