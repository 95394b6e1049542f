import assert from "node:assert/strict";
import { buildGateway } from "../app.ts";
import { checkIn } from "../_fixtures_test.ts";
import { FakeClock } from "../../shared/clock.ts";
import { RECONCILE_INTERVAL_MS } from "./reconcile.ts";

const token = "gateway-volume-reconcile-test-token-0123456789abcdef";
const id = "vol-0000000000000000000a";

/**
 * A gateway over stub nodes: `holds[node]` are the volume ids each advertises and answers
 * `present` for; every node call is recorded as `<node> <path>`.
 */
function fleet(
  holds: Record<string, string[]>,
  options: {
    answers?: Record<string, boolean>;
    unreachable?: string[];
    roots?: Record<string, string>;
  } = {},
) {
  const calls: string[] = [];
  const clock = new FakeClock();
  const endpoints: Record<string, string> = {};
  const lines: { msg: string; fields: Record<string, unknown> }[] = [];
  const gateway = buildGateway({
    token,
    clock,
    timers: clock,
    log: (_level, msg, fields = {}) => lines.push({ msg, fields }),
    fetch: async (input: RequestInfo | URL, init?: RequestInit) => {
      const request = new Request(input, init);
      const url = new URL(request.url);
      const node = Object.keys(endpoints).find((n) => endpoints[n] === url.origin)!;
      calls.push(`${node} ${url.pathname}`);
      if (options.unreachable?.includes(node)) throw new TypeError("Connection refused");
      const body = await request.json().catch(() => ({}));
      if (url.pathname === "/volumeUsers") {
        const present = options.answers?.[node] ?? holds[node].includes(body.id);
        const root = options.roots?.[node] ?? `root-of-${node}`;
        return Response.json({ present, sandboxes: [], node, root });
      }
      if (url.pathname === "/destroyVolume") {
        holds[node] = holds[node].filter((v) => v !== body.id);
        return Response.json({ destroyed: true });
      }
      return new Response("{}", { status: 404 });
    },
  });
  const checkInAll = () => {
    for (const [i, node] of Object.keys(holds).entries()) {
      endpoints[node] = `http://10.0.0.${i + 1}:3676`;
      gateway.fleet.checkIn(checkIn(node, endpoints[node], { volumes: holds[node] }));
    }
  };
  checkInAll();
  return { gateway, calls, clock, lines, checkInAll };
}

async function addVolume(
  gateway: ReturnType<typeof buildGateway>,
  node: string,
  state: "ready" | "moving" = "ready",
) {
  await gateway.volumes!.table.reserve({ id, team: "default", name: "data", node });
  await gateway.volumes!.table.update(id, { state, sizeBytes: 1e9 });
}

Deno.test("volume reconcile: the gateway's sweep drops a stale copy once seen twice, after asking the recorded node", async () => {
  // A move's target (node-b) took the image but died before the table named it: the table still
  // records node-a, and node-b holds a whole copy again after its restart.
  const f = fleet({ "node-a": [id], "node-b": [id] });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a");
  // The nodes check in every second while the sweep runs once a second: two passes.
  for (let s = 0; s <= RECONCILE_INTERVAL_MS / 1000 + 1; s++) {
    f.checkInAll();
    f.clock.tick(1000);
    await new Promise((r) => setTimeout(r, 1));
  }
  assert.deepEqual(f.calls, [
    "node-b /volumeUsers",
    "node-a /volumeUsers",
    "node-b /destroyVolume",
  ]);
  const row = await gateway.volumes!.table.get(id);
  assert.deepEqual([row?.node, row?.state], ["node-a", "ready"]);
  const line = f.lines.find((l) => /stale copy of a volume was dropped/.test(l.msg));
  assert.deepEqual(line?.fields, { volume: id, nodeId: "node-b", recordedOn: "node-a" });
});

Deno.test("volume reconcile: a copy whose recorded node lacks it, or is down, is kept and logged once with the command", async () => {
  const f = fleet({ "node-a": [], "node-b": [id] });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a");
  const reconciler = gateway.volumes!.reconciler;
  assert.deepEqual(await reconciler.pass(), { dropped: [], kept: [] }, "seen once: no verdict");
  const second = await reconciler.pass();
  assert.deepEqual(second.dropped, []);
  assert.match(second.kept[0].why, /does not hold it now: this copy may be the only one/);
  assert.deepEqual(f.calls, ["node-b /volumeUsers", "node-a /volumeUsers"]);
  await reconciler.pass();
  const logged = f.lines.filter((l) => /a node holds a copy of a volume/.test(l.msg));
  assert.equal(logged.length, 1, "logged once while it stays");
  assert.match(
    String(logged[0].fields.fix),
    /curl -X POST http:\/\/10\.0\.0\.2:3676\/destroyVolume/,
  );
  // The row was released after each try.
  assert.equal((await gateway.volumes!.table.get(id))?.state, "ready");
});

Deno.test("volume reconcile: a copy whose recorded node is down, or whose row is moving, is never dropped", async () => {
  const f = fleet({ "node-a": [id], "node-b": [id] });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a", "moving");
  const reconciler = gateway.volumes!.reconciler;
  await reconciler.pass();
  assert.deepEqual(await reconciler.pass(), { dropped: [], kept: [] });
  await gateway.volumes!.table.update(id, { state: "ready" });
  // node-a stops checking in: down.
  f.clock.tick(10 * 60_000);
  gateway.fleet.checkIn(checkIn("node-b", "http://10.0.0.2:3676", { volumes: [id] }));
  await reconciler.pass();
  const kept = await reconciler.pass();
  assert.match(
    kept.kept[0]?.why ?? "",
    /'node-a'\) is down or gone: this copy may be the only one/,
  );
  assert.deepEqual(f.calls, []);
});

Deno.test("volume reconcile: a volume no row names is kept and named", async () => {
  const f = fleet({ "node-a": [id] });
  await using gateway = f.gateway;
  const reconciler = gateway.volumes!.reconciler;
  await reconciler.pass();
  const report = await reconciler.pass();
  assert.deepEqual(report.kept.map((k) => [k.volume, k.node]), [[id, "node-a"]]);
  assert.match(report.kept[0].why, /no volume row names it/);
  assert.deepEqual(f.calls, []);
});

Deno.test("volume reconcile: a second check-in naming the recorded node's endpoint never gets its copy dropped", async () => {
  // node-a holds the only copy. A check-in under another id (a node restarted under a new id, or
  // one that is not the node's) names node-a's endpoint and lists the volume: a drop sent to
  // 'node-z' would reach node-a and delete the only copy.
  const f = fleet({ "node-a": [id] });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a");
  const twin = () =>
    gateway.fleet.checkIn(checkIn("node-z", "http://10.0.0.1:3676", { volumes: [id] }));
  twin();
  const reconciler = gateway.volumes!.reconciler;
  await reconciler.pass();
  twin();
  const report = await reconciler.pass();
  assert.deepEqual(report.dropped, []);
  assert.match(report.kept[0]?.why ?? "", /answers as "node-a": two check-ins may name one node/);
  assert.ok(!f.calls.some((c) => c.endsWith("/destroyVolume")), f.calls.join(", "));
  assert.deepEqual(f.calls, ["node-a /volumeUsers"], "the copy's endpoint was asked who it is");
});

Deno.test("volume reconcile: a clock set back does not stop the passes", async () => {
  const f = fleet({ "node-a": [id], "node-b": [id] });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a");
  const reconciler = gateway.volumes!.reconciler;
  const settle = () => new Promise((r) => setTimeout(r, 5));
  const t = f.clock.now();
  reconciler.tick(t);
  await settle();
  // The host's clock is set back an hour: the next tick is the next pass all the same.
  reconciler.tick(t - 3_600_000);
  await settle();
  assert.ok(f.calls.includes("node-b /destroyVolume"), `calls: ${f.calls.join(", ")}`);
  // And a minute on from the clock as it reads now is the pass after.
  const before = f.calls.length;
  reconciler.tick(t - 3_600_000 + RECONCILE_INTERVAL_MS / 2);
  await settle();
  assert.equal(f.calls.length, before, "half a minute after that pass: none");
});

Deno.test("volume reconcile: a node that does not answer costs its own copy's check, not the pass", async () => {
  const other = "vol-0000000000000000000b";
  // id is recorded on node-a, which checks in but refuses connections; other on node-c.
  const f = fleet({ "node-a": [id], "node-b": [id, other], "node-c": [other] }, {
    unreachable: ["node-a"],
  });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a");
  await gateway.volumes!.table.reserve({
    id: other,
    team: "default",
    name: "more",
    node: "node-c",
  });
  await gateway.volumes!.table.update(other, { state: "ready", sizeBytes: 1e9 });
  const reconciler = gateway.volumes!.reconciler;
  await reconciler.pass();
  const report = await reconciler.pass();
  assert.deepEqual(report.dropped.map((d) => d.volume), [other]);
  assert.match(report.kept[0]?.why ?? "", /asking the nodes failed: .*did not answer/);
  assert.equal((await gateway.volumes!.table.get(id))?.state, "ready", "the claim was released");
});

Deno.test("volume reconcile: a pass checks at most 64 copies, those checked longest ago first", async () => {
  // A restored database: 100 copies on node-b whose recorded node-a lacks them, kept every pass.
  const ids = Array.from({ length: 100 }, (_, i) => `vol-${String(i).padStart(20, "0")}`);
  const f = fleet({ "node-a": [], "node-b": [...ids] });
  await using gateway = f.gateway;
  for (const [i, v] of ids.entries()) {
    await gateway.volumes!.table.reserve({ id: v, team: "default", name: `v${i}`, node: "node-a" });
    await gateway.volumes!.table.update(v, { state: "ready", sizeBytes: 1e9 });
  }
  const reconciler = gateway.volumes!.reconciler;
  await reconciler.pass();
  const second = await reconciler.pass();
  assert.equal(second.kept.length, 64);
  assert.equal(f.calls.length, 128, "two node requests per check");
  const third = await reconciler.pass();
  const checked = new Set([...second.kept, ...third.kept].map((k) => k.volume));
  assert.equal(checked.size, 100, "the 36 left out go first the pass after");
  const logged = f.lines.filter((l) => /a node holds a copy of a volume/.test(l.msg));
  assert.equal(logged.length, 100, "each logged once");
});

Deno.test("volume reconcile: two nodes over one volume root never drop the copy they share", async () => {
  // Two nodes given one data dir (or one network mount) without a shared root: each lists the
  // volume and answers that it holds it, but it is one copy; a drop on node-b deletes node-a's.
  const f = fleet({ "node-a": [id], "node-b": [id] }, {
    roots: { "node-a": "r1", "node-b": "r1" },
  });
  await using gateway = f.gateway;
  await addVolume(gateway, "node-a");
  const reconciler = gateway.volumes!.reconciler;
  await reconciler.pass();
  const report = await reconciler.pass();
  assert.deepEqual(report.dropped, []);
  assert.match(report.kept[0]?.why ?? "", /keep their volumes in one place \(volume root id r1\)/);
  assert.ok(!f.calls.some((c) => c.endsWith("/destroyVolume")), f.calls.join(", "));
});
