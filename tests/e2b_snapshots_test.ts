/**
 * Snapshots and fork through the official `e2b` SDK, unmodified, pointed at a real gateway in
 * front of two real node processes: a named snapshot, the list by name and by sandbox, a create
 * from it by id and by name (placed on the node that holds it, with the files written before
 * it), a fork of 3 with independent writes, a fork held to the key's maxSandboxes, team
 * isolation, a duplicate name, delete, and a create from a snapshot whose only holder is down
 * (a 503 naming it). Run on the fake executor,
 * and again on Docker (two nodes on one engine, which never see each other's snapshots): off
 * CI the Docker run skips with a printed reason when there is no engine; with `CI=true` it fails.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { Sandbox, SandboxError } from "e2b";
import { DEFAULT_DOCKER_SOCKET } from "../node/executors/docker/mod.ts";
import { startNode } from "./_processes.ts";
import { nodeOf, sdkOptions, startTwoNodeFleet, type TwoNodeFleet } from "./_two_nodes.ts";
import { dockerGate, removeContainersOf, startDockerNode, until } from "./_docker.ts";

type Opts = ReturnType<typeof sdkOptions>;

/** Every snapshot id a paginator yields. */
async function allIds(paginator: ReturnType<typeof Sandbox.listSnapshots>): Promise<string[]> {
  const ids: string[] = [];
  while (paginator.hasNext) ids.push(...(await paginator.nextItems()).map((s) => s.snapshotId));
  return ids;
}

/** The exam, on whichever executor the fleet runs. */
async function exam(t: Deno.TestContext, fleet: TwoNodeFleet): Promise<void> {
  const { gw } = fleet;
  const key = async (team: string) => {
    const minted = await gw.json("createApiKey", { team });
    assert.equal(minted.status, 200, JSON.stringify(minted.body));
    return sdkOptions(gw.url, minted.body.key);
  };
  const a = await key("team-a");
  const b = await key("team-b");
  const name = `ready-${crypto.randomUUID().slice(0, 8)}`;
  const source = await Sandbox.create(a);
  const holder = await nodeOf(a, source.sandboxId);
  const made: Sandbox[] = [source];
  let snapshotId = "";
  try {
    await t.step("createSnapshot({ name }) keeps the files; the source runs on", async () => {
      await source.files.write("/home/user/state.txt", "before");
      const snap = await source.createSnapshot({ name });
      assert.match(snap.snapshotId, /^snap-[a-z0-9]{20}$/);
      assert.deepEqual(snap.names, [name]);
      snapshotId = snap.snapshotId;
      await source.files.write("/home/user/state.txt", "after");
      assert.equal(await source.files.read("/home/user/state.txt"), "after");
    });

    await t.step("listSnapshots by name and by sandbox", async () => {
      assert.deepEqual(await allIds(Sandbox.listSnapshots({ ...a, name })), [snapshotId]);
      const bySandbox = await allIds(Sandbox.listSnapshots({ ...a, sandboxId: source.sandboxId }));
      assert.deepEqual(bySandbox, [snapshotId]);
      assert.deepEqual(await allIds(source.listSnapshots()), [snapshotId]);
      // Paging: one row per page, the SDK follows X-Next-Token.
      const extra = await source.createSnapshot();
      const paged = Sandbox.listSnapshots({ ...a, limit: 1 });
      const first = await paged.nextItems();
      assert.equal(first.length, 1);
      assert.ok(paged.hasNext, "a second page");
      assert.deepEqual(
        [...first.map((s) => s.snapshotId), ...(await allIds(paged))].sort(),
        [
          snapshotId,
          extra.snapshotId,
        ].sort(),
      );
      assert.equal(await Sandbox.deleteSnapshot(extra.snapshotId, a), true);
    });

    await t.step(
      "Sandbox.create(snapshot id) and by name start on the holder with the files",
      async () => {
        for (const from of [snapshotId, name, snapshotId, name]) {
          const copy = await Sandbox.create(from, a);
          made.push(copy);
          assert.equal(await copy.files.read("/home/user/state.txt"), "before", from);
          // Only the holder has the files: the other node is never chosen.
          assert.equal(await nodeOf(a, copy.sandboxId), holder, from);
        }
      },
    );

    await t.step("fork({ count: 3 }): three copies, each written on its own", async () => {
      const forks = await Sandbox.fork(source.sandboxId, { ...a, count: 3, timeoutMs: 120_000 });
      assert.equal(forks.length, 3);
      const sandboxes = forks.map((f) => {
        assert.ok(f instanceof Sandbox, String(f));
        return f as Sandbox;
      });
      made.push(...sandboxes);
      for (const [i, fork] of sandboxes.entries()) {
        assert.equal(await fork.files.read("/home/user/state.txt"), "after");
        await fork.files.write("/home/user/state.txt", `fork ${i}`);
      }
      for (const [i, fork] of sandboxes.entries()) {
        assert.equal(await fork.files.read("/home/user/state.txt"), `fork ${i}`);
      }
      assert.equal(await source.files.read("/home/user/state.txt"), "after");
      // The fork's own snapshot is not left in the team's list.
      assert.deepEqual(await allIds(Sandbox.listSnapshots(a)), [snapshotId]);
    });

    await t.step(
      "a fork is held to the key's maxSandboxes: copies past it are RateLimitError",
      async () => {
        const minted = await gw.json("createApiKey", { team: "team-c", maxSandboxes: 3 });
        assert.equal(minted.status, 200, JSON.stringify(minted.body));
        const c = sdkOptions(gw.url, minted.body.key);
        const limited = await Sandbox.create(c);
        made.push(limited);
        const forks = await Sandbox.fork(limited.sandboxId, { ...c, count: 4, timeoutMs: 120_000 });
        assert.equal(forks.length, 4);
        made.push(...forks.filter((f): f is Sandbox => f instanceof Sandbox));
        assert.deepEqual(
          forks.map((f) => f instanceof Sandbox ? "sandbox" : (f as Error).name),
          ["sandbox", "sandbox", "RateLimitError", "RateLimitError"],
        );
        assert.match((forks[2] as Error).message, /maxSandboxes 3/);
        // Full: a whole fork is one 429, the SDK's RateLimitError.
        const full = await Sandbox.fork(limited.sandboxId, { ...c, count: 1 }).then(
          () => undefined,
          (e) => e,
        );
        assert.ok(full instanceof Error && full.name === "RateLimitError", String(full));
      },
    );

    await t.step("another team neither lists, starts from nor deletes the snapshot", async () => {
      assert.deepEqual(await allIds(Sandbox.listSnapshots(b)), []);
      assert.deepEqual(await allIds(Sandbox.listSnapshots({ ...b, name })), []);
      const byId = await Sandbox.create(snapshotId, b).then(() => undefined, (e) => e);
      assert.ok(byId instanceof SandboxError, String(byId));
      assert.match(byId.message, /Snapshot 'snap-[a-z0-9]+' not found/);
      const byName = await Sandbox.create(name, b).then(() => undefined, (e) => e);
      assert.ok(byName instanceof SandboxError, String(byName));
      assert.match(byName.message, /^400: /);
      assert.equal(await Sandbox.deleteSnapshot(snapshotId, b), false);
      assert.deepEqual(await allIds(Sandbox.listSnapshots({ ...a, name })), [snapshotId]);
    });

    await t.step(
      "a name the team already uses is a new build of that snapshot (E2B): one id, the newest files, from either node",
      async () => {
        // E2B's SandboxSnapshotRequest: a name that exists gets a new build, not a new template.
        const again = await source.createSnapshot({ name });
        assert.equal(again.snapshotId, snapshotId);
        assert.deepEqual(await allIds(Sandbox.listSnapshots({ ...a, name })), [snapshotId]);
        const fromName = await Sandbox.create(name, a);
        made.push(fromName);
        assert.equal(await fromName.files.read("/home/user/state.txt"), "after");
        // Taken again from a sandbox on the other node: still one id, and its files win.
        let elsewhere: Sandbox | undefined;
        for (let i = 0; i < 6 && !elsewhere; i++) {
          const s = await Sandbox.create(a);
          made.push(s);
          if (await nodeOf(a, s.sandboxId) !== holder) elsewhere = s;
        }
        assert.ok(elsewhere, "a sandbox on the node that does not hold the snapshot");
        await elsewhere.files.write("/home/user/state.txt", "from the other node");
        const third = await elsewhere.createSnapshot({ name });
        assert.equal(third.snapshotId, snapshotId);
        assert.deepEqual(await allIds(Sandbox.listSnapshots({ ...a, name })), [snapshotId]);
        for (const from of [name, snapshotId]) {
          const copy = await Sandbox.create(from, a);
          made.push(copy);
          assert.equal(await copy.files.read("/home/user/state.txt"), "from the other node", from);
        }
      },
    );

    await t.step(
      "deleteSnapshot(): gone from the listing, and nothing starts from it",
      async () => {
        assert.equal(await Sandbox.deleteSnapshot(snapshotId, a), true);
        assert.equal(await Sandbox.deleteSnapshot(snapshotId, a), false);
        assert.deepEqual(await allIds(Sandbox.listSnapshots(a)), []);
        const from = await Sandbox.create(snapshotId, a).then(() => undefined, (e) => e);
        assert.ok(from instanceof SandboxError, String(from));
        // Sandboxes started from it keep their files.
        assert.equal(await made[1].files.read("/home/user/state.txt"), "before");
      },
    );

    await t.step("a snapshot whose only holder is down is a 503 naming it", async () => {
      const kept = await source.createSnapshot();
      const taken = Date.now();
      // A check-in the gateway received over a second after the take (interval 1 s) was built
      // after it, so it advertised the snapshot.
      await until("a check-in of the holder built after the take", async () => {
        const { body } = await gw.json("listNodes");
        return body.nodes.some((n: { id: string; lastCheckInAgeMs: number }) =>
          n.id === holder && n.lastCheckInAgeMs < Date.now() - taken - 1_100
        );
      });
      for (const s of made.splice(0)) await s.kill().catch(() => {});
      await fleet.nodes.get(holder)!.stop();
      fleet.nodes.delete(holder);
      await until("the gateway to see the holder down", async () => {
        const { body } = await gw.json("listNodes");
        return body.nodes.some((n: { id: string; state: string }) =>
          n.id === holder && n.state === "down"
        );
      }, 30_000);
      const error = await Sandbox.create(kept.snapshotId, a).then(() => undefined, (e) => e);
      // The SDK's ServiceBusyError: a 503, which it may retry.
      assert.ok(error instanceof Error && error.name === "ServiceBusyError", String(error));
      assert.match(
        error.message,
        new RegExp(`Snapshot '${kept.snapshotId}' is held only by node '${holder}', which is down`),
      );
    });
  } finally {
    for (const s of made) await s.kill().catch(() => {});
  }
}

Deno.test({
  name: "e2b SDK snapshots and fork through a gateway in front of two fake nodes",
  // The SDK keeps pooled keep-alive connections it never closes.
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  const fleet = await startTwoNodeFleet(
    (gw, id) =>
      startNode({
        token: gw.token,
        env: {
          DORMICE_GATEWAY_ENDPOINT: gw.url,
          DORMICE_NODE_ID: id,
          DORMICE_CHECK_IN_INTERVAL_SECONDS: "1",
        },
      }),
    ["snap-fake-a", "snap-fake-b"],
  );
  try {
    await exam(t, fleet);
  } finally {
    await fleet.stop();
  }
});

const gate = await dockerGate("docker snapshot suite");

Deno.test({
  name: "e2b SDK snapshots and fork through a gateway in front of two Docker nodes",
  ignore: gate.skip,
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  if (gate.failure) throw new Error(gate.failure);
  const ids: [string, string] = [
    `snapa-${crypto.randomUUID().slice(0, 6)}`,
    `snapb-${crypto.randomUUID().slice(0, 6)}`,
  ];
  const fleet = await startTwoNodeFleet(
    (gw, id) => startDockerNode({ token: gw.token, gatewayUrl: gw.url, nodeId: id }),
    ids,
  );
  try {
    await exam(t, fleet);
  } finally {
    await fleet.stop();
    await removeContainersOf(ids);
    // The snapshot the down step left behind, and any a failed step did.
    const docker = new Docker({ socketPath: DEFAULT_DOCKER_SOCKET });
    for (const id of ids) {
      const images = await docker.listImages({ filters: { label: [`dormice.node=${id}`] } });
      for (const image of images) {
        await docker.getImage(image.Id).remove({ force: true }).catch(() => {});
      }
    }
  }
});
