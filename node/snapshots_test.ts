/**
 * The node's snapshots beyond the E2B routes: the TTL sweep (a healed copy keeps its taking
 * time, so it expires with the original), a heal between two fake executors through the move
 * verbs, and a delete that reaches the registry (a stub speaking the registry's HTTP API).
 */
import assert from "node:assert/strict";
import { FakeClock } from "../shared/clock.ts";
import { FakeExecutor } from "./executors/fake.ts";
import { Ledger } from "./ledger.ts";
import { SandboxService } from "./service.ts";
import { NodeSnapshots } from "./snapshots.ts";
import { ImageMoves } from "./image_moves.ts";

const HOUR = 3_600_000;
const token = "fleet-token-0123456789abcdefghijklmnop";

function node(clock: FakeClock, nodeId: string, moves?: (e: FakeExecutor) => ImageMoves) {
  const executor = new FakeExecutor({ clock, nodeId });
  const ledger = Ledger.inMemory({ nodeId, endpoint: "http://127.0.0.1:1" });
  const service = new SandboxService({ ledger, executor, clock });
  const snapshots = new NodeSnapshots({
    executor,
    service,
    queue: service.queue,
    ttlMs: HOUR,
    ...(moves ? { moves: moves(executor) } : {}),
  });
  return { executor, service, snapshots };
}

Deno.test("NodeSnapshots.expire deletes a snapshot once its TTL has run from its taking", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const { service, snapshots } = node(clock, "n1");
  const { sandbox } = await service.acquire({ name: "a" });
  const snap = await snapshots.take({ id: sandbox.id });
  clock.tick(HOUR - 1);
  assert.deepEqual(await snapshots.expire(clock.now()), []);
  assert.equal((await snapshots.list()).length, 1);
  clock.tick(1);
  assert.deepEqual(await snapshots.expire(clock.now()), [snap.snapshotId]);
  assert.deepEqual(await snapshots.list(), []);
  assert.deepEqual(snapshots.advertised().snapshots, []);
});

Deno.test("a healed copy keeps its taking time and expires with the original", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const holder = node(clock, "holder");
  // The receiver fetches from the holder's export verb as its route would serve it.
  const holderMoves = new ImageMoves({ executor: holder.executor, token });
  const receiver = node(clock, "receiver", (executor) =>
    new ImageMoves({
      executor,
      token,
      fetch: async (input) => {
        const name = decodeURIComponent(new URL(String(input)).pathname.split("/").pop()!);
        return await holderMoves.export(name, new AbortController().signal);
      },
    }));
  const { sandbox } = await holder.service.acquire({ name: "a" });
  await holder.executor.writeFile(sandbox.id, "/home/user/x.txt", new TextEncoder().encode("x"));
  const snap = await holder.snapshots.take({ id: sandbox.id });
  clock.tick(HOUR / 2);
  const healed = await receiver.snapshots.findOrHeal(snap.snapshotId, "default", [
    { nodeId: "holder", endpoint: "http://127.0.0.1:1" },
  ]);
  assert.equal(healed?.createdAt, snap.createdAt);
  assert.equal(healed?.node, "holder");
  // It starts sandboxes with the holder's files.
  const { sandbox: copy } = await receiver.service.acquire({
    name: "b",
    template: snap.snapshotId,
    snapshot: snap.snapshotId,
  });
  assert.equal(
    new TextDecoder().decode(await receiver.executor.readFile(copy.id, "/home/user/x.txt")),
    "x",
  );
  clock.tick(HOUR / 2);
  assert.deepEqual(await receiver.snapshots.expire(clock.now()), [snap.snapshotId]);
  assert.deepEqual(await holder.snapshots.expire(clock.now()), [snap.snapshotId]);
});

Deno.test("a heal whose bytes do not match the holder's digest keeps nothing (503 naming it)", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const holder = node(clock, "holder");
  const holderMoves = new ImageMoves({ executor: holder.executor, token });
  const receiver = node(clock, "receiver", (executor) =>
    new ImageMoves({
      executor,
      token,
      fetch: async (input) => {
        const name = decodeURIComponent(new URL(String(input)).pathname.split("/").pop()!);
        const real = await holderMoves.export(name, new AbortController().signal);
        const bytes = new Uint8Array(await real.arrayBuffer());
        bytes[bytes.length - 3] ^= 1; // one bit changed on the way
        return new Response(bytes, { headers: real.headers });
      },
    }));
  const { sandbox } = await holder.service.acquire({ name: "a" });
  const snap = await holder.snapshots.take({ id: sandbox.id });
  await assert.rejects(
    receiver.snapshots.findOrHeal(snap.snapshotId, "default", [
      { nodeId: "holder", endpoint: "http://127.0.0.1:1" },
    ]),
    (e: Error & { status?: number }) =>
      e.status === 503 && /node 'holder': .*digest/.test(e.message),
  );
  assert.deepEqual(await receiver.snapshots.list(), []);
});

Deno.test("a delete reaches the registry: its manifest is deleted, another team's is not", async () => {
  const deleted: string[] = [];
  const labels = { "dormice.snapshot.team": "acme", "dormice.snapshot.created": "1" };
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (req) => {
    const path = new URL(req.url).pathname;
    if (req.method === "DELETE") {
      deleted.push(path);
      return new Response(null, { status: 202 });
    }
    if (path.endsWith("/manifests/snap-aaaaaaaaaaaaaaaaaaaa")) {
      return Response.json({ config: { digest: "sha256:c" } }, {
        headers: { "docker-content-digest": "sha256:m" },
      });
    }
    if (path.endsWith("/blobs/sha256:c")) return Response.json({ config: { Labels: labels } });
    return new Response("{}", { status: 404 });
  });
  try {
    const clock = new FakeClock(1_800_000_000_000);
    const registry = `127.0.0.1:${server.addr.port}`;
    const { snapshots } = node(
      clock,
      "n1",
      (executor) => new ImageMoves({ executor, token, registry }),
    );
    assert.equal(await snapshots.delete("snap-aaaaaaaaaaaaaaaaaaaa", "other"), false);
    assert.deepEqual(deleted, []);
    assert.equal(await snapshots.delete("snap-aaaaaaaaaaaaaaaaaaaa", "acme"), true);
    assert.deepEqual(deleted, ["/v2/dormice-snapshot/manifests/sha256:m"]);
    assert.equal(await snapshots.delete("snap-bbbbbbbbbbbbbbbbbbbb", "acme"), false);
  } finally {
    await server.shutdown();
  }
});

Deno.test("every take is announced, advertised, before it answers: a new name, none, a name taken again", async () => {
  const clock = new FakeClock(1_800_000_000_000);
  const executor = new FakeExecutor({ clock, nodeId: "n2" });
  const ledger = Ledger.inMemory({ nodeId: "n2", endpoint: "http://127.0.0.1:1" });
  const service = new SandboxService({ ledger, executor, clock });
  const announced: { id: string; advertised: string[] }[] = [];
  const snapshots: NodeSnapshots = new NodeSnapshots({
    executor,
    service,
    queue: service.queue,
    announceRetaken: (id) => {
      announced.push({ id, advertised: snapshots.advertised().snapshots });
      return Promise.resolve();
    },
  });
  const { sandbox } = await service.acquire({ name: "a" });
  // A new name, and an unnamed take: the gateways ask only advertising nodes, so each is
  // announced with the new id (and name) already advertised.
  const fresh = await snapshots.take({ id: sandbox.id }, "fresh", {});
  const unnamed = await snapshots.take({ id: sandbox.id });
  assert.deepEqual(announced.map((a) => a.id), [fresh.snapshotId, unnamed.snapshotId]);
  assert.ok(announced[0].advertised.includes(fresh.snapshotId), "the check-in advertises it");
  assert.ok(snapshots.advertised().snapshotNames?.some((n) => n.endsWith("/fresh")));
  assert.ok(announced[1].advertised.includes(unnamed.snapshotId));
  const elsewhere = "snap-" + "q".repeat(20);
  const info = await snapshots.take({ id: sandbox.id }, "ready", { snapshotId: elsewhere });
  assert.equal(info.snapshotId, elsewhere);
  assert.equal(announced.length, 3);
  assert.equal(announced[2].id, elsewhere);
  assert.ok(announced[2].advertised.includes(elsewhere), "the pushed check-in advertises it");
});
