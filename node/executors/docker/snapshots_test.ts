/**
 * Docker snapshots across executor instances: a node restarted with its ledger (the same
 * instance id) finds its snapshots, another node on the same engine never sees them, and a
 * sandbox started from a snapshot keeps its files after the snapshot is deleted, whose image
 * goes with the last such sandbox.
 */
import assert from "node:assert/strict";
import Docker from "dockerode";
import { DockerExecutor } from "./executor.ts";
import { DEFAULT_DOCKER_SOCKET } from "./engine.ts";
import { dockerSuite } from "./_fixtures_test.ts";
import { runTag } from "./_build_fixtures_test.ts";

const dockerTest = await dockerSuite("snapshots_test");

dockerTest("DockerExecutor snapshots outlive the executor, scoped to its instance id", async () => {
  const tag = runTag();
  const nodeId = `snapunit-${tag}`;
  const instanceId = `i${tag}`;
  const first = new DockerExecutor({ nodeId, instanceId });
  const spec = { memoryMB: 96 };
  await first.create({ id: "src", name: "src", template: "minimal", spec, env: {} });
  let snapshotId = "";
  let restarted: DockerExecutor | undefined;
  let other: DockerExecutor | undefined;
  try {
    await first.writeFile("src", "/tmp/kept.txt", new TextEncoder().encode("kept"));
    snapshotId = (await first.snapshot("src", { team: "t", name: "n" })).snapshotId;
    await first.destroy("src");
    await first.close();
    // The same node id and instance, as after a restart with its data dir.
    restarted = new DockerExecutor({ nodeId, instanceId });
    const listed = await restarted.listSnapshots("t");
    assert.deepEqual(listed.map((s) => [s.snapshotId, s.name, s.sandboxId, s.node]), [
      [snapshotId, "n", "src", nodeId],
    ]);
    // Another instance with the same node id on the same engine sees none, starts none.
    other = new DockerExecutor({ nodeId, instanceId: `j${tag}` });
    assert.deepEqual(await other.listSnapshots(), []);
    await assert.rejects(
      other.create({
        id: "x",
        name: "x",
        template: "minimal",
        spec,
        env: {},
        snapshot: snapshotId,
      }),
      /not found on this node/,
    );
    assert.equal(await other.deleteSnapshot(snapshotId), false);
    await restarted.create({
      id: "copy",
      name: "copy",
      template: snapshotId,
      snapshot: snapshotId,
      spec,
      env: {},
    });
    // Deleted while a sandbox runs from it: that sandbox keeps its files.
    assert.equal(await restarted.deleteSnapshot(snapshotId), true);
    assert.deepEqual(await restarted.listSnapshots(), []);
    const bytes = await restarted.readFile("copy", "/tmp/kept.txt");
    assert.equal(new TextDecoder().decode(bytes), "kept");
    // Once that sandbox is gone, so is the deleted snapshot's image: no untagged leftover.
    const images = () =>
      new Docker({ socketPath: DEFAULT_DOCKER_SOCKET }).listImages({
        all: true,
        filters: { label: [`dormice.instance=${instanceId}`] },
      });
    assert.equal((await images()).length, 1, "kept untagged while the sandbox runs from it");
    await restarted.destroy("copy");
    assert.deepEqual(await images(), []);
  } finally {
    await restarted?.destroy("copy").catch(() => {});
    await restarted?.deleteSnapshot(snapshotId).catch(() => {});
    await first.destroy("src").catch(() => {});
    await first.close();
    await restarted?.close();
    await other?.close();
  }
});
